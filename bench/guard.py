"""Does `keel lm --guard` save the runs that would collapse, and what does it cost the ones that would not?

    .venv/bin/python -m bench.guard --corpus corpora/regimes --out guard.jsonl [--collapsed 60 --stable 60]

Takes the settings of runs of a regime corpus (`keel lm-regimes`): those whose reward fell
for good (a lasting collapse, wire/labels.py) and as many that learned and never fell, and trains each
again twice, side by side in one process each (`--jobs` at once): without the guard and with
it. The guard acts as `keel lm --guard` does, on the default critical rules (`--on rules`, the
default), or on the built-in collapse hazard passing 0.5 (`--on hazard`: `--guard-hazard 0.5`),
either computed beside the loop from the same metrics the server would compute it from (what
`Monitor.alerts` and `Monitor.hazard` say, without the server's delay). Resumable: every
finished run is one line of `--out`, and a line already there is not run again.

Prints, for the would-be collapses (those that collapsed in the corpus) and the stable ones:
the share that end without a lasting collapse, with and without the guard; the median final
reward (mean of the last 50 steps) of each arm; rollbacks and steps lost. A run is
asynchronous (the sampler races the learner), so the unguarded rerun of a corpus collapse may
not collapse again: both figures are shown.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

FINAL_WINDOW = 50


def _pick(corpus: str, collapsed: int, stable: int) -> list[tuple[str, dict[str, Any]]]:
    """Runs that fell for good, and runs that learned (reached the label's 0.5) and never fell
    (no dip, nothing unjudged), each in an order drawn from their names (every loss and
    regime mixed, the same every time)."""
    from learners.lm.runfiles import read_dir
    from wire.labels import REACH, falls, smoothed

    falling, steady = [], []
    for run in sorted(read_dir(corpus), key=lambda run: hashlib.sha256(run["name"].encode()).hexdigest()):
        rewards = smoothed(run["series"]["reward/mean"])
        label = falls(rewards)
        if label.collapse is not None:
            falling.append(("collapsed", run["spec"]))
        elif label.unjudged is None and not label.dips and max(rewards, default=0.0) >= REACH:
            steady.append(("stable", run["spec"]))
    return falling[:collapsed] + steady[:stable]


def _drawn(count: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """Settings where PPO falls half the time in the regime corpus (unclipped, a learning rate
    of 1.5e-3 or more: 8 of its 16 such runs fell for good), drawn with their other axes as
    the corpus draws them: which twin would have collapsed is only known once the unguarded
    one has run."""
    import random

    rng = random.Random(seed)
    drawn = []
    for index in range(count):
        prompts, group = rng.choice([(16, 8), (8, 16), (32, 4), (8, 8)])
        drawn.append(("drawn", {
            "loss": "ppo", "lag": rng.randint(2, 12), "sampler_dtype": rng.choice(["bf16", "fp16", "fp32"]),
            "lr": rng.choice([1.5e-3, 2e-3, 3e-3]), "clip": 0.0, "digits": rng.choice([2, 2, 3, 3, 4]),
            "prompts": prompts, "group": group, "steps": 1000, "seed": 1000 + index,
        }))  # fmt: skip
    return drawn


def run_arm(kind: str, spec: dict[str, Any], guard: bool, confirm_drop: float = 0.0, on: str = "rules") -> dict[str, Any]:
    """One run (in a worker process): its outcome. The guarded arm acts on the default critical
    rules (`on` "rules": what `keel lm --guard` does) or on the built-in hazard passing 0.5
    ("hazard": `--guard-hazard 0.5`), either computed beside the loop from the step's metrics."""
    import torch

    from learners.lm.guard import GuardConfig
    from learners.lm.learner import LMConfig, Recorder, train
    from server.alerts.backtest import Replay
    from server.alerts.catalog import DEFAULT_RULES
    from server.alerts.hazard import MODEL, HazardModel, hazard_at, reads
    from wire import Row
    from wire.labels import falls, smoothed

    torch.set_num_threads(1)
    model = HazardModel(MODEL)  # the built-in one (a server with no KEEL_HAZARD_MODEL)
    state: dict[str, Any] = {}
    latest: dict[str, float | None] = {"hazard": None}
    critical = [Replay(rule, hazard_model=model) for rule in DEFAULT_RULES if rule.severity == "critical"] if on == "rules" else []

    class WatchingRecorder(Recorder):
        """Keeps the series, the hazard and the critical rules' episodes after each step, as
        the server computes them."""

        def log(self, step: int, metrics: Any) -> None:
            super().log(step, metrics)
            values = {key: column[step] for key, column in self.series.items() if len(column) > step}
            if on == "hazard" and reads(values):
                latest["hazard"] = hazard_at(state, values, model)
            for replay in critical:
                replay.feed(Row(step=step, time=None, values=values))

    def alarm() -> int | None:
        """The step the earliest critical alert firing now started at (`keel lm`'s alarm)."""
        started = [replay.firing.started_step for replay in critical if replay.firing is not None]
        return min(started) if started else None

    recorder = WatchingRecorder()
    config = LMConfig(**spec)
    guarding = GuardConfig(hazard=0.5 if on == "hazard" else None, confirm_drop=confirm_drop) if guard else None
    train(config, recorder, guard=guarding, hazard=lambda: latest["hazard"], alarm=alarm)
    rewards = recorder.series["reward/mean"]
    label = falls(smoothed(rewards))
    rollbacks = recorder.series.get("guard/rollback", [])
    lost = recorder.series.get("guard/steps_lost", [0.0])
    return {
        "name": config.name,
        "kind": kind,
        "guard": guard,
        "on": on if guard else None,
        "confirm_drop": confirm_drop if guard else None,
        "collapse": label.collapse,
        "peak": max(smoothed(rewards), default=0.0),
        "final_reward": statistics.fmean(rewards[-FINAL_WINDOW:]),
        "rollbacks": int(sum(r for r in rollbacks if r == r)),
        "steps_lost": int(lost[-1]) if lost else 0,
    }


def _done(out: Path) -> dict[tuple[str, bool], dict[str, Any]]:
    if not out.exists():
        return {}
    results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["name"], r["guard"]): r for r in results}


