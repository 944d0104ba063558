"""One round of `keel demo` under its own pacing: is every step of every run stored?

    python -m bench.demo_round [--jobs N] [--step-delay S] [--timeout-s 1500]

Starts `keel demo` (a fresh database in a temporary directory, a free port), waits for its
second round to start (the first round's runs have all ended), reads every run of the first
round back, then stops the demo with Ctrl-C (SIGINT) as a person does. Prints, per run, its
status and last stored step against the last step its trainer logged, the round's wall time,
the load average sampled every 10 s (its median and maximum against the cores), and what the
demo printed on Ctrl-C. Exits 1 when a run of the round is not `finished` at its last step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.support import free_port

EXPECTED_LAST_STEP = {"toy": 599, "lm": 499}
"""The last step of a demo run (keel/demo.py: toy runs of 600 steps, transformers of 500)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=None, help="passed to keel demo (default: its own, from the cores)")
    parser.add_argument("--step-delay", type=float, default=None, help="passed to keel demo")
    parser.add_argument("--timeout-s", type=float, default=1500.0)
    args = parser.parse_args()

    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="keel-demo-bench-"))
    command = [sys.executable, "-m", "keel", "demo", "--port", str(port), "--dir", str(home / "demo")]
    command += ["--jobs", str(args.jobs)] if args.jobs is not None else []
    command += ["--step-delay", str(args.step_delay)] if args.step_delay is not None else []
    output = home / "demo.out"
    with output.open("w") as out:
        demo = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    started = time.monotonic()
    loads: list[float] = []
    try:
        while "round 2" not in output.read_text():
            if demo.poll() is not None or time.monotonic() - started > args.timeout_s:
                print(f"the demo did not finish its first round in {args.timeout_s:g} s:\n{output.read_text()}")
                return 1
            time.sleep(10)
            loads.append(os.getloadavg()[0])
        wall = time.monotonic() - started
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/runs", timeout=30) as response:
            runs = json.load(response)
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=60)
    first_round = [run for run in runs if run["name"].endswith(("-s0", "-s1", "-s2", "-s0-guard"))]
    bad = 0
    for run in sorted(first_round, key=lambda r: r["name"]):
        expected = EXPECTED_LAST_STEP["lm" if run["name"].startswith("lm-") else "toy"]
        whole = run["status"] == "finished" and run["last_step"] == expected
        bad += not whole
        print(f"{run['name']:<36} {run['status']:<9} last step {run['last_step']} of {expected}{'' if whole else '  <- lost its end'}")
    cores = os.cpu_count() or 1
    print(f"\n{len(first_round)} runs, {len(first_round) - bad} stored whole; round 1 took {wall:.0f} s on {cores} core(s)")
    print(f"load average (1 min) during the round: median {statistics.median(loads):.2f}, max {max(loads):.2f} "
          f"({statistics.median(loads) / cores:.2f} and {max(loads) / cores:.2f} per core)")  # fmt: skip
    tail = output.read_text().splitlines()
    print(f"the demo's exit code {demo.returncode}; its last line: {tail[-1] if tail else ''}")
    print(f"tracebacks in the demo's output and its runs' logs: "
          f"{sum(path.read_text(errors='replace').count('Traceback') for path in [output, *home.glob('demo/logs/*.log')])}")  # fmt: skip
    return 1 if bad or not first_round else 0


if __name__ == "__main__":
    sys.exit(main())
