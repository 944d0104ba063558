"""Calibrate `keel parity` on the real learner: seeds of one engine must come out the same,
a changed engine different.

    .venv/bin/python -m bench.parity_calibration grow [--limit N]   # run what corpora/parity/ lacks
    .venv/bin/python -m bench.parity_calibration score              # the figures of docs/parity.md

`grow` runs `keel lm`'s loop (learners.lm.learner.train, tiny model, the sort task with 3
digits, 8 prompts x 8 samples, 1,000 steps) for every run of `plan()` not yet in
`corpora/parity/`, one at a time, and writes each finished run there as one compact file
(the format of `keel lm-regimes`, learners/lm/runfiles.py: gzip JSON, each series float32 in
base64), so a killed `grow` resumes where it stopped. A run records the per-step values
`keel parity` compares: the mismatch scalars, and the tail shares the server would take from
the `mismatch/log_ratio` histogram (|ℓ| ≥ τ and ℓ ≤ −τ for each default τ, the NaN share),
computed here from the same tokens.

`score` reads the corpus and decides every pair with `wire.parity.compare`, the code
`keel parity` and the compare page decide with, on the first 100, 300 and 1,000 steps:

- *same engine*: two seeds of one setting (loss, lag, sampler dtype): the share called
  `different` is the false-alarm rate a CI gate would see; the share `same` is what must stay
  at 95 % or more;
- *dtype*: fp32 against bf16 and fp16, bf16 against fp16, same loss and lag, other seeds;
- *planted*: the bf16 engine against the same engine whose sampler adds Gaussian noise of
  σ nats to its logits (`keel lm --sampler-logit-noise`), other seeds: power against σ;
- with two seeds a side (`keel parity A1,A2 B1,B2`): the same, grouped.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from learners.lm.runfiles import done_names, read_dir, write_run

CORPUS = Path(__file__).resolve().parents[1] / "corpora" / "parity"
LENGTHS = (100, 300, 1000)
"""The run lengths scored: the first L steps of each run (a run of L steps is the first L
steps of a longer one: nothing in the learner depends on the planned length)."""
STEPS = 1000
LOSSES = ("cispo", "ppo", "importance_sampling", "tis")
LAGS = (0, 4)
DTYPES = ("bf16", "fp16", "fp32")
SEEDS = (1, 2, 3, 4)
PLANTED_SEEDS = (5, 6)
"""Two more seeds of the planted-on engine and its changes: three seeds a side."""
NOISES = (0.002, 0.005, 0.01, 0.02)
"""σ of the planted change (nats on each logit), adding about σ²/2 nats of KL: a bf16
sampler's own KL on this task grows from ~1e-6 nats at step 100 to ~1e-5 at step 1,000, so
these span a change too small to matter to one of orders of magnitude (`score` prints the
KL ratio each makes)."""
PLANTED_ON = ("cispo", 0, "bf16")


# -- the corpus -----------------------------------------------------------------------------


def plan() -> list[Any]:
    """Every run of the corpus, in the order `grow` makes them: two seeds of every setting
    first (so pairs exist early), the planted changes, then the other seeds, then two more
    seeds of the planted-on engine with and without its changes."""
    from learners.lm.learner import LMConfig

    base = LMConfig(steps=STEPS, digits=3, prompts=8, group=8, size="tiny")
    settings = list(itertools.product(LOSSES, LAGS, DTYPES))
    loss, lag, dtype = PLANTED_ON

    def seeds(chosen: Sequence[int]) -> list[Any]:
        engines = [replace(base, loss=lo, lag=la, sampler_dtype=dt, seed=s) for s in chosen for lo, la, dt in settings]
        planted = [
            replace(base, loss=loss, lag=lag, sampler_dtype=dtype, seed=s, logit_noise=noise)
            for s in chosen
            for noise in NOISES
        ]
        return engines + planted

    more = [
        replace(base, loss=loss, lag=lag, sampler_dtype=dtype, seed=s, logit_noise=noise)
        for s in PLANTED_SEEDS
        for noise in (0.0, *NOISES)
    ]
    return seeds(SEEDS[:2]) + seeds(SEEDS[2:]) + more


def corpus(directory: Path = CORPUS) -> Iterator[dict[str, Any]]:
    yield from read_dir(directory)


def _recorder() -> Any:
    """A `Recorder` that also keeps, per step, the shares of the answer tokens in each tail of
    ℓ = log π − log μ (what `wire.parity.histogram_values` takes from the server's
    `mismatch/log_ratio` histogram), without a server."""
    import torch

    from learners.lm.learner import Recorder
    from wire.parity import DEFAULT_TAUS, NAN_KEY, tail_key

    class TailRecorder(Recorder):
        def log_inputs(self, step: int, inputs: Any, *, metrics: Any = None, decode: Any = None) -> None:
            super().log_inputs(step, inputs, metrics=metrics, decode=decode)
            with torch.no_grad():
                ell = (inputs.learner_logprobs.double() - inputs.sampler_logprobs.double())[inputs.mask.bool()]
                finite = ell[torch.isfinite(ell)]
                shares = {NAN_KEY: float(torch.isnan(ell).double().mean()) if ell.numel() else math.nan}
                for tau in DEFAULT_TAUS:
                    count = max(finite.numel(), 1)
                    shares[tail_key(tau, low=False)] = float((finite.abs() >= tau).sum()) / count
                    shares[tail_key(tau, low=True)] = float((finite < -tau).sum()) / count
            self.log(step, shares)

    return TailRecorder()


def _kept(series: Mapping[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    from wire.parity import HISTOGRAM_KEY, SCALAR_KEYS

    return {k: v for k, v in series.items() if k in SCALAR_KEYS or k.startswith(f"{HISTOGRAM_KEY}:") or k == "reward/mean"}


def grow(directory: Path, limit: int | None) -> int:
    import torch

    from learners.lm.learner import train

    torch.set_num_threads(1)
    done = done_names(directory)
    missing = [config for config in plan() if config.name not in done]
    print(f"parity corpus: {len(done)} runs in {directory}, {len(missing)} to make", flush=True)
    for made, config in enumerate(missing[:limit] if limit is not None else missing, start=1):
        recorder = _recorder()
        started = time.perf_counter()
        train(config, recorder)
        wall_s = time.perf_counter() - started
        run = {"name": config.name, "spec": asdict(config), "wall_s": round(wall_s, 1), "series": _kept(recorder.series)}
        write_run(directory, run, keys=None)
        print(f"{made}/{len(missing)} {config.name} {wall_s:.0f} s", flush=True)
    return 0


# -- scoring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    name: str
    loss: str
    lag: int
    dtype: str
    noise: float
    seed: int
    series: Mapping[str, Sequence[float]]

    @property
    def engine(self) -> tuple[str, int, str, float]:
        return self.loss, self.lag, self.dtype, self.noise


Sides = tuple[Sequence[Run], Sequence[Run]]
"""A comparison: A's runs and B's."""


def runs(directory: Path = CORPUS) -> list[Run]:
    return [
        Run(body["name"], spec["loss"], spec["lag"], spec["sampler_dtype"], spec.get("logit_noise", 0.0), spec["seed"],
            _kept(body["series"]))
        for body in corpus(directory)
        for spec in [body["spec"]]
    ]  # fmt: skip


def _head(series: Mapping[str, Sequence[float]], length: int) -> dict[str, list[float]]:
    return {key: list(values[:length]) for key, values in series.items() if not key.startswith("reward/")}


def _verdict(a: Sequence[Run], b: Sequence[Run], length: int) -> Any:
    from wire.parity import compare_groups

    return compare_groups([_head(r.series, length) for r in a], [_head(r.series, length) for r in b])


def pairs_same(found: Sequence[Run]) -> list[tuple[Run, Run]]:
    by_engine: dict[Any, list[Run]] = {}
    for run in found:
        by_engine.setdefault(run.engine, []).append(run)
    return [(x, y) for group in by_engine.values() for x, y in itertools.combinations(sorted(group, key=lambda r: r.seed), 2)]


def pairs_dtype(found: Sequence[Run]) -> list[tuple[Run, Run]]:
    plain = [r for r in found if not r.noise]
    return [
        (x, y) for x in plain for y in plain
        if (x.loss, x.lag) == (y.loss, y.lag) and x.seed != y.seed and DTYPES.index(x.dtype) < DTYPES.index(y.dtype)
    ]  # fmt: skip


def _kl_ratio(pairs: Sequence[Sides], length: int) -> float:
    """The median over pairs of B/A of the mean KL over the first `length` steps: the size of
    the change a planted σ makes at that length."""
    ratios = sorted(
        statistics.fmean(v for r in b for v in r.series["mismatch/kl"][:length])
        / statistics.fmean(v for r in a for v in r.series["mismatch/kl"][:length])
        for a, b in pairs
    )
    return ratios[len(ratios) // 2] if ratios else math.nan


def pairs_planted(found: Sequence[Run], noise: float) -> list[tuple[Run, Run]]:
    loss, lag, dtype = PLANTED_ON
    base = [r for r in found if r.engine == (loss, lag, dtype, 0.0)]
    changed = [r for r in found if r.engine == (loss, lag, dtype, noise)]
    return [(x, y) for x in base for y in changed if x.seed != y.seed]


def _rates(pairs: Sequence[Sides], length: int) -> dict[str, float]:
    """The share of `pairs` given each verdict on their first `length` steps."""
    counts = {"same": 0, "different": 0, "cannot tell": 0, "incomparable": 0}
    for a, b in pairs:
        counts[_verdict(a, b, length).verdict] += 1
    return {verdict: count / len(pairs) for verdict, count in counts.items()} if pairs else {}


def _grouped(group: Sequence[Run], size: int) -> list[Sides]:
    """Every split of one engine's runs into two disjoint sides of `size` seeds (each once)."""
    splits: list[Sides] = []
    for a in itertools.combinations(group, size):
        rest = [r for r in group if r not in a]
        splits += [(a, b) for b in itertools.combinations(rest, size) if a[0].seed < b[0].seed]
    return splits


