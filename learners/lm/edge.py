"""The edge corpus (`keel lm-edge`): each cell's runs drawn where they learn and then fall.

A uniform draw of settings (the regime corpus, learners/lm/corpus.py) puts most runs far from
the edge: they never learn, or learn and never fall (6 % of its runs collapse for good). Here
every *cell* (loss family × sampler dtype × digits × clipping; the fp32 cells at lag 0, with
no sampler–learner mismatch at all) searches the learning rate at which its runs reach a
reward of 0.5 and then fall, and draws its runs around it:

- **Outcome** of a run (`outcome`, from its 10-step trailing mean reward, wire.labels):
  `collapsed` (a fall that lasts), `dipped` (fell 0.2 and regained, or fell at the end),
  `held` (reached 0.5, never fell), `slow` (never reached 0.5, still climbing or still
  exploring: entropy left) or `stuck` (never reached 0.5, the policy went deterministic on
  a poor answer: the learning rate burnt its entropy before it learned).
- **Search** (`centre`): a stochastic approximation on log lr, one iterate per cell. After
  each run the centre moves up after `held` and `slow` (too cold to fall), half a step up
  after `dipped`, down after `stuck` (too hot to learn) and stays after `collapsed`; the
  step starts at a doubling and halves at every reversal of direction (Kesten's rule), down
  to MIN_STEP, so the centre settles on the edge and goes on sampling around it.
- **Draw** (`plan`): a run's lr is the centre times a jitter of up to ±JITTER (log), drawn
  from the cell's name and the run's index alone; one run in ANCHOR_EVERY (on average, by the
  same draw) is an *anchor*, ANCHOR_BELOW below the centre, so every cell keeps stable runs.
  Anchors do not move the centre. Within a cell the loss (of its family), the batch shape
  the advantages (group, group_std) and, with a bf16/fp16 sampler, the lag (4, 8, 12) cycle
  with the run's index.
- **Turns** (`plan`): every cell gets EXPLORE runs in turn (fewest runs first, then CELLS'
  order); after that the runs go where runs fall: each turn goes to the cell with the highest
  draw from the Beta posterior of its share of lasting collapses, the corpus's share as the
  prior (Thompson sampling), except
  one turn in IN_TURN, which goes to the cell with the fewest runs. Most
  cells never fall for good on this learner (held at one lr, stuck at the next); the ones
  that do get most of the runs, and a cell that has not fallen yet still gets one now and then.
- **Targets** (TARGETS): once the lasting collapses still missing are no more than those
  without mismatch still missing, only the fp32 cells take turns: a fall with mismatch would
  count towards nothing the corpus lacks.
- **Resumable and deterministic**: nothing but the run files is read. A run's centre is
  recovered from its own lr (lr / its jitter), so the next config of every cell is a function
  of the directory's runs, and the turn's draws are seeded by the number of runs made. A cell
  with no run yet starts at the mean centre of its siblings (same family, clipping and
  mismatch) that have MIN_SIBLING runs, or at DEFAULT_LR.

The copy task is left out: none of its runs that fell had reached 0.5 (docs/lm.md, "Collapses
on the copy task"), so the collapse label cannot mark them.
"""

from __future__ import annotations

import math
import os
import random
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from learners.lm.corpus import REGIME_BATCHES, REGIME_STEPS
from learners.lm.learner import LMConfig
from learners.lm.runfiles import SUFFIX, read_run
from wire.labels import REACH, falls, smoothed

__all__ = [
    "ANCHOR_BELOW", "ANCHOR_EVERY", "CELLS", "DIRECTION", "EXPLORE", "EDGE_CLIPS", "EDGE_DIGITS", "EDGE_DTYPES",
    "FAMILY_LOSSES", "JITTER", "MISMATCH_LAGS", "SEED_BASE", "Cell", "EdgeRun", "cell_of", "centre",
    "draw", "format_report", "outcome", "plan", "read_edge_runs", "shortfall", "tally",
]  # fmt: skip

