/* Formatters for dash-ag-grid cells ({"function": "keelNumber(params.value)"}). */
window.dashAgGridFunctions = window.dashAgGridFunctions || {};

window.dashAgGridFunctions.keelNumber = function (value) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value !== "number") return String(value); // "NaN", "+Inf", "−Inf" stay visible
  var magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e5)) return value.toExponential(2);
  return Number(value.toPrecision(4)).toString();
};

// A probability as a percentage with one decimal ("" for none: a run without a hazard).
window.dashAgGridFunctions.keelPercent = function (value) {
  if (value === null || value === undefined || value === "" || typeof value !== "number") return "";
  return (100 * value).toFixed(1) + "%";
};

window.dashAgGridFunctions.keelNonFinite = function (value) {
  return typeof value === "string" && /^(NaN|[+−-]Inf)$/.test(value);
};
