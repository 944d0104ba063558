/*
 * Keel live updates: what a chart is waiting to draw, and drawing it into
 * the figure (overlay.js paints it over the chart until then).
 *
 * Chart conventions come from dashboard/figures.py: layout.meta says what the chart
 * shows; each trace's meta its run and role ("raw", "smooth", "nonfinite", ...). Pushed
 * rows become pending appends per chart (`take`); `draw` puts them on the chart with one
 * Plotly.extendTraces. A chart's own state lives in a WeakMap.
 */
(function (live) {
  "use strict";

  var math = live.math;
  var states = new WeakMap();
  // Points appended to a line before the server is asked to draw the chart afresh (its
  // history bucketed again, views/charts.HISTORY_POINTS): a redraw costs every point drawn,
  // so a page kept open all day must not keep every pushed point.
  var COMPACT_AFTER = 500;

  /* The live state of one chart element (created on first use). */
  function state(gd) {
    var s = states.get(gd);
    if (!s) {
      s = {
        render: null, // the figure (layout.meta.render_id) the state belongs to
        pending: null, // {idx, x, y}: appends not drawn yet
        received: [], // [run, steps, received at] of the pending appends (instrumentation)
        // Out of view until the IntersectionObserver's first word (it speaks as soon as it
        // observes the chart): a chart mounted below the window draws nothing meanwhile.
        visible: !window.IntersectionObserver,
        observed: false,
        lastDraw: -Infinity, // performance.now() of the last draw
        lastPaint: -Infinity, // performance.now() of the last paint of the live overlay
        urgent: false, // the overlay holds a point only a draw can show
        fresh: false, // appends taken in since the overlay was last painted
      };
      states.set(gd, s);
    }
    return s;
  }

  function byStep(a, b) {
    return a.step - b.step;
  }

  /* The server chose the axis from the values it had: a first positive value on a chart drawn
     linear for want of one, or a first value ≤ 0 on a log chart with nothing drawn yet, needs
     its redraw (log axis again / the note and linear axis). */
  function needsServerAxis(meta, logAxis, value) {
    if (!Number.isFinite(value)) return false;
    return (meta.log_fallback && value > 0) || (logAxis && !meta.y_extent && value <= 0);
  }

  /* A run's own line took `count` points: past COMPACT_AFTER the chart asks to be drawn again
     from buckets, once per figure (the new one starts from zero). */
  function countAppended(meta, line, count, ask) {
    line.appended = (line.appended || 0) + count;
    if (line.appended > COMPACT_AFTER && !meta.compacting) {
      meta.compacting = true;
      ask("compact");
    }
  }

  /*
   * Take the rows of one run into one chart's pending appends. Returns the steps that will
   * be drawn on its raw line (its member line, on a chart of group means); calls
   * `ask(reason)` when only a server redraw can show them (a log axis that must change),
   * `ask(reason, gd)` when only this chart's can (a learned level the run does not have yet).
   */
  function take(gd, runId, rows, ask) {
    var meta = gd.layout && gd.layout.meta;
    if (!meta || !meta.key || !gd.data) return [];
    var s = state(gd);
    if (s.pending && s.pending.render !== meta.render_id) {
      // The figure was replaced since these appends were computed: their trace indices are void.
      s.pending = null;
      s.received = [];
    }
    // The metrics the chart's lines draw (meta.keys): its key, or for a chart of other
    // metrics (the loss magnitude) those, and a companion's (the length cap).
    var keys = meta.keys || [meta.key];
    var relevant = rows.filter(function (row) {
      if (!row.values) return false;
      for (var k = 0; k < keys.length; k++) {
        if (Object.prototype.hasOwnProperty.call(row.values, keys[k])) return true;
      }
      return false;
    });
    if (!relevant.length) return [];
    if (meta.unused && meta.unused.indexOf(runId) >= 0) {
      // Drawn as "not used by its loss" (0 at every step): a value other than 0 needs its line.
      var used = relevant.some(function (row) { return math.parseValue(row.values[meta.key]) !== 0; });
      if (used) ask("unused");
      return [];
    }
    // A learned level or a start still to come for this run: only the server can say when it is set.
    var waits = function (list) { return !!list && list.indexOf(runId) >= 0; };
    if (waits(meta.pending) || waits(meta.pending_start)) ask("level", gd);
    relevant.sort(byStep);
    var weight = meta.smoothing || 0;
    var logAxis = !!(gd.layout.yaxis && gd.layout.yaxis.type === "log");
    var axisChange = false;
    var edge = meta.edge || {};
    var lines = { idx: [], x: [], y: [], marks: [] };
    var drawnSteps = [];
    var magnitude = meta.of === "magnitude";
    for (var i = 0; i < gd.data.length; i++) {
      var tm = gd.data[i].meta;
      if (!tm || tm.run !== runId) continue;
      var role = tm.role;
      if (role !== "raw" && role !== "smooth" && role !== "nonfinite" && role !== "companion") continue;
      var key = tm.key || meta.key; // the metric this line draws
      var last = tm.last_step === null || tm.last_step === undefined ? -Infinity : tm.last_step;
      var xs = [], ys = [], symbols = [], texts = [];
      for (var r = 0; r < relevant.length; r++) {
        var row = relevant[r];
        if (row.step <= last || !Object.prototype.hasOwnProperty.call(row.values, key)) continue;
        last = row.step;
        var value = math.parseValue(row.values[key]);
        if (magnitude) value = Math.abs(value); // |x|: NaN stays NaN, −Inf is +Inf (series.magnitude)
        var finite = Number.isFinite(value);
        if (role === "companion") {
          // A metric beside the run's line (its length cap): its values as logged, no markers.
          xs.push(row.step);
          ys.push(math.drawable(value, logAxis) ? value : null);
        } else if (role === "raw") {
          xs.push(row.step);
          // null is a gap; on a log axis 0 and negatives would plunge off the bottom edge.
          ys.push(math.drawable(value, logAxis) ? value : null);
          drawnSteps.push(row.step);
          if (needsServerAxis(meta, logAxis, value)) axisChange = true;
        } else if (role === "smooth") {
          var ema = tm.ema || (tm.ema = { value: 0, count: 0 });
          xs.push(row.step);
          if (finite) {
            var smoothed = math.emaStep(ema, value, weight);
            // On a log axis, not below its floor: zeros decaying the EMA are not a dive.
            if (logAxis) tm.floor = math.logFloor(tm.floor, value);
            ys.push(math.aboveFloor(smoothed, tm.floor, logAxis) ? smoothed : null);
          } else {
            ys.push(null);
          }
        } else if (!finite) {
          var mark = edge[math.nonFiniteKind(value)] || [0.95, "x", "NaN"];
          xs.push(row.step);
          ys.push(mark[0]);
          symbols.push(mark[1]);
          texts.push(mark[2]);
        } else if (logAxis && value <= 0) {
          // A value ≤ 0 the log axis cannot place: an open circle at the bottom edge.
          var zero = edge.zero || [0.045, "circle-open", "0"];
          xs.push(row.step);
          ys.push(zero[0]);
          symbols.push(zero[1]);
          texts.push(math.zeroLabel(value));
        }
      }
      if (last !== -Infinity) tm.last_step = last;
      if (!xs.length) continue;
      if (role === "raw") countAppended(meta, tm, xs.length, ask);
      if (role === "nonfinite") {
        lines.marks.push([i, xs, ys, symbols, texts]);
      } else {
        lines.idx.push(i);
        lines.x.push(xs);
        lines.y.push(ys);
      }
    }
    if (meta.aggregate) drawnSteps = drawnSteps.concat(takeMember(gd, runId, relevant, lines, ask));
    if (axisChange) ask("log-axis");
    if (lines.idx.length || lines.marks.length) {
      s.pending = s.pending || { render: meta.render_id, idx: [], x: [], y: [], marks: {}, groups: {} };
      s.fresh = true;
      var p = s.pending;
      lines.marks.forEach(function (mark) {
        var m = p.marks[mark[0]] || (p.marks[mark[0]] = { x: [], y: [], symbol: [], text: [] });
        m.x = m.x.concat(mark[1]);
        m.y = m.y.concat(mark[2]);
        m.symbol = m.symbol.concat(mark[3]);
        m.text = m.text.concat(mark[4]);
      });
      Object.keys(lines.groups || {}).forEach(function (i) {
        var g = p.groups[i] || (p.groups[i] = { n: [], band: lines.groups[i].band, x: [], upper: [], lower: [] });
        var add = lines.groups[i];
        g.n = g.n.concat(add.n);
        g.x = g.x.concat(add.x);
        g.upper = g.upper.concat(add.upper);
        g.lower = g.lower.concat(add.lower);
      });
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

  /*
   * An aggregated chart (figures: group means): the run's member line takes its points,
   * smoothed as the server smooths them, and its group's mean and band are extended to the
   * newest step every running member has reached (traces.group_traces cut them there), each
   * step's mean and spread as series.band_at computes them from each member's value as of
   * that step (series.group_band). Adds to `lines` (the pending appends): the member's and the
   * mean's points, and under `lines.groups[mean index]` the mean's counts and the band's new
   * upper and lower edges (their trace is a closed outline: `draw` splices them in).
   */
  function takeMember(gd, runId, rows, lines, ask) {
    var meta = gd.layout.meta;
    var weight = meta.smoothing || 0;
    var logAxis = !!(gd.layout.yaxis && gd.layout.yaxis.type === "log");
    var members = {}, bands = {}, mean; // run -> its member line, group -> its band, the run's group mean
    for (var i = 0; i < gd.data.length; i++) {
      var tm = gd.data[i].meta || {};
      if (tm.role === "member") members[tm.run] = i;
      else if (tm.role === "band") bands[tm.group] = i;
      else if (tm.role === "mean" && tm.members.indexOf(runId) >= 0) mean = i;
    }
    var at = members[runId];
    if (at === undefined || mean === undefined) return [];
    var member = gd.data[at].meta, group = gd.data[mean].meta;
    var band = bands[group.group] === undefined ? -1 : bands[group.group];
    if (!group.running || group.running.indexOf(runId) < 0) {
      // The server drew this group's band over every step (the run was not live then, or a
      // member that stopped is ahead of it): only it can draw the band again.
      ask("aggregate");
      return [];
    }
    var key = member.key || meta.key, magnitude = meta.of === "magnitude"; // the metric its line draws
    var last = member.last_step === null || member.last_step === undefined ? -Infinity : member.last_step;
    var drawnTo = group.last_step === null || group.last_step === undefined ? -Infinity : group.last_step;
    var xs = [], ys = [];
    rows.forEach(function (row) {
      if (row.step <= last || !Object.prototype.hasOwnProperty.call(row.values, key)) return;
      last = row.step;
      var value = math.parseValue(row.values[key]);
      if (magnitude) value = Math.abs(value);
      var finite = Number.isFinite(value);
      if (needsServerAxis(meta, logAxis, value)) ask("log-axis");
      // A member's first point inside the band already drawn: the server's band counts it there.
      if ((member.first_step === null || member.first_step === undefined) && row.step <= drawnTo) ask("aggregate");
      var curve = null; // what the band reads of this member at this step (null: not counted)
      if (finite) {
        if (logAxis) {
          member.floor = math.logFloor(member.floor, value);
          group.floor = math.logFloor(group.floor, value);
        }
        curve = weight > 0 ? math.emaStep(member.ema || (member.ema = { value: 0, count: 0 }), value, weight) : value;
      }
      if (member.first_step === null || member.first_step === undefined) member.first_step = row.step;
      member.tail.push([row.step, curve]);
      xs.push(row.step);
      var shown = curve !== null && (weight > 0 ? math.aboveFloor(curve, member.floor, logAxis) : math.drawable(curve, logAxis));
      ys.push(shown ? curve : null);
    });
    if (last !== -Infinity) member.last_step = last;
    if (!xs.length) return [];
    countAppended(meta, member, xs.length, ask);
    lines.idx.push(at);
    lines.x.push(xs);
    lines.y.push(ys);
    var grown = extendGroup(gd, group, members, logAxis);
    if (!grown) return xs;
    lines.idx.push(mean);
    lines.x.push(grown.x);
    lines.y.push(grown.mean);
    lines.groups = lines.groups || {};
    lines.groups[mean] = { n: grown.n, band: band, x: grown.x, upper: grown.upper, lower: grown.lower };
    return xs;
  }

  /* The group's mean and band at the steps after its drawn end up to the newest every running
     member has reached ({x, mean, upper, lower, n} as drawn), or null while one lags (a
     running member with no point yet holds nothing back, as on the server). */
  function extendGroup(gd, group, members, logAxis) {
    if (!group.running || !group.running.length) return null;
    var metas = group.members.map(function (id) { return gd.data[members[id]].meta; });
    var reached = Infinity; // the newest step every running member with a point has reached
    group.running.forEach(function (id) {
      var m = gd.data[members[id]].meta;
      if (m.last_step !== null && m.last_step !== undefined) reached = Math.min(reached, m.last_step);
    });
    var from = group.last_step === null || group.last_step === undefined ? -Infinity : group.last_step;
    if (reached === Infinity || !(reached > from)) return null;
    var grid = {};
    metas.forEach(function (m) {
      m.tail.forEach(function (point) { if (point[0] > from && point[0] <= reached) grid[point[0]] = true; });
    });
    var steps = Object.keys(grid).map(Number).sort(function (a, b) { return a - b; });
    var running = {};
    group.running.forEach(function (id) { running[id] = true; });
    /* A member's value as of `step`, only inside its own range (series.as_of). */
    function asOf(m, step) {
      if (m.first_step === null || m.first_step === undefined || step < m.first_step) return null;
      if (!running[m.run] && step > m.last_step) return null;
      var value = m.asof === undefined ? null : m.asof;
      for (var i = 0; i < m.tail.length && m.tail[i][0] <= step; i++) value = m.tail[i][1];
      return value;
    }
    var out = { x: [], mean: [], upper: [], lower: [], n: [] };
    steps.forEach(function (step) {
      var at = math.band(metas.map(function (m) { return asOf(m, step); }), group.spread);
      // As traces.group_traces draws them: the mean and upper edge drawable and above the
      // group's floor on a log axis, the lower edge at the mean where it is not drawable.
      var mu = at && math.aboveFloor(at.mean, group.floor, logAxis) ? at.mean : null;
      var hi = at && math.aboveFloor(at.upper, group.floor, logAxis) ? at.upper : null;
      out.x.push(step);
      out.mean.push(mu);
      out.upper.push(hi);
      out.lower.push(at && math.drawable(at.lower, logAxis) ? at.lower : mu);
      out.n.push(at ? at.n : 0);
    });
    metas.forEach(function (m) {
      m.asof = asOf(m, reached);
      m.tail = m.tail.filter(function (point) { return point[0] > reached; });
    });
    group.last_step = reached;
    return out;
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
    var ys = p.y.slice();
    Object.keys(p.groups || {}).forEach(function (i) { ys.push(p.groups[i].upper, p.groups[i].lower); });
    for (var i = 0; i < ys.length; i++) {
      for (var j = 0; j < ys[i].length; j++) {
        var y = ys[i][j];
        if (y === null || y === undefined) continue;
        if (!extent) extent = [y, y];
        else if (y < extent[0]) extent[0] = y;
        else if (y > extent[1]) extent[1] = y;
      }
    }
    meta.y_extent = extent;
    var flat = meta.flat;
    if (!flat) return {};
    var range = math.flatRange(extent, !!(gd.layout.yaxis && gd.layout.yaxis.type === "log"), flat);
    var before = flat.range;
    if (range === null ? before === null || before === undefined
        : before && range[0] === before[0] && range[1] === before[1]) {
      return {};
    }
    flat.range = range;
    return range === null ? { "yaxis.autorange": true } : { "yaxis.range": range, "yaxis.autorange": false };
  }

  /*
   * Room on the right of an autoranged step axis for the points to come, so that the live
   * overlay (overlay.js) can paint them before the next redraw: when the appends reach the end
   * of the x range, it is widened to math.xAxisEnd (figures.x_axis_end, as the server draws a
   * growing run's chart). Every chart of the page ends where the farthest of them does
   * (`pageEnd`, the hazard chart's too), so the charts show the same steps side by side. Set on
   * gd.layout itself so that the redraw appending the points applies it (a relayout would be
   * a second redraw). A zoomed axis is left alone.
   */
  var pageEnd = { page: null, end: -Infinity };
  var following = false; // a followPage is queued for the next frame

  function currentPage() {
    return window.location.pathname + window.location.search;
  }

  /* The page's step axis end so far (-Infinity for none), raised to `end` when given: the
     other charts then follow it (followPage). */
  function sharedEnd(end) {
    if (pageEnd.page !== currentPage()) pageEnd = { page: currentPage(), end: -Infinity };
    if (end !== undefined && end > pageEnd.end) {
      pageEnd.end = end;
      if (!following) {
        following = true;
        requestAnimationFrame(followPage);
      }
    }
    return pageEnd.end;
  }

  function autoranged(gd) {
    var full = gd._fullLayout && gd._fullLayout.xaxis;
    return !!(full && full.range && gd.layout && gd.layout.meta && !(gd.layout.xaxis && gd.layout.xaxis.autorange === false));
  }

  function axisEnd(gd) {
    var range = gd._fullLayout.xaxis.range;
    return Math.max(range[0], range[1]);
  }

  /* Let `gd`'s autoranged step axis reach `end` from its next redraw on. */
  function widen(gd, end) {
    var xaxis = gd.layout.xaxis || (gd.layout.xaxis = {});
    xaxis.autorangeoptions = Object.assign({}, xaxis.autorangeoptions, { include: [end] });
    gd.layout.meta.x_end = end;
  }

  /*
   * Every growing chart of the page whose step axis ends before the page's end is redrawn to
   * reach it (the page's end rises a few times per run: when a chart's points reach its end).
   * Plotly.redraw, not a relayout: a relayout would be reported as the reader's (relayoutData).
   */
  function followPage() {
    following = false;
    var end = pageEnd.end;
    document.querySelectorAll(".keel-graph .js-plotly-plot, .hazard-graph .js-plotly-plot").forEach(function (gd) {
      if (!autoranged(gd) || gd.layout.meta.x_end === undefined || axisEnd(gd) >= end) return;
      widen(gd, end);
      // A chart out of view is only widened: its next draw, once in view, applies it (a
      // redraw now would draw the points it holds back while out of view).
      if (state(gd).visible) window.Plotly.redraw(gd);
    });
  }

  function roomOnTheRight(gd, p) {
    if (!autoranged(gd)) return;
    var newest = -Infinity;
    for (var i = 0; i < p.x.length; i++) newest = Math.max(newest, p.x[i][p.x[i].length - 1]);
    var hi = axisEnd(gd);
    var first = gd.layout.meta.x_first === undefined ? Math.min.apply(null, gd._fullLayout.xaxis.range) : gd.layout.meta.x_first;
    var end = sharedEnd(newest >= hi ? math.xAxisEnd(first, newest) : undefined);
    if (end > hi) widen(gd, end);
  }

  /*
   * Alert marks (figures.alert_marks): a chart's live alert shapes (named "firing:<run>" or
   * "resolved") and its trace whose meta.role is "alerts", read by the server when an alert
   * fired or resolved. `marks` keeps the newest per chart key with the server time of its
   * read: a figure drawn from alerts read before them (layout.meta.alerts_read) takes them
   * in when it arrives.
   */
  var marks = { read: -Infinity, charts: {} };

  function isAlertShape(shape) {
    var name = (shape && shape.name) || "";
    return name.indexOf("firing:") === 0 || name === "resolved";
  }

  /* What a chart's alert marks say: each range's name, start and colour (a firing range's
     end follows the appended points) and the markers' steps and texts. */
  function markSummary(shapes, trace) {
    return JSON.stringify([
      shapes.map(function (shape) { return [shape.name, shape.x0, shape.fillcolor]; }),
      trace ? [trace.x, trace.text] : [[], []],
    ]);
  }

  /* Put `mark` in place of the chart's alert shapes and trace, unless they say the same
     already (most charts, when one alert changed: no redraw). The trace keeps its index
     (restyled, or added last), so the appends pending on the chart keep theirs. */
  function markAlerts(gd, mark) {
    if (!gd.layout || !gd.layout.meta || !gd.data) return false;
    var at = -1;
    for (var i = 0; i < gd.data.length; i++) {
      if (gd.data[i].meta && gd.data[i].meta.role === "alerts") at = i;
    }
    gd.layout.meta.alerts_read = marks.read;
    var drawn = markSummary((gd.layout.shapes || []).filter(isAlertShape), at >= 0 && gd.data[at].x && gd.data[at].x.length ? gd.data[at] : null);
    if (drawn === markSummary(mark.shapes || [], mark.trace)) return false;
    var shapes = (gd.layout.shapes || []).filter(function (shape) { return !isAlertShape(shape); }).concat(mark.shapes || []);
    var trace = mark.trace;
    if (at >= 0) {
      var now = trace || { x: [], y: [], text: [], marker: gd.data[at].marker };
      window.Plotly.update(gd, { x: [now.x], y: [now.y], text: [now.text], marker: [now.marker] }, { shapes: shapes }, [at]);
    } else {
      window.Plotly.relayout(gd, { shapes: shapes });
      if (trace) window.Plotly.addTraces(gd, trace);
    }
    live.note("alertMarks", 1);
    return true;
  }

  /* New alert marks for the charts `plots`: each drawn from alerts read before them takes them in. */
  function markAll(read, plots) {
    if (!(read.read > marks.read)) return;
    marks = read;
    plots.forEach(function (gd) {
      var meta = gd.layout && gd.layout.meta;
      var mark = meta && marks.charts[meta.key];
      if (mark && !(meta.alerts_read >= marks.read)) markAlerts(gd, mark);
    });
  }

  /* A figure the server drew: alert marks newer than its own go on it; for a growing run,
     its step axis end counts for the page's, and it follows the page's if that is farther. */
  function serverDrawn(gd) {
    var meta = gd.layout && gd.layout.meta;
    var mark = meta && marks.charts[meta.key];
    if (mark && meta.alerts_read !== undefined && meta.alerts_read < marks.read) markAlerts(gd, mark);
    if (!meta || meta.x_end === undefined) return;
    var end = sharedEnd(meta.x_end);
    if (autoranged(gd) && axisEnd(gd) < end && !following) {
      following = true;
      requestAnimationFrame(followPage);
    }
  }

  /* A group's new steps into its mean's counts and its band's outline (upper edge left to
     right, then the lower edge back): in place, for the extendTraces that follows to draw. */
  function spliceGroups(gd, p) {
    Object.keys(p.groups || {}).forEach(function (i) {
      var g = p.groups[i], mean = gd.data[i];
      mean.customdata = (mean.customdata || []).concat(g.n);
      if (g.band < 0 || !gd.data[g.band]) return;
      var outline = gd.data[g.band], half = outline.meta.points;
      var back = function (values) { return values.slice().reverse(); };
      outline.x = outline.x.slice(0, half).concat(g.x, back(g.x), outline.x.slice(half));
      outline.y = outline.y.slice(0, half).concat(g.upper, back(g.lower), outline.y.slice(half));
      outline.meta.points = half + g.x.length;
    });
  }

  /*
   * Draw what is pending on one chart: one extendTraces for all its traces (and a relayout
   * when an alert range or the y axis must follow). Returns the appends drawn, as
   * {points, received: [[run, steps, received at]...], done: promise}, or null.
   */
  function draw(gd) {
    var s = state(gd);
    var p = s.pending;
    var received = s.received;
    s.pending = null;
    s.received = [];
    if (!p || !gd.layout.meta || p.render !== gd.layout.meta.render_id) return null;
    var marked = Object.keys(p.marks);
    if (marked.length) {
      // Rare: rewrite the marker traces so per-point symbols stay aligned with x.
      var update = { x: [], y: [], "marker.symbol": [], text: [] };
      marked.forEach(function (i) {
        var trace = gd.data[i], m = p.marks[i];
        var symbol = trace.marker && Array.isArray(trace.marker.symbol) ? trace.marker.symbol : [];
        update.x.push((trace.x || []).concat(m.x));
        update.y.push((trace.y || []).concat(m.y));
        update["marker.symbol"].push(symbol.concat(m.symbol));
        update.text.push((trace.text || []).concat(m.text));
      });
      window.Plotly.restyle(gd, update, marked.map(Number));
    }
    if (!p.idx.length) return { points: 0, received: received, done: Promise.resolve() };
    var wasEmpty = gd.layout.meta.empty;
    gd.layout.meta.empty = false;
    var layout = Object.assign(stretchFiring(gd, p), keepFlatAxis(gd, p));
    roomOnTheRight(gd, p);
    spliceGroups(gd, p);
    var done = window.Plotly.extendTraces(gd, { x: p.x, y: p.y }, p.idx);
    if (wasEmpty) layout.annotations = [];
    if (Object.keys(layout).length) window.Plotly.relayout(gd, layout);
    s.lastDraw = performance.now();
    return {
      points: p.x.reduce(function (n, xs) { return n + xs.length; }, 0),
      received: received,
      done: Promise.resolve(done),
    };
  }

  /* Whether a chart of the page draws group means (a run's status change redraws it: a member
     that stopped no longer holds its group's band back). */
  function aggregated() {
    return Array.prototype.some.call(document.querySelectorAll(".keel-graph .js-plotly-plot"), function (gd) {
      return !!(gd.layout && gd.layout.meta && gd.layout.meta.aggregate);
    });
  }

  live.charts = { state: state, take: take, draw: draw, serverDrawn: serverDrawn, markAll: markAll, aggregated: aggregated };
})(window.keelLive = window.keelLive || {});