FAMILY_LOSSES: dict[str, tuple[str, ...]] = {
    "unbounded": ("ppo", "importance_sampling", "ppo", "gspo", "dro"),
    "bounded": ("cispo", "tis", "mis", "cispo_floor"),
    "ratio-free": ("reinforce", "stable_proxy"),
}
"""The losses a family's runs cycle through (keel/regimes.py's families). FlashREINFORCE is
left out: it never reached a reward of 0.5 in the regime corpus (0 of 19 runs)."""
EDGE_DTYPES = ("fp32", "bf16", "fp16")
"""fp32 cells run at lag 0: no mismatch at all. bf16 and fp16 cells cycle MISMATCH_LAGS."""
EDGE_DIGITS = ((3, 4), (2,))
"""Digits to sort, in the rounds they were added. The 2-digit cells came last: on the easy
task PPO learns within ~150 steps and then falls often, at lag 0 with an fp32 sampler too
(docs/lm.md, "The edge corpus"); they take the last places in CELLS, so the earlier cells keep
theirs (and their runs' seeds). A new round goes at the end."""
EDGE_CLIPS = (0.0, 2.0)
"""Max grad norm (0: none). At 1 or below, 0 of the 19 regime runs that reached 0.5 fell for good."""
MISMATCH_LAGS = (4, 8, 12)
ADVANTAGES = ("group", "group_std")
"""GRPO's advantages without and with the group's standard deviation, alternately: at lag 0
the copy task's one lasting fall came with group_std (docs/lm.md)."""
SEED_BASE = 100_000
"""A run's seed is SEED_BASE + 1000 × its cell's place in CELLS + its index in the cell."""

STEP = math.log(2.0)
"""The search's first step on log lr: a doubling."""
MIN_STEP = math.log(2.0) / 4
JITTER = math.log(1.25)
"""A run's lr is the centre times up to 1.25 either way."""
ANCHOR_EVERY = 6
ANCHOR_BELOW = math.log(4.0)
"""An anchor runs at a quarter of the centre's lr: a stable run of the cell."""
LR_RANGE = (1e-4, 2e-2)
"""The centre stays within it."""
MIN_SIBLING = 1
EXPLORE = 4
"""Runs every cell gets in turn before the turns go to the cells whose runs fall (`plan`)."""
IN_TURN = 3
"""One turn in IN_TURN still goes to the cell with the fewest runs: every cell's search goes on."""
PRIOR_RUNS = 5
"""The weight, in runs, of the corpus's share of lasting collapses in each cell's prior."""

COLLAPSED, DIPPED, HELD, SLOW, STUCK = "collapsed", "dipped", "held", "slow", "stuck"
OUTCOMES = (COLLAPSED, DIPPED, HELD, SLOW, STUCK)
DIRECTION = {COLLAPSED: 0.0, DIPPED: 0.5, HELD: 1.0, SLOW: 1.0, STUCK: -1.0}
"""Where a run's outcome moves its cell's centre, in steps (up: a higher lr)."""
CLIMBING = 0.03
"""A run that never learned is `slow` when its smoothed reward over its last 200 steps is
at least this much above the 200 before, or its policy keeps ENTROPY_LEFT nats of entropy."""
ENTROPY_LEFT = 0.2


@dataclass(frozen=True)
class Cell:
    family: str
    dtype: str
    digits: int
    clip: float

    @property
    def name(self) -> str:
        return f"{self.family}-{self.dtype}-d{self.digits}-clip{self.clip:g}"

    @property
    def mismatch(self) -> bool:
        return self.dtype != "fp32"


CELLS: tuple[Cell, ...] = tuple(
    Cell(family, dtype, digits, clip)
    for digits_round in EDGE_DIGITS
    for clip in EDGE_CLIPS
    for digits in digits_round
    for dtype in EDGE_DTYPES
    for family in FAMILY_LOSSES
)
"""54 cells, in the order they take turns (families, then dtypes, change fastest; the 2-digit
cells after the rest)."""

