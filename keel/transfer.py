"""`keel import tensorboard|wandb|console|csv` and `keel export`: other trackers' runs in, Keel's out.

Imports go through the ingest protocol like a live trainer's: the rows are cut into
frames in a temporary spool and streamed by the Sender (`trainer_hooks.sender.upload`,
as `keel sync` does), so an import has succeeded only when the server has acked every
frame. The run id is derived from the source (keel/importers.py), so importing the
same source again resumes the same run and the server, which keeps each (run, key,
step) once, stores nothing twice. See docs/read-api.md.

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.client import Client
    from keel.importers import ImportedRun
    from wire import Row

__all__ = ["COMMANDS", "upload_run"]

# A frame stays well inside the server's 8 MiB limit and the Sender's defaults.
_FRAME_ROWS = 1000
_FRAME_VALUES = 20_000
_FRAME_BYTES = 2 * 1024 * 1024
_EXIT_BAD_INPUT = 2


def _fail(command: str, message: str) -> int:
    print(f"keel {command}: {message}", file=sys.stderr)
    return _EXIT_BAD_INPUT


# -- import ---------------------------------------------------------------------------


def _add_import(parser: argparse.ArgumentParser) -> None:
    from keel.importers import FRAMEWORK_CHOICES
    from wire.urls import DEFAULT_SERVER_URL

    sources = parser.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for source, what, help_text in (
        ("tensorboard", "logdir", "a TensorBoard log directory (every directory with event files is a run)"),
        ("wandb", "path", "a wandb offline run directory, a wandb/ directory of them, or a history export (.csv, .json, .jsonl)"),
        ("console", "path", "a plain-text log of what a trainer printed (verl's console, the Hugging Face Trainer's and TRL's "
                            "dicts, JSON lines, key=value lines with a step): docs/integrations/run.md"),
        ("csv", "path", "any CSV with a step column (step, Step, _step, global_step, iteration), or wandb's panel export"),
    ):
        sub = sources.add_parser(source, help=help_text, description=help_text)
        sub.add_argument(what, type=Path, metavar=what.upper())
        sub.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
        sub.add_argument("--project", default="default", help="Keel project of the imported runs (default: default)")
        sub.add_argument("--name", default=None, help="run name (with several runs: the prefix of each name)")
        sub.add_argument("--group", default=None, help="Keel group of the imported runs")
        sub.add_argument("--tag", action="append", default=[], help="a tag to add (repeatable)")
        sub.add_argument("--token", default=None, help="API token with ingest scope (default: $KEEL_TOKEN)")
        sub.add_argument("--timeout", type=float, default=300.0, help="seconds to keep trying per run (default 300)")
        sub.add_argument("--dry-run", action="store_true", help="read and report, upload nothing")
        sub.add_argument("--framework", choices=FRAMEWORK_CHOICES, default="auto",
                         help="whose metric names to map to Keel's, as keel watch --framework does "
                              "(default auto: recognised from the names and the config)")  # fmt: skip
        if source == "console":
            sub.add_argument("--resume", action="store_true",
                             help="a step that goes back to 0 or 1 goes on in the same run (default: a new run)")  # fmt: skip
        if source == "csv":
            sub.add_argument("--step-column", default=None, help="the step's column (default: the first of step, Step, "
                                                                 "_step, global_step, iteration)")  # fmt: skip
            sub.add_argument("--run-column", default=None, help="a column naming the run of each row: one run per value")


def _import(args: argparse.Namespace) -> int:
    from keel.console import read_console
    from keel.importers import ImportSourceError, read_csv, read_tensorboard, read_wandb
    from wire import ProtocolError
    from wire.urls import default_server

    command = f"import {args.source}"
    path = getattr(args, "logdir", None) or args.path
    args.server = default_server(args.server)
    readers: dict[str, Any] = {
        "tensorboard": read_tensorboard,
        "wandb": read_wandb,
        "console": lambda path, **kw: read_console(path, resume=args.resume, **kw),
        "csv": lambda path, **kw: read_csv(path, step_column=args.step_column, run_column=args.run_column, **kw),
    }
    try:
        runs = readers[args.source](path.expanduser(), name=args.name, framework=args.framework)
    except (ImportSourceError, OSError) as exc:
        return _fail(command, str(exc))
    token = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
    failures = 0
    for run in runs:
        run.tags = list(dict.fromkeys([*run.tags, *args.tag]))
        rows = run.table.rows()
        summary = f"run {run.name!r} ({run.run_id}): {run.table.points} point(s) at {len(run.table.values)} step(s)"
        if run.table.points and args.framework == "auto":
            print(f"keel {command}: run {run.name!r}: framework {run.framework or 'none'} ({run.framework_why})")
        if not rows:
            print(f"keel {command}: {summary}: nothing to import, skipped")
        elif args.dry_run:
            print(f"keel {command}: {summary} (dry run, not uploaded)")
        else:
            try:
                error = upload_run(run, rows, args.server, project=args.project, group=args.group, token=token, timeout=args.timeout)
            except (ProtocolError, ValueError) as exc:
                return _fail(command, f"run {run.name!r}: {exc}")
            if error is None:
                print(f"keel {command}: {summary} uploaded to {args.server}")
            else:
                failures += 1
                print(f"keel {command}: {summary} NOT uploaded ({error}); import again to retry", file=sys.stderr)
        _report_skipped(command, run)
    return 1 if failures else 0


def _report_skipped(command: str, run: ImportedRun) -> None:
    for what in run.not_imported:
        print(f"keel {command}:   not imported: {what}")
    for (key, reason), count in sorted(run.table.skipped.items()):
        print(f"keel {command}:   not imported: {count} value(s) of {key!r}: {reason}")


def upload_run(
    run: ImportedRun,
    rows: list[Row],
    server_url: str,
    *,
    project: str = "default",
    group: str | None = None,
    token: str | None = None,
    timeout: float = 300.0,
) -> str | None:
    """Store `rows` in `run`'s deterministic run id; None once the server holds them all,
    else what went wrong. Raises ProtocolError for a run description the server would refuse.

    A new (or unfinished) run is streamed over the ingest socket and finished. The server
    does not reopen a finished run over the socket, so a re-import of one posts its rows
    to POST /runs/{id}/points instead: the same storage, where a point already stored
    keeps its value, so only points the source gained since are added.
    """
    from trainer_hooks.sender import ConnState, upload
    from trainer_hooks.spool import Spool
    from wire import Hello, RunInfo, encode_rows

    info = RunInfo(id=run.run_id, name=run.name, project=project, group=group, config=run.config, tags=run.tags)
    Hello.from_json(Hello(info).to_json())
    frames = _frames(encode_rows(rows))
    stored = _stored_run(server_url, run.run_id, token)
    if stored is not None and stored["project"] != project:
        return f"it was imported into project {stored['project']!r} before; import it with --project {stored['project']}"
    if stored is not None and stored["status"] == "finished":
        return _post_frames(server_url, run.run_id, frames, token, timeout)
    with tempfile.TemporaryDirectory(prefix="keel-import-") as root:
        spool = Spool.open(Path(root) / run.run_id, run=info, server_url=server_url)
        try:
            for frame in frames:
                spool.append(frame)
            sender = upload(spool, server_url, status="finished", token=token, timeout=timeout)
        finally:
            spool.close()
    if sender.state is ConnState.DONE:
        return None
    if "run_finished" in (sender.last_error or ""):  # finished meanwhile, or no read scope to see it
        return _post_frames(server_url, run.run_id, frames, token, timeout)
    return sender.last_error or "timed out"


def _stored_run(server_url: str, run_id: str, token: str | None) -> dict[str, Any] | None:
    """The run as the server holds it; None when it has no such run or will not say."""
    from keel.client import Client, ClientError

    try:
        return Client(server_url, token).run({"id": run_id})
    except ClientError:
        return None


def _post_frames(server_url: str, run_id: str, frames: list[str], token: str | None, timeout: float) -> str | None:
    """POST each frame's rows; every 200 means they are committed. None, or the first error."""
    import urllib.error
    import urllib.parse
    import urllib.request

    from wire.urls import api_url

    url = f"{api_url(server_url)}/runs/{urllib.parse.quote(run_id, safe='')}/points"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    for frame in frames:
        request = urllib.request.Request(url, data=f'{{"rows":{frame}}}'.encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                pass
        except urllib.error.HTTPError as exc:
            return f"POST {url}: HTTP {exc.code}: {exc.read().decode('utf-8', 'replace')[:300]}"
        except OSError as exc:
            return f"POST {url}: {exc}"
    return None


def _frames(encoded_rows: list[dict[str, Any]]) -> list[str]:
    """The wire rows cut into frames (each a JSON array) within the limits above."""
    frames: list[str] = []
    batch: list[str] = []
    values = size = 0
    for row in encoded_rows:
        text = json.dumps(row, separators=(",", ":"))
        if batch and (len(batch) >= _FRAME_ROWS or values + len(row["values"]) > _FRAME_VALUES or size + len(text) > _FRAME_BYTES):
            frames.append("[" + ",".join(batch) + "]")
            batch, values, size = [], 0, 0
        batch.append(text)
        values += len(row["values"])
        size += len(text) + 1
    if batch:
        frames.append("[" + ",".join(batch) + "]")
    return frames


# -- export ---------------------------------------------------------------------------


def _add_export(parser: argparse.ArgumentParser) -> None:
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument("run", help="run id or name")
    parser.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv", help="file format (default csv)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="file to write (default <run name>.<format>; '-' for CSV on stdout)")
    parser.add_argument("--keys", default=None, help="comma-separated metric keys (default: all)")
    parser.add_argument(
        "--details", type=Path, default=None, metavar="PATH",
        help="where the run's step details go, as JSON lines (default: beside the output, its suffix .details.jsonl, when it has any)",
    )
    parser.add_argument("--no-details", action="store_true", help="leave the step details out")
    parser.add_argument("--token", default=None, help="API token with read scope (default: $KEEL_TOKEN)")


