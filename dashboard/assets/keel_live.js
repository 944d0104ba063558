/*
 * Keel live updates.
 *
 * One WebSocket to /api/v1/live per page, subscribed to the runs the page names
 * in its [data-live-runs] element ("*" = every run). Pushed points are appended
 * to the charts with Plotly.extendTraces, batched once per animation frame: no
 * figure re-render and no polling. Chart conventions come from
 * dashboard/figures.py (layout.meta and trace meta roles).
 *
 * Server re-renders are only asked for (by bumping the "live-tick" store, at
 * most every REFRESH_MS) where appending cannot work: group-aggregated charts,
 * alert changes, the runs table, and after a reconnect (missed points).
 */
(function () {
  "use strict";

  var BUFFER_ROWS = 5000; // per run; replayed into charts drawn after the rows arrived
  var DRAWN_LOG = 20000; // (run, key, step, time) records kept for latency measurement
  var REFRESH_MS = 2000;
  var DATA_REFRESH_MS = 5000; // tables beside charts (summary, run header) refresh less often
  var OFFSCREEN_MS = 1000;
  var FRAME_BUDGET_MS = 12;
  var COALESCE_MS = 25;

  var live = {
    socket: null,
    target: null,
    retry: 0,
    buffers: {}, // run id -> rows, ascending by step
    pending: [], // [run id, rows] waiting for the next frame
    frame: null,
    coalesce: null,
    refreshTimers: {},
    offscreenTimer: null,
    drawQueue: [],
    observer: null,
    drawn: [],
    stats: { messages: 0, appended: 0, renders: 0, refreshes: 0, frames: 0, ticks: {} },
  };
  window.keelLive = live;

  function parseValue(raw) {
    if (typeof raw === "number") return raw;
    if (raw === "inf" || raw === "+inf") return Infinity;
    if (raw === "-inf") return -Infinity;
    return NaN;
  }

  function nonFiniteKind(value) {
    if (Number.isNaN(value)) return "nan";
    return value > 0 ? "+inf" : "-inf";
  }

  /* Whether the main y axis can place a value: finite, and positive on a log axis (as figures.py). */
  function drawable(value, logAxis) {
    return Number.isFinite(value) && (value > 0 || !logAxis);
  }

  /* The y range that shows a flat series flat (figures.flat_range); null when it varies. */
  function flatRange(extent, logAxis, flat) {
    if (!extent || !flat) return null;
    var lo = extent[0], hi = extent[1];
    var size = Math.max(Math.abs(lo), Math.abs(hi));
    if (size === 0 || hi - lo >= flat.span * size) return null;
    var middle = (lo + hi) / 2;
    if (logAxis) return [Math.log10(middle) - flat.pad, Math.log10(middle) + flat.pad];
    return [middle - flat.pad * Math.abs(middle), middle + flat.pad * Math.abs(middle)];
  }

  function indicator(state) {
    var el = document.getElementById("live-indicator");
    if (el && el.getAttribute("data-state") !== state) el.setAttribute("data-state", state);
  }

  function plots() {
    return document.querySelectorAll(".keel-graph .js-plotly-plot");
  }

  /* Ask the server to redraw what appending cannot update, at most once per REFRESH_MS per store. */
  function requestRefresh(store, reason, delay) {
    if (live.refreshTimers[store]) return;
    live.refreshTimers[store] = setTimeout(function () {
      live.refreshTimers[store] = null;
      live.stats.refreshes += 1;
      live.stats.ticks[store] = (live.stats.ticks[store] || 0) + 1;
      if (window.dash_clientside && window.dash_clientside.set_props) {
        window.dash_clientside.set_props(store, { data: { reason: reason, t: Date.now() } });
      }
    }, delay);
  }

  function remember(runId, rows) {
    var buffer = live.buffers[runId] || (live.buffers[runId] = []);
    for (var i = 0; i < rows.length; i++) buffer.push(rows[i]);
    if (buffer.length > BUFFER_ROWS) buffer.splice(0, buffer.length - BUFFER_ROWS);
  }

  function byStep(a, b) {
    return a.step - b.step;
  }

  /* Append the rows of one run to one chart. Returns the steps drawn on its raw lines. */
  function apply(gd, runId, rows) {
    var meta = gd.layout && gd.layout.meta;
    if (!meta || !meta.key || !gd.data) return [];
    if (gd.__keelPending && gd.__keelPending.render !== meta.render_id) {
      // The figure was replaced since these appends were computed: their trace indices are void.
      gd.__keelPending = null;
      gd.__keelDrawn = null;
    }
    var key = meta.key;
    var relevant = rows.filter(function (row) {
      return row.values && Object.prototype.hasOwnProperty.call(row.values, key);
    });
    if (!relevant.length) return [];
    if (meta.aggregate) {
      // Group means cannot be appended to; ask for a redraw when a run got past its drawn end.
      var drawnTo = meta.last_steps || (meta.last_steps = {});
      var newest = relevant.reduce(function (m, row) { return Math.max(m, row.step); }, -Infinity);
      var known = drawnTo[runId] === null || drawnTo[runId] === undefined ? -Infinity : drawnTo[runId];
      if (newest > known) {
        drawnTo[runId] = newest;
        requestRefresh("live-tick", "aggregate", REFRESH_MS);
      }
      return [];
    }
    relevant.sort(byStep);
    var weight = meta.smoothing || 0;
    var logAxis = !!(gd.layout.yaxis && gd.layout.yaxis.type === "log");
    var axisChange = false;
    var edge = meta.edge || {};
    var lines = { idx: [], x: [], y: [] };
    var drawnSteps = [];
    for (var i = 0; i < gd.data.length; i++) {
      var tm = gd.data[i].meta;
      if (!tm || tm.run !== runId) continue;
      if (tm.role !== "raw" && tm.role !== "smooth" && tm.role !== "nonfinite") continue;
      var last = tm.last_step === null || tm.last_step === undefined ? -Infinity : tm.last_step;
      var xs = [], ys = [], symbols = [], texts = [];
      for (var r = 0; r < relevant.length; r++) {
        var row = relevant[r];
        if (row.step <= last) continue;
        last = row.step;
        var value = parseValue(row.values[key]);
        var finite = Number.isFinite(value);
        if (tm.role === "raw") {
          xs.push(row.step);
          // null is a gap; on a log axis 0 and negatives would plunge off the bottom edge.
          ys.push(drawable(value, logAxis) ? value : null);
          drawnSteps.push(row.step);
          // The server chose the axis from the values it had: a first positive value on a
          // chart drawn linear for want of one, or a first value ≤ 0 on a log chart with
          // nothing drawn yet, needs its redraw (log axis again / the note and linear axis).
          if (meta.log_fallback && finite && value > 0) axisChange = true;
          if (logAxis && !meta.y_extent && finite && value <= 0) axisChange = true;
        } else if (tm.role === "smooth") {
          // The running form of the debiased EMA, exact for a constant (series.EmaState).
          var state = tm.ema || (tm.ema = { value: 0, count: 0 });
          xs.push(row.step);
          if (finite) {
            state.count += 1;
            var gain = (1 - weight) / (1 - Math.pow(weight, state.count));
            state.value = gain >= 1 ? value : state.value + gain * (value - state.value);
            ys.push(drawable(state.value, logAxis) ? state.value : null);
          } else {
            ys.push(null);
          }
        } else if (!finite) {
          var mark = edge[nonFiniteKind(value)] || [0.95, "x", "NaN"];
          xs.push(row.step);
          ys.push(mark[0]);
          symbols.push(mark[1]);
          texts.push(mark[2]);
        }
      }
      if (last !== -Infinity) tm.last_step = last;
      if (!xs.length) continue;
      if (tm.role === "nonfinite") {
        // Rare: rewrite this one trace so per-point symbols stay aligned with x.
        var trace = gd.data[i];
        var symbol = trace.marker && Array.isArray(trace.marker.symbol) ? trace.marker.symbol : [];
        window.Plotly.restyle(gd, {
          x: [(trace.x || []).concat(xs)],
          y: [(trace.y || []).concat(ys)],
          "marker.symbol": [symbol.concat(symbols)],
          text: [(trace.text || []).concat(texts)],
        }, [i]);
      } else {
        lines.idx.push(i);
        lines.x.push(xs);
        lines.y.push(ys);
      }
    }
    if (axisChange) requestRefresh("live-tick", "log-axis", 0);
    if (lines.idx.length) {
      gd.__keelPending = gd.__keelPending || { render: meta.render_id, idx: [], x: [], y: [] };
      var p = gd.__keelPending;
      for (var j = 0; j < lines.idx.length; j++) {
        var at = p.idx.indexOf(lines.idx[j]);
        if (at < 0) {
          p.idx.push(lines.idx[j]);
          p.x.push(lines.x[j]);
          p.y.push(lines.y[j]);
        } else {
          p.x[at] = p.x[at].concat(lines.x[j]);
          p.y[at] = p.y[at].concat(lines.y[j]);
        }
      }
    }
    return drawnSteps;
  }

  function logDrawn(key, runId, steps, receivedAt) {
    var now = Date.now();
    for (var i = 0; i < steps.length; i++) {
      live.drawn.push({ key: key, run: runId, step: steps[i], t: now, received: receivedAt });
    }
    if (live.drawn.length > DRAWN_LOG) live.drawn.splice(0, live.drawn.length - DRAWN_LOG);
  }

  function visible(gd) {
    return gd.__keelVisible !== false; // unknown until the IntersectionObserver reports
  }

  /* The relayout that stretches each still-firing alert range to its run's newest appended step. */
  function stretchFiring(gd, p) {
    var layout = {};
    var shapes = gd.layout.shapes || [];
    if (!shapes.length) return layout;
    var newest = {};
    for (var i = 0; i < p.idx.length; i++) {
      var run = gd.data[p.idx[i]].meta.run;
      var top = Math.max.apply(null, p.x[i]);
      if (!(run in newest) || top > newest[run]) newest[run] = top;
    }
    for (var s = 0; s < shapes.length; s++) {
      var name = shapes[s].name || "";
      if (name.indexOf("firing:") !== 0) continue;
      var step = newest[name.slice(7)];
      if (step !== undefined && step > shapes[s].x1) layout["shapes[" + s + "].x1"] = step;
    }
    return layout;
  }

  /*
   * The relayout that keeps the y axis off rounding error (figures.flat_range) once the
   * appended points have widened the chart's extent: the flat range, or autorange again
   * when the series stopped being flat; {} when nothing changes (a user's y zoom stays).
   */
  function keepFlatAxis(gd, p) {
    var meta = gd.layout.meta;
    var extent = meta.y_extent ? meta.y_extent.slice() : null;
    for (var i = 0; i < p.y.length; i++) {
      for (var j = 0; j < p.y[i].length; j++) {
        var y = p.y[i][j];
        if (y === null || y === undefined) continue;
        if (!extent) extent = [y, y];
        else if (y < extent[0]) extent[0] = y;
        else if (y > extent[1]) extent[1] = y;
      }
    }
    meta.y_extent = extent;
    var flat = meta.flat;
    if (!flat) return {};
    var range = flatRange(extent, !!(gd.layout.yaxis && gd.layout.yaxis.type === "log"), flat);
    var before = flat.range;
    if (range === null ? before === null || before === undefined
        : before && range[0] === before[0] && range[1] === before[1]) {
      return {};
    }
    flat.range = range;
    return range === null ? { "yaxis.autorange": true } : { "yaxis.range": range, "yaxis.autorange": false };
  }

  /* Draw what is pending on one chart: a single extendTraces for all its traces. */
  function extend(gd) {
    var p = gd.__keelPending;
    var drawn = gd.__keelDrawn || [];
    gd.__keelPending = null;
    gd.__keelDrawn = null;
    if (!p || !p.idx.length || !gd.layout.meta || p.render !== gd.layout.meta.render_id) return;
    var key = gd.layout.meta.key;
    var wasEmpty = gd.layout.meta.empty;
    gd.layout.meta.empty = false;
    var layout = Object.assign(stretchFiring(gd, p), keepFlatAxis(gd, p));
    var done = window.Plotly.extendTraces(gd, { x: p.x, y: p.y }, p.idx);
    live.stats.appended += p.x.reduce(function (n, xs) { return n + xs.length; }, 0);
    if (wasEmpty) layout.annotations = [];
    if (Object.keys(layout).length) window.Plotly.relayout(gd, layout);
    Promise.resolve(done).then(function () {
      // Logged on the next frame: the points have been painted by then.
      requestAnimationFrame(function () {
        for (var d = 0; d < drawn.length; d++) logDrawn(key, drawn[d][0], drawn[d][1], drawn[d][2]);
      });
    });
  }

  /*
   * Per animation frame: everything that arrived goes into each chart's pending appends;
   * then charts on screen are redrawn one after another within FRAME_BUDGET_MS, the rest
   * on the next frames (a Plotly redraw costs tens of ms per chart on a slow laptop, so
   * the page paints and keeps reading the socket between charts). Charts scrolled out of
   * view are redrawn every OFFSCREEN_MS.
   */
  function flush() {
    live.frame = null;
    live.stats.frames += 1;
    var started = performance.now();
    var batch = live.pending;
    live.pending = [];
    var deferred = false;
    plots().forEach(function (gd) {
      for (var b = 0; b < batch.length; b++) {
        var steps = apply(gd, batch[b][0], batch[b][1]);
        if (steps.length) (gd.__keelDrawn = gd.__keelDrawn || []).push([batch[b][0], steps, batch[b][2]]);
      }
      if (!gd.__keelPending) return;
      if (!visible(gd)) deferred = true;
      else if (live.drawQueue.indexOf(gd) < 0) live.drawQueue.push(gd);
    });
    while (live.drawQueue.length) {
      var next = live.drawQueue.shift();
      if (next.isConnected && next.__keelPending) extend(next);
      if (performance.now() - started > FRAME_BUDGET_MS) break;
    }
    if (live.drawQueue.length) requestFlush();
    if (deferred && live.offscreenTimer === null) {
      live.offscreenTimer = setTimeout(function () {
        live.offscreenTimer = null;
        plots().forEach(function (gd) {
          if (gd.__keelPending && live.drawQueue.indexOf(gd) < 0) live.drawQueue.push(gd);
        });
        requestFlush();
      }, OFFSCREEN_MS);
    }
  }

  function requestFlush() {
    if (live.frame === null) live.frame = requestAnimationFrame(flush);
  }

  function schedule(runId, rows, receivedAt) {
    live.pending.push([runId, rows, receivedAt]);
    // Wait COALESCE_MS for the rest of a burst (runs stepping together, a reconnect's
    // catch-up) so each chart is redrawn once for all of it, not once per message.
    if (live.frame === null && live.coalesce === null) {
      live.coalesce = setTimeout(function () {
        live.coalesce = null;
        requestFlush();
      }, COALESCE_MS);
    }
  }

  function onMessage(message) {
    live.stats.messages += 1;
    if (message.type === "points") {
      var rows = message.rows || [];
      remember(message.run_id, rows);
      schedule(message.run_id, rows, Date.now());
      requestRefresh("live-data-tick", "points", live.target === "*" ? REFRESH_MS : DATA_REFRESH_MS);
    } else if (message.type === "status") {
      requestRefresh("live-data-tick", "status", REFRESH_MS);
    } else if (message.type === "alert") {
      requestRefresh("live-tick", "alert", REFRESH_MS);
      requestRefresh("live-data-tick", "alert", REFRESH_MS);
    }
  }

  function connect(target, attempt) {
    if (live.socket) {
      live.socket.onclose = null;
      live.socket.close();
      live.socket = null;
    }
    if (target !== live.target) live.buffers = {};
    live.target = target;
    live.retry = attempt || 0;
    if (!target) {
      indicator("off");
      return;
    }
    var scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    var query = target === "*" ? "" : "?runs=" + encodeURIComponent(target);
    var socket = new WebSocket(scheme + "//" + window.location.host + "/api/v1/live" + query);
    live.socket = socket;
    indicator("connecting");
    socket.onopen = function () {
      // Charts drawn before the socket listened may have missed points in between.
      var missed = live.retry > 0 || Array.prototype.some.call(plots(), function (gd) { return !!gd.__keelRender; });
      live.retry = 0;
      indicator("live");
      if (missed) {
        requestRefresh("live-tick", "reconnect", 0);
        requestRefresh("live-data-tick", "reconnect", 0);
      }
    };
    socket.onmessage = function (event) {
      onMessage(JSON.parse(event.data));
    };
    socket.onerror = function () {
      indicator("reconnecting");
    };
    socket.onclose = function () {
      if (live.socket !== socket) return;
      live.socket = null;
      indicator("reconnecting");
      var delay = Math.min(10000, 500 * Math.pow(2, live.retry));
      live.retry += 1;
      var attempt = live.retry;
      setTimeout(function () {
        if (live.target === target && live.socket === null) connect(target, attempt);
      }, delay);
    };
  }

  /* New figures (first draw, zoom, smoothing change): replay what arrived while they were drawn. */
  function scanGraphs() {
    plots().forEach(function (gd) {
      if (!gd.__keelObserved && live.observer) {
        gd.__keelObserved = true;
        live.observer.observe(gd);
      }
      var meta = gd.layout && gd.layout.meta;
      if (!meta || !meta.render_id || gd.__keelRender === meta.render_id) return;
      gd.__keelRender = meta.render_id;
      live.stats.renders += 1;
      // The new figure replaced the traces: pending appends are void; replay the buffer instead.
      gd.__keelPending = null;
      gd.__keelDrawn = null;
      Object.keys(live.buffers).forEach(function (runId) {
        schedule(runId, live.buffers[runId], null);
      });
    });
  }

  function sync() {
    var el = document.querySelector("[data-live-runs]");
    var target = el ? el.getAttribute("data-live-runs") : null;
    if (target !== live.target) connect(target, 0);
    scanGraphs();
  }

  var queued = false;
  function queueSync() {
    if (queued) return;
    queued = true;
    setTimeout(function () {
      queued = false;
      sync();
    }, 0);
  }

  function start() {
    if (window.IntersectionObserver) {
      live.observer = new IntersectionObserver(function (entries) {
        entries.forEach(function (entry) {
          entry.target.__keelVisible = entry.isIntersecting;
          if (entry.isIntersecting && entry.target.__keelPending) requestFlush();
        });
      });
    }
    new MutationObserver(queueSync).observe(document.body, { childList: true, subtree: true });
    queueSync();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
