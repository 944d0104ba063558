"""A run's hazard read again and again, as the run page and `GET /runs?hazard=true` do.

Each read of a running run adds the rows stored since the last read and labels its reward
(collapsed, falling, dips: wire/labels.py). The baseline is what the label cost before
HazardCache kept its scan: `fall_of` over the run's whole reward history on every read.
Both are timed on the same run, interleaved, and checked equal before they are timed.

    python -m bench.hazard_reads [--steps 50000] [--reads 30] [--new 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from server.alerts import hazard
from wire import Row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="history of the run before the reads")
    parser.add_argument("--reads", type=int, default=30)
    parser.add_argument("--new", type=int, default=5, help="steps stored between two reads")
    args = parser.parse_args()
    rng = random.Random(0)
    total = args.steps + args.reads * args.new
    rows = [
        Row(step=s, time=None, values={"reward/mean": min(0.9, s / 2000) + rng.gauss(0, 0.05), "mismatch/kl": 0.01, "grad/norm": 1.0})
        for s in range(total)
    ]
    cache = hazard.HazardCache(hazard.load_model(None), runs=1)
    cache.extend("run", 1.0, rows[: args.steps])
    kept, full = [], []
    for read in range(args.reads):
        end = args.steps + (read + 1) * args.new
        started = time.perf_counter()
        after = cache.after("run", 1.0)
        course = cache.extend("run", 1.0, [row for row in rows[after + 1 : end]])
        label = course.fall()
        kept.append(time.perf_counter() - started)
        started = time.perf_counter()
        whole = hazard.fall_of([row.step for row in rows[:end]], [row.values["reward/mean"] for row in rows[:end]])
        full.append(time.perf_counter() - started)
        assert label == whole, (read, label, whole)
    ms = 1e3 * statistics.median(kept), 1e3 * statistics.median(full)
    print(f"label of a {args.steps:,}-step run, {args.new} new steps a read, median of {args.reads} reads:")
    print(f"  kept scan (HazardCache)   {ms[0]:8.2f} ms")
    print(f"  whole history (baseline)  {ms[1]:8.2f} ms")
    print(f"  ratio kept / whole        {ms[0] / ms[1]:8.4f}")


if __name__ == "__main__":
    main()
