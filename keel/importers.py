"""Readers that turn another tracker's logs into Keel runs (`keel import`, docs/read-api.md).

Each reader returns `ImportedRun`s: the run's description, its rows and a report of
every value it did not take (never dropped silently). Nothing here touches the network;
keel/transfer.py uploads what they return through the ingest protocol.

One reader per log format, shared with `keel watch`: a wandb `.wandb` transaction log and
TensorBoard event files are read by keel/readers.py's incremental readers (the framing,
and what a corrupt, torn or oversized record does, live there alone), read after read to
the end, and their names become Keel's through `Renamer`, the same as the watcher's
(`--framework`, trainer_hooks/integrations/names.py). Importing a finished log and watching
it land the same run (`run_id_for`), the same points, under the same names.

- TensorBoard: every directory under LOGDIR holding event files is one run. Scalars only
  (legacy `simple_value` summaries and TF2 scalar tensors); step = the event's step, time =
  the earliest wall time of the step.
- wandb offline runs (`wandb/offline-run-*/run-*.wandb`): the transaction log wandb
  writes, a LevelDB-style record log of `wandb_internal_pb2.Record` protobufs, decoded with
  wandb's own protobuf classes (wandb >= 0.20 has no Python reader of it).
- wandb history exports (`run.history()` / `scan_history()` written as CSV, a JSON
  array of row objects, or JSON lines): `_step` is the step, `_timestamp` the time; a
  Hugging Face Trainer's `trainer_state.json` (its `log_history`, `step` the step).

Run ids are uuid5 of the source's identity (`run_id_for`), so importing the same source
again writes to the same run, where the server keeps each (run, key, step) once.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import os
import uuid
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wire import KeelError, Limits, Row

if TYPE_CHECKING:
    from keel.readers import HistoryRow, Scalar

__all__ = [
    "FRAMEWORK_CHOICES",
    "ImportSourceError",
    "ImportedRun",
    "PointTable",
    "Renamer",
    "choose_framework",
    "read_csv",
    "read_tensorboard",
    "read_wandb",
    "run_id_for",
]

FRAMEWORK_CHOICES = ("auto", "none", "verl", "trl", "openrlhf", "prime-rl", "areal", "slime", "skyrl", "nemo-rl")
"""`--framework` of `keel import` and `keel watch`: `auto`, `none` or a framework of
trainer_hooks/integrations/names.py (`FRAMEWORKS`)."""
_LIMITS = Limits()
_MAX_STEP = 2**62  # the protocol's bound on a step
_RUN_ID_NAMESPACE = uuid.UUID("6f1d7c2e-54b1-5c55-9a51-0c2a4f3e6b70")
# wandb's own bookkeeping columns: the step and time become the row's, the rest are not metrics.
_WANDB_STEP, _WANDB_TIME = "_step", "_timestamp"


class ImportSourceError(KeelError, ValueError):
    """A path that is not, or not entirely, a source Keel can import (`keel import` exits 2)."""


def run_id_for(identity: str) -> str:
    """The Keel run id of an imported source: the same source gives the same run."""
    return str(uuid.uuid5(_RUN_ID_NAMESPACE, identity))


@dataclass
class PointTable:
    """Points gathered by step, with every value that cannot be kept counted by reason."""

    values: dict[int, dict[str, float]] = field(default_factory=dict)
    times: dict[int, float] = field(default_factory=dict)
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(key, reason) -> how many values of that key were not imported."""

    def add(self, step: Any, key: str, raw: Any, wall_time: float | None = None) -> None:
        self.add_row(step, ((key, raw),), wall_time)

    def add_row(self, step: Any, items: Iterable[tuple[str, Any]], wall_time: float | None = None) -> None:
        """`add` for every (key, raw) of one step (the same checks, made once per step where
        they can be)."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < _MAX_STEP:
            for key, raw in items:
                reason = _as_float(raw)
                self.skipped[(key, reason if isinstance(reason, str) else f"step {step!r} is not an integer in 0..2^62")] += 1
            return
        values = self.values.setdefault(step, {})
        added = False
        max_key = _LIMITS.max_key_length
        for key, raw in items:
            value = raw if type(raw) is float else _as_float(raw)
            if isinstance(value, str):
                self.skipped[(key, value)] += 1
            elif not key or len(key) > max_key:
                self.skipped[(key[:60], f"key is not 1..{max_key} characters")] += 1
            elif key in values:
                # Keel keeps a point's first value; say so rather than letting the server drop it.
                self.skipped[(key, "a second value at a step already read (the first is kept)")] += 1
            else:
                values[key] = value
                added = True
        if not values:
            del self.values[step]
        if added and wall_time is not None and math.isfinite(wall_time):
            self.times[step] = min(wall_time, self.times.get(step, wall_time))

    def rows(self) -> list[Row]:
        """Rows in step order, split so that none carries more keys than the protocol allows."""
        per_row = _LIMITS.max_keys_per_row
        rows: list[Row] = []
        for step in sorted(self.values):
            items = list(self.values[step].items())
            for start in range(0, len(items), per_row):
                rows.append(Row(step, self.times.get(step), dict(items[start : start + per_row])))
        return rows

    @property
    def points(self) -> int:
        return sum(len(values) for values in self.values.values())


@dataclass
class ImportedRun:
    identity: str
    """What makes this source itself (its run id is `run_id_for(identity)`)."""
    name: str
    table: PointTable
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    not_imported: list[str] = field(default_factory=list)
    """Whole tags or records left out, in words ("histograms 'weights'")."""
    framework: str | None = None
    """Whose name map named its metrics (trainer_hooks/integrations/names.py), or None."""
    framework_why: str = ""
    """Why that framework (`--framework`, or what `auto` recognised)."""

    @property
    def run_id(self) -> str:
        return run_id_for(self.identity)


def _as_float(raw: Any) -> float | str:
    """The metric value of `raw`, or the reason it is not one."""
    if isinstance(raw, bool):
        return "a boolean, not a number"
    if isinstance(raw, (int, float)):
        return float(raw)
    if raw is None:
        return "null"
    if isinstance(raw, str):
        return "text"
    if isinstance(raw, dict) and "_type" in raw:
        return f"wandb media ({raw['_type']})"
    return f"a {type(raw).__name__}, not a number"


def _name(sub: str, override: str | None, *, single: bool, base: str | None = None) -> str:
    """--name N names a lone run; with several, each is N/<its own name>."""
    if single:
        return override or sub or base or "imported"
    return "/".join(part for part in (override or base, sub) if part)


def flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Nested dicts as wandb shows them: {"a": {"b": 1}} -> ("a.b", 1); media stay whole."""
    if isinstance(value, dict) and "_type" not in value:
        for key, inner in value.items():
            yield from flatten(f"{prefix}.{key}" if prefix else str(key), inner)
    else:
        yield prefix, value


