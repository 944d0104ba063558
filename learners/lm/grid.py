"""`keel lm-grid`: many `keel lm` runs in worker processes, their table, corpus and lead times.

Each run is a full asynchronous learner (learner.train) in its own process (one
torch thread for the learner, one for its sampler), recorded step by step with
a `Recorder`; `--server` also streams it live with a Monitor. The corpus (`--json`)
holds every run's config, its per-step series of every logged key and its
collapse label: wire.labels (the reward reached >= 0.5, fell >= 0.2 below its
running peak and did not regain within 0.1 of it in the next 100 steps) applied to the
10-step trailing mean of `reward/mean`, because one batch of 16 prompts is too noisy
for it: single-step dips of 0.2 happen in runs whose reward climbs steadily. The label
on the raw per-step reward is kept beside it (`collapse_step_raw`).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from typing import Any

from learners.lm.learner import LMConfig
from wire.labels import collapse_step, smoothed

__all__ = [
    "CLIMB_FACTOR",
    "DEFAULT_LOSSES",
    "climb_step",
    "collapse_step",
    "format_collapses",
    "format_leads",
    "format_table",
    "grid_configs",
    "lead_times",
    "run_grid",
    "run_one",
    "smoothed",
]

DEFAULT_LOSSES = (
    "importance_sampling",
    "ppo",
    "cispo",
    "tis",
    "mis",
    "stable_proxy",
    "flash_reinforce",
    "reinforce",
)
FINAL_WINDOW = 50
"""Final reward = mean reward/mean over the last 50 steps."""
CLIMB_FACTOR = 3.0
"""A metric has climbed when its 10-step rolling median exceeds 3x its healthy baseline."""
CLIMB_WINDOW = 10
BASELINE_WINDOW = 50
"""The healthy baseline: the metric's median over the 50 steps up to reward first reaching 0.5."""


def grid_configs(
    base: LMConfig,
    losses: Sequence[str],
    lags: Sequence[int],
    dtypes: Sequence[str],
    seeds: Sequence[int],
) -> list[LMConfig]:
    """Every combination, loss-major."""
    return [
        replace(base, loss=loss, lag=lag, sampler_dtype=dtype, seed=seed)
        for loss, lag, dtype, seed in itertools.product(losses, lags, dtypes, seeds)
    ]


def _first_reach(rewards: Sequence[float], reach: float = 0.5) -> int | None:
    return next((step for step, reward in enumerate(rewards) if reward >= reach), None)


def climb_step(values: Sequence[float], rewards: Sequence[float]) -> int | None:
    """First step after the reward first reached 0.5 where `values` climbed (CLIMB_FACTOR).

    NaN/Inf count as a climb (a non-finite ratio or KL is the loudest signal there is).
    """
    reached = _first_reach(smoothed(rewards))
    if reached is None:
        return None
    healthy = [v for v in values[max(0, reached - BASELINE_WINDOW) : reached + 1] if math.isfinite(v)]
    if not healthy:
        return None
    baseline = statistics.median(healthy)
    for step in range(reached + 1, len(values)):
        window = values[max(0, step - CLIMB_WINDOW + 1) : step + 1]
        if not all(math.isfinite(v) for v in window[-1:]):
            return step
        if statistics.median(window) > CLIMB_FACTOR * baseline:
            return step
    return None


def run_one(config: dict[str, Any], server: str | None, project: str, token: str | None) -> dict[str, Any]:
    """One run in this process; its spec, series and label (the worker of `run_grid`)."""
    import torch

    from learners.lm.learner import Recorder, Tee, run_config, train
    from trainer_hooks.monitor import Monitor

    torch.set_num_threads(1)  # the learner's thread; the sampler's thread is the other core
    spec = LMConfig(**config)
    recorder = Recorder()
    if server:
        with Monitor(
            server, run_name=spec.name, project=project, group=spec.loss,
            config=run_config(spec), tags=("lm", "lm-grid"), token=token,
        ) as monitor:  # fmt: skip
            result = train(spec, Tee(recorder, monitor))
    else:
        result = train(spec, recorder)
    rewards = recorder.series["reward/mean"]
    return {
        "name": spec.name,
        "spec": asdict(spec),
        "collapse_step": collapse_step(smoothed(rewards)),
        "collapse_step_raw": collapse_step(rewards),
        "final_reward": statistics.fmean(rewards[-FINAL_WINDOW:]),
        "wall_s": result.wall_s,
        "learner_tokens_per_s": result.learner_tokens_per_s,
        "sampler_tokens_per_s": result.sampler_tokens_per_s,
        "series": recorder.series,
    }


def _worker_init() -> None:
    """In a worker: get SIGTERM when the grid process dies, however it dies (Linux only)."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass


def run_grid(
    configs: Sequence[LMConfig],
    *,
    jobs: int,
    server: str | None = None,
    project: str = "default",
    token: str | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every config, `jobs` processes at a time; results in the order of `configs`."""
    results: list[dict[str, Any] | None] = [None] * len(configs)
    # spawn, not fork: a forked child would inherit torch's thread pools and locks.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_worker_init
    ) as pool:
        futures = {
            pool.submit(run_one, asdict(config), server, project, token): index
            for index, config in enumerate(configs)
        }
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if on_done is not None:
                on_done(result)
    return [result for result in results if result is not None]


