"""`keel parity A B`: is B's sampler–learner mismatch the same as A's?

    keel parity base-engine new-engine --server http://keel:8750 [--steps 50:]
    keel parity base-s1,base-s2,base-s3 new-s1,new-s2,new-s3     # several seeds a side

For a change to the inference engine, a kernel, the precision or a framework version: run a
short job before and after (better: a few seeds of each), then ask whether the mismatch
moved. Exit 0 when it did not (every metric within its margin), 1 when it did (a metric
beyond it), 2 when the runs cannot be compared (an unknown or ambiguous run, no metric both
sides have, no steps in the range, too few steps to test), 3 when the runs cannot tell
(neither within nor beyond the margin: more steps or more seeds).

This module is the command and its reads; what is compared and how the verdict is reached
is `wire.parity` (pure, shared with the compare page's parity view, which gives the same
verdict) and docs/parity.md, "How it decides".

Standard library only at module level (see keel/cli.py): `wire.parity` is imported
inside the functions, and the reads go through `keel.client.Client` (urllib).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.client import Client

__all__ = ["COMMANDS", "read_run"]

"""As trainer_hooks.integrations.common (not imported: it pulls in the Monitor)."""

_DISTRIBUTION_PAGE = 5000
"""The most steps GET /runs/{id}/distributions answers unbucketed."""


# -- reading a run ------------------------------------------------------------------------


def read_run(
    client: Client, run: dict[str, Any], start: int | None, end: int | None, taus: Sequence[float]
) -> tuple[dict[str, list[float]], list[str], list[int]]:
    """The run's per-step values of every parity metric it has in start..end, notes, and the
    steps its scalars have there (sorted)."""
    from wire.parity import HISTOGRAM_KEY, SCALAR_KEYS, histogram_values

    stored = {info["key"] for info in client.keys(run)}
    values: dict[str, list[float]] = {}
    steps: set[int] = set()
    for key in SCALAR_KEYS:
        if key in stored:
            at, values[key] = client.points(run, key, start=start, end=end)
            steps.update(int(step) for step in at)
    notes: list[str] = []
    edges, counts, nans, left_out = _distributions(client, run, start, end)
    if left_out:
        notes.append(f"{left_out} step(s) of {HISTOGRAM_KEY} have other bin edges than the newest: left out")
    if counts:
        from_histograms, histogram_notes = histogram_values(edges, counts, nans, taus)
        values.update(from_histograms)
        notes += histogram_notes
    return values, notes, sorted(steps)


def _distributions(
    client: Client, run: dict[str, Any], start: int | None, end: int | None
) -> tuple[list[float], list[list[int]], list[int], int]:
    """Edges, per-step counts and NaN counts of the histogram in start..end, every step on
    its own (consecutive windows when the range holds more than one unbucketed answer)."""
    from wire.parity import HISTOGRAM_KEY, joined_pages

    found = client.distributions(run, HISTOGRAM_KEY, start, end, max_steps=_DISTRIBUTION_PAGE)
    if not found["bucketed"]:
        return found["edges"], found["counts"], found["nan"], found["left_out"]
    low = start or 0
    high = end if end is not None else int(run.get("last_step") or found["steps"][-1])
    return joined_pages([
        client.distributions(run, HISTOGRAM_KEY, window, min(window + _DISTRIBUTION_PAGE - 1, high), max_steps=_DISTRIBUTION_PAGE)
        for window in range(low, high + 1, _DISTRIBUTION_PAGE)
    ])  # fmt: skip


def _span(steps: Sequence[int]) -> str:
    return f"steps {steps[0]}–{steps[-1]} ({len(steps)})" if steps else "no steps"


# -- the command --------------------------------------------------------------------------


def _steps_range(text: str) -> tuple[int | None, int | None]:
    first, colon, last = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"--steps takes FROM:TO (either may be empty), got {text!r}")
    try:
        start = int(first) if first.strip() else None
        end = int(last) if last.strip() else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps takes integers FROM:TO, got {text!r}") from None
    if start is not None and end is not None and start > end:
        raise argparse.ArgumentTypeError(f"--steps FROM must not be after TO, got {text!r}")
    return start, end


def _keyed(text: str) -> tuple[str | None, float]:
    key, equals, number = text.rpartition("=")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected [KEY=]NUMBER, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return (key if equals else None), value


def _taus(text: str) -> list[float]:
    try:
        taus = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--taus takes comma-separated numbers, got {text!r}") from None
    if not taus or any(not tau > 0 or math.isinf(tau) for tau in taus):
        raise argparse.ArgumentTypeError(f"--taus takes positive numbers, got {text!r}")
    return taus


def _refs(text: str) -> list[str]:
    refs = [part.strip() for part in text.split(",") if part.strip()]
    if not refs:
        raise argparse.ArgumentTypeError(f"expected a run id or name, or several separated by commas, got {text!r}")
    return refs


def _add_parity(parser: argparse.ArgumentParser) -> None:
    from wire.parity import DEFAULT_ALPHA, DEFAULT_TAUS, DEFAULT_TOLERANCE, SEED_TOLERANCE
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument("a", metavar="A", type=_refs, help="the reference run (id or name), or its seeds: A1,A2,...")
    parser.add_argument("b", metavar="B", type=_refs, help="the run to compare with it (id or name), or its seeds: B1,B2,...")
    parser.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
    parser.add_argument("--token", default=None, help="API token with read scope (default: $KEEL_TOKEN)")
    parser.add_argument("--steps", type=_steps_range, default=(None, None), metavar="FROM:TO",
                        help="the steps compared, both ends included, either may be empty (default: all)")
    parser.add_argument("--tolerance", type=_keyed, action="append", default=[], metavar="[KEY=]REL",
                        help=f"the margin: B/A within [1/(1+REL), 1+REL] is no difference (default {SEED_TOLERANCE:g} with one run "
                             f"a side, {DEFAULT_TOLERANCE:g} with several); KEY=REL for one metric; repeatable")
    parser.add_argument("--floor", type=_keyed, action="append", default=[], metavar="[KEY=]ABS",
                        help="numerical-noise floor: values at or below it count as zero (default per metric: KL 1e-12, "
                             "|ℓ| 1e-6, shares 1e-4); KEY=ABS for one metric; repeatable")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"family-wise significance level over the metrics (default {DEFAULT_ALPHA})")
    parser.add_argument("--taus", type=_taus, default=list(DEFAULT_TAUS), metavar="T1,T2,...",
                        help="τ of the histogram's tail shares |ℓ| ≥ τ and ℓ ≤ −τ, bin edges (default 0.001,0.01,0.1)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _split_keyed(pairs: list[tuple[str | None, float]], default: float | None) -> tuple[float | None, dict[str, float]]:
    per_key: dict[str, float] = {}
    for key, value in pairs:
        if key is None:
            default = value
        else:
            per_key[key] = value
    return default, per_key


def _fail(message: str, as_json: bool) -> int:
    from wire.parity import EXIT_INCOMPARABLE

    if as_json:
        print(json.dumps({"verdict": "incomparable", "exit": EXIT_INCOMPARABLE, "error": message}))
    print(f"keel parity: {message}", file=sys.stderr)
    return EXIT_INCOMPARABLE


def _parity(args: argparse.Namespace) -> int:
    from keel.cli import one_line
    from keel.client import Client, ClientError
    from wire.parity import ParityError, compare_groups
    from wire.urls import default_server

    if not 0 < args.alpha < 0.5:
        return _fail(f"--alpha must be in (0, 0.5), got {args.alpha}", args.json)
    tolerance, tolerances = _split_keyed(args.tolerance, None)
    floor, floors = _split_keyed(args.floor, None)
    server = default_server(args.server)
    token = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
    start, end = args.steps
    try:
        client = Client(server, token)
        sides = {side: [client.run(ref) for ref in refs] for side, refs in (("a", args.a), ("b", args.b))}
        read = {side: [read_run(client, run, start, end, args.taus) for run in runs] for side, runs in sides.items()}
    except (ClientError, ValueError) as exc:
        return _fail(str(exc), args.json)
    names = {side: ",".join(str(run["name"]) for run in runs) for side, runs in sides.items()}
    shown = str if args.json else one_line  # a name on a line of the report is that line's text, never a line of its own
    try:
        report = compare_groups(
            [values for values, _, _ in read["a"]], [values for values, _, _ in read["b"]],
            tolerance=tolerance, tolerances=tolerances, floor=floor, floors=floors, alpha=args.alpha,
        )  # fmt: skip
    except ParityError as exc:
        return _fail(f"{names['a']!r} and {names['b']!r}: {exc}", args.json)
    spans = {f"{side.upper()} {shown(str(run['name']))}": _span(steps) for side in ("a", "b") for run, (_, _, steps) in zip(sides[side], read[side], strict=True)}
    if len(set(spans.values())) > 1:
        listed = ", ".join(f"{who} has {span}" for who, span in spans.items())
        report.notes.insert(0, f"the step ranges differ: {listed}; each run's own steps are compared")
    run_notes = [
        f"run {side.upper()}{' (' + shown(str(run['name'])) + ')' if len(sides[side]) > 1 else ''}: {note}"
        for side in ("a", "b")
        for run, (_, notes, _) in zip(sides[side], read[side], strict=True)
        for note in dict.fromkeys(notes)
    ]
    report.notes = run_notes + report.notes
    report.runs = {
        side: {
            "name": shown(names[side]), "start": start, "end": end,
            "runs": [{"id": run["id"], "name": run["name"]} for run in runs],
            **({"id": runs[0]["id"]} if len(runs) == 1 else {}),
        }
        for side, runs in sides.items()
    }  # fmt: skip
    print(json.dumps(report.to_json(), indent=2) if args.json else report.render())
    return report.exit_code


COMMANDS = {
    "parity": (
        "Compare two runs' (or two sets of seeds') sampler–learner mismatch: exit 0 same, 1 different, "
        "2 not comparable, 3 cannot tell.",
        _add_parity,
        _parity,
    ),
}
