"""The token view's pieces (pure): a step's worst sequences as text, each token coloured by
ℓ = log π − log μ, its hover text saying π, μ, r and what each shipped loss does with it.

A sample is one entry of GET /runs/{id}/samples (docs/protocol.md, "Step details"): the
sequence's scalars, and aligned per-token lists from position `start` on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dash import html

from dashboard.coefficients import TokenContext, sequence_drift, token_coefficients
from dashboard.topk import TOPK_TOKEN, entries_by_position, first_shown, token_class, topk_panel
from wire import read_value

__all__ = ["token_colour", "token_hover", "sample_card", "sample_header", "colour_legend", "ELL_FULL"]

ELL_FULL = 4.0
"""|ℓ| at which a token's colour is full: r = e⁴ ≈ 55."""
ELL_SOFT = 0.05
"""Below about this |ℓ| (a 5 % ratio) a token stays near white: float noise, not mismatch."""
RED = (200, 30, 30)  # the learner likes the token more than the sampler did (r > 1)
BLUE = (37, 99, 235)  # the sampler liked it more (r < 1)


def _number(raw: Any) -> float | None:
    """A sample's value: None when absent (shown as —), NaN when unreadable."""
    return read_value(raw, missing=None)


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "—"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "−Inf"
    text = f"{value:.{digits}g}"
    return text.replace("-", "−") if value < 0 else text


def token_colour(ell: float | None) -> tuple[str, str]:
    """(background, text colour) of a token: white at ℓ = 0, red for ℓ > 0, blue for ℓ < 0,
    full at |ℓ| ≥ ELL_FULL on an asinh scale (so 0.1 is visibly tinted, 1 clearly)."""
    if ell is None or math.isnan(ell):
        return "#e4e7eb", "#1f2933"
    strength = min(1.0, math.asinh(abs(ell) / ELL_SOFT) / math.asinh(ELL_FULL / ELL_SOFT))
    base = RED if ell > 0 else BLUE
    r, g, b = (round(255 + (c - 255) * strength) for c in base)
    return f"rgb({r},{g},{b})", "#ffffff" if strength > 0.6 else "#1f2933"


def _token_ell(sample: dict[str, Any], index: int) -> float | None:
    given = _list_number(sample, "log_ratio", index)
    if given is not None:
        return given
    learner, sampler = _list_number(sample, "learner_logprob", index), _list_number(sample, "sampler_logprob", index)
    return None if learner is None or sampler is None else learner - sampler


def _list_number(sample: dict[str, Any], name: str, index: int) -> float | None:
    values = sample.get(name)
    if not isinstance(values, list) or index >= len(values):
        return None
    return _number(values[index])


def _drift(sample: dict[str, Any]) -> float | None:
    """The sequence's mean Bernoulli KL when the sample shows the whole sequence; else None."""
    sampler, learner = sample.get("sampler_logprob"), sample.get("learner_logprob")
    length = sample.get("length")
    if not isinstance(sampler, list) or not isinstance(learner, list) or sample.get("start", 0) != 0:
        return None
    if length is None or len(sampler) != length:
        return None
    mu = [_number(v) for v in sampler]
    pi = [_number(v) for v in learner]
    if any(v is None for v in mu + pi):
        return None
    return sequence_drift([float(v) for v in mu if v is not None], [float(v) for v in pi if v is not None])


