"""`keel lm` (one asynchronous transformer learner, streamed live) and `keel lm-grid`.

Standard library only at module level (keel/cli.py imports every command module
to build the parser); torch is imported when a command runs. See docs/lm.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

_DEFAULT_LOSSES = "importance_sampling,ppo,cispo,tis,mis,stable_proxy,flash_reinforce,reinforce"
_CLIMBERS = ("mismatch/kl", "mismatch/ratio_max", "mismatch/log_ratio_p99", "grad/norm")
_HEADLINE = (
    "mismatch/kl",
    "mismatch/ratio_max",
    "mismatch/log_ratio_p99",
    "mismatch/ess_frac",
    "grad/norm",
    "gate/frac",
)


def _str_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _int_list(text: str) -> list[int]:
    try:
        return [int(item) for item in _str_list(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def _idle_cores() -> int:
    """Cores the 1-minute load average leaves idle, at least 1 (as `keel grid`)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return os.cpu_count() or 1
    return max(1, (os.cpu_count() or 1) - round(load))


def _add_training(parser: argparse.ArgumentParser) -> None:
    """The options `keel lm` and `keel lm-grid` share (defaults: learners.lm.LMConfig's)."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (sampler and learner)")
    parser.add_argument("--size", choices=("tiny", "small"), default=None,
                        help="model size (default: tiny on cpu, small on cuda)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=600, help="learner steps (default 600)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--task", choices=("sort", "copy"), default="sort",
                        help="sort: fixed-length answers (default); copy: answers that end with <eos> "
                             "under a length cap, 64-token vocabulary (docs/lm.md)")  # fmt: skip
    parser.add_argument("--digits", type=int, default=None,
                        help="task difficulty: digits to sort (default 6); copy: most digits in a prompt "
                             "(default 3)")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=0, metavar="N",
                        help="copy: the length cap of an answer, <eos> included (default 2*digits + 2)")  # fmt: skip
    parser.add_argument("--truncation-penalty", type=float, default=0.0, metavar="P",
                        help="copy: the reward of an answer cut at the cap is -P (default 0)")  # fmt: skip
    parser.add_argument("--prompts", type=int, default=16, help="prompts per batch (default 16)")
    parser.add_argument("--samples", type=int, default=8,
                        help="samples per prompt (default 8; 1 only with --adv batch)")  # fmt: skip
    parser.add_argument("--adv", choices=("group", "group_std", "batch"), default="",
                        help="advantages: reward - group mean (group), divided by the group's std + 1e-6 "
                             "(group_std), or reward - batch mean (batch); default batch for flash_reinforce, "
                             "group otherwise")  # fmt: skip
    parser.add_argument("--agg", choices=("token_sum", "token_mean", "seq_mean_token_mean"), default="",
                        help="the loss's aggregation over tokens (default: the loss's own, docs/losses.md)")  # fmt: skip
    parser.add_argument("--clip", type=float, default=1.0, help="max grad norm, 0: off (default 1)")
    parser.add_argument("--sft-steps", type=int, default=0, metavar="N",
                        help="supervised steps on the right answers before RL, so that RL starts from a "
                             "trained policy as it starts from a fine-tuned model (default 0: none)")  # fmt: skip
    parser.add_argument("--project", default="default", help="Keel project of the runs")
    parser.add_argument("--token", default=None, help="API token (default: $KEEL_TOKEN)")


def _config(args: argparse.Namespace, **fields: Any) -> Any:
    from learners.lm.learner import LMConfig

    size = args.size or ("small" if args.device.startswith("cuda") else "tiny")
    digits = args.digits if args.digits is not None else (3 if args.task == "copy" else 6)
    return LMConfig(
        device=args.device, size=size, steps=args.steps, lr=args.lr, digits=digits,
        prompts=args.prompts, group=args.samples, clip=args.clip, task=args.task,
        max_new_tokens=args.max_new_tokens, truncation_penalty=args.truncation_penalty, adv=args.adv,
        agg=args.agg, sft_steps=args.sft_steps, **fields,
    )  # fmt: skip


def _check_device(command: str, device: str) -> bool:
    import torch

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print(f"keel {command}: {device} requested but CUDA is not available", file=sys.stderr)
        return False
    return True


# -- keel lm ---------------------------------------------------------------------------


def _add_lm(parser: argparse.ArgumentParser) -> None:
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument("--loss", required=True, help="a loss of trainer_hooks.losses, e.g. cispo")
    parser.add_argument("--lag", type=int, default=0, help="versions the sampler may run behind")
    parser.add_argument("--sampler-dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--sampler-logit-noise", type=float, default=0.0, metavar="SIGMA",
                        help="a planted engine change: Gaussian noise of SIGMA nats on every logit the sampler "
                             "samples from (default 0; docs/parity.md, \"Calibration\")")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    _add_training(parser)
    parser.add_argument("--step-delay", type=float, default=0.0, metavar="SECONDS",
                        help="sleep after each step, to watch a fast run live")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per thread of the loop (default 1)")  # fmt: skip
    parser.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
    parser.add_argument("--name", default=None, help="run name (default {loss}-lag{lag}-{dtype}-s{seed})")
    parser.add_argument("--group", default=None, help="run group (default: the loss)")
    parser.add_argument("--guard", action="store_true",
                        help="roll back to the weights from before the trouble began when a critical alert fires on "
                             "the run (the server's rules), with --guard-hazard when the collapse hazard passes P, or "
                             "on a `rollback` command (docs/lm.md, \"The guard\")")  # fmt: skip
    parser.add_argument("--guard-hazard", type=float, default=None, metavar="P",
                        help="act on the collapse hazard too, when it passes P (default: on critical alerts only)")  # fmt: skip
    parser.add_argument("--guard-confirm", type=float, default=0.0, metavar="R",
                        help="act on the hazard only once the reward's moving average fell R below its best "
                             "since the hazard rose (default 0: on the hazard alone)")  # fmt: skip


def _lm(args: argparse.Namespace) -> int:
    import torch

    from learners.lm.guard import Guard, GuardConfig
    from learners.lm.learner import run_config, train
    from trainer_hooks.monitor import Monitor
    from trainer_hooks.signals import Command
    from wire.urls import default_server

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    config = _config(
        args, loss=args.loss, lag=args.lag, sampler_dtype=args.sampler_dtype, seed=args.seed,
        step_delay=args.step_delay, logit_noise=args.sampler_logit_noise,
    )  # fmt: skip
    guard = GuardConfig(hazard=args.guard_hazard, confirm_drop=args.guard_confirm) if args.guard else None
    try:
        config.check()
        if guard is not None:
            guard.check()
    except ValueError as exc:
        print(f"keel lm: {exc}", file=sys.stderr)
        return 2
    if not _check_device("lm", args.device):
        return 2
    torch.set_num_threads(max(1, args.threads))

    def progress(step: int, reward: float) -> None:
        print(f"step {step + 1:>5}  reward/mean {reward:.3f}", file=sys.stderr, flush=True)

    name = args.name or config.name + ("-guard" if guard else "")
    stored = {**run_config(config), **({"guard": asdict(guard)} if guard else {})}
    with Monitor(
        default_server(args.server), run_name=name, project=args.project, group=args.group or config.loss,
        config=stored, tags=("lm",), token=args.token,
    ) as monitor:  # fmt: skip

        def on_guard(guarding: Guard) -> None:
            def on_command(_command: Command) -> str:  # a rollback: the only action it names
                guarding.ask()
                return "rolling back at the end of the next step"

            monitor.on_command(
                on_command, {"rollback": "restores the last good weights and skips the batches sampled since, at the end of the next step"}
            )

        def alarm() -> int | None:
            """The step the earliest critical alert firing on the run started at."""
            started = [a.started_step for a in monitor.alerts if a.severity == "critical" and a.started_step is not None]
            return min(started) if started else None

        result = train(
            config, monitor, progress=progress, guard=guard, hazard=lambda: monitor.hazard, alarm=alarm, on_guard=on_guard
        )
    window = min(50, len(result.rewards))
    start = statistics.fmean(result.rewards[:window])
    end = statistics.fmean(result.rewards[-window:])
    print(
        f"keel lm: run {monitor.run_id} ({name}): reward/mean {start:.3f} -> {end:.3f} "
        f"(first/last {window} steps) in {result.wall_s:.1f} s; learner "
        f"{result.learner_tokens_per_s:,.0f} tokens/s, sampler {result.sampler_tokens_per_s:,.0f} tokens/s"
    )
    return 0 if monitor.finish() else 1


# -- keel lm-grid ----------------------------------------------------------------------


def _add_grid(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--losses", type=_str_list, default=_str_list(_DEFAULT_LOSSES),
                        help=f"comma-separated (default: {_DEFAULT_LOSSES})")  # fmt: skip
    parser.add_argument("--lags", type=_int_list, default=[0, 8], help="default: 0,8")
    parser.add_argument("--dtypes", type=_str_list, default=["bf16", "fp32"],
                        help="sampler dtypes (default: bf16,fp32)")  # fmt: skip
    parser.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="default: 0,1,2")
    _add_training(parser)
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs in parallel, one process each (default: idle cores / 2, >= 1)")  # fmt: skip
    parser.add_argument("--json", metavar="PATH",
                        help="write the corpus: every run's spec, per-step series and collapse label")  # fmt: skip
    parser.add_argument("--server", default=None, help="also stream every run live to this server")


def _grid(args: argparse.Namespace) -> int:
    from learners.lm.grid import grid_configs

    configs = grid_configs(_config(args), args.losses, args.lags, args.dtypes, args.seeds)
    return _run_configs("lm-grid", args, configs)


def _add_corpus(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=_seed_list, required=True,
                        help="e.g. 100-114 or 200,201: ten runs per seed (learners/lm/corpus.py)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=500, help="learner steps (default 500)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (sampler and learner)")
    parser.add_argument("--size", choices=("tiny", "small"), default=None,
                        help="model size (default: tiny on cpu, small on cuda)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs in parallel, one process each (default: idle cores / 2, >= 1)")  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="write the corpus (as keel lm-grid --json)")
    parser.add_argument("--server", default=None, help="also stream every run live to this server")
    parser.add_argument("--project", default="default", help="Keel project of the runs")
    parser.add_argument("--token", default=None, help="API token (default: $KEEL_TOKEN)")


def _seed_list(text: str) -> list[int]:
    seeds: list[int] = []
    for item in _str_list(text):
        first, _, last = item.partition("-")
        try:
            seeds += range(int(first), int(last or first) + 1)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected seeds like 100-114 or 3,4, got {text!r}") from exc
    return seeds


def _corpus(args: argparse.Namespace) -> int:
    from learners.lm.corpus import corpus_configs
    from learners.lm.learner import LMConfig

    size = args.size or ("small" if args.device.startswith("cuda") else "tiny")
    base = LMConfig(device=args.device, size=size, steps=args.steps)
    return _run_configs("lm-corpus", args, corpus_configs(base, args.seeds))


# -- keel lm-regimes -------------------------------------------------------------------


def _add_regimes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=_seed_list, required=True,
                        help="ten runs per seed, e.g. 0-59 (600 runs)")  # fmt: skip
    parser.add_argument("--dir", required=True, metavar="PATH",
                        help="one file per run; runs already there are not run again")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="learner steps (default 1000)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (sampler and learner)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs at a time (default: idle cores / 2)")  # fmt: skip
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="run at most N of the missing runs, then stop")  # fmt: skip
    parser.add_argument("--sft-steps", type=int, default=0, metavar="N",
                        help="start every run from N supervised steps on the right answers (default 0: none)")  # fmt: skip


def _regimes(args: argparse.Namespace) -> int:
    from learners.lm.corpus import REGIME_STEPS, regime_configs
    from learners.lm.grid import run_grid
    from learners.lm.learner import LMConfig
    from learners.lm.runfiles import done_names, write_run

    base = LMConfig(device=args.device, steps=args.steps or REGIME_STEPS, sft_steps=args.sft_steps)
    configs = regime_configs(base, args.seeds)
    done = done_names(args.dir)
    missing = [config for config in configs if config.name not in done]
    already = len(configs) - len(missing)
    if args.limit is not None:
        missing = missing[: max(0, args.limit)]
    print(f"keel lm-regimes: {len(configs)} runs, {already} already in {args.dir}, "
          f"running {len(missing)}", file=sys.stderr, flush=True)  # fmt: skip
    if not _check_device("lm-regimes", args.device):
        return 2
    jobs = args.jobs or max(1, _idle_cores() // 2)

    def done_one(run: dict[str, Any]) -> None:
        write_run(args.dir, run)
        spec = run["spec"]
        print(f"{run['name']:<52} {spec['size']:>5} final reward {run['final_reward']:.3f} "
              f"({run['wall_s']:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip

    if missing:
        run_grid(missing, jobs=jobs, on_done=done_one)
    left = len(configs) - len(done_names(args.dir))
    print(f"keel lm-regimes: {len(missing)} runs written to {args.dir}, {left} of {len(configs)} "
          f"still to run; score them with keel eval-alerts --corpus {args.dir}")  # fmt: skip
    return 0


# -- keel lm-edge ----------------------------------------------------------------------


def _add_edge(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", required=True, metavar="PATH",
                        help="one file per run; the search reads the runs already there and goes on from them")  # fmt: skip
    parser.add_argument("--runs", type=int, default=None, metavar="N",
                        help="run N more runs, then stop (default: until every target is met: 300 runs, 80 "
                             "lasting collapses, 20 of them without mismatch; a killed command resumes)")  # fmt: skip
    parser.add_argument("--report", action="store_true",
                        help="print the tally (runs by cell and outcome, lasting collapses) and run nothing")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="learner steps (default 1000)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (sampler and learner)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time, each in its own cell (default 1)")  # fmt: skip


def _edge(args: argparse.Namespace) -> int:
    from learners.lm.corpus import REGIME_STEPS
    from learners.lm.edge import EdgeRun, format_report, plan, read_edge_runs, shortfall
    from learners.lm.grid import run_grid
    from learners.lm.learner import LMConfig
    from learners.lm.runfiles import write_run

    cache: dict[str, EdgeRun | None] = {}
    runs = read_edge_runs(args.dir, cache) if os.path.isdir(args.dir) else []
    if args.report:
        print(format_report(runs), end="")
        return 0
    if not _check_device("lm-edge", args.device):
        return 2
    base = LMConfig(device=args.device, steps=args.steps or REGIME_STEPS)
    # Without --runs: until every target is met (runs, lasting collapses, those without mismatch).
    left: int | None = args.runs
    short = ", ".join(f"{n} {key}" for key, n in shortfall(runs).items() if n)
    doing = f"running {max(0, left)}" if left is not None else f"running until the targets are met ({short or 'met'})"
    print(f"keel lm-edge: {len(runs)} edge runs in {args.dir}, {doing}", file=sys.stderr, flush=True)

    def done_one(run: dict[str, Any]) -> None:
        write_run(args.dir, run)
        print(f"{run['name']:<52} final reward {run['final_reward']:.3f} ({run['wall_s']:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip

    jobs = max(1, args.jobs)
    while (left > 0) if left is not None else any(shortfall(runs).values()):
        configs = plan(runs, jobs if left is None else min(jobs, left), base)
        run_grid(configs, jobs=len(configs), on_done=done_one)
        left = None if left is None else left - len(configs)
        runs = read_edge_runs(args.dir, cache)
    print(format_report(runs), end="")
    return 0


def _run_configs(command: str, args: argparse.Namespace, configs: list[Any]) -> int:
    from learners.lm.grid import (
        format_collapses,
        format_leads,
        format_table,
        mismatch_medians,
        run_grid,
    )

    try:
        for config in configs:
            config.check()
    except ValueError as exc:
        print(f"keel {command}: {exc}", file=sys.stderr)
        return 2
    if not configs or not _check_device(command, args.device):
        return 2
    # Each run is two busy threads (learner, sampler).
    jobs = args.jobs or max(1, _idle_cores() // 2)
    started = time.perf_counter()

    def done(run: dict[str, Any]) -> None:
        label = "stable" if run["collapse_step"] is None else f"collapsed at {run['collapse_step']}"
        print(f"{run['name']:<36} final reward {run['final_reward']:.3f}  {label}  "
              f"({run['wall_s']:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip

    runs = run_grid(configs, jobs=jobs, server=args.server, project=args.project,
                    token=args.token, on_done=done)  # fmt: skip
    wall_s = time.perf_counter() - started
    print(format_table(runs), end="")
    print(format_collapses(runs, _CLIMBERS), end="")
    print(format_leads(runs, _CLIMBERS), end="")
    medians = mismatch_medians(runs)
    if "bf16" in medians and "fp32" in medians:
        ratio = medians["bf16"] / medians["fp32"] if medians["fp32"] > 0 else math.inf
        print(f"mismatch/kl at lag 0, median over steps >= 50: bf16 {medians['bf16']:.3g}, "
              f"fp32 {medians['fp32']:.3g}, ratio {ratio:.3g}")  # fmt: skip
    print(f"{len(runs)} runs x {args.steps} steps in {wall_s:.0f} s, {jobs} at a time")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"wall_s": wall_s, "keys_headline": list(_HEADLINE), "runs": runs}, handle)
    return 0


COMMANDS = {
    "lm": (
        "Train a small transformer policy asynchronously (stale bf16 sampler, fp32 learner), live.",
        _add_lm,
        _lm,
    ),
    "lm-grid": (
        "Run keel lm over losses x lags x sampler dtypes x seeds; table, lead times, corpus.",
        _add_grid,
        _grid,
    ),
    "lm-regimes": (
        "The regime corpus: ten keel lm runs per seed over learning rates, tasks, model sizes, "
        "batch shapes, clipping, every loss, lags and sampler dtypes, one file per run (resumable).",
        _add_regimes,
        _regimes,
    ),
    "lm-edge": (
        "The edge corpus: keel lm runs drawn, cell by cell, at the learning rate where runs learn and then "
        "fall (an adaptive search that resumes from the runs in --dir; --report prints the tally).",
        _add_edge,
        _edge,
    ),
    "lm-corpus": (
        "The alert corpus: ten keel lm runs per seed, settings drawn from it (docs/alerts.md).",
        _add_corpus,
        _corpus,
    ),
}
