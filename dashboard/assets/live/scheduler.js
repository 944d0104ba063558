/*
 * Keel live updates: when each chart paints its overlay and draws.
 *
 * Pushed rows are taken into each chart's pending appends at once (cheap), and painted
 * over the chart as its live overlay (overlay.js) within OVERLAY_INTERVAL_MS, every chart's
 * in the same frame: that is when a point shows. Drawing the appends into the figure is a
 * Plotly redraw of the whole chart (every trace, every point: tens of ms on a laptop,
 * however few points are appended), so it comes out of a budget: the page earns
 * BUSY_SHARE ms of drawing per ms of wall time (up to BURST_MS saved), and each paint or
 * draw spends what its script took and the frame's rendering after it. So live drawing
 * keeps to about BUSY_SHARE of the main thread (script, then style, layout and paint),
 * whatever streams.
 *
 * A chart draws when its overlay cannot show a point (past the axes' range, a non-finite
 * marker): soon (URGENT_INTERVAL_MS), first, and on credit if need be. Otherwise at most
 * every DRAW_INTERVAL_MS, so that hover and the lines' history catch up. Within a frame,
 * charts draw until FRAME_BUDGET_MS is spent, the one that drew longest ago first. Charts
 * out of view and pages in a hidden tab paint and draw nothing; they catch up when seen.
 */
