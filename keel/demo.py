"""`keel demo` and `keel eval-alerts`: commands that join the server and the learners.

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from typing import Any

# A child started as `python -m keel` or `-c "import keel…"` would resolve against its
# working directory first (sys.path[0]); started from a training repository with its own
# `server/` or `keel.py`, it would run that. The child drops that entry before importing.
_KEEL_CHILD = "import sys; del sys.path[0]; from keel.cli import main; sys.exit(main())"


def keel_command(*args: str) -> list[str]:
    """argv that runs `keel *args` with this interpreter, whatever the working directory holds."""
    return [sys.executable, "-c", _KEEL_CHILD, *args]


DEMO_ARMS = ("importance_sampling", "cispo")
"""The toy A/B: an unbounded loss against a bounded one (lag 8, severe mismatch)."""
LM_ARMS = ("ppo", "cispo")
"""The real-network A/B (`keel lm`, docs/lm.md): PPO collapses at these settings, CISPO does not."""
LM_SETTINGS = ("--lag", "8", "--sampler-dtype", "bf16", "--lr", "2e-3", "--clip", "0", "--digits", "4", "--steps", "500")
GUARD_PAIR = "lm-ppo-lag4-bf16"
"""Run-name stem of the guarded PPO and its unguarded twin (same seed, GUARD_SETTINGS)."""
GUARD_SETTINGS = (
    "--lag", "4", "--sampler-dtype", "bf16", "--lr", "3.5e-3", "--clip", "0", "--digits", "2",
    "--prompts", "32", "--samples", "4", "--steps", "500",
)  # fmt: skip
"""The guarded pair's settings: PPO learns the easy task within ~150 steps here and then, more
often than not, falls (a hot learning rate, a stale bf16 sampler, no gradient clipping;
docs/lm.md, "The guard"). The guarded run acts on the collapse hazard (GUARD_HAZARD), which
rises as the reward starts to fall, and rolls back to the weights from before the rise."""
GUARD_HAZARD = "0.5"


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8750)
    parser.add_argument("--step-delay", type=float, default=0.15, help="seconds between toy and transformer steps")
    parser.add_argument("--dir", default=".keel-demo", metavar="DIR",
                        help="where the demo's database and the trainers' spools go, emptied at start (default: ./.keel-demo)")  # fmt: skip
    parser.add_argument("--database-url", default=None, help="default: a fresh DIR/demo.db")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="CPU the demo's trainers may take at once, in toy runs (a transformer counts as "
                             f"{LM_WEIGHT}); default {JOBS_PER_CORE} per core the machine has, at least "
                             f"{MIN_JOBS}")  # fmt: skip


JOBS_PER_CORE = 3
"""A toy run at the demo's pace takes about a sixth of a core, a transformer twice that (its
learner and sampler threads), each beside a Monitor worker, the server and the browser."""
MIN_JOBS = 6
"""Enough for three transformers at once (3 × LM_WEIGHT)."""
LM_WEIGHT = 2


def demo_jobs(cores: int | None) -> int:
    """The demo's budget of concurrent trainers, in toy runs, for a machine with `cores`."""
    return max(MIN_JOBS, JOBS_PER_CORE * (cores or 1))


def demo_waves(runs: dict[str, list[str]]) -> list[list[str]]:
    """The round's run names in launch groups that run side by side, in the round's order: the
    toy runs together, the guarded run with its twin, each transformer seed's arms together."""
    groups: dict[str, list[str]] = {}
    for name in runs:
        if name.startswith(GUARD_PAIR):  # the guarded run and its twin
            key = "guard"
        elif name.startswith("lm-"):  # lm-<loss>-lag8-bf16-s<seed>: one group per seed
            key = "lm-" + name.rsplit("-s", 1)[1]
        else:  # <loss>-lag8-severe-s<seed>
            key = "toy"
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def _weight(name: str) -> int:
    return LM_WEIGHT if name.startswith("lm-") else 1


