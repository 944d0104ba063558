"""What Keel costs the asynchronous transformer learner: tokens/s with and without it.

    .venv/bin/python -m bench.lm                     # starts its own `keel serve` (temp SQLite)
    .venv/bin/python -m bench.lm --server URL        # or streams to a running server
    .venv/bin/python -m bench.lm --device cuda --size small

Runs `learners.lm.train` (sampler thread + fp32 learner, the loop of `keel lm`)
in two variants, in alternating random order for `--rounds` rounds of `--steps`
steps each: "plain" (no Monitor: the `# keel:` lines skipped) and "keel"
(`Monitor.log_batch` every step, streamed to the server). Per run it takes the
median learner step's tokens/s, the median sampler batch's tokens/s and the
end-to-end rate (learner steps per second of wall time, waits included); it
prints the median over rounds of each, then the ratios keel / plain of the same
invocation. The server shares this machine's CPUs unless --server points
elsewhere; on a shared 2-core box identical variants differ by several per
cent from run to run, so read the ratios against that noise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from bench.support import keel_server
from learners.lm.learner import LMConfig, run_config, train
from trainer_hooks.monitor import Monitor

VARIANTS = ("plain", "keel")
FIGURES = ("learner tokens/s", "sampler tokens/s", "end-to-end steps/s")


def one_run(config: LMConfig, variant: str, server: str, spool: Path) -> dict[str, float]:
    started = time.perf_counter()
    if variant == "plain":
        result = train(config)
    else:
        with Monitor(
            server, run_name=f"bench-{config.name}", config=run_config(config), tags=("bench",),
            spool_dir=spool,
        ) as monitor:  # fmt: skip
            result = train(config, monitor)
    wall_s = time.perf_counter() - started  # the keel variant's includes its final flush
    return {
        "learner tokens/s": result.learner_tokens_per_s,
        "sampler tokens/s": result.sampler_tokens_per_s,
        "end-to-end steps/s": config.steps / result.wall_s,
        "wall_s": wall_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=None, help="stream to this server instead of a local one")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant")
    parser.add_argument("--steps", type=int, default=200, help="learner steps per run")
    parser.add_argument("--loss", default="cispo")
    parser.add_argument("--lag", type=int, default=2)
    parser.add_argument("--sampler-dtype", default="bf16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default=None, help="tiny or small (default: tiny on cpu, small on cuda)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per thread of the loop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    size = args.size or ("small" if args.device.startswith("cuda") else "tiny")
    config = LMConfig(
        loss=args.loss, lag=args.lag, sampler_dtype=args.sampler_dtype, device=args.device,
        size=size, steps=args.steps,
    )  # fmt: skip
    samples: dict[str, dict[str, list[float]]] = {v: {f: [] for f in FIGURES} for v in VARIANTS}
    shuffle = random.Random(0)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="keel-bench-lm-")))
        server = args.server or stack.enter_context(
            keel_server(f"sqlite:///{workdir / 'keel.db'}", log=workdir / "server.log")
        ).url
        print(
            f"server: {server}{'' if args.server else ' (local keel serve, same CPUs)'}; "
            f"{config.loss} lag {config.lag}, {config.sampler_dtype} sampler, {size} model on "
            f"{config.device}, {args.rounds} rounds x {args.steps} steps, torch threads "
            f"{torch.get_num_threads()}"
        )
        for variant in VARIANTS:  # warm-up: first-call costs, the server's first run
            one_run(replace(config, steps=20), variant, server, workdir / "spool")
        for round_index in range(args.rounds):
            for variant in shuffle.sample(VARIANTS, len(VARIANTS)):
                figures = one_run(replace(config, seed=round_index), variant, server, workdir / "spool")
                for figure in FIGURES:
                    samples[variant][figure].append(figures[figure])
    width = max(len(f) for f in FIGURES)
    print(f"{'median over rounds':<{width}}  {'plain':>12}  {'with keel':>12}")
    for figure in FIGURES:
        plain, keel = (statistics.median(samples[v][figure]) for v in VARIANTS)
        print(f"{figure:<{width}}  {plain:>12,.1f}  {keel:>12,.1f}")
    print("ratios keel / plain (1.00 = no cost):")
    for figure in FIGURES:
        plain, keel = (statistics.median(samples[v][figure]) for v in VARIANTS)
        paired = [k / p for k, p in zip(samples["keel"][figure], samples["plain"][figure], strict=True)]
        print(
            f"  {figure:<{width}}  {keel / plain:.3f}  (per-round ratios: "
            + ", ".join(f"{x:.2f}" for x in paired)
            + ")"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