def token_hover(text: str, position: int, sample: dict[str, Any], index: int, *, drift: float | None) -> str:
    """The hover text of one token: π, μ, r, ℓ, and the coefficient c_t of every loss."""
    ell = _token_ell(sample, index)
    learner = _list_number(sample, "learner_logprob", index)
    sampler = _list_number(sample, "sampler_logprob", index)
    lines = [f"{text!r} · position {position}" + (" · the sequence's worst token" if position == sample.get("worst") else "")]
    lines.append(f"π = e^(log π) = {_fmt(None if learner is None else math.exp(learner))}   (log π = {_fmt(learner)})")
    lines.append(f"μ = e^(log μ) = {_fmt(None if sampler is None else math.exp(sampler))}   (log μ = {_fmt(sampler)})")
    ratio = None if ell is None or math.isnan(ell) else math.exp(max(-30.0, min(30.0, ell)))
    lines.append(f"r = π/μ = e^ℓ = {_fmt(ratio)}   ℓ = {_fmt(ell)}")
    advantage = _number(sample.get("advantage"))
    seq_log_ratio = _number(sample.get("seq_log_ratio"))
    length = sample.get("length")
    if ell is None or math.isnan(ell) or advantage is None or not math.isfinite(advantage):
        lines.append("Coefficients: not known (ℓ or the advantage is missing)")
        return "\n".join(lines)
    context = TokenContext(
        advantage=advantage,
        log_ratio=ell,
        seq_log_ratio=seq_log_ratio if seq_log_ratio is not None and math.isfinite(seq_log_ratio) else None,
        length=int(length) if isinstance(length, int) and length > 0 else 1,
        seq_drift=drift,
    )
    lines.append(f"Coefficient c on ∇log π of each loss (A = {_fmt(advantage)}; ? = needs what the sample does not show):")
    for loss, value in token_coefficients(context):
        shown = "?" if value is None else _fmt(value)
        lines.append(f"  {loss.name:<20} {shown:>10}   {loss.formula}")
    return "\n".join(lines)


def _shown_text(text: str) -> str:
    if text == "":
        return "∅"
    return text.replace("\n", "↵\n").replace("\t", "→\t")


def sample_header(rank: int, sample: dict[str, Any]) -> list[Any]:
    """seq_id, version, reward, advantage, length, Σℓ and max ℓ of a sample."""
    facts = [
        ("seq", str(sample.get("seq_id", "—"))),
        ("version", _fmt(_number(sample.get("version")))),
        ("reward", _fmt(_number(sample.get("reward")))),
        ("advantage", _fmt(_number(sample.get("advantage")))),
        ("length", str(sample.get("length", "—"))),
        ("Σℓ", _fmt(_number(sample.get("seq_log_ratio")))),
        ("max ℓ", _fmt(_number(sample.get("max_log_ratio")))),
    ]
    parts: list[Any] = [html.B(f"#{rank}", className="rank")]
    for name, value in facts:
        parts.append(html.Span([html.Span(name, className="fact-name"), " ", html.Span(value, className="fact-value")], className="fact"))
    return parts


def sample_card(rank: int, sample: dict[str, Any]) -> html.Div:
    """One sample: its header, then its tokens coloured by ℓ, each with its hover text."""
    texts: Sequence[Any] = sample.get("tokens") or []
    count = max((len(sample[name]) for name in ("tokens", "log_ratio", "learner_logprob", "sampler_logprob") if isinstance(sample.get(name), list)), default=0)
    start = int(sample.get("start") or 0)
    drift = _drift(sample)
    topk = entries_by_position(sample)
    panel = topk_panel(rank, sample)
    chosen = first_shown(sample, topk) if topk else None
    spans = []
    for index in range(count):
        text = str(texts[index]) if index < len(texts) else f"[{index + start}]"
        position = start + index
        background, ink = token_colour(_token_ell(sample, index))
        extra: dict[str, Any] = {}
        if position in topk:  # a click shows this token's top-k (views/token_view.py)
            extra = {"id": {"type": TOPK_TOKEN, "sample": rank, "position": position}, "n_clicks": 0}
        spans.append(
            html.Span(
                _shown_text(text),
                title=token_hover(text, position, sample, index, drift=drift),
                className=token_class(position, sample.get("worst"), position in topk, chosen),
                style={"backgroundColor": background, "color": ink},
                **extra,
            )
        )
    shown = f"tokens {start}–{start + count - 1} of {sample.get('length', '?')}" if count else "no tokens sent"
    return html.Div(
        [
            html.Div([*sample_header(rank, sample), html.Span(shown, className="sub")], className="sample-head"),
            html.Div(spans, className="sample-tokens"),
            *panel,
        ],
        className="sample",
    )


def colour_legend() -> html.Div:
    """What the token colours mean."""
    return html.Div(
        [
            html.Span(f"ℓ ≤ −{ELL_FULL:g} (r ≪ 1)", className="sub"),
            html.Span(className="legend-bar"),
            html.Span(f"ℓ ≥ +{ELL_FULL:g} (r ≫ 1: the learner likes the token far more than the sampler did)", className="sub"),
        ],
        className="token-legend",
    )
