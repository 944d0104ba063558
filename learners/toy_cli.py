"""`keel grid` (the toy grid of docs/losses.md, its table) and `keel sim` (one toy run, live).

Standard library only at module level (server/cli.py imports every command
module to build the parser); torch is imported when the command runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

_DEFAULT_LOSSES = "reinforce,stable_proxy,importance_sampling,ppo,cispo,cispo_floor,tis,mis"
_BELOW = 0.9  # docs/losses.md counts the runs that end below this final reward

GRID_HELP = "Run the toy off-policy grid (losses x lags x mismatch x seeds) and print its table."


def _str_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _int_list(text: str) -> list[int]:
    try:
        return [int(item) for item in _str_list(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--losses",
        type=_str_list,
        default=_str_list(_DEFAULT_LOSSES),
        help="comma-separated loss names (default: the toy study's 8)",
    )
    parser.add_argument("--lags", type=_int_list, default=[0, 2, 8, 32], help="default: 0,2,8,32")
    parser.add_argument(
        "--mismatch",
        type=_str_list,
        default=["none", "mild", "severe"],
        help="levels among none,mild,severe (default: all)",
    )
    parser.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="default: 0,1,2")
    parser.add_argument("--steps", type=int, default=600, help="SGD steps per run (default: 600)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: the cores other processes leave idle, at least 1)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every run's result as JSON")
    parser.add_argument("--server", default=None, help="stream every run live to this Keel server")
    parser.add_argument("--project", default="default", help="project of the streamed runs")
    parser.add_argument("--token", default=None, help="API token (default: env KEEL_TOKEN)")


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


def idle_cores() -> int:
    """Cores not busy with other processes (1-minute load average), at least 1.

    torch's OpenMP threads spin at every op's barrier: on 2 cores with another
    busy process, 2 threads ran the grid ~10x slower than 1 thread (640 s vs
    65 s), while on an idle machine 2 threads take half the time (24 s vs 48 s).
    """
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return cores
    return max(1, cores - round(load))


def keep_freed_memory() -> None:
    """Ask glibc to keep freed blocks for reuse instead of handing them back to the OS.

    A grid step allocates ~100 temporaries of a few MB each; by default glibc
    unmaps them and page-faults them back in (~12k faults per step, a third of
    a CPU step). Process-wide, so only entry points (this CLI, the bench) call it.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


def run_grid(
    args: argparse.Namespace, on_step: Callable[..., None] | None = None, out: IO[str] = sys.stdout
) -> int:
    """Run the grid; `on_step(step, metrics)` sees every step (the seam for live streaming)."""
    import torch

    from learners.toy import MISMATCH_LEVELS, ToyConfig, grid_specs, simulate
    from trainer_hooks.losses import LOSSES

    unknown = [name for name in args.losses if name not in LOSSES]
    unknown += [level for level in args.mismatch if level not in MISMATCH_LEVELS]
    bad_threads = args.threads is not None and args.threads < 1
    if unknown or bad_threads or args.steps < 1 or any(lag < 0 for lag in args.lags):
        print(
            f"keel grid: bad arguments {unknown or ''} (losses: {', '.join(LOSSES)})",
            file=sys.stderr,
        )
        return 2
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"keel grid: {args.device} requested but CUDA is not available", file=sys.stderr)
        return 2
    keep_freed_memory()
    torch.set_num_threads(args.threads or idle_cores())
    specs = grid_specs(args.losses, args.lags, args.mismatch, args.seeds)
    config = ToyConfig(steps=args.steps, final_window=min(ToyConfig.final_window, args.steps))
    if getattr(args, "server", None) and on_step is None:
        from learners.stream import ToyStreamer

        with ToyStreamer(
            specs, args.server, steps=config.steps, project=args.project, token=args.token
        ) as streamer:
            result = simulate(specs, config, device=args.device, on_step=streamer.on_step)
            streamer.finish()
    else:
        result = simulate(specs, config, device=args.device, on_step=on_step)
    runs = [
        {
            "loss": spec.loss,
            "lag": spec.lag,
            "mismatch": spec.mismatch,
            "seed": spec.seed,
            "final_reward": reward,
            "max_grad_norm": grad,
        }
        for spec, reward, grad in zip(
            specs, result.final_reward.tolist(), result.max_grad_norm.tolist(), strict=True
        )
    ]
    out.write(format_table(runs, args.losses, args.lags))
    out.write(f"{len(runs)} runs x {args.steps} steps in {result.wall_s:.1f} s on {args.device}\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"wall_s": result.wall_s, "device": str(args.device), "runs": runs},
                handle,
                indent=1,
            )
    return 0