DEFAULT_LR: dict[tuple[str, bool], float] = {
    ("unbounded", True): 1.5e-3,
    ("bounded", True): 2e-3,
    ("ratio-free", True): 2e-3,
    ("unbounded", False): 2e-3,
    ("bounded", False): 2e-3,
    ("ratio-free", False): 2e-3,
}
"""(family, mismatch): where a cell's search starts when no sibling has runs yet (the regime
corpus's lasting collapses came at 5e-4 to 3e-3, most of them 1.5e-3 to 3e-3; PPO at lag 0,
fp32, 3 digits, no clipping held at 1.5e-3 and 2e-3 and went deterministic at 0.36 by 3e-3)."""


def _family(loss: str) -> str | None:
    return next((family for family, losses in FAMILY_LOSSES.items() if loss in losses), None)


def cell_of(spec: Mapping[str, Any]) -> Cell | None:
    """The cell of an edge run's config (None: not an edge run)."""
    family = _family(str(spec.get("loss")))
    if family is None or int(spec.get("seed", -1)) < SEED_BASE or spec.get("task", "sort") != "sort":
        return None
    cell = Cell(family, str(spec.get("sampler_dtype")), int(spec.get("digits", -1)), float(spec.get("clip", -1)))
    if cell not in CELLS or (not cell.mismatch and spec.get("lag") != 0):
        return None
    return cell


def outcome(series: Mapping[str, Sequence[float]]) -> str:
    """collapsed, dipped, held, slow or stuck (see the module), from a run's series."""
    rewards = list(series.get("reward/mean", []))
    if not rewards or not all(math.isfinite(value) for value in rewards):
        return STUCK
    smooth = smoothed(rewards)
    fall = falls(smooth)
    if fall.collapse is not None:
        return COLLAPSED
    if fall.dips or fall.unjudged is not None:
        return DIPPED
    if max(smooth) >= REACH:
        return HELD
    late = smooth[-200:]
    before = smooth[-400:-200] or smooth[:1]
    entropy = [value for value in series.get("policy/entropy", [])[-100:] if math.isfinite(value)]
    if statistics.fmean(late) - statistics.fmean(before) >= CLIMBING:
        return SLOW
    return SLOW if entropy and statistics.fmean(entropy) >= ENTROPY_LEFT else STUCK


@dataclass(frozen=True)
class EdgeRun:
    """One run of the directory, as the search reads it."""

    name: str
    cell: Cell
    index: int
    """Its place in its cell (its seed's last three digits)."""
    lr: float
    outcome: str
    lag: int
    wall_s: float | None = None


def draw(cell: Cell, index: int) -> tuple[float, bool]:
    """(log offset of run `index` of `cell` from its centre, whether it is an anchor): drawn
    from the cell's name and the index alone."""
    rng = random.Random(f"keel-lm-edge/{cell.name}/{index}")
    anchor = rng.random() < 1 / ANCHOR_EVERY
    jitter = rng.uniform(-JITTER, JITTER)
    return (-ANCHOR_BELOW if anchor else jitter), anchor


def _clamp(x: float) -> float:
    return min(max(x, math.log(LR_RANGE[0])), math.log(LR_RANGE[1]))


def centre(cell: Cell, runs: Sequence[EdgeRun], start: float) -> float:
    """The cell's centre (log lr) after `runs` (its own, any order), from `start` when none."""
    x, reversals, last = start, 0, 0.0
    for run in sorted(runs, key=lambda r: r.index):
        offset, anchor = draw(cell, run.index)
        x = _clamp(math.log(run.lr) - offset)  # the centre this run was drawn around
        if anchor:
            continue
        direction = DIRECTION[run.outcome]
        if direction:
            sign = math.copysign(1.0, direction)
            reversals += bool(last) and sign != last
            last = sign
            x = _clamp(x + direction * max(MIN_STEP, STEP / 2**reversals))
    return x