(function (live) {
  "use strict";

  var charts = live.charts;
  // Rows are kept this long (and at most BUFFER_ROWS per run) to be replayed into a chart
  // whose figure was read from the server while they arrived: a figure asked for later holds
  // them already. Bounded by time, a page open all day keeps seconds of rows, not hours.
  var BUFFER_MS = 60000;
  var BUFFER_ROWS = 5000;
  // Of the main thread, for the live draws of all charts together: their script, and the
  // browser's style, layout and paint of the frame they changed (a bigger page costs more).
  var BUSY_SHARE = 0.05;
  var BURST_MS = 300; // drawing time a quiet page saves up for the next burst
  var OVERLAY_INTERVAL_MS = 200; // a chart paints its overlay at most this often
  var URGENT_INTERVAL_MS = 100; // a chart whose overlay cannot show a point draws this soon
  var DRAW_INTERVAL_MS = 2000; // any other chart draws at most this often
  var FRAME_BUDGET_MS = 12;
  var COALESCE_MS = 25; // wait for the rest of a burst before the next frame

  var buffers = {}; // run id -> [[received at, rows]...], oldest first
  var incoming = []; // [run id, rows, received at] not yet taken into the charts
  var frame = null;
  var timer = null;
  var timerDue = Infinity;
  var credit = BURST_MS; // ms of drawing the page may spend now
  var earned = performance.now(); // when credit was last brought up to date

  function plots() {
    return document.querySelectorAll(".keel-graph .js-plotly-plot");
  }

  function remember(runId, rows) {
    var buffer = buffers[runId] || (buffers[runId] = []);
    var now = performance.now();
    buffer.push([now, rows]);
    var kept = 0;
    for (var i = 0; i < buffer.length; i++) kept += buffer[i][1].length;
    while (buffer.length > 1 && (buffer[0][0] < now - BUFFER_MS || kept - buffer[0][1].length >= BUFFER_ROWS)) {
      kept -= buffer.shift()[1].length;
    }
  }

  /* Drop every row kept or waiting (another page, or a socket closed: the server redraws). */
  function forget() {
    buffers = {};
    incoming = [];
  }

  function seen(gd) {
    return !document.hidden && charts.state(gd).visible;
  }

  function earn(now) {
    credit = Math.min(BURST_MS, credit + (now - earned) * BUSY_SHARE);
    earned = now;
  }

  function wakeAt(due) {
    if (frame !== null) return;
    if (timer !== null && timerDue <= due) return;
    if (timer !== null) clearTimeout(timer);
    timerDue = due;
    timer = setTimeout(function () {
      timer = null;
      timerDue = Infinity;
      if (frame !== null || document.hidden) return;
      // Rows are taken in here; a frame is asked for only when a chart paints or draws in it:
      // every animation frame costs the browser a commit of the page's layers (~2 ms here),
      // whether or not anything on it changed.
      var next = earliest(take());
      if (next <= performance.now()) frame = requestAnimationFrame(tick);
      else if (next < Infinity) wakeAt(next);
    }, Math.max(0, due - performance.now()));
  }

  /* The rows that arrived, taken into every chart's pending appends; the charts in view
   * with appends waiting. */
  function take() {
    var batch = incoming;
    incoming = [];
    var waiting = [];
    plots().forEach(function (gd) {
      for (var b = 0; b < batch.length; b++) {
        var steps = charts.take(gd, batch[b][0], batch[b][1], live.socket.askRedraw);
        if (steps.length) charts.state(gd).received.push([batch[b][0], steps, batch[b][2]]);
      }
      if (charts.state(gd).pending && seen(gd)) waiting.push(gd);
    });
    return waiting;
  }

  /* When a chart of `waiting` may draw (DRAW_INTERVAL_MS, URGENT_INTERVAL_MS, the budget)... */
  function drawDue(s, now) {
    var at = s.lastDraw + (s.urgent ? URGENT_INTERVAL_MS : DRAW_INTERVAL_MS);
    var floor = s.urgent ? -BURST_MS : 0; // an urgent draw may borrow a burst's worth
    return credit <= floor ? Math.max(at, now + (floor - credit) / BUSY_SHARE) : at;
  }

  /* ...or paint its overlay: paints fall on one clock of OVERLAY_INTERVAL_MS slots, so the
   * charts that paint do so in the same frame (the page is rendered once per slot, not once
   * per chart). Infinity: nothing new to paint. */
  function paintDue(s) {
    return s.fresh ? (Math.floor(s.lastPaint / OVERLAY_INTERVAL_MS) + 1) * OVERLAY_INTERVAL_MS : Infinity;
  }

  /* The earliest a chart of `waiting` paints or draws. */
  function earliest(waiting) {
    var now = performance.now();
    earn(now);
    var next = Infinity;
    for (var i = 0; i < waiting.length; i++) {
      var s = charts.state(waiting[i]);
      next = Math.min(next, drawDue(s, now), paintDue(s));
    }
    return next;
  }

  /* Rows arrived (or a chart came into view): take them in and draw what is due. */
  function wake(delay) {
    wakeAt(performance.now() + (delay === undefined ? COALESCE_MS : delay));
  }

  function push(runId, rows, receivedAt) {
    incoming.push([runId, rows, receivedAt]);
    if (!document.hidden) wake(); // a hidden tab keeps the rows until it is shown
  }

  function tick() {
    frame = null;
    if (document.hidden) return; // shown again: start() wakes the scheduler
    live.note("frames", 1);
    var started = performance.now();
    var waiting = take();
    var next = Infinity;
    var spentAt = null;
    // Urgent charts first, then the one that drew longest ago, while the budget lasts.
    waiting.sort(function (a, b) {
      var sa = charts.state(a), sb = charts.state(b);
      return (sb.urgent - sa.urgent) || (sa.lastDraw - sb.lastDraw);
    });
    var overlaid = [];
    for (var i = 0; i < waiting.length; i++) {
      var gd = waiting[i];
      var s = charts.state(gd);
      var now = performance.now();
      earn(now);
      var drawAt = drawDue(s, now);
      if (drawAt > now || now - started > FRAME_BUDGET_MS) {
        next = Math.min(next, Math.max(drawAt, now));
        overlaid.push(gd);
        continue;
      }
      var before = performance.now();
      var drawn = charts.draw(gd);
      live.overlay.clear(gd);
      s.urgent = false;
      spentAt = performance.now();
      credit -= spentAt - before;
      live.note("draws", 1);
      live.note("drawMs", spentAt - before);
      if (drawn) live.drew(gd, drawn);
    }
    // The charts that did not draw show what they hold on their overlay.
    for (var t = 0; t < overlaid.length; t++) {
      var chartState = charts.state(overlaid[t]);
      if (!chartState.fresh) continue;
      var paintAt = paintDue(chartState);
      var at = performance.now();
      if (paintAt > at) {
        next = Math.min(next, paintAt);
        continue;
      }
      var shown = live.overlay.paint(overlaid[t]);
      spentAt = performance.now();
      credit -= spentAt - at;
      live.note("overlays", 1);
      if (shown.urgent && !chartState.urgent) {
        chartState.urgent = true;
        next = Math.min(next, Math.max(spentAt, chartState.lastDraw + URGENT_INTERVAL_MS));
      }
    }
    if (spentAt !== null) chargeRendering(spentAt);
    else live.note("idleFrames", 1); // a frame asked for that painted and drew nothing
    if (next < Infinity) wakeAt(next);
  }

  /*
   * The frame's rendering runs after this animation-frame callback; a message posted now is
   * handled once it is done, so the time until then is what the draws cost the browser
   * beyond their script. It is spent from the budget too.
   */
  var channel = new MessageChannel();
  var renderFrom = null;
  channel.port1.onmessage = function () {
    if (renderFrom === null) return;
    credit -= performance.now() - renderFrom;
    renderFrom = null;
  };
  function chargeRendering(from) {
    renderFrom = from;
    channel.port2.postMessage(null);
  }

  /* A new figure (first draw, zoom, option change): replay what arrived while it was drawn. */
  function replay(gd) {
    var s = charts.state(gd);
    s.pending = null;
    s.received = [];
    s.urgent = false;
    live.overlay.clear(gd);
    Object.keys(buffers).forEach(function (runId) {
      var rows = [];
      buffers[runId].forEach(function (kept) {
        for (var i = 0; i < kept[1].length; i++) rows.push(kept[1][i]);
      });
      incoming.push([runId, rows, null]);
    });
    wake();
  }

  live.scheduler = {
    plots: plots,
    remember: remember,
    forget: forget,
    push: push,
    wake: wake,
    replay: replay,
    BUSY_SHARE: BUSY_SHARE,
  };
})(window.keelLive = window.keelLive || {});
