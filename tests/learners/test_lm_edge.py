"""The edge corpus's search (learners/lm/edge.py, `keel lm-edge`): outcomes, the next setting,
determinism and resumption from a directory, cells in turn. No learner runs here."""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter
from dataclasses import asdict

import pytest

from keel.eval_alerts import load_corpus
from learners.lm.edge import (
    ANCHOR_BELOW,
    CELLS,
    COLLAPSED,
    DEFAULT_LR,
    DIPPED,
    EXPLORE,
    HELD,
    MIN_STEP,
    SEED_BASE,
    SLOW,
    STEP,
    STUCK,
    TARGETS,
    Cell,
    EdgeRun,
    cell_of,
    centre,
    draw,
    format_report,
    outcome,
    plan,
    read_edge_runs,
    shortfall,
    tally,
)
from learners.lm.learner import LMConfig
from learners.lm.runfiles import write_run
from learners.lm_cli import _edge

STEPS = 1000


def _ramp(top: float, until: int = 300) -> list[float]:
    return [0.1 + (top - 0.1) * min(1.0, step / until) for step in range(STEPS)]


def _series(kind: str) -> dict[str, list[float]]:
    """A synthetic run of each outcome: its reward and its policy's entropy."""
    entropy = [1.0] * STEPS
    if kind == COLLAPSED:  # learns to 0.8, falls to 0.2 at step 400 and stays
        rewards = _ramp(0.8)[:400] + [0.2] * (STEPS - 400)
    elif kind == DIPPED:  # falls to 0.5 for 30 steps and comes back
        rewards = [0.5 if 400 <= step < 430 else value for step, value in enumerate(_ramp(0.8))]
    elif kind == HELD:
        rewards = _ramp(0.8)
    elif kind == SLOW:  # still climbing at the end, never 0.5
        rewards = [0.1 + 0.35 * step / STEPS for step in range(STEPS)]
    else:  # stuck: flat at 0.2 on a deterministic policy
        rewards, entropy = [0.2] * STEPS, [0.0] * STEPS
    return {"reward/mean": rewards, "policy/entropy": entropy}


def test_outcomes_are_read_from_the_smoothed_reward_and_the_entropy() -> None:
    for kind in (COLLAPSED, DIPPED, HELD, SLOW, STUCK):
        assert outcome(_series(kind)) == kind
    flat_alive = {"reward/mean": [0.2] * STEPS, "policy/entropy": [0.5] * STEPS}
    assert outcome(flat_alive) == SLOW  # not climbing, but still exploring
    assert outcome({"reward/mean": [0.2, math.nan] * 500, "policy/entropy": [1.0] * STEPS}) == STUCK


CELL = CELLS[0]


def _run(cell: Cell, index: int, x: float, kind: str) -> EdgeRun:
    """Run `index` of `cell` drawn around centre `x` (as plan draws it), with outcome `kind`."""
    offset, _ = draw(cell, index)
    return EdgeRun(f"{cell.name}-{index}", cell, index, math.exp(x + offset), kind, 0)


def _edge_index(cell: Cell, skip: int = 0) -> int:
    """The first index past `skip` whose run is not an anchor."""
    return next(i for i in range(skip, 100) if not draw(cell, i)[1])


def test_the_centre_moves_up_when_too_cold_down_when_too_hot_and_stays_on_a_collapse() -> None:
    x = math.log(2e-3)
    i = _edge_index(CELL)
    assert centre(CELL, [], x) == x
    for kind, direction in ((HELD, 1.0), (SLOW, 1.0), (DIPPED, 0.5), (STUCK, -1.0), (COLLAPSED, 0.0)):
        assert centre(CELL, [_run(CELL, i, x, kind)], 0.0) == pytest.approx(x + direction * STEP, abs=2e-3)
    # two steps up, then one down (a reversal halves the step), then up again (halves again)
    runs, at = [], x
    expected = [STEP, STEP, -STEP / 2, STEP / 4]
    kinds = [HELD, SLOW, STUCK, HELD]
    index = -1
    for kind, move in zip(kinds, expected, strict=True):
        index = _edge_index(CELL, index + 1)
        runs.append(_run(CELL, index, at, kind))
        at = centre(CELL, runs, 0.0)
        assert at == pytest.approx(math.log(runs[-1].lr) - draw(CELL, index)[0] + move, abs=1e-9)
    # the step never goes below MIN_STEP
    for _ in range(6):
        index = _edge_index(CELL, index + 1)
        kind = STUCK if len(runs) % 2 else HELD
        runs.append(_run(CELL, index, at, kind))
        previous, at = at, centre(CELL, runs, 0.0)
        assert abs(at - previous) == pytest.approx(MIN_STEP, abs=2e-3)