def _start(cell: Cell, by_cell: Mapping[Cell, Sequence[EdgeRun]]) -> float:
    siblings = [
        other for other in CELLS
        if other != cell and (other.family, other.clip, other.mismatch) == (cell.family, cell.clip, cell.mismatch)
        and len(by_cell.get(other, ())) >= MIN_SIBLING
    ]  # fmt: skip
    if siblings:
        return statistics.fmean(centre(other, by_cell[other], 0.0) for other in siblings)
    return math.log(DEFAULT_LR[(cell.family, cell.mismatch)])


def _config(base: LMConfig, cell: Cell, index: int, x: float) -> LMConfig:
    """Run `index` of `cell` around the centre `x`: the loss, batch shape, advantages and lag
    cycle with the index (shifted by the cell's place, so the cells' first runs differ too)."""
    place = CELLS.index(cell)
    k = index + place
    losses = FAMILY_LOSSES[cell.family]
    prompts, group = REGIME_BATCHES[(k + k // len(losses)) % len(REGIME_BATCHES)]
    offset, _ = draw(cell, index)
    lr = float(f"{math.exp(x + offset):.3g}")
    return replace(
        base, task="sort", loss=losses[k % len(losses)], sampler_dtype=cell.dtype,
        lag=MISMATCH_LAGS[k % len(MISMATCH_LAGS)] if cell.mismatch else 0,
        digits=cell.digits, clip=cell.clip, prompts=prompts, group=group, lr=lr,
        adv=ADVANTAGES[(k // 2) % len(ADVANTAGES)], agg="", seed=SEED_BASE + 1000 * place + index,
    )  # fmt: skip


def _turn(i: int, mine: Sequence[EdgeRun], made: int, share: float) -> tuple[int, float, int]:
    """Where cell `i` stands in the next turn (lowest first): the cells with fewer than
    EXPLORE runs, fewest first, and on one turn in IN_TURN every cell so; otherwise by a draw
    from the Beta posterior of its share of lasting collapses, highest first, seeded by the
    runs made so far and the cell. The prior is the corpus's share (`share`) as PRIOR_RUNS runs
    would show it: with tens of cells that have not fallen yet, a flat prior lets one of them
    draw highest nearly every turn."""
    if len(mine) < EXPLORE or made % IN_TURN == 0:
        return (0, float(len(mine)), i)
    fell = sum(run.outcome == COLLAPSED for run in mine)
    rng = random.Random(f"keel-lm-edge/turn/{made}/{CELLS[i].name}")
    a, b = PRIOR_RUNS * share + fell, PRIOR_RUNS * (1 - share) + len(mine) - fell
    return (1, -rng.betavariate(a, b), i)


def plan(runs: Iterable[EdgeRun], count: int = 1, base: LMConfig | None = None) -> list[LMConfig]:
    """The next `count` configs (at most one per cell), given the runs already made, each at
    its cell's search's next lr; the cells in `_turn`'s order."""
    base = base or LMConfig(steps=REGIME_STEPS)
    runs = list(runs)
    by_cell: dict[Cell, list[EdgeRun]] = {}
    for run in runs:
        by_cell.setdefault(run.cell, []).append(run)
    made = len(runs)
    share = (sum(run.outcome == COLLAPSED for run in runs) + 1) / (made + 2)
    order = sorted(range(len(CELLS)), key=lambda i: _turn(i, by_cell.get(CELLS[i], ()), made, share))
    short = shortfall(runs)
    if short["collapsed without mismatch"] and short["collapsed"] <= short["collapsed without mismatch"]:
        # Only a fall without mismatch still counts towards every target: the turns go to the
        # cells where one can happen (a fall with mismatch would add nothing the corpus lacks).
        order = [i for i in order if not CELLS[i].mismatch]
    configs = []
    for i in order[: max(0, min(count, len(CELLS)))]:
        cell = CELLS[i]
        mine = by_cell.get(cell, [])
        index = max((run.index for run in mine), default=-1) + 1
        configs.append(_config(base, cell, index, centre(cell, mine, _start(cell, by_cell))))
    return configs


def read_edge_runs(
    directory: str | os.PathLike[str], cache: dict[str, EdgeRun | None] | None = None
) -> list[EdgeRun]:
    """The edge runs of `directory` (other run files are skipped); `cache` (file name → run)
    keeps files already read from being read again."""
    cache = {} if cache is None else cache
    runs = []
    for path in sorted(Path(directory).glob(f"*{SUFFIX}")):
        if path.name not in cache:
            body = read_run(path)
            spec = body["spec"]
            cell = cell_of(spec)
            cache[path.name] = None if cell is None else EdgeRun(
                body["name"], cell, int(spec["seed"]) % 1000, float(spec["lr"]), outcome(body["series"]),
                int(spec["lag"]), body.get("wall_s"),
            )  # fmt: skip
        run = cache[path.name]
        if run is not None:
            runs.append(run)
    return runs


# -- the tally ---------------------------------------------------------------------------

TARGETS = {"runs": 300, "collapsed": 80, "collapsed without mismatch": 20}
"""What issue 45 asks of the corpus."""


def tally(runs: Sequence[EdgeRun]) -> dict[str, int]:
    """Runs, lasting collapses, and those with no mismatch (fp32 sampler, lag 0)."""
    collapsed = [run for run in runs if run.outcome == COLLAPSED]
    return {
        "runs": len(runs),
        "collapsed": len(collapsed),
        "collapsed without mismatch": sum(not run.cell.mismatch and run.lag == 0 for run in collapsed),
        "collapsed with mismatch": sum(run.cell.mismatch or run.lag > 0 for run in collapsed),
    }


def shortfall(runs: Sequence[EdgeRun]) -> dict[str, int]:
    """What the corpus still lacks of each of TARGETS (0: met)."""
    totals = tally(runs)
    return {key: max(0, target - totals[key]) for key, target in TARGETS.items()}


def format_report(runs: Sequence[EdgeRun]) -> str:
    """Per cell: its runs by outcome and its search's centre; then the totals and targets."""
    by_cell: dict[Cell, list[EdgeRun]] = {}
    for run in runs:
        by_cell.setdefault(run.cell, []).append(run)
    head = f"{'cell':<28}{'runs':>5}" + "".join(f"{name:>10}" for name in OUTCOMES) + f"{'next lr':>9}"
    lines = [head]
    for cell in CELLS:
        mine = by_cell.get(cell, [])
        counts = Counter(run.outcome for run in mine)
        x = centre(cell, mine, _start(cell, by_cell))
        lines.append(
            f"{cell.name:<28}{len(mine):>5}" + "".join(f"{counts[name]:>10}" for name in OUTCOMES) + f"{math.exp(x):>9.2g}"
        )
    by_family = Counter(run.cell.family for run in runs if run.outcome == COLLAPSED)
    by_dtype = Counter(run.cell.dtype for run in runs if run.outcome == COLLAPSED)
    totals = tally(runs)
    share = totals["collapsed"] / totals["runs"] if totals["runs"] else math.nan
    walls = [run.wall_s for run in runs if run.wall_s]
    lines += [
        f"lasting collapses by family: {dict(sorted(by_family.items()))}; by sampler dtype: {dict(sorted(by_dtype.items()))}",
        f"{totals['runs']} runs, {totals['collapsed']} lasting collapses ({share:.0%}): "
        f"{totals['collapsed with mismatch']} with mismatch, {totals['collapsed without mismatch']} without (fp32, lag 0); "
        f"all outcomes {dict(Counter(run.outcome for run in runs))}",
        "left to the targets: " + ", ".join(f"{short} {key}" for key, short in shortfall(runs).items()),
    ]
    if walls:
        lines.append(f"wall time: {statistics.median(walls):.0f} s a run (median), {sum(walls) / 3600:.1f} h in all")
    return "\n".join(lines) + "\n"