def _die_with_parent() -> None:
    """In a demo child: get SIGTERM when the demo process dies, however it dies (Linux)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the demo's finally block still terminates its children


def _demo_runs(base: str, round_index: int, step_delay: float) -> dict[str, list[str]]:
    """The `keel` commands of one demo round, by run name, in launch order: the toy A/B over
    three seeds, the guarded PPO beside its unguarded twin, and the transformer A/B over two."""
    seeds = [3 * round_index + s for s in range(3)]
    runs: dict[str, list[str]] = {}
    for loss in DEMO_ARMS:
        for seed in seeds:
            name = f"{loss}-lag8-severe-s{seed}"
            runs[name] = ["sim", "--loss", loss, "--lag", "8", "--mismatch", "severe", "--seed", str(seed),
                          "--steps", "600", "--step-delay", str(step_delay), "--server", base, "--name", name]
    # The guard beside its unguarded twin (same seed): a run that protects itself (docs/lm.md).
    twin = f"{GUARD_PAIR}-s{seeds[0]}"
    for name, guard in ((twin, ()), (f"{twin}-guard", ("--guard", "--guard-hazard", GUARD_HAZARD))):
        runs[name] = ["lm", "--loss", "ppo", *GUARD_SETTINGS, "--seed", str(seeds[0]), "--step-delay", str(step_delay),
                      "--group", "lm-ppo-guarded" if guard else "lm-ppo-unguarded", *guard, "--server", base, "--name", name]  # fmt: skip
    for seed in seeds[:2]:
        for loss in LM_ARMS:
            name = f"lm-{loss}-lag8-bf16-s{seed}"
            runs[name] = ["lm", "--loss", loss, *LM_SETTINGS, "--seed", str(seed), "--step-delay", str(step_delay),
                          "--group", f"lm-{loss}", "--server", base, "--name", name]
    return runs


def _demo_comparisons(runs: dict[str, list[str]]) -> list[tuple[str, set[str]]]:
    """The compare pages of one demo round, as (label, run names): the toy A/B, the guarded
    PPO beside its unguarded twin, and the transformer A/B."""
    toy = {name for name in runs if not name.startswith("lm-")}
    pair = {name for name in runs if name.startswith(GUARD_PAIR)}
    transformer = set(runs) - toy - pair
    pages = [
        (f"toy {' vs '.join(DEMO_ARMS)}", toy),
        ("guarded ppo beside its unguarded twin", pair),
        (f"transformer {' vs '.join(LM_ARMS)}", transformer),
    ]
    return [(label, names) for label, names in pages if names]


def _demo(args: argparse.Namespace) -> int:
    """Serve on the embedded database and stream A/B experiments, round after round: toy runs
    (IS vs CISPO) and small transformers trained asynchronously on a stale bf16 sampler
    (PPO vs CISPO), paced to the machine's cores."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    import uvicorn

    from server.app import create_app
    from server.config import Settings
    from server.serving import uvicorn_config

    home = Path(args.dir).expanduser().resolve()
    shutil.rmtree(home, ignore_errors=True)
    (home / "logs").mkdir(parents=True)
    database_url = args.database_url or f"sqlite:///{home / 'demo.db'}"
    jobs = args.jobs if args.jobs is not None else demo_jobs(os.cpu_count())
    if jobs < 1:
        print("keel demo: --jobs must be at least 1", file=sys.stderr)
        return 2
    env = {
        **os.environ, "KEEL_SPOOL_DIR": str(home / "spool"),
        # One torch thread per process: OpenMP threads spin at every op's barrier, and a dozen
        # spinning processes on two cores are what starves the server and the sockets.
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    }
    settings = Settings(database_url=database_url, port=args.port, silent_after_s=30)
    server = uvicorn.Server(uvicorn_config(create_app(settings), settings, log_level="warning", keel_loggers=True))
    running: dict[str, subprocess.Popen[bytes]] = {}
    stop = threading.Event()

    def start(name: str, command: list[str]) -> None:
        with open(home / "logs" / f"{name}.log", "wb") as log:
            running[name] = subprocess.Popen(
                keel_command(*command), stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # Ctrl-C reaches the demo alone; it stops its children
                preexec_fn=_die_with_parent,
            )  # fmt: skip

    def reap() -> None:
        for name, child in list(running.items()):
            code = child.poll()
            if code is not None:
                del running[name]
                if code != 0 and not stop.is_set():
                    print(f"keel demo: {name} exited with {code}; its output: {home / 'logs' / (name + '.log')}", flush=True)

    def experiment() -> None:
        while not server.started:
            if stop.wait(0.1):
                return
        base = settings.base_url
        round_index = 0
        while not stop.is_set():
            runs = _demo_runs(base, round_index, args.step_delay)
            print(
                f"keel demo: round {round_index + 1}: toy {' vs '.join(DEMO_ARMS)} (lag 8, severe mismatch), "
                f"a guarded ppo beside its unguarded twin (lag 4, bf16 sampler, hot learning rate), then "
                f"transformer {' vs '.join(LM_ARMS)} (lag 8, bf16 sampler); {len(runs)} runs, "
                f"at most {jobs} toy runs' worth at once",
                flush=True,
            )
            waves = demo_waves(runs)
            pages = _demo_comparisons(runs)
            while (waves or running) and not stop.is_set():
                reap()
                used = sum(_weight(name) for name in running)
                while waves and (not running or used + sum(map(_weight, waves[0])) <= jobs):
                    wave = waves.pop(0)
                    for name in wave:
                        if stop.wait(0.5):  # the imports one after the other, not all at once
                            return
                        start(name, runs[name])
                    used += sum(map(_weight, wave))
                pages = _print_pages(base, pages)
                stop.wait(2.0)
            round_index += 1

    launcher = threading.Thread(target=experiment, daemon=True)
    launcher.start()
    print(
        f"keel demo: dashboard at {settings.base_url}/  (Ctrl-C to stop); database and spools in {home}",
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down, then raises the Ctrl-C it caught again
        pass
    finally:
        stop.set()
        launcher.join(timeout=10)  # it starts no child once it sees `stop`
        children = list(running.values())
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        print(f"keel demo: stopped ({len(children)} run(s) cut short); the database stays in {home}", flush=True)
    return 0


def _print_pages(base: str, pages: list[tuple[str, set[str]]]) -> list[tuple[str, set[str]]]:
    """Print the compare page of each A/B whose runs have all said hello; the rest, left."""
    import httpx

    if not pages:
        return pages
    try:
        runs = httpx.get(f"{base}/api/v1/runs", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return pages
    ids: dict[str, str] = {}
    for run in runs:  # newest first: this round's run of a name
        ids.setdefault(run["name"], run["id"])
    left = []
    for label, names in pages:
        if names <= ids.keys():
            print(f"keel demo: {label}: {base}/compare?runs={','.join(ids[name] for name in sorted(names))}", flush=True)
        else:
            left.append((label, names))
    return left


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part]


def _add_eval_alerts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", action="append", default=None, metavar="PATH",
                        help="score this corpus file (--save-corpus, or `keel lm-grid --json`); repeat; "
                        "default: build the toy grid below")  # fmt: skip
    parser.add_argument("--losses", type=_csv(str), default=None, help="default: the toy grid's 8 losses")
    parser.add_argument("--lags", type=_csv(int), default=[0, 2, 8, 32])
    parser.add_argument("--mismatch", type=_csv(str), default=["none", "mild", "severe"],
                        help="levels of learners.toy, or SIGMA/FRACTION (e.g. 0.15/0.01)")  # fmt: skip
    parser.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the idle cores)")
    parser.add_argument("--save-corpus", default=None, metavar="PATH", help="write the toy corpus built here to this file")
    parser.add_argument("--rules", default=None, metavar="FILE", help="a rule file to score instead of the default rules")
    parser.add_argument("--details", action="store_true", help="list every false alarm, early false alarm and miss")
    parser.add_argument("--without", action="append", default=[], metavar="METRIC",
                        help="score every run as if it did not log METRIC (a framework that logs no largest ratio: "
                        "--without mismatch/ratio_max); repeat")  # fmt: skip
    parser.add_argument("--no-rlwatch", action="store_true", help="skip rlwatch's detectors")
    parser.add_argument("--json", default=None, help="also write the scores to this file")
    parser.add_argument("--hazard", type=float, default=None, metavar="P",
                        help="also score the collapse hazard as a rule (hazard > P), its calibration "
                        "and its features' separation")  # fmt: skip
    parser.add_argument("--hazard-model", default=None, metavar="FILE",
                        help="a hazard model file (--fit-hazard) to use instead of the built-in one")  # fmt: skip
    parser.add_argument("--hazard-kind", choices=("logistic", "trees"), default="logistic",
                        help="the model --fit-hazard and --regimes fit: logistic, or gradient-boosted trees "
                        "(needs scikit-learn)")  # fmt: skip
    parser.add_argument("--regimes", action="store_true",
                        help="leave one regime out: per axis value of the corpora's runs (learning rate, "
                        "difficulty, model size, batch shape, loss family, sampler dtype, lag, clipping), fit the hazard "
                        "on the other runs and score the rules on that value's runs; the worst cell counts")  # fmt: skip
    parser.add_argument("--curve", type=_csv(float), default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                        metavar="P,P,...", help="with --regimes: the hazard thresholds of the operating curve")  # fmt: skip
    parser.add_argument("--fit-hazard", default=None, metavar="FILE",
                        help="fit the hazard on every corpus given and write the model to FILE")  # fmt: skip