def test_an_anchor_runs_well_below_the_centre_and_does_not_move_it() -> None:
    anchor = next(i for i in range(100) if draw(CELL, i)[1])
    assert draw(CELL, anchor)[0] == -ANCHOR_BELOW
    x = math.log(3e-3)
    assert centre(CELL, [_run(CELL, anchor, x, HELD)], 0.0) == pytest.approx(x, abs=2e-3)
    shares = Counter(draw(cell, i)[1] for cell in CELLS for i in range(60))
    assert 0.12 < shares[True] / sum(shares.values()) < 0.22  # one in six


def _world(lr: float, edge: float | None) -> str:
    """A synthetic cell: too slow below edge/3, holds up to the edge, collapses up to 1.6 x the
    edge, stuck beyond; a cell with no edge (None) holds up to 2e-3 and is stuck beyond: it
    never falls, as most of this learner's cells."""
    if edge is None:
        return HELD if lr < 2e-3 else STUCK
    if lr < edge / 3:
        return SLOW
    if lr < edge:
        return HELD
    return COLLAPSED if lr < 1.6 * edge else STUCK


def _grow(count: int, edges: dict[Cell, float | None]) -> list[EdgeRun]:
    """Grow a corpus of `count` runs one at a time through plan, outcomes from `_world`."""
    runs: list[EdgeRun] = []
    for _ in range(count):
        (config,) = plan(runs)
        cell = cell_of(asdict(config))
        assert cell is not None
        runs.append(EdgeRun(config.name, cell, config.seed % 1000, config.lr, _world(config.lr, edges[cell]), config.lag))
    return runs


def test_the_search_converges_on_each_cells_edge() -> None:
    rng = random.Random(0)
    edges: dict[Cell, float | None] = {cell: math.exp(rng.uniform(math.log(4e-4), math.log(8e-3))) for cell in CELLS}
    runs = _grow(20 * len(CELLS), edges)
    counts = Counter(run.cell for run in runs)
    assert min(counts.values()) >= EXPLORE  # every cell had its turns
    late = [run for run in runs if run.index >= 10]
    share = sum(run.outcome == COLLAPSED for run in late) / len(late)
    assert share > 0.5  # after ten runs a cell draws most of its runs inside its band
    assert min(counts.values()) >= 12  # one turn in IN_TURN goes to the cell with the fewest runs
    for cell in CELLS:
        mine = [run for run in runs if run.cell == cell]
        x = centre(cell, mine, 0.0)
        assert math.log(edges[cell]) - MIN_STEP < x < math.log(1.6 * edges[cell]) + MIN_STEP  # type: ignore[arg-type]
        assert any(run.outcome in (HELD, SLOW) for run in mine)  # every cell keeps stable runs
    assert sum(run.outcome == COLLAPSED for run in runs) / len(runs) > 0.3


