"""`keel sync` (upload spools a trainer left behind) and `keel sim` (stream one toy run live).

Standard library only at module level (see server/cli.py): `keel sync` must work on a
GPU node with neither the server's dependencies nor torch; torch is imported by `sim`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_hooks.monitor import Monitor
    from trainer_hooks.toy import RunSpec

__all__ = ["COMMANDS", "ToyStreamer"]


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


# -- keel sync ---------------------------------------------------------------------------


def _add_sync(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        type=Path,
        help="a run spool (…/<run_id>) or a directory of them (default root: ~/.keel/spool)",
    )
    parser.add_argument(
        "--server", default=None, help="server URL (default: the one the trainer used)"
    )
    parser.add_argument(
        "--token", default=None, help="API token with ingest scope (default: $KEEL_TOKEN)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to keep trying per run before giving up (default 120)",
    )


def _sync(args: argparse.Namespace) -> int:
    from trainer_hooks.sender import ConnState, upload
    from trainer_hooks.spool import Spool, SpoolBusyError, find_spools

    _setup_logging()
    spools = find_spools(args.path.expanduser())
    if not spools:
        print(f"keel sync: no run spool in {args.path}", file=sys.stderr)
        return 1
    token = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
    failures = 0
    for path in spools:
        try:
            spool = Spool.open(path)
        except (SpoolBusyError, OSError, ValueError) as exc:
            print(f"keel sync: skipping {path}: {exc}", file=sys.stderr)
            failures += 1
            continue
        run = spool.run
        server_url = args.server or spool.server_url
        if not server_url:
            print(f"keel sync: {path} does not say which server; pass --server", file=sys.stderr)
            spool.close()
            failures += 1
            continue
        # A spool without a recorded status belongs to a trainer that died before finish().
        status = spool.status or "killed"
        frames = spool.unacked
        sender = upload(spool, server_url, status=status, token=token, timeout=args.timeout)
        done = sender.state is ConnState.DONE
        spool.close(remove=done)
        if done:
            print(
                f"keel sync: run {run.name!r} ({run.id}): {frames} frame(s) uploaded to "
                f"{server_url}, status {status}"
            )
        else:
            failures += 1
            print(
                f"keel sync: run {run.name!r} ({run.id}) not uploaded ({sender.last_error}); "
                f"{spool.unacked} frame(s) kept in {path}",
                file=sys.stderr,
            )
    return 1 if failures else 0


# -- keel sim ----------------------------------------------------------------------------


class ToyStreamer:
    """Streams toy runs live, one Monitor per run; `on_step` is a toy.StepCallback.

    `keel sim` streams one run with it; `keel grid --server` streams a whole grid:

        with ToyStreamer(specs, server_url, steps=config.steps) as streamer:
            simulate(specs, config, on_step=streamer.on_step)
    """

    def __init__(
        self,
        specs: Sequence[RunSpec],
        server_url: str,
        *,
        steps: int,
        project: str = "default",
        names: Sequence[str] | None = None,
        group: str | None = None,
        token: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        step_delay: float = 0.0,
        config: dict[str, Any] | None = None,
    ) -> None:
        from trainer_hooks.monitor import Monitor

        self.step_delay = step_delay
        self.monitors: list[Monitor] = []
        for index, spec in enumerate(specs):
            self.monitors.append(
                Monitor(
                    server_url,
                    run_name=names[index] if names else spec.name,
                    project=project,
                    group=group or spec.loss,
                    config={
                        "loss": spec.loss,
                        "lag": spec.lag,
                        "mismatch": spec.mismatch,
                        "seed": spec.seed,
                        "steps": steps,
                        **(config or {}),
                    },
                    tags=("toy",),
                    token=token,
                    spool_dir=spool_dir,
                )
            )

    def on_step(self, step: int, metrics: dict[str, Any]) -> None:
        """Log step `step` of every run; `metrics` maps each key to a tensor [R]."""
        keys = list(metrics)
        if len(self.monitors) == 1:
            self.monitors[0].log(step, {key: value[0] for key, value in metrics.items()})
        else:
            import torch

            # One copy for the whole grid instead of R × keys scalar tensors: the grid
            # is the reference loop, not a GPU job that must never sync.
            values_R_K = torch.stack([metrics[key].float() for key in keys], dim=1).tolist()
            for monitor, values in zip(self.monitors, values_R_K, strict=True):
                monitor.log(step, dict(zip(keys, values, strict=True)))
        if self.step_delay > 0:
            time.sleep(self.step_delay)

    def finish(self, status: str = "finished", *, timeout: float = 30.0) -> bool:
        """Finish every run within one shared `timeout` (not one per run)."""
        deadline = time.monotonic() + timeout
        for monitor in self.monitors:
            monitor._request_finish(status)  # all flush and say goodbye in parallel
        delivered = True
        # Newest first: each Monitor then puts back the SIGTERM handler it found.
        for monitor in reversed(self.monitors):
            remaining = max(1.0, deadline - time.monotonic())
            delivered = monitor.finish(status, timeout=remaining) and delivered
        return delivered

    def __enter__(self) -> ToyStreamer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        from trainer_hooks.monitor import status_for_exit

        # A SIGTERM reaches every Monitor's handler (they chain); any of them will do.
        signalled = self.monitors[0]._exit_status if self.monitors else None
        self.finish(status_for_exit(exc_type, exc, signalled))


def _add_sim(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--server", required=True, help="server URL, e.g. http://127.0.0.1:8750")
    parser.add_argument(
        "--name", default=None, help="run name (default {loss}-lag{lag}-{mismatch}-s{seed})"
    )
    parser.add_argument("--group", default=None, help="run group (default: the loss)")
    parser.add_argument("--project", default="default")
    parser.add_argument("--token", default=None, help="API token (default: $KEEL_TOKEN)")
    parser.add_argument("--device", default="cpu", help="torch device for the simulation")


def _sim(args: argparse.Namespace) -> int:
    from trainer_hooks.losses import LOSSES
    from trainer_hooks.toy import MISMATCH_LEVELS, RunSpec, ToyConfig, simulate

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
    with ToyStreamer(
        [spec],
        args.server,
        steps=args.steps,
        project=args.project,
        names=[args.name] if args.name else None,
        group=args.group,
        token=args.token,
        step_delay=args.step_delay,
    ) as streamer:
        result = simulate([spec], config, device=args.device, on_step=streamer.on_step)
        delivered = streamer.finish()
    print(
        f"keel sim: run {streamer.monitors[0].run_id} ({spec.name}): final reward "
        f"{float(result.final_reward[0]):.4f}, max grad norm {float(result.max_grad_norm[0]):.4g}"
    )
    return 0 if delivered else 1


CommandRun = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], CommandRun]] = {
    "sync": (
        "Upload the spool a trainer left behind (server away, process killed).",
        _add_sync,
        _sync,
    ),
    "sim": ("Stream one toy off-policy run live to a Keel server.", _add_sim, _sim),
}