def _max(values: Sequence[float]) -> float:
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=math.nan)


def format_table(runs: Sequence[dict[str, Any]]) -> str:
    """Per loss: mean final reward per (lag, dtype), runs collapsed, max grad/norm, ratio tail."""
    cells = sorted({(r["spec"]["lag"], r["spec"]["sampler_dtype"]) for r in runs})
    losses = list(dict.fromkeys(r["spec"]["loss"] for r in runs))
    header = f"{'loss':<20}" + "".join(f"{f'lag{lag} {dt}':>12}" for lag, dt in cells)
    lines = [header + f"{'collapsed':>11}{'max |g|':>10}{'max ratio':>11}{'p99|l|':>8}"]
    for loss in losses:
        mine = [r for r in runs if r["spec"]["loss"] == loss]
        row = f"{loss:<20}"
        for lag, dtype in cells:
            rewards = [
                r["final_reward"] for r in mine
                if (r["spec"]["lag"], r["spec"]["sampler_dtype"]) == (lag, dtype)
            ]  # fmt: skip
            row += f"{statistics.fmean(rewards):>12.3f}" if rewards else f"{'-':>12}"
        collapsed = sum(r["collapse_step"] is not None for r in mine)
        grads = [g for r in mine for g in r["series"]["grad/norm"]]
        ratios = [x for r in mine for x in r["series"]["mismatch/ratio_max"]]
        p99 = [x for r in mine for x in r["series"].get("mismatch/log_ratio_p99", [])]
        row += f"{f'{collapsed}/{len(mine)}':>11}{_max(grads):>10.3g}{_max(ratios):>11.3g}"
        row += f"{statistics.median(p99) if p99 else math.nan:>8.3f}"
        lines.append(row)
    return "\n".join(lines) + "\n"


def lead_times(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """Over the collapsing runs: how often `key` climbed before the collapse, and how long before.

    Also the false-alarm side: stable runs that reached 0.5 in which `key` climbed anyway.
    """
    leads, late, silent = [], 0, 0
    for run in runs:
        if run["collapse_step"] is None:
            continue
        climbed = climb_step(run["series"][key], run["series"]["reward/mean"])
        if climbed is None:
            silent += 1
        elif climbed < run["collapse_step"]:
            leads.append(run["collapse_step"] - climbed)
        else:
            late += 1
    stable = [
        run for run in runs
        if run["collapse_step"] is None
        and _first_reach(smoothed(run["series"]["reward/mean"])) is not None
    ]  # fmt: skip
    alarms = sum(climb_step(r["series"][key], r["series"]["reward/mean"]) is not None for r in stable)
    return {
        "key": key,
        "collapsing": len(leads) + late + silent,
        "before": len(leads),
        "after": late,
        "never": silent,
        "median_lead": statistics.median(leads) if leads else None,
        "leads": sorted(leads),
        "stable_reached": len(stable),
        "stable_climbed": alarms,
    }


def format_leads(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    lines = [
        f"climb = 10-step rolling median > {CLIMB_FACTOR:g}x its median over the "
        f"{BASELINE_WINDOW} steps before reward first reached 0.5"
    ]
    for key in keys:
        lead = lead_times(runs, key)
        median = "-" if lead["median_lead"] is None else f"{lead['median_lead']:g}"
        lines.append(
            f"{key:<26} climbed before the collapse in {lead['before']}/{lead['collapsing']} "
            f"(after: {lead['after']}, never: {lead['never']}), median lead {median} steps "
            f"{lead['leads']}; climbed in {lead['stable_climbed']}/{lead['stable_reached']} "
            "stable runs"
        )
    return "\n".join(lines) + "\n"


def format_collapses(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    """One line per collapsing run: smoothed peak, collapse step, and where each key climbed."""
    lines = []
    for run in runs:
        if run["collapse_step"] is None:
            continue
        rewards = run["series"]["reward/mean"]
        peak = max(smoothed(rewards)[: run["collapse_step"] + 1])
        climbs = ", ".join(f"{key} {climb_step(run['series'][key], rewards)}" for key in keys)
        lines.append(
            f"{run['name']:<34} peak {peak:.2f}, collapse at {run['collapse_step']}; climbed: {climbs}"
        )
    return "\n".join(lines) + "\n" if lines else "no run collapsed\n"


def mismatch_medians(runs: Sequence[dict[str, Any]], skip: int = 50) -> dict[str, float]:
    """Median `mismatch/kl` per sampler dtype over the lag-0 runs' steps after the first `skip`."""
    out: dict[str, float] = {}
    for dtype in sorted({r["spec"]["sampler_dtype"] for r in runs}):
        values = [
            v for r in runs
            if r["spec"]["lag"] == 0 and r["spec"]["sampler_dtype"] == dtype
            for v in r["series"]["mismatch/kl"][skip:] if math.isfinite(v)
        ]  # fmt: skip
        if values:
            out[dtype] = statistics.median(values)
    return out
