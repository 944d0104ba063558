"""The gate-against-gap detector on token-level synthetic runs.

Each step draws the per-token log-ratios ℓ = log π − log μ of a batch and computes what a
trainer logs: `gate/frac`, the share of tokens an IcePop-style band mask drops (r outside
[1/2, 2]), and `mismatch/kl`, the k3 KL. The runs differ only in how ℓ drifts:

- diverging (IcePop's follow-up): the mismatch moves from a few far-out tokens, which the
  band masks, to a bias every token shares, which stays inside the band: fewer tokens
  masked while the KL grows;
- widening: ℓ's spread grows, so more tokens leave the band as the KL grows: both rise;
- noise: a stationary mixture.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from server.alerts.backtest import backtest, parse_rules
from server.alerts.catalog import DEFAULT_RULES, DETECTORS, build_detector
from server.alerts.gate_gap import GateAgainstGap, mann_kendall_z
from wire import Row

BAND = math.log(2.0)
TOKENS = 1000
RULE_FILE = Path(__file__).resolve().parents[3] / "docs" / "rules" / "gate-vs-gap.json"


def _step(rng: random.Random, bias: float, spread: float, outliers: float) -> dict[str, float]:
    """One batch: `outliers` of the tokens at |ℓ| in [0.8, 1.2], just outside the band
    (either sign), the rest N(−bias, spread)."""
    ells = [
        rng.choice((-1, 1)) * rng.uniform(0.8, 1.2) if rng.random() < outliers else rng.gauss(-bias, spread)
        for _ in range(TOKENS)
    ]
    return {
        "gate/frac": sum(abs(ell) > BAND for ell in ells) / TOKENS,
        "mismatch/kl": sum(math.expm1(ell) - ell for ell in ells) / TOKENS,
    }


def _run(kind: str, steps: int, seed: int) -> list[dict[str, float]]:
    """Steady for 100 steps, then (diverging, widening) drifting to the end: geometrically
    (a gap that widens by a constant factor per step) or linearly."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        t = max(0.0, (step - 100) / (steps - 100))
        if kind == "diverging":
            out.append(_step(rng, bias=0.03 * 20**t, spread=0.03, outliers=0.04 * 0.1**t))
        elif kind == "widening":
            out.append(_step(rng, bias=0.0, spread=0.1 + 0.4 * t, outliers=0.0))
        else:
            out.append(_step(rng, bias=0.1, spread=0.1, outliers=0.02))
    return out


def _active_steps(detector: GateAgainstGap, run: list[dict[str, float]]) -> list[int]:
    state: dict = detector.initial_state()
    active = []
    for step, values in enumerate(run):
        signal = detector.update(state, step, values)
        assert signal is not None
        if signal.active:
            active.append(step)
    return active


def _detector() -> GateAgainstGap:
    detector = build_detector("gate_vs_gap", "gate/frac,mismatch/kl")
    assert isinstance(detector, GateAgainstGap)
    return detector


def test_synthetic_runs_behave_as_their_mechanism_says() -> None:
    """The generator itself: the diverging run's gate falls while its KL rises; the
    widening run's both rise (else the tests below would prove nothing)."""
    diverging, widening = _run("diverging", 200, 1), _run("widening", 200, 1)
    for run, gate_direction in ((diverging, -1), (widening, 1)):
        gate_before = sum(v["gate/frac"] for v in run[80:100]) / 20
        gate_after = sum(v["gate/frac"] for v in run[180:200]) / 20
        kl_before = sum(v["mismatch/kl"] for v in run[80:100]) / 20
        kl_after = sum(v["mismatch/kl"] for v in run[180:200]) / 20
        assert (gate_after - gate_before) * gate_direction > 0.02
        assert kl_after > 2 * kl_before


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fires_when_the_gate_falls_while_the_kl_grows(seed: int) -> None:
    active = _active_steps(_detector(), _run("diverging", 200, seed))
    assert active, "never fired on a gate falling against a growing KL"
    assert all(step > 100 for step in active)  # not during the steady part


