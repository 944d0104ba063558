/* The run page's token view (dashboard/views/token_view.py), the browser's part: a click on
   a chart or on an alert's "tokens" button opens the view at a step, and the URL names the
   step the view shows (?step=S, without a reload). Clientside callbacks: keel_tokens.* */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.keel_tokens = (function () {
  var noUpdate = function () { return window.dash_clientside.no_update; };

  function nameStep(step) {
    var url = new URL(window.location.href);
    if (url.searchParams.get("step") === String(step)) return;
    url.searchParams.set("step", String(step));
    window.history.replaceState(window.history.state, "", url.toString());
  }

  /* The URL names `step`, the view scrolls in, and the step goes to the view's step field. */
  function openAt(step) {
    nameStep(step);
    var view = document.getElementById("tokens");
    if (view) view.scrollIntoView({ behavior: "smooth", block: "start" });
    return step;
  }

  /* A chart's click: the step is the clicked point's `field` (x, or customdata). */
  function stepFrom(field) {
    return function () {
      var hit = (window.dash_clientside.callback_context.triggered || [])[0];
      var point = hit && hit.value && hit.value.points && hit.value.points[0];
      var raw = point ? point[field] : null;
      if (raw === null || raw === undefined || !isFinite(Number(raw))) return noUpdate();
      return openAt(Math.round(Number(raw)));
    };
  }

  return {
    step_from_x: stepFrom("x"),
    step_from_customdata: stepFrom("customdata"),
    /* An alert's "tokens" button: the alert's first step is in the button's id. */
    step_from_alert: function () {
      var hit = (window.dash_clientside.callback_context.triggered || [])[0];
      if (!hit || !hit.value) return noUpdate();
      return openAt(JSON.parse(hit.prop_id.slice(0, hit.prop_id.lastIndexOf("."))).step);
    },
    /* Once the user picked a step (shown.explicit), the URL names it. */
    follow_url: function (shown) {
      if (shown && shown.explicit && shown.step !== null) nameStep(shown.step);
      return noUpdate();
    },
  };
})();