def _planted_groups(found: Sequence[Run], noise: float, size: int) -> list[Sides]:
    """`size` seeds of the planted-on engine against `size` other seeds of it with the change."""
    loss, lag, dtype = PLANTED_ON
    base = sorted((r for r in found if r.engine == (loss, lag, dtype, 0.0)), key=lambda r: r.seed)
    changed = sorted((r for r in found if r.engine == (loss, lag, dtype, noise)), key=lambda r: r.seed)
    chosen: list[Sides] = [
        (a, b) for a in itertools.combinations(base, size) for b in itertools.combinations(changed, size)
        if not {r.seed for r in a} & {r.seed for r in b}
    ]  # fmt: skip
    return chosen


def _one_a_side(pairs: Sequence[tuple[Run, Run]]) -> list[Sides]:
    return [((x,), (y,)) for x, y in pairs]


def comparisons(found: Sequence[Run]) -> list[tuple[str, list[Sides]]]:
    """(label, the pairs of sides it scores): what the docs' table reports."""
    plain = [r for r in found if not r.noise]
    by_engine: dict[Any, list[Run]] = {}
    for run in plain:
        by_engine.setdefault(run.engine, []).append(run)
    rows: list[tuple[str, list[Sides]]] = [
        ("same engine, 1 run a side", _one_a_side(pairs_same(plain))),
        *(
            (f"same engine, {size} seeds a side", [s for g in by_engine.values() for s in _grouped(sorted(g, key=lambda r: r.seed), size)])
            for size in (2, 3)
        ),
    ]
    for lag in LAGS:
        for low, high in (("fp32", "bf16"), ("fp32", "fp16"), ("bf16", "fp16")):
            chosen = [(x, y) for x, y in pairs_dtype(plain) if {x.dtype, y.dtype} == {low, high} and x.lag == lag]
            rows.append((f"{low} vs {high}, lag {lag}", _one_a_side(chosen)))
    for noise in NOISES:
        rows.append((f"bf16 vs bf16 + noise {noise:g}, 1 run a side", _one_a_side(pairs_planted(found, noise))))
        for size in (2, 3):
            rows.append((f"bf16 vs bf16 + noise {noise:g}, {size} seeds a side", _planted_groups(found, noise, size)))
    return rows