def test_after_their_turns_the_runs_go_to_the_cells_that_fall() -> None:
    """Most of this learner's cells hold at one learning rate and are stuck at the next, with
    no band where they fall: once every cell has had EXPLORE runs, the cells that do fall get
    most of the runs, and the others still get one now and then."""
    rng = random.Random(3)
    falling = set(rng.sample(list(CELLS), len(CELLS) // 6))
    edges: dict[Cell, float | None] = {
        cell: math.exp(rng.uniform(math.log(1e-3), math.log(4e-3))) if cell in falling else None for cell in CELLS
    }
    runs = _grow(12 * len(CELLS), edges)
    counts = Counter(run.cell for run in runs)
    assert min(counts.values()) >= EXPLORE
    after = [run for run in runs if run.index >= EXPLORE]
    assert sum(run.cell in falling for run in after) / len(after) > 0.6  # a sixth of the cells
    assert all(counts[cell] > EXPLORE for cell in CELLS)  # every cell still tried (one turn in IN_TURN)
    share = sum(run.outcome == COLLAPSED for run in runs) / len(runs)
    in_turn = len(falling) / len(CELLS)  # at most, had the cells only taken turns
    assert share > 2 * in_turn
    # deterministic: the same runs give the same next turns
    assert plan(runs, 4) == plan(list(reversed(runs)), 4)


def test_once_only_falls_without_mismatch_are_missing_only_fp32_cells_take_turns() -> None:
    """60 lasting collapses with mismatch and 10 without: 10 more of either kind are missing,
    and a fall without mismatch counts for both; 70 with mismatch: only those without count."""
    with_mismatch = [cell for cell in CELLS if cell.mismatch]
    without = [cell for cell in CELLS if not cell.mismatch]

    def corpus(fell_with: int, fell_without: int) -> list[EdgeRun]:
        runs = [EdgeRun(f"m{i}", with_mismatch[i % len(with_mismatch)], i // len(with_mismatch), 2e-3, COLLAPSED, 4) for i in range(fell_with)]
        runs += [EdgeRun(f"f{i}", without[i % len(without)], 100 + i // len(without), 2e-3, COLLAPSED, 0) for i in range(fell_without)]
        runs += [EdgeRun(f"h{i}", cell, 200 + k, 1e-3, HELD, 0 if not cell.mismatch else 4) for k in range(EXPLORE) for i, cell in enumerate(CELLS)]  # fmt: skip
        return runs

    assert shortfall(corpus(60, 10))["collapsed"] == 10 == shortfall(corpus(60, 10))["collapsed without mismatch"]
    for fell_with in (60, 70):
        picked = [cell_of(asdict(config)) for config in plan(corpus(fell_with, 10), len(CELLS))]
        assert picked and all(cell is not None and not cell.mismatch for cell in picked), fell_with
    # 20 of either kind missing, 10 of them without mismatch: every cell still takes turns.
    assert any(cell_of(asdict(config)).mismatch for config in plan(corpus(50, 10), len(CELLS)))  # type: ignore[union-attr]


def test_cells_take_turns_fewest_runs_first_then_in_order() -> None:
    first = plan([], len(CELLS))
    assert [cell_of(asdict(config)) for config in first] == list(CELLS)
    runs = _grow(len(CELLS) + 3, {cell: 2e-3 for cell in CELLS})
    assert [run.cell for run in runs[: len(CELLS)]] == list(CELLS)
    assert [run.cell for run in runs[len(CELLS) :]] == list(CELLS[:3])
    (next_one,) = plan(runs)
    assert cell_of(asdict(next_one)) == CELLS[3] and next_one.seed == SEED_BASE + 1000 * 3 + 1
    # a cell's settings: fp32 at lag 0, bf16/fp16 with a lag; one cell's runs differ in loss and shape
    for config in plan(runs, len(CELLS)):
        cell = cell_of(asdict(config))
        assert cell is not None and (config.lag == 0) == (cell.dtype == "fp32")
        config.check()
    mine = [c for c in (plan(_grow(k * len(CELLS), {cell: 2e-3 for cell in CELLS}), 1)[0] for k in range(4))]
    assert len({c.loss for c in mine}) > 1 and len({(c.prompts, c.group) for c in mine}) > 1


def test_a_new_cell_starts_from_its_siblings_or_the_default() -> None:
    (first,) = plan([])
    assert first.lr == pytest.approx(DEFAULT_LR[(CELL.family, CELL.mismatch)] * math.exp(draw(CELL, 0)[0]), rel=5e-3)
    sibling = next(c for c in CELLS[1:] if (c.family, c.clip, c.mismatch) == (CELL.family, CELL.clip, CELL.mismatch))
    x = math.log(5e-4)
    runs = [_run(sibling, i, x, COLLAPSED) for i in range(3)]
    (config,) = plan(runs)  # CELL has no run yet: it comes first, at its sibling's centre
    assert cell_of(asdict(config)) == CELL
    assert config.lr == pytest.approx(math.exp(centre(sibling, runs, 0.0) + draw(CELL, 0)[0]), rel=5e-3)


def test_the_plan_is_a_function_of_the_runs_in_any_order() -> None:
    runs = _grow(50, {cell: 1e-3 for cell in CELLS})
    shuffled = list(runs)
    random.Random(1).shuffle(shuffled)
    assert plan(runs, 8) == plan(shuffled, 8) == plan(list(runs), 8)


def _write(directory: object, config: LMConfig, kind: str) -> None:
    write_run(str(directory), {"name": config.name, "spec": asdict(config), "wall_s": 30.0, "series": _series(kind)})


def test_a_directory_of_k_runs_gives_the_next_config_as_the_search_did(tmp_path: object) -> None:
    edges = {cell: 1.5e-3 for cell in CELLS}
    grown = _grow(45, edges)
    # write the same runs as files, their outcomes as synthetic series
    written: list[EdgeRun] = []
    for _ in range(45):
        (config,) = plan(written)
        cell = cell_of(asdict(config))
        assert cell is not None
        _write(tmp_path, config, _world(config.lr, edges[cell]))
        written = read_edge_runs(str(tmp_path))
    assert sorted(run.name for run in written) == sorted(run.name for run in grown)
    assert plan(read_edge_runs(str(tmp_path)), 5) == plan(grown, 5)
    # files the search does not own are skipped: a regime-corpus run, an fp32 run with a lag
    _write(tmp_path, LMConfig(loss="ppo", lag=8, seed=17, steps=STEPS), HELD)
    _write(tmp_path, LMConfig(loss="ppo", lag=4, sampler_dtype="fp32", clip=0.0, digits=3, seed=SEED_BASE + 999), HELD)
    assert len(read_edge_runs(str(tmp_path))) == 45
    # and eval-alerts reads the folder unchanged, labels from the reward
    corpus = load_corpus(str(tmp_path))
    assert len(corpus) == 47
    collapsed = {run.name for run in written if run.outcome == COLLAPSED}
    assert {run.name for run in corpus if run.collapse_step is not None} == collapsed


def test_the_report_counts_lasting_collapses_with_and_without_mismatch(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    fp32 = next(c for c in CELLS if not c.mismatch)
    bf16 = next(c for c in CELLS if c.mismatch)
    runs = [
        _run(fp32, 0, -6.0, COLLAPSED), _run(fp32, 1, -6.0, HELD),
        _run(bf16, 0, -6.0, COLLAPSED), _run(bf16, 1, -6.0, COLLAPSED), _run(bf16, 2, -6.0, STUCK),
    ]  # fmt: skip
    runs[2:] = [EdgeRun(r.name, r.cell, r.index, r.lr, r.outcome, 8) for r in runs[2:]]
    assert tally(runs) == {"runs": 5, "collapsed": 3, "collapsed without mismatch": 1, "collapsed with mismatch": 2}
    report = format_report(runs)
    assert "5 runs, 3 lasting collapses (60%): 2 with mismatch, 1 without" in report
    assert "left to the targets: 295 runs, 77 collapsed, 19 collapsed without mismatch" in report
    # keel lm-edge --report on a folder
    config = plan([])[0]
    _write(tmp_path, config, COLLAPSED)
    args = argparse.Namespace(dir=str(tmp_path), report=True, runs=None, steps=None, device="cpu", jobs=1)
    assert _edge(args) == 0
    assert "1 runs, 1 lasting collapses (100%): 0 with mismatch, 1 without" in capsys.readouterr().out


def test_the_shortfall_is_what_each_target_still_lacks() -> None:
    collapsed = [_run(next(c for c in CELLS if c.mismatch), i, math.log(2e-3), COLLAPSED) for i in range(3)]
    without = [EdgeRun(f"fp32-{i}", next(c for c in CELLS if not c.mismatch), i, 2e-3, COLLAPSED, 0) for i in range(2)]
    held = [_run(CELLS[1], i, math.log(2e-3), HELD) for i in range(5)]
    assert shortfall(collapsed + without + held) == {
        "runs": TARGETS["runs"] - 10, "collapsed": TARGETS["collapsed"] - 5,
        "collapsed without mismatch": TARGETS["collapsed without mismatch"] - 2,
    }  # fmt: skip
    assert shortfall([]) == TARGETS
