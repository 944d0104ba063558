/*
 * Keel live updates: wiring.
 *
 * Watches the page (Dash replaces it on navigation) for the live target and for new
 * figures; follows which charts are in view and whether the tab is shown. A chart's figure
 * is asked of the server only once its card comes within SEEN_MARGIN of the view (its
 * "metric-seen" store, layout.SEEN_TYPE): a page of 40 charts costs what is on screen.
 * A card the server sent with its figure (data-seen="drawn": the run page's headline
 * charts) asks for nothing.
 *
 * Instrumentation (counters in keelLive.stats, and when each pushed point was painted in
 * keelLive.drawn) is off unless the page is opened with window.keelInstrument set (tests
 * and bench/ set it before the page loads).
 */
(function (live) {
  "use strict";

  var charts = live.charts;
  var scheduler = live.scheduler;
  var DRAWN_LOG = 20000; // (run, key, step, time) records kept for latency measurement
  var instrument = !!window.keelInstrument;
  var observer = null;
  var SEEN_MARGIN = 0.5; // of the window's height: cards this near the view fetch their figure
  var seenObserver = null;
  var cards = new WeakSet(); // chart cards observed for "seen"
  var seenCards = new WeakSet(); // chart cards whose figure was asked for
  var everDrawn = false;

  live.stats = instrument ? { messages: 0, appended: 0, renders: 0, refreshes: 0, chartAsks: 0, frames: 0, idleFrames: 0, overlays: 0, draws: 0, drawMs: 0, seen: 0, alertMarks: 0, ticks: {} } : null;
  live.drawn = instrument ? [] : null;

  /* Count an event (instrumentation only): "ticks.<store>" counts per store. */
  live.note = function (name, n) {
    if (!instrument) return;
    if (name.indexOf("ticks.") === 0) {
      var store = name.slice(6);
      live.stats.ticks[store] = (live.stats.ticks[store] || 0) + n;
    } else {
      live.stats[name] += n;
    }
  };

  /* A chart drew its pending appends: when they are painted, log it (instrumentation only). */
  live.drew = function (gd, drawn) {
    if (!instrument) return;
    live.stats.appended += drawn.points;
    var key = gd.layout.meta.key;
    drawn.done.then(function () {
      requestAnimationFrame(function () { // painted by the next frame
        var now = Date.now();
        drawn.received.forEach(function (item) {
          for (var i = 0; i < item[1].length; i++) {
            live.drawn.push({ key: key, run: item[0], step: item[1][i], t: now, received: item[2] });
          }
        });
        if (live.drawn.length > DRAWN_LOG) live.drawn.splice(0, live.drawn.length - DRAWN_LOG);
      });
    });
  };

  /* Whether a figure was drawn on this page before the socket listened. */
  live.drawnBefore = function () {
    return everDrawn;
  };

  var hazardRender = null; // the hazard chart's figure last seen (layout.meta.render_id)
  var drawnFirst = null; // the first chart of the page whose charts all got their first figure

  /*
   * Once every chart of a page has its first figure, what the page shows beside them (the
   * summary table, the collapse hazard) is asked for: drawn first, it would queue before
   * the charts on the server and in the browser. Once per page as Dash built it: a page
   * built again (back to it through the history, with no reload) asks again, whatever the
   * pages between held; the URL alone would not tell (it changes before Dash replaces the
   * page it leaves, and is the same when it comes back).
   */
  function allDrawn(plots) {
    if (plots.length && plots[0] === drawnFirst) return;
    var wanted = 0;
    for (var i = 0; i < plots.length; i++) {
      var card = plots[i].closest(".chart-card");
      if (card && card.hasAttribute("data-key") && !seenCards.has(card)) continue; // not asked for
      var meta = plots[i].layout && plots[i].layout.meta;
      if (!meta || !meta.render_id) return;
      wanted += 1;
    }
    if (!wanted) return;
    drawnFirst = plots[0];
    live.socket.refresh("live-data-tick", "drawn", 0);
  }

  /* Ask for the figure of a chart card that came near the view (once per card). */
  function see(card) {
    if (seenCards.has(card)) return;
    if (!(window.dash_clientside && window.dash_clientside.set_props)) {
      setTimeout(function () { see(card); }, 100); // the renderer is not up yet
      return;
    }
    seenCards.add(card);
    if (seenObserver) seenObserver.unobserve(card);
    live.note("seen", 1);
    window.dash_clientside.set_props(
      { type: "metric-seen", key: card.getAttribute("data-key") }, { data: true });
  }

  /* Whether `card` is within SEEN_MARGIN of the view now (as the observer's rootMargin says). */
  function near(card) {
    var box = card.getBoundingClientRect();
    var margin = window.innerHeight * SEEN_MARGIN;
    return box.bottom >= -margin && box.top <= window.innerHeight + margin;
  }

  function scanCards() {
    document.querySelectorAll(".chart-card[data-key]").forEach(function (card) {
      if (cards.has(card)) return;
      cards.add(card);
      if (card.getAttribute("data-seen") === "drawn") { // sent with its figure: nothing to ask
        seenCards.add(card);
        return;
      }
      // A card already near the view asks at once (the observer's first report comes a frame
      // later); the others when they come near.
      if (!seenObserver || (!document.hidden && near(card))) see(card);
      else seenObserver.observe(card);
    });
  }

  /* New figures (first draw, zoom, smoothing change): replay what arrived while they were drawn. */
  function scanGraphs() {
    var plots = scheduler.plots();
    allDrawn(plots);
    plots.forEach(function (gd) {
      var s = charts.state(gd);
      if (!s.observed && observer) {
        s.observed = true;
        observer.observe(gd);
        live.overlay.watch(gd);
      }
      var meta = gd.layout && gd.layout.meta;
      if (!meta || !meta.render_id || s.render === meta.render_id) return;
      s.render = meta.render_id;
      charts.serverDrawn(gd);
      everDrawn = true;
      live.note("renders", 1);
      scheduler.replay(gd);
    });
  }

  function sync() {
    var el = document.querySelector("[data-live-runs]");
    var runs = el ? el.getAttribute("data-live-runs") : null;
    if (runs !== live.socket.target()) {
      everDrawn = false;
      live.socket.connect(runs, 0);
    }
    scanCards();
    scanGraphs();
    // The hazard chart is only ever drawn by the server: its figures are seen here.
    var hazard = document.querySelector(".hazard-graph .js-plotly-plot");
    var meta = hazard && hazard.layout && hazard.layout.meta;
    if (meta && meta.render_id && meta.render_id !== hazardRender) {
      hazardRender = meta.render_id;
      charts.serverDrawn(hazard);
    }
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
      observer = new IntersectionObserver(function (entries) {
        entries.forEach(function (entry) {
          charts.state(entry.target).visible = entry.isIntersecting;
          if (entry.isIntersecting) scheduler.wake(0);
        });
      });
    }
    if (window.IntersectionObserver) {
      seenObserver = new IntersectionObserver(function (entries) {
        entries.forEach(function (entry) {
          if (entry.isIntersecting) see(entry.target);
        });
      }, { rootMargin: SEEN_MARGIN * 100 + "% 0px" });
    }
    document.addEventListener("visibilitychange", function () {
      if (document.hidden) {
        live.socket.pauseSoon();
        return;
      }
      live.socket.resume();
      live.socket.catchUp();
      scheduler.wake(0);
    });
    new MutationObserver(queueSync).observe(document.body, { childList: true, subtree: true });
    queueSync();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})(window.keelLive = window.keelLive || {});