def score(directory: Path) -> int:
    found = runs(directory)
    width = 48
    print(f"{len(found)} runs in {directory}; per comparison, the share of pairs called same / different / cannot tell")
    print(f"{'comparison (first L steps of each run)':<{width}} {'pairs':>5}" + "".join(f"  {f'L = {n}':<24}" for n in LENGTHS))
    for label, pairs in comparisons(found):
        cells = []
        for length in LENGTHS:
            rates = _rates(pairs, length)
            cell = "-" if not rates else f"{rates['same']:.0%}/{rates['different']:.0%}/{rates['cannot tell']:.0%}"
            if rates and rates["incomparable"]:
                cell += f" ({rates['incomparable']:.0%} inc.)"
            if rates and "noise" in label:
                cell += f" KL {_kl_ratio(pairs, length):.2g}x"
            cells.append(cell)
        print(f"{label:<{width}} {len(pairs):>5}" + "".join(f"  {cell:<24}" for cell in cells))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    grow_parser = commands.add_parser("grow", help="run the corpus's missing runs, one at a time")
    grow_parser.add_argument("--limit", type=int, default=None, metavar="N", help="make at most N runs")
    commands.add_parser("score", help="decide every pair of the corpus and print the figures")
    for sub in commands.choices.values():
        sub.add_argument("--dir", type=Path, default=CORPUS, help=f"the corpus (default {CORPUS})")
    args = parser.parse_args(argv)
    if args.command == "grow":
        return grow(args.dir, args.limit)
    return score(args.dir)


if __name__ == "__main__":
    sys.exit(main())
