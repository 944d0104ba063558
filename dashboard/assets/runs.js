/* The runs page (dashboard/views/runs.py), the browser's part. Clientside callbacks: keel_runs.* */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.keel_runs = {
  /* The "Compare" link follows the grid's selection: its href, class and label. */
  compare_link: function (rows) {
    var n = (rows || []).length;
    if (!n) return ["/compare", "button disabled", "Select runs to compare"];
    var ids = rows.map(function (r) { return r.id; }).join(",");
    return ["/compare?runs=" + ids, "button", "Compare " + n + " run" + (n === 1 ? "" : "s") + " →"];
  },
};