def format_table(runs: Sequence[dict[str, Any]], losses: Sequence[str], lags: Sequence[int]) -> str:
    """Rows losses, columns lags: mean final reward per cell; runs < 0.9 and max grad norm per loss."""
    header = f"{'loss':<20}" + "".join(f"{'lag ' + str(lag):>9}" for lag in lags)
    lines = [header + f"{'< 0.9':>7}{'max |g|':>11}"]
    for loss in losses:
        mine = [run for run in runs if run["loss"] == loss]
        cells = []
        for lag in lags:
            rewards = [run["final_reward"] for run in mine if run["lag"] == lag]
            cells.append(f"{sum(rewards) / len(rewards):>9.3f}" if rewards else f"{'-':>9}")
        below = sum(1 for run in mine if not run["final_reward"] >= _BELOW)  # NaN counts as below
        grads = [run["max_grad_norm"] for run in mine]
        max_grad = math.nan if any(math.isnan(g) for g in grads) else max(grads, default=math.nan)
        lines.append(f"{loss:<20}" + "".join(cells) + f"{below:>7}{max_grad:>11.2f}")
    return "\n".join(lines) + "\n"


def _add_sim(parser: argparse.ArgumentParser) -> None:
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument("--loss", required=True, help="a loss of trainer_hooks.losses, e.g. cispo")
    parser.add_argument("--lag", type=int, default=0, help="sampler staleness in steps")
    parser.add_argument("--mismatch", choices=("none", "mild", "severe"), default="none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sleep after each step, to watch the run live",
    )
    parser.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
    parser.add_argument(
        "--name", default=None, help="run name (default {loss}-lag{lag}-{mismatch}-s{seed})"
    )
    parser.add_argument("--group", default=None, help="run group (default: the loss)")
    parser.add_argument("--project", default="default")
    parser.add_argument("--token", default=None, help="API token (default: $KEEL_TOKEN)")
    parser.add_argument("--device", default="cpu", help="torch device for the simulation")


def _sim(args: argparse.Namespace) -> int:
    from learners.toy import MISMATCH_LEVELS, RunSpec, ToyConfig, simulate
    from trainer_hooks.losses import LOSSES
    from wire.urls import default_server

    _setup_logging()
    if args.loss not in LOSSES:
        print(
            f"keel sim: unknown loss {args.loss!r}; one of {', '.join(sorted(LOSSES))}",
            file=sys.stderr,
        )
        return 2
    if args.lag < 0 or args.steps < 1 or args.mismatch not in MISMATCH_LEVELS:
        print("keel sim: --lag must be >= 0 and --steps >= 1", file=sys.stderr)
        return 2
    spec = RunSpec(loss=args.loss, lag=args.lag, mismatch=args.mismatch, seed=args.seed)
    config = ToyConfig(steps=args.steps)
    from learners.stream import ToyStreamer

    with ToyStreamer(
        [spec],
        default_server(args.server),
        steps=args.steps,
        project=args.project,
        names=[args.name] if args.name else None,
        group=args.group,
        token=args.token,
        step_delay=args.step_delay,
    ) as streamer:
        result = simulate([spec], config, device=args.device, on_batch=streamer.on_batch)
        delivered = streamer.finish()
    print(
        f"keel sim: run {streamer.monitors[0].run_id} ({spec.name}): final reward "
        f"{float(result.final_reward[0]):.4f}, max grad norm {float(result.max_grad_norm[0]):.4g}"
    )
    return 0 if delivered else 1


COMMANDS = {
    "grid": (GRID_HELP, add_grid_arguments, run_grid),
    "sim": ("Stream one toy off-policy run live to a Keel server.", _add_sim, _sim),
}