def _both_arms(results: list[dict[str, Any]]) -> list[tuple[str, dict[bool, dict[str, Any]]]]:
    """Each setting that has both arms, with its kind: (kind, {False: unguarded, True: guarded})."""
    pairs: dict[tuple[str, str], dict[bool, dict[str, Any]]] = {}
    for r in results:
        pairs.setdefault((r["kind"], r["name"]), {})[r["guard"]] = r
    return [(kind, pair) for (kind, _), pair in pairs.items() if True in pair and False in pair]


def _pairs(results: list[dict[str, Any]]) -> dict[str, list[dict[bool, dict[str, Any]]]]:
    """Both arms of each setting, by what it is: "collapsed" and "stable" as the corpus ran them;
    a drawn setting by what its unguarded twin did ("drawn, collapsed unguarded", "drawn,
    learned and stayed"; one that never learned says nothing of the guard)."""
    grouped: dict[str, list[dict[bool, dict[str, Any]]]] = {}
    for kind, pair in _both_arms(results):
        if kind == "drawn":
            unguarded = pair[False]
            if unguarded["collapse"] is not None:
                kind = "drawn, collapsed unguarded"
            elif unguarded.get("peak", 0.0) >= 0.5:
                kind = "drawn, learned and stayed unguarded"
            else:
                continue
        grouped.setdefault(kind, []).append(pair)
    return grouped