def _export(args: argparse.Namespace) -> int:
    from keel.cli import one_line
    from keel.client import Client, ClientError
    from wire.urls import default_server

    token = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
    try:
        client = Client(default_server(args.server), token)
        run = client.run(args.run)
        stored = [info["key"] for info in client.keys(run)]
        keys = stored if args.keys is None else [key for key in args.keys.split(",") if key]
        missing = sorted(set(keys) - set(stored))
        if missing:
            return _fail("export", f"run {run['name']!r} has no key(s) {', '.join(map(repr, missing))}")
        steps, columns = _wide_table(client, run, keys)
    except (ClientError, ValueError) as exc:
        return _fail("export", str(exc))
    output = args.output or Path(re.sub(r"[^A-Za-z0-9._-]+", "_", run["name"]) + f".{args.format}")
    if args.format == "parquet":
        if str(output) == "-":
            return _fail("export", "parquet is binary: pass -o FILE")
        try:
            _write_parquet(output, steps, columns)
        except ImportError:
            return _fail("export", "--format parquet needs pyarrow: pip install pyarrow")
    else:
        _write_csv(output, steps, columns)
    where = "stdout" if str(output) == "-" else output
    print(f"keel export: run {run['name']!r} ({one_line(run['id'])}): {len(keys)} key(s) at {len(steps)} step(s) to {where}", file=sys.stderr)
    if args.no_details or (args.details is None and str(output) == "-"):
        return 0
    target = args.details or output.with_suffix(".details.jsonl")
    try:
        count = _write_details(client, run, target, create=args.details is not None)
    except ClientError as exc:
        return _fail("export", f"step details: {exc}")
    if count:
        print(f"keel export: run {run['name']!r}: {count} step detail(s) to {target}", file=sys.stderr)
    return 0


