"""`keel backtest`: replay stored runs through rules and print where each would have fired.

Like `promtool test rules`: tune a rule on last week's runs before enabling it. The
replay is `server.alerts.backtest` (the engine's detectors and lifecycle, in-process,
read-only: nothing is written to the database). Standard library only at module level
(keel/cli.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default=None,
                        help="sqlite:///path or postgresql://... (env KEEL_DATABASE_URL; default ~/.keel/keel.db)")  # fmt: skip
    parser.add_argument("--run", action="append", default=None, metavar="ID", help="a run id (repeat); default: --project's runs")
    parser.add_argument("--project", default=None, help="every run of this project (with no --run: every run)")
    rules = parser.add_mutually_exclusive_group()
    rules.add_argument("--rules", default=None, metavar="FILE",
                       help="JSON or YAML list of {name, metric, detector, params, severity, for_steps, keep_firing_for}")  # fmt: skip
    rules.add_argument("--rule-id", type=int, action="append", default=None, metavar="N", help="a stored rule (repeat)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every result to this file")


def format_results(results: list[Any]) -> str:
    """A line per firing: run, rule, severity, pending/firing/resolved steps, message. The
    names and the message (a metric's key is in it) are `one_line`: each firing one line."""
    from keel.cli import one_line

    lines = [f"{'run':34s} {'rule':24s} {'severity':8s} {'pending':>7s} {'fired':>6s} {'resolved':>8s}  message"]
    fired_runs: dict[str, int] = {}
    for run in results:
        for result in run.results:
            if result.skipped:
                continue
            fired_runs.setdefault(result.rule.name, 0)
            fired_runs[result.rule.name] += bool(result.episodes)
            for episode in result.episodes:
                resolved = "-" if episode.resolved_step is None else str(episode.resolved_step)
                lines.append(
                    f"{one_line(run.run_name)[:34]:34s} {one_line(result.rule.name)[:24]:24s} {one_line(result.rule.severity):8s} "
                    f"{episode.started_step:>7d} {episode.fired_step:>6d} {resolved:>8s}  {one_line(episode.message)[:120]}"
                )
    lines.append("")
    for name, count in fired_runs.items():
        lines.append(f"{one_line(name)}: fired on {count} of {len(results)} runs")
    skipped = {r.rule.name: r.skipped for run in results for r in run.results if r.skipped}
    lines.extend(f"{one_line(name)}: not replayed ({one_line(why)})" for name, why in skipped.items())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from sqlalchemy.exc import DBAPIError

    from server import db
    from server.alerts.backtest import DEFAULT_RULES, backtest_runs, parse_rules, stored_rules
    from server.alerts.hazard import load_model
    from server.config import Settings
    from server.errors import NotFound
    from server.storage import Store

    settings = Settings(**({"database_url": args.database_url} if args.database_url else {}))  # type: ignore[arg-type]
    rules = None
    if args.rules:
        try:
            with open(args.rules, encoding="utf-8") as handle:
                rules = parse_rules(handle.read())
        except (OSError, ValueError) as exc:
            print(f"keel backtest: {args.rules}: {exc}", file=sys.stderr)
            return 2

    hazard_model = load_model(settings.hazard_model)  # the server's (KEEL_HAZARD_MODEL), else the built-in one

    async def replay() -> list[Any]:
        store = Store(db.create_engine(settings.database_url))
        try:
            chosen = rules
            if chosen is None:
                chosen = await stored_rules(store, args.rule_id) if args.rule_id else list(DEFAULT_RULES)
            run_ids = args.run or [r.id for r in await store.list_runs(project=args.project)]
            return await backtest_runs(store, chosen, run_ids, hazard_model)
        finally:
            await store.close()

    try:
        results = asyncio.run(replay())
    except NotFound as exc:
        print(f"keel backtest: {exc}", file=sys.stderr)
        return 2
    except DBAPIError as exc:
        print(f"keel backtest: cannot read the database ({type(exc.orig).__name__}); is it a Keel database "
              "(`keel db upgrade`)?", file=sys.stderr)  # fmt: skip
        return 2
    if not results:
        print("keel backtest: no runs to replay", file=sys.stderr)
        return 1
    print(format_results(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"runs": [r.to_json() for r in results]}, handle, indent=2)
    return 0


COMMANDS = {
    "backtest": ("Replay stored runs through rules: where would each have fired?", add_arguments, run),
}