def report(results: list[dict[str, Any]]) -> str:
    lines = []
    both_arms = [pair for _, pair in _both_arms(results)]
    if both_arms:
        # Unconditioned: what the guard changes over every setting. A setting's outcome is
        # partly chance (an asynchronous run), so the groups below, picked by what the
        # unguarded twin did, regress towards the mean even with a guard that does nothing.
        fell = {g: sum(p[g]["collapse"] is not None for p in both_arms) for g in (False, True)}
        means = {g: statistics.fmean(p[g]["final_reward"] for p in both_arms) for g in (False, True)}
        n = len(both_arms)
        diffs = [p[True]["final_reward"] - p[False]["final_reward"] for p in both_arms]
        spread = 1.96 * statistics.stdev(diffs) / n**0.5 if n > 1 else float("nan")
        lines.append(
            f"every setting ({n}): collapsed without the guard {fell[False]}/{n} ({fell[False] / n:.0%}), "
            f"with it {fell[True]}/{n} ({fell[True] / n:.0%}); mean final reward {means[False]:.3f} -> {means[True]:.3f} "
            f"(paired change {statistics.fmean(diffs):+.3f} ± {spread:.3f}, 95 %)"
        )
    for kind, both in _pairs(results).items():
        if not both:
            continue
        n = len(both)

        def share(guard: bool, pairs: list[dict[bool, dict[str, Any]]] = both) -> str:
            healthy = sum(p[guard]["collapse"] is None for p in pairs)
            return f"{healthy}/{len(pairs)} ({healthy / len(pairs):.0%})"

        finals = {g: statistics.median(p[g]["final_reward"] for p in both) for g in (False, True)}
        means = {g: statistics.fmean(p[g]["final_reward"] for p in both) for g in (False, True)}
        diffs = [p[True]["final_reward"] - p[False]["final_reward"] for p in both]
        rollbacks = [p[True]["rollbacks"] for p in both]
        change = f"{means[True] / means[False] - 1:+.1%}" if means[False] else "n/a"
        lines.append(
            f"{kind} ({n} settings): end healthy without the guard {share(False)}, with it {share(True)}; "
            f"mean final reward {means[False]:.3f} -> {means[True]:.3f} ({change}), "
            f"median {finals[False]:.3f} -> {finals[True]:.3f} (median change {statistics.median(diffs):+.3f}); "
            f"runs rolled back {sum(r > 0 for r in rollbacks)}/{n}, rollbacks {sum(rollbacks)}, "
            f"steps lost {sum(p[True]['steps_lost'] for p in both)}"
        )
        # A guarded run the guard never acted on is a rerun of its twin: how often the two
        # differ there is the run-to-run noise of an asynchronous run, not the guard's doing.
        acted = [p for p in both if p[True]["rollbacks"]]
        idle = [p for p in both if not p[True]["rollbacks"]]
        for what, some in (("rolled back", acted), ("never rolled back (a rerun)", idle)):
            if some:
                lines.append(f"  {what} ({len(some)}): end healthy without the guard {share(False, some)}, with it {share(True, some)}")
        if kind == "collapsed":
            again = [p for p in both if p[False]["collapse"] is not None]
            if again:
                lines.append(f"  of them collapsing again unguarded ({len(again)}): end healthy with the guard {share(True, again)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="corpora/regimes")
    parser.add_argument("--out", default="guard.jsonl", help="one line per finished run (resumable)")
    parser.add_argument("--collapsed", type=int, default=60, help="would-be collapses taken (default 60)")
    parser.add_argument("--stable", type=int, default=60, help="stable runs taken (default 60)")
    parser.add_argument("--draw", type=int, default=0, metavar="N",
                        help="also N collapse-prone PPO settings drawn afresh (judged by their unguarded twin)")  # fmt: skip
    parser.add_argument("--confirm-drop", type=float, default=0.0, metavar="R",
                        help="the guarded arm's GuardConfig.confirm_drop (0: roll back on the hazard alone); "
                             "one --out per value")  # fmt: skip
    parser.add_argument("--on", choices=("rules", "hazard"), default="rules",
                        help="what the guarded arm acts on: the default critical rules (keel lm --guard) or the "
                             "built-in hazard passing 0.5 (--guard-hazard 0.5); one --out per value")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="only print what --out holds")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.report:
        done = _done(out)
        picked = _pick(args.corpus, args.collapsed, args.stable) + _drawn(args.draw)
        todo = [(kind, spec, guard) for kind, spec in picked for guard in (False, True)]
        from learners.lm.learner import LMConfig

        other = {r.get("confirm_drop", 0.0) for (_, guard), r in done.items() if guard} - {args.confirm_drop}
        if other:
            parser.error(f"{out} holds guarded runs with confirm_drop {sorted(other)}: one --out per --confirm-drop")
        acted_on = {r.get("on") or "hazard" for (_, guard), r in done.items() if guard} - {args.on}
        if acted_on:
            parser.error(f"{out} holds runs guarded on {sorted(acted_on)}: one --out per --on")
        todo = [t for t in todo if (LMConfig(**t[1]).name, t[2]) not in done]
        print(f"bench.guard: {len(todo)} run(s) to go, {len(done)} done", file=sys.stderr, flush=True)
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            arms = [(*t, args.confirm_drop, args.on) for t in todo]
            for result in pool.map(run_arm, *zip(*arms, strict=True)) if arms else ():
                with out.open("a") as file:
                    file.write(json.dumps(result) + "\n")
                print(f"  {result['name']} guard={result['guard']}: collapse {result['collapse']}, final {result['final_reward']:.3f}, rollbacks {result['rollbacks']}", file=sys.stderr, flush=True)
    print(report(list(_done(out).values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
