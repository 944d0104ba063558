/* The metric charts (dashboard/views/charts.py) and the step details' heatmap
   (dashboard/views/details.py), the browser's part. Clientside callbacks: keel_charts.* */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.keel_charts = {
  /* Only relayouts that touch the x axis reach the server. Plotly reports others (the first
     autosize, resizes, y-only zooms) as relayoutData too; a request for each would be in
     flight when the user changes an option, and Dash then drops the option's redraw. */
  x_axis_only: function (relayout) {
    if (relayout && (relayout["xaxis.autorange"] || Array.isArray(relayout["xaxis.range"])
            || ("xaxis.range[0]" in relayout && "xaxis.range[1]" in relayout))) {
      return relayout;
    }
    return window.dash_clientside.no_update;
  },
  /* An alert fired or resolved: each drawn chart takes its new alert marks in place of its
     own (views/charts.mark_alerts), its series untouched. */
  alert_marks: function (marks) {
    var live = window.keelLive;
    if (marks && marks.charts && live && live.charts) live.charts.markAll(marks, live.scheduler.plots());
    return window.dash_clientside.no_update;
  },
};
