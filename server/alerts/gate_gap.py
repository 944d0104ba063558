"""Gate against gap: a gate or mask fraction falling while the sampler–learner mismatch grows.

A loss that masks (or clips) the tokens whose ratio leaves a band, IcePop's token mask,
MIS, TIS, PPO's clip, reports the share it threw away (`gate/frac`). Read alone, a falling
share looks like a run settling down. IcePop's follow-up (docs/metrics.md, "Healthy
magnitudes") reports the opposite: as training went on, IcePop masked *fewer* tokens while
the training–inference gap kept widening, and optimisation grew unstable. A fixed band stops
seeing a mismatch that moves its bulk without pushing more tokens past the band's edges.
So the signal is the two trends against each other: the gated share falling while the
mismatch (`mismatch/kl`, or the tail mass) grows, over the same window.

Per series, over the last `window` steps where both were logged:

- the Mann–Kendall trend statistic S = Σ_{i<j} sign(x_j − x_i) and its z against "no trend"
  (variance n(n−1)(2n+5)/18 less the ties' share: a gated share is a count over a few
  hundred units, so ties are common). Ranks, not values: the KL spans decades and has spikes,
  and a rank test is unmoved by either and by any monotone transform (log or not);
- the change from the window's earlier half to its later half, as the ratio of the halves'
  medians: the size of the move, not just its direction.

Active when the gate's trend is down (z ≤ −`z`) and the mismatch's is up (z ≥ `z`), and
both moves are large: the gate's later median at most `fall_factor` times its earlier one,
the mismatch's at least `rise_factor` times. Training series are autocorrelated, which
inflates a trend test's z (a random walk "trends"); the size requirements are what keep a
wandering series from firing, as parity's tolerance does (docs/metrics.md). A gate that
gates next to nothing (earlier median under `min_gate`) has nothing to fall from: a loss
that gates nothing never fires.

S is updated incrementally: a value entering the window adds Σ sign(x − x_i) over the
values already there, the value leaving subtracts Σ sign(x_i − x_old): O(window) per step,
constant in the run's length, like every detector. The state (both windows and both S) is
JSON.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from server.alerts.detectors import Detector, Signal, _positive

__all__ = ["GateAgainstGap", "mann_kendall_z"]

MAX_WINDOW = 1_000
"""Values per series the state keeps; they are saved with the rule's state."""


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def mann_kendall_z(values: Sequence[float], s: int) -> float:
    """z of the Mann–Kendall statistic `s` of `values` (tie-corrected variance, continuity
    correction); 0 when every value ties."""
    n = len(values)
    ties = sum(t * (t - 1) * (2 * t + 5) for t in Counter(values).values() if t > 1)
    variance = (n * (n - 1) * (2 * n + 5) - ties) / 18
    if variance <= 0 or s == 0:
        return 0.0
    return (s - _sign(s)) / math.sqrt(variance)


def _push(window: list[float], s: int, x: float, size: int) -> int:
    """Append x to the window (dropping its oldest value past `size`); the new S."""
    if len(window) == size:
        oldest = window.pop(0)
        s -= sum(_sign(v - oldest) for v in window)
    s += sum(_sign(x - v) for v in window)
    window.append(x)
    return s


def _halves(window: Sequence[float]) -> tuple[float, float]:
    """Medians of the earlier and the later half of the window."""
    half = len(window) // 2
    return statistics.median(window[:half]), statistics.median(window[-half:])


class GateAgainstGap(Detector):
    """Two comma-separated metrics, the gated (masked) fraction first and the mismatch second:
    active while the first falls and the second grows over the last `window` steps, both
    trends significant (Mann–Kendall |z| ≥ `z`) and both moves large (halves' medians by
    `fall_factor` and `rise_factor`)."""

    kind = "gate_vs_gap"
    defaults: ClassVar[dict[str, Any]] = {
        "window": 50, "z": 4.0, "fall_factor": 0.67, "rise_factor": 2.0, "min_gate": 1e-3,
    }

    def validate(self) -> None:
        keys = [key.strip() for key in self.metric.split(",") if key.strip()]
        if len(keys) != 2 or keys[0] == keys[1]:
            raise ValueError("gate_vs_gap watches two distinct metrics, comma-separated: the gated fraction, then the mismatch")
        self.gate_key, self.gap_key = keys
        _positive(self.params, "window", "z", "fall_factor", "rise_factor", "min_gate")
        window = self.params["window"]
        if not isinstance(window, int) or not 4 <= window <= MAX_WINDOW:
            raise ValueError(f"parameter 'window' must be a whole number of steps from 4 to {MAX_WINDOW}")
        if not self.params["fall_factor"] < 1 < self.params["rise_factor"]:
            raise ValueError("parameters 'fall_factor' must be below 1 and 'rise_factor' above 1")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        gate, gap = values.get(self.gate_key), values.get(self.gap_key)
        if gate is None or gap is None or not (math.isfinite(gate) and math.isfinite(gap)):
            return None
        p = self.params
        gates: list[float] = state.setdefault("gate", [])
        gaps: list[float] = state.setdefault("gap", [])
        state["s_gate"] = _push(gates, state.get("s_gate", 0), gate, p["window"])
        state["s_gap"] = _push(gaps, state.get("s_gap", 0), gap, p["window"])
        if len(gates) < p["window"]:
            return Signal(False, gate, "warming up")
        gate_z, gap_z = mann_kendall_z(gates, state["s_gate"]), mann_kendall_z(gaps, state["s_gap"])
        (gate_before, gate_after), (gap_before, gap_after) = _halves(gates), _halves(gaps)
        falling = gate_z <= -p["z"] and gate_before >= p["min_gate"] and gate_after <= p["fall_factor"] * gate_before
        growing = gap_z >= p["z"] and gap_after >= p["rise_factor"] * gap_before and gap_after > 0
        if not (falling and growing):
            return Signal(False, gate, "gate and mismatch not diverging")
        message = (
            f"{self.gate_key} falling ({gate_before:.4g} -> {gate_after:.4g}, trend z {gate_z:.1f}) while "
            f"{self.gap_key} grows ({gap_before:.4g} -> {gap_after:.4g}, trend z {gap_z:.1f}) over the last "
            f"{p['window']} steps: the gate is letting through a mismatch it no longer sees"
        )
        return Signal(True, gate, message, metric=f"{self.gate_key},{self.gap_key}")
