"""Benchmark: the batched toy grid against the same code one run at a time.

    .venv/bin/python -m bench.grid [--steps 600] [--device cpu] [--threads N]
                                   [--single-runs 8] [--single-steps 100]

Runs the full default grid (288 runs x 600 steps) as one tensor program, then
a one-run-at-a-time loop of the same code on a subset of the runs for fewer
steps, and reports both as runs·steps/s and their ratio. Wall time is noisy
on a shared machine: CPU time of this process is printed too, and the load
average before and after.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from learners.toy import ToyConfig, grid_specs, simulate
from learners.toy_cli import idle_cores, keep_freed_memory


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: as `keel grid`)")
    parser.add_argument("--single-runs", type=int, default=8, help="runs measured one at a time")
    parser.add_argument("--single-steps", type=int, default=100, help="steps per run in the loop")
    args = parser.parse_args()

    keep_freed_memory()  # as `keel grid` does
    torch.set_num_threads(args.threads or idle_cores())
    specs = grid_specs()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, load {_load()}"
    )

    cpu_started = time.process_time()
    result = simulate(specs, ToyConfig(steps=args.steps), device=args.device)
    grid_cpu = time.process_time() - cpu_started
    grid_rate = len(specs) * args.steps / result.wall_s
    print(
        f"grid:   {len(specs)} runs x {args.steps} steps in {result.wall_s:.1f} s "
        f"(cpu {grid_cpu:.1f} s) = {grid_rate:,.0f} runs·steps/s"
    )

    # Spread the subset over the grid so every loss and lag is sampled.
    stride = max(1, len(specs) // args.single_runs)
    subset = specs[::stride][: args.single_runs]
    config = ToyConfig(steps=args.single_steps, final_window=min(50, args.single_steps))
    started = time.perf_counter()
    for spec in subset:
        simulate([spec], config, device=args.device)
    loop_s = time.perf_counter() - started
    loop_rate = len(subset) * args.single_steps / loop_s
    print(
        f"loop:   {len(subset)} runs x {args.single_steps} steps one at a time in {loop_s:.1f} s "
        f"= {loop_rate:,.0f} runs·steps/s (full grid this way: ~{len(specs) * args.steps / loop_rate:.0f} s)"
    )
    print(f"ratio:  {grid_rate / loop_rate:.1f}x   load {_load()}")


if __name__ == "__main__":
    main()
