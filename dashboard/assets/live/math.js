/*
 * Keel live updates: the arithmetic the browser shares with Python.
 *
 * The live updater (dashboard/assets/live/) appends pushed points to the charts the
 * server drew. Its parts, in the order the page loads them (declared once, as
 * dashboard/app.py LIVE_PARTS; Dash leaves this folder out of its own asset loading):
 *   math.js       values, smoothing and the y range, as dashboard/series.py,
 *                 traces.py and figures.py compute them: both sides are held to one
 *                 table of cases, tests/dashboard/drawing_spec.json
 *   charts.js     what a chart is waiting to draw, and drawing it into the figure
 *   overlay.js       the points not drawn into the figure yet, painted over it at once
 *   scheduler.js  when each chart draws: a share of the main thread, visible charts only
 *   tally.js      what the pushed points add to the compare page's summary
 *   socket.js     the websocket, and the server redraws it asks for
 *   start.js      wiring: which runs, which charts, page visibility, instrumentation
 * Every part adds its functions to window.keelLive; none keeps state on DOM nodes.
 */
(function (live) {
  "use strict";

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

  /* Whether the main y axis can place a value: finite, and positive on a log axis (traces.drawable). */
  function drawable(value, logAxis) {
    return Number.isFinite(value) && (value > 0 || !logAxis);
  }

  /*
   * A smoothed line on a log axis stops at LOG_FLOOR × the smallest positive value its run
   * logged (traces.LOG_FLOOR, log_floor): below it the EMA is zeros pulling it to 0.
   * `floor` (null: no positive value yet) lowered by one more value; `aboveFloor` says
   * whether a smoothed value is drawn.
   */
  var LOG_FLOOR = 0.1;
  function logFloor(floor, value) {
    if (!(Number.isFinite(value) && value > 0)) return floor;
    var candidate = LOG_FLOOR * value;
    return floor === null || floor === undefined || candidate < floor ? candidate : floor;
  }
  function aboveFloor(value, floor, logAxis) {
    if (!drawable(value, logAxis)) return false;
    return !logAxis || floor === null || floor === undefined || value >= floor;
  }

  /* The hover text of a value ≤ 0 marked on a log chart's edge (traces.zero_label). */
  function zeroLabel(value) {
    return value === 0 ? "0" : String(value) + " (≤ 0)";
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

  /*
   * Where a growing chart's step axis ends (figures.x_axis_end): HEADROOM of the steps shown
   * past the newest (at least MIN_HEADROOM), rounded up to a multiple of a round step.
   */
  var HEADROOM = 0.1;
  var MIN_HEADROOM = 10;
  function xAxisEnd(first, newest) {
    var room = Math.max(MIN_HEADROOM, HEADROOM * (newest - first));
    var decade = Math.pow(10, Math.floor(Math.log10(room)));
    var grid = [5, 2, 1].map(function (m) { return m * decade; }).filter(function (g) { return g <= room; })[0];
    return Math.ceil((newest + room) / grid) * grid;
  }

  /*
   * One step of the debiased EMA (series.EmaState): `state` = {value, count} is updated
   * with a finite `value` and the smoothed value returned. Exact for a constant.
   */
  function emaStep(state, value, weight) {
    state.count += 1;
    var gain = (1 - weight) / (1 - Math.pow(weight, state.count));
    state.value = gain >= 1 ? value : state.value + gain * (value - state.value);
    return state.value;
  }

  /* series.ema over a list: a non-finite value is a gap (null) and leaves the state alone. */
  function ema(values, weight, state) {
    state = state || { value: 0, count: 0 };
    var out = values.map(function (v) {
      return Number.isFinite(v) ? emaStep(state, v, weight) : null;
    });
    return { values: out, state: state };
  }

  /* A sum that keeps the bits a plain one drops (Neumaier): series.band_at sums with math.fsum. */
  function sum(values) {
    var total = 0, lost = 0;
    for (var i = 0; i < values.length; i++) {
      var v = values[i], t = total + v;
      lost += Math.abs(total) >= Math.abs(v) ? (total - t) + v : (v - t) + total;
      total = t;
    }
    return total + lost;
  }

  /*
   * A group's mean and band at one step from its members' values there (series.band_at):
   * non-finite and missing (null) values left out, the sample std as the half-width, or
   * std/√n for "stderr"; null when no value is finite.
   */
  function band(values, spread) {
    var finite = values.filter(function (v) { return v !== null && v !== undefined && Number.isFinite(v); });
    var n = finite.length;
    if (!n) return null;
    var mu, std;
    if (Math.min.apply(null, finite) === Math.max.apply(null, finite)) {
      mu = finite[0]; // equal runs give a line, not a band
      std = 0;
    } else {
      mu = sum(finite) / n;
      std = Math.sqrt(sum(finite.map(function (v) { return (v - mu) * (v - mu); })) / (n - 1));
    }
    var half = spread === "stderr" ? std / Math.sqrt(n) : std;
    return { mean: mu, lower: mu - half, upper: mu + half, n: n };
  }

  live.math = {
    band: band,
    parseValue: parseValue,
    nonFiniteKind: nonFiniteKind,
    drawable: drawable,
    logFloor: logFloor,
    aboveFloor: aboveFloor,
    zeroLabel: zeroLabel,
    flatRange: flatRange,
    xAxisEnd: xAxisEnd,
    emaStep: emaStep,
    ema: ema,
  };
})(window.keelLive = window.keelLive || {});
