/*
 * Keel live updates: the compare page's summary, from the points the socket pushed.
 *
 * The summary's numbers (final and peak reward, largest KL and ratio, non-finite points)
 * are read from the server once, when the page opens; after that the server does not read
 * the points again. This part keeps, per run and per key the page names in its
 * [data-summary-keys] element, what the pushed points add: the last finite value and its
 * step ("last"), the largest finite value and its step ("top"), whether a +Inf came
 * ("inf"), the steps of non-finite values (the newest MAX_BAD: "bad") and the last step
 * ("to"). It is sent with every data tick (socket.js), whole: the server merges it into what
 * it read (dashboard/summary.py Headline.merged), and merging twice changes nothing, so a
 * tick the server never answered loses nothing.
 */
(function (live) {
  "use strict";

  var math = live.math;
  var MAX_BAD = 200; // non-finite steps kept per key: a run that logs NaN at every step is counted to this many past the read
  var runs = {}; // run id -> key -> tally

  var named = null; // the page's [data-summary-keys] element, while it is in the document
  var wanted = null; // its keys

  /* The keys the page's summary names; null on a page without one. Looked up again only
   * once the element left the document (another page): a query per pushed message costs
   * a walk of the whole page, charts and grid included. */
  function keys() {
    if (named === null || !named.isConnected) {
      named = document.querySelector("[data-summary-keys]");
      wanted = named ? named.getAttribute("data-summary-keys").split(",") : null;
    }
    return wanted;
  }

  /* Rows the socket pushed for `runId`. */
  function take(runId, rows) {
    var wanted = keys();
    if (!wanted) return;
    var run = runs[runId] || (runs[runId] = {});
    for (var r = 0; r < rows.length; r++) {
      var row = rows[r];
      if (!row.values) continue;
      for (var k = 0; k < wanted.length; k++) {
        var key = wanted[k];
        if (!Object.prototype.hasOwnProperty.call(row.values, key)) continue;
        var value = math.parseValue(row.values[key]);
        var t = run[key] || (run[key] = { last: null, top: null, inf: false, bad: [], to: null });
        if (t.to === null || row.step > t.to) t.to = row.step;
        if (Number.isFinite(value)) {
          if (t.last === null || row.step >= t.last[0]) t.last = [row.step, value];
          if (t.top === null || value > t.top[1]) t.top = [row.step, value];
        } else {
          if (value === Infinity) t.inf = true;
          if (t.bad.indexOf(row.step) < 0) {
            t.bad.push(row.step);
            if (t.bad.length > MAX_BAD) t.bad.shift();
          }
        }
      }
    }
  }

  /* What the page's summary is sent with a data tick: null on a page without one. */
  function all() {
    return keys() ? runs : null;
  }

  /* Another set of runs, or a socket closed for good: start again. */
  function forget() {
    runs = {};
  }

  live.tally = { take: take, all: all, forget: forget };
})(window.keelLive = window.keelLive || {});
