/* The run page's Checkpoint and Stop buttons (dashboard/views/run.py): shown to an admin
   only, and only while the run is running (a finished run has no trainer to take them); they
   POST a command to the run as the logged-in user (the login cookie goes with the request;
   docs/alerts.md, "Acting on an alert"). */
window.dash_clientside = window.dash_clientside || {};
window.dash_clientside.keel_commands = {
  shown: async function (state) {
    if (!state || state.page !== "run") return window.dash_clientside.no_update;
    try {
      var answer = await fetch("/api/v1/whoami", { credentials: "same-origin" });
      var who = await answer.json();
      if ((who.scopes || []).indexOf("admin") < 0) return { display: "none" };
      // The runs list answers 200 with [] for a run that does not exist (the run's own URL
      // would answer 404, an error in the page's console).
      var found = await fetch("/api/v1/runs?run_id=" + encodeURIComponent(state.runs[0]), { credentials: "same-origin" });
      var runs = found.ok ? await found.json() : [];
      return runs.length && runs[0].status === "running" ? { display: "flex" } : { display: "none" };
    } catch (e) {
      return { display: "none" };
    }
  },
  send: async function (checkpoints, stops, state) {
    var hit = (window.dash_clientside.callback_context.triggered || [])[0];
    if (!hit || !hit.value || !state || state.page !== "run") return window.dash_clientside.no_update;
    var action = hit.prop_id.indexOf("command-stop") === 0 ? "stop" : "checkpoint";
    if (action === "stop" && !window.confirm(
      "Ask this run's trainer to stop? A trainer that listens to commands does what its stop handler does " +
      "(TRL's KeelCallback saves a checkpoint and stops; keel run interrupts its command)."
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
