/* The run page's step details (dashboard/views/details.py), the browser's part.
   Clientside callbacks: keel_details.* */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.keel_details = {
  /* The heatmap's rows are bins of unequal width in ℓ (one row each): say which bin is
     hovered. The bins' edges are in the figure's layout.meta. */
  dist_readout: function (hover) {
    var point = hover && hover.points && hover.points[0];
    var gd = document.querySelector("#dist-graph .js-plotly-plot");
    var meta = gd && gd.layout && gd.layout.meta;
    if (!point || !meta || !meta.edges || point.z === null || point.z === undefined) {
      return window.dash_clientside.no_update;
    }
    var bin = Math.floor(point.y);
    var edges = meta.edges;
    if (bin < 0 || bin + 1 >= edges.length) return window.dash_clientside.no_update;
    var fmt = function (v) { return Number(v.toPrecision(3)).toString(); };
    var share = Math.pow(10, point.z);
    return "step " + point.x + ": " + share.toPrecision(3) + " of the tokens have ℓ in [" +
        fmt(edges[bin]) + ", " + fmt(edges[bin + 1]) + ")";
  },
};