def _eval_alerts(args: argparse.Namespace) -> int:
    import json
    import time

    from keel.eval_alerts import (
        AFTERMATH,
        MIN_HISTORY,
        WINDOW,
        build_corpus,
        evaluate,
        load_corpus,
        save_corpus,
    )
    from server.alerts.backtest import DEFAULT_RULES, parse_rules
    from server.alerts.hazard import load_model

    rules = list(DEFAULT_RULES)
    if args.rules:
        with open(args.rules, encoding="utf-8") as handle:
            rules = parse_rules(handle.read())
    corpora = []
    if args.corpus:
        corpora = [(path, load_corpus(path)) for path in args.corpus]
    else:
        import torch

        from learners.toy import DEFAULT_LOSSES
        from learners.toy_cli import idle_cores, keep_freed_memory

        torch.set_num_threads(args.threads or idle_cores())
        keep_freed_memory()
        started = time.perf_counter()
        corpus = build_corpus(args.losses or list(DEFAULT_LOSSES), args.lags, args.mismatch, args.seeds, args.steps, args.device)
        print(f"toy corpus built in {time.perf_counter() - started:.0f} s")
        if args.save_corpus:
            save_corpus(corpus, args.save_corpus)
        corpora = [("toy grid", corpus)]
    for _, corpus in corpora:
        for run in corpus:
            for metric in args.without:
                run.series.pop(metric, None)
    if args.fit_hazard:
        from keel.hazard_eval import fit, fit_trees, rows

        data = rows([run for _, corpus in corpora for run in corpus])
        fitter = fit_trees if args.hazard_kind == "trees" else fit
        model = fitter(data, description=", ".join(name for name, _ in corpora))
        with open(args.fit_hazard, "w", encoding="utf-8") as handle:
            json.dump(model, handle, indent=1)
        print(f"hazard fitted on {len(data.y)} rows ({sum(data.y)} within {model['horizon']} steps of a collapse): {args.fit_hazard}")
    hazard_model = load_model(args.hazard_model)  # after --fit-hazard, which may have written it; None: the built-in one
    if args.regimes:
        return _regimes(args, [run for _, corpus in corpora for run in corpus], rules)
    print(f"scoring: a hit is a firing in the {WINDOW} steps before the collapse; collapses before step "
          f"{MIN_HISTORY} are scored apart (no hist.); the last {AFTERMATH} steps of every run are not scored; "
          "FA = runs that never collapsed but fired")  # fmt: skip
    results = []
    for name, corpus in corpora:
        result = evaluate(
            corpus, rules, hazard_model=hazard_model, hazard_p=args.hazard, details=args.details, rlwatch=not args.no_rlwatch
        )
        print(f"\n== {name}: {result['runs']} runs, {result['collapsing']} collapsing "
              "(reward reached >= 0.5, fell >= 0.2 below its running peak and did not regain within 0.1 "
              "of it in 100 steps); dips: falls that regained, firings near them not judged")  # fmt: skip
        print(result["text"])
        if args.hazard is not None:
            from keel.hazard_eval import (
                calibration,
                feature_separation,
                format_calibration,
                format_separation,
                rows,
            )

            data = rows(corpus)
            result["calibration"] = calibration(data, hazard_model)
            result["separation"] = feature_separation(data)
            print(format_calibration(result["calibration"]))
            print(format_separation(result["separation"]))
        for line in result.get("details", []):
            print(line)
        if not result["rlwatch_available"] and not args.no_rlwatch:
            print("(rlwatch is not installed: pip install rlwatch to compare)")
        results.append({"corpus": name, **{k: v for k, v in result.items() if k != "text"}})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


