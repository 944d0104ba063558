/*
 * The page benchmarks' probe (bench/page/browser.py `probe`): a function of its SPEC
 * ({kind, keys, runs}), installed before any of the page's own scripts. It polls the page's
 * "shown" condition for `kind` every 50 ms and records performance.now() (ms since
 * navigation start) in window.__bench.shown the first time it holds; it also counts the
 * charts' figure requests in flight (for "settled", bench/page/live.py).
 */
(function (SPEC) {
  if (window.top !== window) return;
  try { performance.setResourceTimingBufferSize(100000); } catch (e) {}
  var bench = window.__bench = {shown: null, noRunsSeen: false, checks: 0, figuresInFlight: 0, figureAt: 0};
  // The charts' figure requests (Dash callbacks of metric-graph), for "settled" (live_busy).
  var fetch0 = window.fetch;
  window.fetch = function (url, init) {
    var figure = init && typeof init.body === 'string' && init.body.indexOf('metric-graph') >= 0
      && String(url).indexOf('_dash-update-component') >= 0;
    if (!figure) return fetch0.apply(this, arguments);
    bench.figuresInFlight++;
    function done() { bench.figuresInFlight--; bench.figureAt = performance.now(); }
    return fetch0.apply(this, arguments).then(function (r) { done(); return r; }, function (e) { done(); throw e; });
  };
  function deepAll(root, sel, out) {
    out = out || [];
    root.querySelectorAll(sel).forEach(function (e) { out.push(e); });
    root.querySelectorAll('*').forEach(function (e) { if (e.shadowRoot) deepAll(e.shadowRoot, sel, out); });
    return out;
  }
  function length(x) {
    if (!x) return 0;
    if (typeof x.length === 'number') return x.length;
    if (x.bdata) return x.bdata.length;
    return 0;
  }
  function keel() {
    var done = {};
    document.querySelectorAll('.keel-graph .js-plotly-plot').forEach(function (gd) {
      var key = gd.layout && gd.layout.meta && gd.layout.meta.key;
      if (SPEC.keys.indexOf(key) < 0) return;
      var have = {};
      (gd.data || []).forEach(function (t, i) {
        var m = t.meta, full = gd._fullData && gd._fullData[i];
        if (!m || ['raw', 'smooth', 'mean'].indexOf(m.role) < 0) return;
        if (length(t.x) > 0 || (full && length(full.x) > 0)) have[m.run] = true;
      });
      if (SPEC.runs.every(function (r) { return have[r]; })) done[key] = true;
    });
    return SPEC.keys.every(function (k) { return done[k]; });
  }
  function table() {
    var text = document.body ? document.body.innerText : '';
    if (text.indexOf('No runs yet') >= 0) bench.noRunsSeen = true;
    return Array.prototype.some.call(
      document.querySelectorAll('.ag-center-cols-container .ag-row'),
      function (row) { return row.innerText.trim().length > 0; });
  }
  function tensorboard() {
    var done = {};
    deepAll(document, 'tf-scalar-card').forEach(function (card) {
      var lines = deepAll(card.shadowRoot || card, 'path.line').filter(function (p) {
        return (p.getAttribute('d') || '').length > 50; });
      if (lines.length >= 2 * SPEC.runs.length) done[card.tag] = true;
    });
    return SPEC.keys.every(function (k) { return done[k]; });
  }
  function trackio() {
    var done = {};
    document.querySelectorAll('.plot-container').forEach(function (plot) {
      var title = plot.querySelector('.plot-title'), accordion = plot.closest('.accordion');
      var label = accordion && accordion.querySelector('.accordion-label');
      if (!title || !label) return;
      var key = label.innerText.replace(/\s*\(\d+\)\s*$/, '').trim() + '/' + title.innerText.trim();
      if (SPEC.keys.indexOf(key) < 0 || done[key]) return;
      // Its legend lists a few runs and "+N more".
      var legend = plot.querySelector('.custom-legend');
      var more = legend ? /\+(\d+) more/.exec(legend.innerText) : null;
      var listed = plot.querySelectorAll('.legend-item').length + (more ? parseInt(more[1], 10) : 0);
      if (listed < SPEC.runs.length) return;
      var canvas = plot.querySelector('canvas');
      if (!canvas || !canvas.width || !canvas.height) return;
      var pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data, coloured = 0;
      for (var i = 0; i < pixels.length; i += 16) {
        var r = pixels[i], g = pixels[i + 1], b = pixels[i + 2];
        if (pixels[i + 3] > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 60) coloured++;
      }
      if (coloured > 100) done[key] = true;
    });
    return SPEC.keys.every(function (k) { return done[k]; });
  }
  var check = {keel: keel, table: table, tensorboard: tensorboard, trackio: trackio}[SPEC.kind];
  var timer = setInterval(function () {
    bench.checks++;
    try {
      if (check()) { bench.shown = performance.now(); clearInterval(timer); }
    } catch (e) { bench.error = String(e); }
  }, 50);
})
