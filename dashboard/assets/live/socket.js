/*
 * Keel live updates: the websocket, and the server redraws it asks for.
 *
 * One WebSocket to /api/v1/live per page, subscribed to the runs the page names in its
 * [data-live-runs] element ("*" = every run); reconnects with backoff. Points go to the
 * scheduler. What appending cannot show (group means, alert changes, the tables beside
 * the charts, what a reconnect missed) is redrawn by the server: asked for by bumping
 * the "live-tick" (charts) or "live-data-tick" (tables, the hazard) store, at most once
 * per REFRESH_MS / DATA_REFRESH_MS, and not at all while the tab is hidden (once when it
 * is shown again). On the every-run socket (the runs table) a data tick names the runs whose
 * points came since the last one, and the table reads those alone (views/runs.py).
 *
 * A tab hidden for PAUSE_HIDDEN_MS closes its socket: a background tab then costs nothing,
 * however much streams. Shown again, it reconnects and, as after any reconnect, asks the
 * server to redraw what it missed.
 */
(function (live) {
  "use strict";

  var scheduler = live.scheduler;
  var REFRESH_MS = 2000;
  var DATA_REFRESH_MS = 5000; // tables beside charts (summary, run header, hazard)
  var MAX_STREAMED = 500; // runs named in a data tick of the runs table; more: it reads them all
  var PAUSE_HIDDEN_MS = 3000; // a tab switch shorter than this keeps the socket

  var socket = null;
  var target = null;
  var retry = 0;
  var timers = {}; // store -> pending refresh timer
  var reasons = {}; // store -> the reasons of its pending refresh
  var deferred = {}; // store -> reason, asked for while the tab was hidden
  var streamed = {}; // run id -> true: points came since the last data tick (every-run socket)
  var pauseTimer = null;
  var paused = false; // the socket was closed because the tab is hidden

  function indicator(state) {
    var el = document.getElementById("live-indicator");
    if (el && el.getAttribute("data-state") !== state) el.setAttribute("data-state", state);
  }

  /*
   * Ask the server to redraw `store`'s outputs, at most once per `delay` ms. The tick names
   * every reason asked for while it waited (`reasons`; `reason` is the first): a chart
   * redraws only for some of them (views/charts.STRUCTURAL_TICKS).
   */
  function refresh(store, reason, delay) {
    if (document.hidden) {
      deferred[store] = reason;
      return;
    }
    var asked = reasons[store] || (reasons[store] = []);
    if (asked.indexOf(reason) < 0) asked.push(reason);
    if (timers[store]) return;
    timers[store] = setTimeout(function () {
      timers[store] = null;
      var sent = reasons[store];
      reasons[store] = [];
      live.note("refreshes", 1);
      live.note("ticks." + store, 1);
      if (window.dash_clientside && window.dash_clientside.set_props) {
        var data = { reason: sent[0], reasons: sent, t: Date.now() };
        // The compare page's summary merges what the pushed points added (tally.js).
        var tally = store === "live-data-tick" ? live.tally.all() : null;
        if (tally) data.tally = tally;
        if (store === "live-data-tick" && target === "*") {
          // The runs table reads again only the runs whose points came (views/runs.py).
          var ids = Object.keys(streamed);
          streamed = {};
          data.runs = ids.length <= MAX_STREAMED ? ids : null;
        }
        window.dash_clientside.set_props(store, { data: data });
      }
    }, delay);
  }

  /* What was asked for while the tab was hidden, now that it is shown. */
  function catchUp() {
    Object.keys(deferred).forEach(function (store) {
      refresh(store, deferred[store], 0);
    });
    deferred = {};
  }

  /*
   * Ask the server to draw the charts again (`gd` given: that chart alone, through its
   * "metric-seen" store, layout.SEEN_TYPE, at most once per DATA_REFRESH_MS: the entropy
   * chart of a run whose learned level or start is still to come, which only the server computes).
   */
  var chartAsked = new WeakSet(); // charts with a redraw of their own asked for and not sent yet
  function metaList(gd, name) {
    var meta = gd.layout && gd.layout.meta;
    return (meta && meta[name]) || [];
  }
  function askRedraw(reason, gd) {
    if (!gd) {
      refresh("live-tick", reason, reason === "log-axis" ? 0 : REFRESH_MS);
      return;
    }
    if (document.hidden || chartAsked.has(gd)) return; // shown again, the next points ask
    chartAsked.add(gd);
    setTimeout(function () {
      chartAsked.delete(gd);
      var card = gd.closest(".chart-card[data-key]");
      if (!card || !document.body.contains(card)) return;
      if (!(window.dash_clientside && window.dash_clientside.set_props)) return;
      live.note("chartAsks", 1);
      window.dash_clientside.set_props(
        { type: "metric-seen", key: card.getAttribute("data-key") },
        // The runs still without a level or a start: the server draws again only once one of them has it.
        { data: { reason: reason, t: Date.now(), pending: metaList(gd, "pending"), pending_start: metaList(gd, "pending_start") } });
    }, DATA_REFRESH_MS);
  }

  function onMessage(message) {
    live.note("messages", 1);
    if (message.type === "points") {
      var rows = message.rows || [];
      scheduler.remember(message.run_id, rows);
      live.tally.take(message.run_id, rows);
      if (target === "*") streamed[message.run_id] = true;
      scheduler.push(message.run_id, rows, Date.now());
      refresh("live-data-tick", "points", target === "*" ? REFRESH_MS : DATA_REFRESH_MS);
    } else if (message.type === "status") {
      refresh("live-data-tick", "status", REFRESH_MS);
      if (live.charts.aggregated()) askRedraw("aggregate");
    } else if (message.type === "alert") {
      refresh("live-tick", "alert", REFRESH_MS);
      refresh("live-data-tick", "alert", REFRESH_MS);
    }
  }

  /* Follow `runs` ("*", a comma-separated list, or null for none). */
  function connect(runs, attempt) {
    paused = false;
    if (socket) {
      socket.onclose = null;
      socket.close();
      socket = null;
    }
    if (runs !== target) {
      scheduler.forget();
      live.tally.forget();
      streamed = {};
    }
    target = runs;
    retry = attempt || 0;
    if (!runs) {
      indicator("off");
      return;
    }
    var scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    var query = runs === "*" ? "" : "?runs=" + encodeURIComponent(runs);
    var opened = new WebSocket(scheme + "//" + window.location.host + "/api/v1/live" + query);
    socket = opened;
    indicator("connecting");
    opened.onopen = function () {
      // Charts drawn before the socket listened may have missed points in between.
      var missed = retry > 0 || live.drawnBefore();
      retry = 0;
      indicator("live");
      if (missed) {
        refresh("live-tick", "reconnect", 0);
        refresh("live-data-tick", "reconnect", 0);
      }
    };
    opened.onmessage = function (event) {
      onMessage(JSON.parse(event.data));
    };
    opened.onerror = function () {
      indicator("reconnecting");
    };
    opened.onclose = function () {
      if (socket !== opened) return;
      socket = null;
      indicator("reconnecting");
      var delay = Math.min(10000, 500 * Math.pow(2, retry));
      retry += 1;
      var again = retry;
      setTimeout(function () {
        if (target === runs && socket === null) connect(runs, again);
      }, delay);
    };
  }

  /* The tab was hidden: close the socket if it stays hidden PAUSE_HIDDEN_MS. */
  function pauseSoon() {
    if (pauseTimer !== null || paused) return;
    pauseTimer = setTimeout(function () {
      pauseTimer = null;
      if (!document.hidden || !socket) return;
      socket.onclose = null;
      socket.close();
      socket = null;
      paused = true;
      scheduler.forget(); // shown again, the server redraws everything: nothing to replay
      indicator("paused");
    }, PAUSE_HIDDEN_MS);
  }

  /* The tab is shown: reconnect a paused socket (its points missed are redrawn on open). */
  function resume() {
    if (pauseTimer !== null) {
      clearTimeout(pauseTimer);
      pauseTimer = null;
    }
    if (!paused) return;
    paused = false;
    if (target) connect(target, 1);
  }

  live.socket = {
    refresh: refresh,
    connect: connect,
    target: function () { return target; },
    askRedraw: askRedraw,
    catchUp: catchUp,
    pauseSoon: pauseSoon,
    resume: resume,
  };
})(window.keelLive = window.keelLive || {});
