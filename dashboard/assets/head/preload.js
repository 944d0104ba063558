/*
 * In the head of every page, before Dash's own scripts (dashboard/app.py PRELOAD, PLOTLY_BUNDLE): a
 * page of charts (a run's, a comparison's) fetches plotly.js (4.8 MB) from its start.
 * dcc.Graph asks for it only once its first chart mounts, after Dash's scripts, its layout and
 * its first callbacks (bench/page: a page of charts' cold load); the runs list draws none.
 * The bundle's address comes on this script's own tag (data-bundle).
 */
(function () {
  "use strict";
  var me = document.currentScript;
  var path = window.location.pathname.replace(/\/+$/, "");
  if (!me || !(path === "/compare" || /^\/runs\/[^\/]+$/.test(path))) return;
  var link = document.createElement("link");
  link.rel = "preload";
  link.as = "script";
  link.href = me.getAttribute("data-bundle");
  document.head.appendChild(link);
})();
