"""Both engines' view of a token (pure): the sampler's top-k beside the learner's, for the
tokens of a worst sequence that carry them (a sample's `topk`, docs/protocol.md, "Step
details"), each with both probabilities, the sampled token marked.

The token view (views/token_view.py) shows the worst token's at first; a click on another
token that carries them (`TOPK_TOKEN`) shows that one's (`choose`).
"""

from __future__ import annotations

import math
from typing import Any

from dash import dcc, html

from wire import read_value

__all__ = [
    "TOPK_PANEL",
    "TOPK_STORE",
    "TOPK_TOKEN",
    "choose",
    "entries_by_position",
    "first_shown",
    "token_class",
    "topk_block",
    "topk_panel",
]

TOPK_TOKEN = "topk-token"
"""Pattern-matching id type of a token that carries both top-k: {"type", "sample": rank, "position"}."""
TOPK_PANEL = "topk-panel"
"""The sample's side-by-side tables: {"type", "sample": rank}."""
TOPK_STORE = "topk-store"
"""The sample's `topk` entries and its sampled ids, for `choose`: {"type", "sample": rank}."""


def _probability(logprob: Any) -> float | None:
    value = read_value(logprob, missing=None)
    return None if value is None or math.isnan(value) else math.exp(min(0.0, value))


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4f}" if value >= 1e-4 else f"{value:.2e}"


def entries_by_position(sample: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The sample's `topk` entries by token position, each with the id sampled there."""
    start = int(sample.get("start") or 0)
    ids = sample.get("token_ids") or []
    out: dict[int, dict[str, Any]] = {}
    for entry in sample.get("topk") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("position"), int):
            continue
        at = entry["position"] - start
        sampled = ids[at] if 0 <= at < len(ids) else None
        out[entry["position"]] = {**entry, "sampled_id": sampled}
    return out


def _rows(
    ids: list[Any], texts: list[Any], own: list[Any], other: dict[int, float | None], sampled: Any
) -> list[html.Tr]:
    rows = []
    for rank, token_id in enumerate(ids, start=1):
        text = str(texts[rank - 1]) if rank - 1 < len(texts) else f"[{token_id}]"
        mine = _probability(own[rank - 1]) if rank - 1 < len(own) else None
        chosen = token_id == sampled
        rows.append(
            html.Tr(
                [
                    html.Td(str(rank)),
                    html.Td(repr(text), className="topk-text", title=f"id {token_id}"),
                    html.Td(_fmt(mine)),
                    html.Td(_fmt(other.get(token_id))),
                    html.Td("◀ sampled" if chosen else ""),
                ],
                className="sampled" if chosen else None,
            )
        )
    return rows


def _table(title: str, own: str, other: str, rows: list[html.Tr], side: str) -> html.Div:
    head = html.Tr([html.Th("#"), html.Th("token"), html.Th(own), html.Th(other), html.Th("")])
    return html.Div(
        [html.B(title), html.Table([html.Thead(head), html.Tbody(rows)], className="topk-table")],
        className=f"topk-side topk-{side}",
    )


def topk_block(entry: dict[str, Any]) -> html.Div:
    """One token's two top-k tables: the sampler's (μ, and the learner's π of the same
    ids) and the learner's (π, and μ where the sampler listed the id)."""
    sampler_ids = list(entry.get("sampler_token_ids") or [])
    learner_ids = list(entry.get("learner_token_ids") or [])
    mu = {i: _probability(lp) for i, lp in zip(sampler_ids, entry.get("sampler_logprobs") or [], strict=False)}
    pi_of_sampler = entry.get("learner_logprobs_of_sampler_ids") or []
    pi = {i: _probability(lp) for i, lp in zip(learner_ids, entry.get("learner_logprobs") or [], strict=False)}
    pi.update({i: _probability(lp) for i, lp in zip(sampler_ids, pi_of_sampler, strict=False)})
    sampled = entry.get("sampled_id")
    tv, kl = read_value(entry.get("tv"), missing=None), read_value(entry.get("kl"), missing=None)
    facts = f"position {entry.get('position')}"
    if tv is not None:
        facts += f" · top-k TV {tv:.4g}"
    if kl is not None:
        facts += f" · KL {kl:.4g}"
    sides = [
        _table(
            "sampler's top-k",
            "μ",
            "π",
            _rows(sampler_ids, list(entry.get("sampler_tokens") or []), list(entry.get("sampler_logprobs") or []), pi, sampled),
            "sampler",
        )
    ]
    if learner_ids:
        sides.append(
            _table(
                "learner's top-k",
                "π",
                "μ",
                _rows(learner_ids, list(entry.get("learner_tokens") or []), list(entry.get("learner_logprobs") or []), mu, sampled),
                "learner",
            )
        )
    return html.Div(
        [html.P(facts, className="sub topk-facts"), html.Div(sides, className="topk-sides")],
        className="topk-block",
    )


def topk_panel(rank: int, sample: dict[str, Any]) -> list[Any]:
    """The sample's top-k panel (the worst token's entry, or the first) and its store;
    [] when the sample carries no top-k."""
    entries = entries_by_position(sample)
    if not entries:
        return []
    shown = first_shown(sample, entries)
    hint = "Both engines' top-k at the token underlined in yellow; click another dotted token for its own."
    return [
        html.P(hint, className="sub"),
        html.Div(topk_block(entries[shown]), id={"type": TOPK_PANEL, "sample": rank}),
        dcc.Store(
            id={"type": TOPK_STORE, "sample": rank},
            data={"entries": list(entries.values()), "worst": sample.get("worst")},
        ),
    ]


def first_shown(sample: dict[str, Any], entries: dict[int, dict[str, Any]]) -> int:
    """The token whose top-k the panel shows first: the worst one, else the first listed."""
    worst = sample.get("worst")
    return worst if isinstance(worst, int) and worst in entries else next(iter(entries))


def token_class(position: int, worst: Any, has_topk: bool, chosen: Any) -> str:
    """A token's classes: `worst` (outlined), `has-topk` (underlined: it can be chosen),
    `topk-chosen` (the one whose top-k the panel shows)."""
    names = ["tok"]
    if position == worst:
        names.append("worst")
    if has_topk:
        names.append("has-topk")
        if position == chosen:
            names.append("topk-chosen")
    return " ".join(names)


def choose(position: int, stored: dict[str, Any]) -> html.Div | None:
    """The block of the entry at `position` (None: the sample has none there)."""
    for entry in stored.get("entries") or []:
        if entry.get("position") == position:
            return topk_block(entry)
    return None