def _regimes(args: argparse.Namespace, corpus: list[Any], rules: list[Any]) -> int:
    import json

    from keel.hazard_eval import fit, fit_trees
    from keel.regimes import format_cells, format_curve, leave_one_out, operating_curve, worst

    p = args.hazard if args.hazard is not None else 0.5
    fitter = fit_trees if args.hazard_kind == "trees" else fit
    results = leave_one_out(corpus, rules, p, fit_model=lambda data: fitter(data, description="leave one regime out"))
    if not results:
        print("keel eval-alerts --regimes: no axis with two values of at least 10 runs in these corpora", file=sys.stderr)
        return 2
    print(f"leave one regime out: {len(corpus)} runs, {len(results)} held-out cells; "
          f"'rules' = the critical rules (hazard rules with the cell's own model)")  # fmt: skip
    print(format_cells(results))
    hardest = worst(results)["recall"]["cell"]
    chosen = next((r for r in results if f"{r.cell.axis} {r.cell.value}" == hardest), results[0])
    curve = operating_curve(chosen, corpus, args.curve)
    print(format_curve(f"{chosen.cell.axis} {chosen.cell.value} (the cell of the worst recall)", curve))
    if args.json:
        from dataclasses import asdict

        with open(args.json, "w") as handle:
            json.dump({
                "cells": [{"axis": r.cell.axis, "value": r.cell.value, "runs": len(r.cell.runs),
                           "scores": [asdict(s) for s in r.scores]} for r in results],
                "worst": worst(results), "curve": [asdict(s) for s in curve],
            }, handle, indent=2, default=str)  # fmt: skip
    return 0


COMMANDS = {
    "eval-alerts": ("Score the alert rules on a labelled corpus (toy grid or a corpus file), beside rlwatch.", _add_eval_alerts, _eval_alerts),
    "demo": ("Serve on the embedded database and stream live A/B runs, round after round: toy simulations "
             "(importance_sampling vs cispo), small transformers trained asynchronously on a stale bf16 sampler "
             "(ppo vs cispo) and a guarded ppo beside its twin.", _add_demo, _demo),
}