# -- names ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def key_refusal(key: str) -> str | None:
    """Why the server refuses `key` as a metric key (its own check, wire.parse_rows), or None."""
    from wire import ProtocolError, parse_rows

    try:
        parse_rows([{"step": 0, "values": {key: 0.0}}])
    except ProtocolError as exc:
        return str(exc).removeprefix("rows[0]: ")
    return None


def choose_framework(option: str, names: Iterable[str], config: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """(framework or None, why) for `--framework option` (`auto`, `none` or a framework of
    trainer_hooks/integrations/names.py): `auto` recognises it from the logged names and the
    config (`detect_framework`)."""
    from trainer_hooks.integrations.names import detect_framework

    if option == "auto":
        return detect_framework(names, config)
    return (None if option == "none" else option), "--framework"


class Renamer:
    """The logged names of one source run as Keel stores them, under a framework's name map
    (trainer_hooks/integrations/names.py; None: as logged). `keel import` and `keel watch`
    both turn what keel/readers.py reads into points through this, so a source lands under
    the same names whichever command read it.

    A name the server refuses as a metric key (a NUL, too long) is not stored: its values are
    counted in the table's `skipped`, and the rest of its step goes on. wandb's `_step` and
    the framework's step columns (`NameMap.step_keys`) give the step and are not metrics;
    wandb's other `_` columns (`_runtime`...) are counted as its bookkeeping."""

    def __init__(self, framework: str | None) -> None:
        from trainer_hooks.integrations.names import MAPS

        self.framework = framework
        self.name_map = MAPS.get(framework) if framework else None
        self.step_keys: tuple[str, ...] = self.name_map.step_keys if self.name_map else ()
        self._names: dict[str, str] = {}
        """{logged column: Keel name} of the columns met so far."""
        self._tags: set[str] = set()
        """TensorBoard tags met so far (what an alias is logged beside)."""

    def name(self, column: str, table: PointTable, beside: Container[str] = ()) -> str | None:
        """Keel's name of a logged column, or None for one the server refuses as a key (its
        value counted in `table` as not stored). `beside`: the columns logged with it (an
        old release's name logged beside its current one keeps the framework's prefix)."""
        name = self._names.get(column)
        if name is None:
            aliased = self.name_map is not None and column in self.name_map.aliases
            name = self.name_map.keel_name(column, beside) if self.name_map else column
            refused = key_refusal(name)
            if refused is not None:
                table.skipped[(column[:60], refused)] += 1
                return None
            if not aliased:  # an alias's name depends on what is logged beside it
                self._names[column] = name
        return name

    def add_wandb_rows(self, rows: Iterable[HistoryRow], table: PointTable) -> None:
        """wandb history rows (of a `.wandb` log, or of a history export) into `table`."""
        step_keys = self.step_keys
        names = self._names
        for row in rows:
            items = row.items
            step = next((items[key] for key in step_keys if key in items), items.get(_WANDB_STEP, row.step))
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            pairs = []
            for column, raw in items.items():
                name = names.get(column)
                if name is None or type(raw) is dict:
                    if column in step_keys or column in (_WANDB_STEP, _WANDB_TIME):
                        continue
                    if column.startswith("_"):  # _runtime and the like: wandb's, not the trainer's
                        table.skipped[(column, "wandb's own bookkeeping column")] += 1
                        continue
                    if type(raw) is dict:
                        for key, value in flatten(column, raw):
                            inner = self.name(key, table)
                            if inner is not None:
                                pairs.append((inner, value))
                        continue
                    name = self.name(column, table, items)
                    if name is None:
                        continue
                pairs.append((name, raw))
            table.add_row(step, pairs, row.time)

    def add_scalars(self, scalars: Iterable[Scalar], table: PointTable) -> None:
        """TensorBoard scalars into `table` (step: the event's)."""
        for scalar in scalars:
            if scalar.tag in self.step_keys:
                continue
            self._tags.add(scalar.tag)
            key = self.name(scalar.tag, table, self._tags)
            if key is not None:
                table.add(scalar.step, key, scalar.value, scalar.time)


# -- TensorBoard ------------------------------------------------------------------------


def _tensorboard_run_dirs(logdir: Path) -> list[Path]:
    if not logdir.is_dir():
        raise ImportSourceError(f"{logdir} is not a directory")
    found = [
        Path(root)
        for root, _dirs, files in sorted(os.walk(logdir))
        if any("tfevents" in name for name in files)
    ]
    if not found:
        raise ImportSourceError(f"no TensorBoard event files (*tfevents*) under {logdir}")
    return found


def read_tensorboard(logdir: Path, *, name: str | None = None, framework: str = "auto") -> list[ImportedRun]:
    """One ImportedRun per directory under `logdir` that holds event files, each read to its
    end by `keel watch`'s reader (keel/readers.py's TensorboardReader, read after read as the
    watcher reads it) and named by `framework` as `keel watch --framework` names it."""
    from keel.readers import ReaderNotInstalled, TensorboardReader, reads_to_the_end

    run_dirs = _tensorboard_run_dirs(logdir)
    runs = []
    for run_dir in run_dirs:
        try:
            reader = TensorboardReader(str(run_dir), within=str(logdir))
        except ReaderNotInstalled as exc:
            raise ImportSourceError(str(exc)) from None
        table = PointTable()
        renamer: Renamer | None = None
        why = ""
        not_scalars: set[str] = set()
        notes: list[str] = []
        corrupt = 0
        for read in reads_to_the_end(reader):
            corrupt += read.corrupt
            not_scalars |= read.not_scalars
            notes += [f"the rest of {file} (a bad record length: unreadable)" for file in read.broken]
            notes += [_too_large_note(file, size) for file, size in read.too_large]
            notes += [f"{file} ({reason})" for file, reason in read.not_read]
            if read.scalars:
                if renamer is None:
                    chosen, why = choose_framework(framework, {scalar.tag for scalar in read.scalars}, {})
                    renamer = Renamer(chosen)
                renamer.add_scalars(read.scalars, table)
        if corrupt:
            notes.append(f"{corrupt} corrupt record(s) in {run_dir.name} (skipped)")
        if reader.waiting:
            notes.append(f"the last {reader.waiting} byte(s) of its event files (not a whole record: a writer killed mid-write?)")
        events = sorted(reader.cursors) or reader.files()
        relative = run_dir.relative_to(logdir).as_posix()
        chosen = renamer.framework if renamer else None
        runs.append(
            ImportedRun(
                # The run directory's name and its first event file (named by creation time,
                # host and pid): stable when the logdir moves or the run appends more files.
                identity=f"tensorboard/{run_dir.name}/{events[0]}",
                name=_name("" if relative == "." else relative, name, single=len(run_dirs) == 1, base=logdir.name),
                table=table,
                config={"keel_import": {"source": "tensorboard", "path": str(run_dir.resolve()), "framework": chosen}},
                not_imported=[*sorted(not_scalars), *notes],
                framework=chosen,
                framework_why=why,
            )
        )
    return runs


def _too_large_note(file: str, size: int) -> str:
    from keel.readers import _READ_LIMIT

    return f"a record of {size} bytes in {file} (larger than the {_READ_LIMIT >> 20} MiB read at once: skipped)"


# -- wandb ------------------------------------------------------------------------------


def wandb_run(meta: Mapping[str, Any] | None, log: Path) -> tuple[dict[str, Any], str, str]:
    """(run record, identity, name) of a `.wandb` log whose run record is `meta` (id, name,
    project, tags; None: the log has none readable, and is named after its file)."""
    if meta is None:
        meta = {"id": log.stem.removeprefix("run-"), "name": "", "project": "", "tags": []}
    return dict(meta), f"wandb/{meta['project']}/{meta['id']}", meta["name"] or meta["id"] or log.stem


def _wandb_log_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    own = sorted(path.glob("run-*.wandb"))
    if own:
        return own
    # A wandb/ directory: its run directories, not the `latest-run` link to one of them.
    return sorted(
        log
        for run_dir in path.glob("*run-*")
        if run_dir.is_dir() and not run_dir.is_symlink()
        for log in run_dir.glob("run-*.wandb")
    )


@dataclass
class _WandbLog:
    meta: dict[str, Any] | None
    config: dict[str, Any]
    table: PointTable
    notes: list[str]
    framework: str | None
    why: str


def _read_wandb_log(log: Path, framework: str) -> _WandbLog:
    """The whole of a `.wandb` log, read by `keel watch`'s reader (keel/readers.py's
    WandbReader, read after read as the watcher reads it), named as the watcher names it."""
    from keel.readers import ReaderNotInstalled, WandbReader, reads_to_the_end

    try:
        reader = WandbReader(str(log))
    except ReaderNotInstalled as exc:
        raise ImportSourceError(str(exc)) from None
    out = _WandbLog(None, {}, PointTable(), [], None, "")
    renamer: Renamer | None = None
    corrupt = 0
    try:
        for read in reads_to_the_end(reader):
            if read.run is not None:
                out.meta = read.run
            out.config.update(read.config)
            corrupt += read.corrupt
            out.notes += [_too_large_note(log.name, size) for size in read.too_large]
            if read.rows:
                if renamer is None:
                    keys = {key for row in read.rows for key in row.items}
                    out.framework, out.why = choose_framework(framework, keys, out.config)
                    renamer = Renamer(out.framework)
                renamer.add_wandb_rows(read.rows, out.table)
    except ValueError as exc:  # not a wandb transaction log
        raise ImportSourceError(str(exc)) from None
    if corrupt:
        out.notes.append(f"{corrupt} corrupt record(s) in {log.name} (skipped)")
    if reader.waiting:
        out.notes.append(f"the last {reader.waiting} bytes of {log.name} (unreadable: a run killed mid-write?)")
    out.config.pop("_wandb", None)
    return out


def _read_history_file(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        return [
            {column: _csv_value(cell) for column, cell in row.items() if cell not in ("", None)}
            for row in csv.DictReader(text.splitlines())
        ]
    try:
        loaded = json.loads(text)
        if isinstance(loaded, dict) and isinstance(loaded.get("log_history"), list):
            return _trainer_state_rows(loaded["log_history"])
        rows = loaded if isinstance(loaded, list) else [loaded]
    except json.JSONDecodeError:  # JSON lines, one row object per line
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ImportSourceError(f"{path} is neither a JSON array nor JSON lines: {exc}") from None
    if not all(isinstance(row, dict) for row in rows):
        raise ImportSourceError(f"{path}: expected row objects like {{\"_step\": 0, \"loss\": 1.5}}")
    return rows


def _trainer_state_rows(history: list[Any]) -> list[dict[str, Any]]:
    """A Hugging Face Trainer's `trainer_state.json` (TRL's too): each `log_history` entry
    with its `step` as `_step`, its names as the Trainer logged them (a framework's name map
    reads them without transformers' `train/`: trainer_hooks/integrations/names.py)."""
    rows = []
    for entry in history:
        if isinstance(entry, dict) and isinstance(entry.get("step"), int):
            rows.append({_WANDB_STEP: entry["step"], **{k: v for k, v in entry.items() if k != "step"}})
    return rows


def _csv_value(cell: str) -> float | str:
    try:
        return float(cell)  # also "nan", "inf", "-inf", "Infinity"
    except ValueError:
        return cell


def read_wandb(path: Path, *, name: str | None = None, framework: str = "auto") -> list[ImportedRun]:
    """An offline run directory (or a wandb/ directory of them, or one .wandb file), or a
    history export (.csv, .json, .jsonl); names mapped by `framework` as `keel watch
    --framework` maps them."""
    if not path.exists():
        raise ImportSourceError(f"{path} does not exist")
    if path.is_file() and path.suffix.lower() in (".csv", ".json", ".jsonl"):
        return [_read_history_export(path, name, framework)]
    logs = _wandb_log_files(path)
    if not logs:
        raise ImportSourceError(
            f"no wandb run file (run-*.wandb) in {path}; pass an offline-run-* directory, "
            "a wandb/ directory, or a history export (.csv, .json, .jsonl)"
        )
    runs = []
    for log in logs:
        read = _read_wandb_log(log, framework)
        meta, identity, run_name = wandb_run(read.meta, log)
        source = {"source": "wandb", "path": str(log.resolve()), "wandb_project": meta["project"], "wandb_id": meta["id"],
                  "framework": read.framework}  # fmt: skip
        runs.append(
            ImportedRun(
                identity=identity,
                name=_name(run_name, name, single=len(logs) == 1),
                table=read.table,
                config={**read.config, "keel_import": source},
                tags=list(meta["tags"]),
                not_imported=read.notes,
                framework=read.framework,
                framework_why=read.why,
            )
        )
    return runs


def _read_history_export(path: Path, name: str | None, framework: str) -> ImportedRun:
    rows = _read_history_file(path)
    if not rows:
        raise ImportSourceError(f"{path} holds no rows")
    if not any(_WANDB_STEP in row for row in rows):
        raise ImportSourceError(f"{path} has no {_WANDB_STEP!r} column to take the step from")
    from keel.readers import HistoryRow

    chosen, why = choose_framework(framework, {key for row in rows for key in row}, {})
    table = PointTable()
    history = []
    for row in rows:
        stamp = row.get(_WANDB_TIME)
        history.append(HistoryRow(None, float(stamp) if isinstance(stamp, (int, float)) else None, row))
    Renamer(chosen).add_wandb_rows(history, table)
    # The file's name and its first row: the same export, moved or grown, is the same run.
    first = json.dumps(rows[0], sort_keys=True, default=str)
    digest = hashlib.sha256(first.encode()).hexdigest()[:16]
    return ImportedRun(
        identity=f"wandb-history/{path.name}/{digest}",
        name=name or path.stem,
        table=table,
        config={"keel_import": {"source": "wandb-history", "path": str(path.resolve()), "framework": chosen}},
        framework=chosen,
        framework_why=why,
    )


# -- CSV --------------------------------------------------------------------------------

CSV_STEP_COLUMNS = ("step", "Step", "_step", "global_step", "iteration")
"""Columns `keel import csv` takes the step from (the first present), unless --step-column."""
_PANEL_BOUNDS = ("__MIN", "__MAX")


def read_csv(path: Path, *, name: str | None = None, framework: str = "auto", step_column: str | None = None,
             run_column: str | None = None) -> list[ImportedRun]:  # fmt: skip
    """Any CSV with a step column: one run, or one per value of `run_column`. wandb's panel
    export (a `Step` column, then `<run> - <metric>` columns, with `__MIN` and `__MAX` ones
    beside each) is split into its runs, the bounds left out."""
    if not path.is_file():
        raise ImportSourceError(f"{path} is not a file")
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    if not header:
        raise ImportSourceError(f"{path} has no header row")
    if step_column is None:
        step_column = next((column for column in CSV_STEP_COLUMNS if column in header), None)
        if step_column is None:
            lowered = {column.lower(): column for column in header}
            step_column = next((lowered[c.lower()] for c in CSV_STEP_COLUMNS if c.lower() in lowered), None)
    if step_column is None or step_column not in header:
        wanted = repr(step_column) if step_column else "a step column (" + ", ".join(CSV_STEP_COLUMNS) + ")"
        raise ImportSourceError(f"{path} has no {wanted}; name it with --step-column")
    if run_column is not None and run_column not in header:
        raise ImportSourceError(f"{path} has no column {run_column!r} (--run-column)")
    panel = run_column is None and any(" - " in column for column in header if column != step_column)
    groups: dict[str, list[tuple[int | float | str, list[tuple[str, Any]]]]] = {}
    bounds = 0
    for row in rows:
        step: Any = _csv_value(row.get(step_column) or "")
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        for column, cell in row.items():
            if column is None or column in (step_column, run_column) or cell in ("", None):
                continue
            if panel:
                if column.endswith(_PANEL_BOUNDS):
                    bounds += 1
                    continue
                run, sep, metric = column.rpartition(" - ")
                key = run if sep else ""
                column = metric if sep else column
            else:
                key = str(row.get(run_column) or "") if run_column else ""
            if not groups.get(key) or groups[key][-1][0] != step:
                groups.setdefault(key, []).append((step, []))
            groups[key][-1][1].append((column, _csv_value(cell)))
    if not groups:
        raise ImportSourceError(f"{path} holds no values")
    chosen, why = choose_framework(framework, {column for column in header}, {})
    if panel:
        metrics = {column.rpartition(" - ")[2] for column in header if " - " in column and not column.endswith(_PANEL_BOUNDS)}
        chosen, why = choose_framework(framework, metrics, {})
    digest = hashlib.sha256(",".join(header).encode()).hexdigest()[:16]
    runs: list[ImportedRun] = []
    for key, steps in groups.items():
        renamer = Renamer(chosen)
        table = PointTable()
        for step, items in steps:
            names = {column for column, _ in items}
            pairs = [(n, value) for column, value in items if (n := renamer.name(column, table, names)) is not None]
            table.add_row(step, pairs)
        source = {"source": "wandb-panel" if panel else "csv", "path": str(path.resolve()), "framework": chosen}
        if key:
            source["run"] = key
        runs.append(
            ImportedRun(
                identity=f"csv/{path.name}/{digest}/{key}",
                name=_name(key, name, single=len(groups) == 1, base=None if panel else path.stem),
                table=table,
                config={"keel_import": source},
                not_imported=[f"{bounds} __MIN/__MAX value(s) of wandb's panel export (the bounds of a smoothed line)"]
                if bounds and not runs else [],
                framework=chosen,
                framework_why=why,
            )
        )
    return runs
