/* The run page's command buttons (dashboard/views/run.py): one for each action the run's
   trainer said it takes, shown to an admin only; a click POSTs the command to the run as the
   logged-in user (the login cookie goes with the request; docs/alerts.md, "Acting on an
   alert"). Every action but a checkpoint asks first, in the words of the trainer's handler. */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.keel_commands = {
  shown: async function (state) {
    if (!state || state.page !== "run") return window.dash_clientside.no_update;
    try {
      var answer = await fetch("/api/v1/whoami", { credentials: "same-origin" });
      var who = await answer.json();
      return (who.scopes || []).indexOf("admin") < 0 ? { display: "none" } : { display: "flex" };
    } catch (e) {
      return { display: "none" };
    }
  },
  send: async function (clicks, titles, state) {
    var context = window.dash_clientside.callback_context;
    var hit = (context.triggered || [])[0];
    if (!hit || !hit.value || !state || state.page !== "run") return window.dash_clientside.no_update;
    var action = JSON.parse(hit.prop_id.slice(0, hit.prop_id.lastIndexOf("."))).action;
    var said = "";
    (context.states_list[0] || []).forEach(function (entry) {
      if (entry.id.action === action) said = entry.value || "";
    });
    if (action !== "checkpoint" && !window.confirm(
      "Send '" + action + "' to this run's trainer? Its handler " + said + "."
    )) {
      return window.dash_clientside.no_update;
    }
    var run = state.runs[0];
    try {
      var answer = await fetch("/api/v1/runs/" + encodeURIComponent(run) + "/commands", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ action: action, payload: {} }),
      });
      var body = await answer.json();
      if (!answer.ok) return action + " refused (" + answer.status + "): " + JSON.stringify(body.detail);
      return action + " sent (" + body.id.slice(0, 8) + ", " + body.state + ")";
    } catch (e) {
      return action + " not sent: " + e;
    }
  },
};