def test_message_names_both_moves() -> None:
    detector = _detector()
    state: dict = {}
    messages = [
        signal.message
        for step, values in enumerate(_run("diverging", 200, 1))
        if (signal := detector.update(state, step, values)) is not None and signal.active
    ]
    assert messages and messages[0].startswith("gate/frac falling (")
    assert "mismatch/kl grows (" in messages[0] and "last 50 steps" in messages[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_silent_when_both_rise(seed: int) -> None:
    assert _active_steps(_detector(), _run("widening", 200, seed)) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_silent_on_noise(seed: int) -> None:
    assert _active_steps(_detector(), _run("noise", 400, seed)) == []


def test_silent_when_the_loss_gates_nothing() -> None:
    """A loss with no gate logs 0 every step: nothing to fall from, whatever the KL does."""
    run = [{"gate/frac": 0.0, "mismatch/kl": 1e-3 * math.exp(step / 20)} for step in range(200)]
    assert _active_steps(_detector(), run) == []


def test_incremental_trend_equals_the_direct_one() -> None:
    """S kept incrementally over a sliding window equals Σ_{i<j} sign(x_j − x_i) of the window."""
    rng = random.Random(7)
    detector = build_detector("gate_vs_gap", "gate/frac,mismatch/kl", {"window": 12})
    state: dict = {}
    for step in range(60):
        values = {"gate/frac": rng.choice((0.0, 0.01, 0.02, rng.random())), "mismatch/kl": rng.random()}
        detector.update(state, step, values)
        for key, s in (("gate", state["s_gate"]), ("gap", state["s_gap"])):
            window = state[key]
            direct = sum((b > a) - (b < a) for i, a in enumerate(window) for b in window[i + 1 :])
            assert s == direct
        assert len(state["gate"]) == min(step + 1, 12)


def test_mann_kendall_z_of_a_monotone_window_and_of_ties() -> None:
    rising = [float(i) for i in range(10)]
    s = 45  # every one of the 10·9/2 pairs rises
    assert mann_kendall_z(rising, s) == pytest.approx(44 / math.sqrt(10 * 9 * 25 / 18))
    assert mann_kendall_z(rising[::-1], -s) == pytest.approx(-44 / math.sqrt(10 * 9 * 25 / 18))
    assert mann_kendall_z([0.0] * 10, 0) == 0.0
    # ties shrink the variance: 4 zeros then 6 rising values
    tied = [0.0] * 4 + [float(i) for i in range(1, 7)]
    s_tied = sum((b > a) - (b < a) for i, a in enumerate(tied) for b in tied[i + 1 :])
    variance = (10 * 9 * 25 - 4 * 3 * 13) / 18
    assert mann_kendall_z(tied, s_tied) == pytest.approx((s_tied - 1) / math.sqrt(variance))


def test_state_survives_a_json_round_trip_mid_run() -> None:
    """A restart (state saved as JSON, a new detector) fires at the same steps."""
    run = _run("diverging", 200, 2)
    whole = _active_steps(_detector(), run)
    first, second = _detector(), _detector()
    state: dict = {}
    resumed = []
    for step, values in enumerate(run):
        if step == 150:
            state = json.loads(json.dumps(state))
        signal = (first if step < 150 else second).update(state, step, values)
        assert signal is not None
        if signal.active:
            resumed.append(step)
    assert resumed == whole and whole


def test_a_step_without_both_metrics_is_skipped() -> None:
    detector = _detector()
    state: dict = {}
    assert detector.update(state, 0, {"gate/frac": 0.1}) is None
    assert detector.update(state, 1, {"gate/frac": 0.1, "mismatch/kl": math.nan}) is None
    assert state == {}


@pytest.mark.parametrize(
    ("metric", "params"),
    [
        ("gate/frac", {}),
        ("gate/frac,gate/frac", {}),
        ("gate/frac,mismatch/kl,mismatch/ratio_max", {}),
        ("gate/frac,mismatch/kl", {"window": 3}),
        ("gate/frac,mismatch/kl", {"window": 50.5}),
        ("gate/frac,mismatch/kl", {"fall_factor": 1.2}),
        ("gate/frac,mismatch/kl", {"rise_factor": 0.9}),
        ("gate/frac,mismatch/kl", {"z": 0}),
        ("gate/frac,mismatch/kl", {"warmup": 10}),
    ],
)
def test_refuses_parameters_that_make_no_sense(metric: str, params: dict) -> None:
    with pytest.raises(ValueError):
        build_detector("gate_vs_gap", metric, params)


def test_registered_and_opt_in() -> None:
    assert DETECTORS["gate_vs_gap"] is GateAgainstGap
    assert all(rule.detector != "gate_vs_gap" for rule in DEFAULT_RULES)


def test_the_shipped_rule_file_fires_through_the_backtest() -> None:
    """docs/rules/gate-vs-gap.json, the rule docs/alerts.md scores, replayed by the engine's
    own backtest: it fires on the diverging run and not on the widening one."""
    rules = parse_rules(RULE_FILE.read_text(encoding="utf-8"))
    assert [rule.detector for rule in rules] == ["gate_vs_gap"]

    def fired(run: list[dict[str, float]]) -> list[int]:
        rows = [Row(step=step, time=None, values=values) for step, values in enumerate(run)]
        return backtest(rules, rows)[0].fired_steps

    assert fired(_run("diverging", 200, 3))
    assert fired(_run("widening", 200, 3)) == []
