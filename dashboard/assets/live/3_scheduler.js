/*
 * Keel live updates, part 3 of 5: when each chart draws.
 *
 * A Plotly redraw costs the whole chart (every trace, every point), tens of ms on a
 * laptop, whatever the number of points appended. So pushed rows are taken into each
 * chart's pending appends at once (cheap), and charts draw them out of a budget: the
 * page earns BUSY_SHARE ms of drawing per ms of wall time (up to BURST_MS saved), and a
 * draw spends what its script took, and the frame's rendering after it. A point that arrives on a quiet page is drawn at once; a page
 * flooded with points draws each chart less often, so that live drawing keeps to about
 * BUSY_SHARE of the main thread (script, then style, layout and paint) whatever streams. Charts out of view and pages in a
 * hidden tab draw nothing; they catch up when seen. Within a frame, charts draw until
 * FRAME_BUDGET_MS is spent, the one that drew longest ago first.
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
  var MIN_INTERVAL_MS = 100; // a chart draws at most this often, however cheap
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
      if (frame === null) frame = requestAnimationFrame(tick);
    }, Math.max(0, due - performance.now()));
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
    // The chart that drew longest ago first, while the budget lasts.
    waiting.sort(function (a, b) { return charts.state(a).lastDraw - charts.state(b).lastDraw; });
    var next = Infinity;
    var drewAt = null;
    for (var i = 0; i < waiting.length; i++) {
      var gd = waiting[i];
      var now = performance.now();
      earn(now);
      var due = charts.state(gd).lastDraw + MIN_INTERVAL_MS;
      if (credit <= 0) due = Math.max(due, now - credit / BUSY_SHARE); // when the budget is back
      if (due > now || now - started > FRAME_BUDGET_MS) {
        next = Math.min(next, Math.max(due, now));
        continue;
      }
      var before = performance.now();
      var drawn = charts.draw(gd);
      var spent = performance.now() - before;
      credit -= spent;
      drewAt = performance.now();
      live.note("draws", 1);
      live.note("drawMs", spent);
      if (drawn) live.drew(gd, drawn);
    }
    if (drewAt !== null) chargeRendering(drewAt);
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