def _write_details(client: Client, run: dict[str, Any], target: Path, *, create: bool) -> int:
    """The run's step details to `target`, one wire row per line (a histogram, the samples or
    the sequences of one step; `values` empty), as `POST /runs/{id}/points` takes them back.
    Without `create` no file is written for a run that has none. The number written."""
    count = 0
    handle = None
    try:
        for row in client.details(run):
            if handle is None:
                handle = open(target, "w", encoding="utf-8")
            handle.write(json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n")
            count += 1
        if handle is None and create:
            target.write_text("", encoding="utf-8")
    finally:
        if handle is not None:
            handle.close()
    return count


def _wide_table(client: Client, run: dict[str, Any], keys: list[str]) -> tuple[list[int], dict[str, dict[int, float]]]:
    """One column per key, by step; a step a key was not logged at has no value there."""
    columns: dict[str, dict[int, float]] = {}
    for key in keys:
        series = client.series(run, key)
        columns[key] = dict(zip(series.steps.tolist(), series.values.tolist(), strict=True))
    steps = sorted({step for column in columns.values() for step in column})
    return steps, columns


def _step_column(columns: dict[str, dict[int, float]]) -> str:
    """"step", unless a metric has that name."""
    return "step" if "step" not in columns else "keel_step"


def _csv_cell(value: float | None) -> str:
    """Empty for no point; the protocol's "nan", "inf", "-inf" for non-finite values."""
    if value is None:
        return ""
    if math.isfinite(value):
        return repr(value)
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _text_cell(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that begins as a formula would (`=`, `+`,
    `-`, `@`, a tab or a carriage return) gets a leading `'`. Numbers are written by
    `_csv_cell` and never pass here (a negative value stays a number)."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _write_csv(output: Path, steps: list[int], columns: dict[str, dict[int, float]]) -> None:
    import csv

    handle = sys.stdout if str(output) == "-" else open(output, "w", newline="", encoding="utf-8")
    try:
        writer = csv.writer(handle)
        writer.writerow([_step_column(columns), *map(_text_cell, columns)])
        for step in steps:
            writer.writerow([step, *(_csv_cell(column.get(step)) for column in columns.values())])
    finally:
        if handle is not sys.stdout:
            handle.close()


def _write_parquet(output: Path, steps: list[int], columns: dict[str, dict[int, float]]) -> None:
    """Points as float64 (NaN and ±inf kept); a step without a point is null, not NaN."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {_step_column(columns): pa.array(steps, type=pa.int64())}
    for key, column in columns.items():
        arrays[key] = pa.array([column.get(step) for step in steps], type=pa.float64())
    pq.write_table(pa.table(arrays), output)


COMMANDS = {
    "import": (
        "Import TensorBoard, wandb, console-log or CSV runs into Keel (idempotent: importing again adds nothing).",
        _add_import,
        _import,
    ),
    "export": (
        "Write a run's metrics to a CSV or Parquet file (one column per key, by step).",
        _add_export,
        _export,
    ),
}
