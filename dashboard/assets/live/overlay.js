/*
 * Keel live updates: the live overlay, painted without redrawing the chart.
 *
 * Plotly has no incremental append: extendTraces redraws the whole chart, every trace and
 * every point (tens of ms with many runs). So a chart takes its pushed points into the
 * figure only now and then, out of a share of the main thread (scheduler.js). Until
 * then they are painted at once on a canvas laid over the plot area: the same lines, in
 * each trace's colour, width, dash and opacity, placed by Plotly's own axis mapping, for
 * the cost of a few line segments. The overlay is exactly the chart's pending appends
 * (charts.js), so the redraw that takes them into the figure clears it.
 *
 * A point the axes cannot place (past the end of the x range, above or below the y
 * range) or a non-finite marker needs that redraw: `paint` says the chart is urgent and
 * the scheduler draws it first. A redraw leaves room on the right of an autoranged step
 * axis (charts.js), so the next points of a growing run can be painted here.
 *
 * Reads Plotly's computed axes (gd._fullLayout.xaxis: range, c2l, c2p, _offset, _length),
 * the mapping plotly.js itself draws with.
 */
(function (live) {
  "use strict";

  var charts = live.charts;
  var canvases = new WeakMap(); // chart element -> its overlay canvas

  /* Plotly's dash patterns (src/components/drawing dashStyle), for a line of `width` px. */
  function dashPattern(dash, width) {
    var d = Math.max(width || 1, 3);
    switch (dash) {
      case "dot": return [d, d];
      case "dash": return [3 * d, 3 * d];
      case "longdash": return [5 * d, 5 * d];
      case "dashdot": return [3 * d, d, d, d];
      case "longdashdot": return [5 * d, 2 * d, d, 2 * d];
      default: return [];
    }
  }

  /* The canvas over `gd`'s plot, sized to the figure; null before Plotly laid the chart out. */
  function canvasFor(gd) {
    var full = gd._fullLayout;
    var container = gd.querySelector(".svg-container");
    var svg = container && container.querySelector(".main-svg");
    if (!full || !svg) return null;
    var canvas = canvases.get(gd);
    if (!canvas || canvas.parentNode !== container) {
      canvas = document.createElement("canvas");
      canvas.className = "keel-overlay";
      // Above the traces, below the hover labels and the legend (the later svg layers).
      canvas.style.cssText = "position:absolute;top:0;left:0;pointer-events:none";
      container.insertBefore(canvas, svg.nextSibling);
      canvases.set(gd, canvas);
    }
    var ratio = window.devicePixelRatio || 1;
    var width = Math.round(full.width * ratio), height = Math.round(full.height * ratio);
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
      canvas.style.width = full.width + "px";
      canvas.style.height = full.height + "px";
    }
    return canvas;
  }

  function within(value, range) {
    return value >= Math.min(range[0], range[1]) && value <= Math.max(range[0], range[1]);
  }

  /* The last point the figure draws for trace `i` ({x, y}), or null after a gap. */
  function anchor(gd, i) {
    var trace = gd.data[i];
    var n = trace.x ? trace.x.length : 0;
    if (!n || trace.y[n - 1] === null || trace.y[n - 1] === undefined) return null;
    return { x: trace.x[n - 1], y: trace.y[n - 1] };
  }

  /*
   * Paint `gd`'s pending appends over it. The raw points now shown leave the chart's
   * instrumentation list for keelLive.drew (start.js). Returns {urgent}: whether a point
   * could not be placed (the chart needs its redraw).
   */
  function paint(gd) {
    var s = charts.state(gd);
    s.lastPaint = performance.now();
    s.fresh = false;
    var canvas = canvasFor(gd);
    if (!canvas) return { urgent: !!s.pending };
    var context = canvas.getContext("2d");
    var ratio = canvas.width / gd._fullLayout.width;
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, canvas.width, canvas.height);
    var p = s.pending;
    var meta = gd.layout.meta;
    if (!p || !meta || p.render !== meta.render_id) return { urgent: false };
    var xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
    var urgent = Object.keys(p.marks).length > 0;
    var placed = {}; // run -> {step: true} of the raw points painted inside the axes
    context.save();
    context.beginPath();
    context.rect(xa._offset, ya._offset, xa._length, ya._length);
    context.clip();
    for (var j = 0; j < p.idx.length; j++) {
      var i = p.idx[j];
      var trace = gd._fullData[i];
      if (!trace || trace.index !== i || trace.visible !== true) continue;
      var raw = gd.data[i].meta.role === "raw" || gd.data[i].meta.role === "member"; // a run's own line
      var steps = raw ? placed[gd.data[i].meta.run] || (placed[gd.data[i].meta.run] = {}) : null;
      context.globalAlpha = trace.opacity === undefined ? 1 : trace.opacity;
      context.strokeStyle = trace.line.color;
      context.lineWidth = trace.line.width;
      context.setLineDash(dashPattern(trace.line.dash, trace.line.width));
      context.beginPath();
      var from = anchor(gd, i);
      var pen = false;
      if (from) {
        context.moveTo(xa._offset + xa.c2p(from.x), ya._offset + ya.c2p(from.y));
        pen = true;
      }
      var xs = p.x[j], ys = p.y[j];
      for (var k = 0; k < xs.length; k++) {
        if (ys[k] === null) {
          pen = false; // a gap, as Plotly draws it
          continue;
        }
        var px = xa._offset + xa.c2p(xs[k]), py = ya._offset + ya.c2p(ys[k]);
        if (pen) context.lineTo(px, py);
        else context.moveTo(px, py);
        pen = true;
        if (!raw) continue;
        if (within(xa.c2l(xs[k]), xa.range) && within(ya.c2l(ys[k]), ya.range)) steps[xs[k]] = true;
        else urgent = true;
      }
      context.stroke();
    }
    context.restore();
    // What was painted leaves the chart's instrumentation list; the rest waits for the redraw.
    var shown = [];
    s.received = s.received.filter(function (item) {
      var steps = placed[item[0]] || {};
      var now = item[1].filter(function (step) { return steps[step]; });
      if (now.length) shown.push([item[0], now, item[2]]);
      var later = item[1].filter(function (step) { return !steps[step]; });
      item[1] = later;
      return later.length > 0;
    });
    if (shown.length) live.drew(gd, { points: 0, received: shown, done: Promise.resolve() });
    return { urgent: urgent };
  }

  /* Clear `gd`'s overlay (its figure was replaced, or took the appends in). */
  function clear(gd) {
    var canvas = canvases.get(gd);
    if (canvas) canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  }

  /* Paint the overlay again whenever Plotly redrew or moved the axes (zoom, resize, a new figure). */
  function watch(gd) {
    if (typeof gd.on !== "function") return;
    var again = function () { paint(gd); };
    gd.on("plotly_afterplot", again);
    gd.on("plotly_relayout", again);
  }

  live.overlay = { paint: paint, clear: clear, watch: watch };
})(window.keelLive = window.keelLive || {});
