"""What the step-details views show instead of their content (docs/dashboard.md, "Step
details"): *Loading…* while they read, and why they are empty. The heatmap and the length
scatter (views/details.py) show it as a chart's message, the token view (views/token_view.py)
as a line of text; the words and the reasons are these, for all three.
"""

from __future__ import annotations

from typing import Any

from dash import html

__all__ = ["LOADING", "NO_DETAILS", "empty_text", "placeholder"]

LOADING = "Loading…"
NO_DETAILS = "No step details: this run's client does not send them (Monitor.log_batch does)"


def empty_text(run: dict[str, Any], bounds: tuple[int, int] | None, elsewhere: bool) -> str:
    """Why a view is empty: no step yet, none in the range shown (`elsewhere`: the run has
    step details outside `bounds`), or none ever."""
    if run.get("last_step") is None:
        return "Waiting for the run's first step…"
    if elsewhere and bounds is not None:
        return f"No step details in steps {bounds[0]}–{bounds[1]}"
    return NO_DETAILS


def placeholder(text: str, *, kind: str = "note", component_id: str | None = None) -> html.P:
    """A line of text in place of a view's content: `kind` "sub" while it reads, "note" when
    there is nothing to show, "note warn" when what was asked for is not there."""
    if component_id is None:
        return html.P(text, className=kind)
    return html.P(text, className=kind, id=component_id)
