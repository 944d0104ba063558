"""Readers that turn another tracker's logs into Keel runs (`keel import`, docs/read-api.md).

Each reader returns `ImportedRun`s: the run's description, its rows and a report of
every value it did not take (never dropped silently). Nothing here touches the network;
keel/transfer.py uploads what they return through the ingest protocol.

- TensorBoard: every directory under LOGDIR holding event files is one run, read with
  TensorBoard's own EventAccumulator. Scalars only (legacy `simple_value` summaries and
  TF2 scalar tensors); step = the event's step, time = the earliest wall time of the step.
- wandb offline runs (`wandb/offline-run-*/run-*.wandb`): the transaction log wandb
  writes, a LevelDB-style record log of `wandb_internal_pb2.Record` protobufs. wandb
  >= 0.20 reads it in its Go core only (the Python `DataStore` is gone), so the framing
  is read here and each record decoded with wandb's own protobuf classes.
- wandb history exports (`run.history()` / `scan_history()` written as CSV, a JSON
  array of row objects, or JSON lines): `_step` is the step, `_timestamp` the time.

Run ids are uuid5 of the source's identity (`run_id_for`), so importing the same source
again writes to the same run, where the server keeps each (run, key, step) once.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import math
import os
import struct
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wire import KeelError, Limits, Row

__all__ = [
    "ImportSourceError",
    "ImportedRun",
    "PointTable",
    "read_tensorboard",
    "read_wandb",
    "run_id_for",
]

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


def read_tensorboard(logdir: Path, *, name: str | None = None) -> list[ImportedRun]:
    """One ImportedRun per directory under `logdir` that holds event files."""
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
        from tensorboard.util import tensor_util
    except ImportError:
        raise ImportSourceError("reading TensorBoard logs needs `pip install tensorboard`") from None

    run_dirs = _tensorboard_run_dirs(logdir)
    runs = []
    for run_dir in run_dirs:
        events = sorted(path.name for path in run_dir.iterdir() if "tfevents" in path.name)
        # size 0 keeps every event; one of each other kind is enough to name what is left out.
        guidance = {kind: 1 for kind in (ea.HISTOGRAMS, ea.COMPRESSED_HISTOGRAMS, ea.IMAGES, ea.AUDIO)}
        accumulator = ea.EventAccumulator(str(run_dir), size_guidance={**guidance, ea.SCALARS: 0, ea.TENSORS: 0})
        try:
            accumulator.Reload()
        except Exception as exc:  # a truncated or foreign file: say which
            raise ImportSourceError(f"cannot read the event files in {run_dir}: {exc}") from exc
        table = PointTable()
        tags = accumulator.Tags()
        for tag in tags["scalars"]:
            for event in accumulator.Scalars(tag):
                table.add(event.step, tag, event.value, event.wall_time)
        not_imported = []
        for tag in tags["tensors"]:
            plugin = accumulator.SummaryMetadata(tag).plugin_data.plugin_name
            if plugin != "scalars":
                not_imported.append(f"{plugin or 'tensor'} {tag!r}")
                continue
            for tensor_event in accumulator.Tensors(tag):
                array = tensor_util.make_ndarray(tensor_event.tensor_proto)
                value = float(array.reshape(-1)[0]) if array.size == 1 else array
                table.add(tensor_event.step, tag, value, tensor_event.wall_time)
        for kind in ("histograms", "images", "audio"):
            not_imported += [f"{kind} {tag!r}" for tag in tags.get(kind, [])]
        relative = run_dir.relative_to(logdir).as_posix()
        runs.append(
            ImportedRun(
                # The run directory's name and its first event file (named by creation time,
                # host and pid): stable when the logdir moves or the run appends more files.
                identity=f"tensorboard/{run_dir.name}/{events[0]}",
                name=_name("" if relative == "." else relative, name, single=len(run_dirs) == 1, base=logdir.name),
                table=table,
                config={"keel_import": {"source": "tensorboard", "path": str(run_dir.resolve())}},
                not_imported=not_imported,
            )
        )
    return runs


# -- wandb ------------------------------------------------------------------------------

# The framing of a .wandb file (LevelDB's log format, with wandb's own 7-byte file header
# and crc32 of type + data): 32 KiB blocks of records `crc u32 | length u16 | type u8 | data`.
_WANDB_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_BLOCK = 32 * 1024
_RECORD_HEAD = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(data: bytes) -> tuple[list[bytes], int]:
    """The records of a .wandb file's bytes, and how many bytes at the end could not be read
    (a run killed mid-write leaves a torn tail; a bad checksum ends the readable part)."""
    if not data.startswith(_WANDB_HEADER):
        raise ImportSourceError("not a wandb transaction log (the header is not ':W&B')")
    records: list[bytes] = []
    pending = b""
    pos = good_end = len(_WANDB_HEADER)
    while pos + _RECORD_HEAD.size <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _RECORD_HEAD.size:  # a block's zero-filled trailer
            pos += room
            continue
        checksum, length, kind = _RECORD_HEAD.unpack_from(data, pos)
        if kind == 0 and length == 0 and checksum == 0:  # zero padding before the next block
            pos += room
            continue
        payload = data[pos + _RECORD_HEAD.size : pos + _RECORD_HEAD.size + length]
        if len(payload) < length or zlib.crc32(payload, zlib.crc32(bytes([kind]))) != checksum:
            break
        pos += _RECORD_HEAD.size + length
        if kind == _FULL:
            records.append(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            records.append(pending + payload)
            pending = b""
        else:
            break
        if kind in (_FULL, _LAST):
            good_end = pos
    return records, len(data) - good_end


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


def _read_wandb_log(log: Path) -> tuple[dict[str, Any], PointTable, list[str]]:
    try:  # by name: the module re-exports the protobuf classes of the installed protobuf
        wandb_internal_pb2: Any = importlib.import_module("wandb.proto.wandb_internal_pb2")
    except ImportError:
        raise ImportSourceError("reading wandb run files needs `pip install wandb`") from None
    records, torn = _wandb_records(log.read_bytes())
    meta: dict[str, Any] = {"config": {}}
    table = PointTable()
    notes = [f"the last {torn} bytes of {log.name} (unreadable: a run killed mid-write?)"] if torn else []
    for payload in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            meta.update(id=run.run_id, name=run.display_name, project=run.project, tags=list(run.tags))
            meta["config"].update(_wandb_items(run.config.update))
        elif kind == "config":
            meta["config"].update(_wandb_items(record.config.update))
        elif kind == "history":
            items = dict(_wandb_items(record.history.item))
            _add_history_row(table, items, default_step=record.history.step.num)
    if "id" not in meta:
        raise ImportSourceError(f"{log} has no run record (is it a wandb run file?)")
    meta["config"].pop("_wandb", None)
    return meta, table, notes


def _wandb_items(items: Any) -> Iterator[tuple[str, Any]]:
    for item in items:
        key = item.key or ".".join(item.nested_key)
        yield key, json.loads(item.value_json)  # json reads wandb's NaN and Infinity


def _add_history_row(table: PointTable, items: Mapping[str, Any], default_step: int | None = None) -> None:
    step = items.get(_WANDB_STEP, default_step)
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    wall_time = items.get(_WANDB_TIME)
    wall_time = float(wall_time) if isinstance(wall_time, (int, float)) else None
    for column, raw in items.items():
        if column in (_WANDB_STEP, _WANDB_TIME):
            continue
        if column.startswith("_"):  # _runtime and the like: wandb's, not the user's metrics
            table.skipped[(column, "wandb's own bookkeeping column")] += 1
            continue
        for key, value in flatten(column, raw):
            table.add(step, key, value, wall_time)


def _read_history_file(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        return [
            {column: _csv_value(cell) for column, cell in row.items() if cell not in ("", None)}
            for row in csv.DictReader(text.splitlines())
        ]
    try:
        loaded = json.loads(text)
        rows = loaded if isinstance(loaded, list) else [loaded]
    except json.JSONDecodeError:  # JSON lines, one row object per line
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ImportSourceError(f"{path} is neither a JSON array nor JSON lines: {exc}") from None
    if not all(isinstance(row, dict) for row in rows):
        raise ImportSourceError(f"{path}: expected row objects like {{\"_step\": 0, \"loss\": 1.5}}")
    return rows


def _csv_value(cell: str) -> float | str:
    try:
        return float(cell)  # also "nan", "inf", "-inf", "Infinity"
    except ValueError:
        return cell


def read_wandb(path: Path, *, name: str | None = None) -> list[ImportedRun]:
    """An offline run directory (or a wandb/ directory of them, or one .wandb file), or a
    history export (.csv, .json, .jsonl)."""
    if not path.exists():
        raise ImportSourceError(f"{path} does not exist")
    if path.is_file() and path.suffix.lower() in (".csv", ".json", ".jsonl"):
        return [_read_history_export(path, name)]
    logs = _wandb_log_files(path)
    if not logs:
        raise ImportSourceError(
            f"no wandb run file (run-*.wandb) in {path}; pass an offline-run-* directory, "
            "a wandb/ directory, or a history export (.csv, .json, .jsonl)"
        )
    runs = []
    for log in logs:
        meta, table, notes = _read_wandb_log(log)
        source = {"source": "wandb", "path": str(log.resolve()), "wandb_project": meta["project"], "wandb_id": meta["id"]}
        runs.append(
            ImportedRun(
                identity=f"wandb/{meta['project']}/{meta['id']}",
                name=_name(meta["name"] or meta["id"], name, single=len(logs) == 1),
                table=table,
                config={**meta["config"], "keel_import": source},
                tags=meta["tags"],
                not_imported=notes,
            )
        )
    return runs


def _read_history_export(path: Path, name: str | None) -> ImportedRun:
    rows = _read_history_file(path)
    if not rows:
        raise ImportSourceError(f"{path} holds no rows")
    if not any(_WANDB_STEP in row for row in rows):
        raise ImportSourceError(f"{path} has no {_WANDB_STEP!r} column to take the step from")
    table = PointTable()
    for row in rows:
        _add_history_row(table, row)
    # The file's name and its first row: the same export, moved or grown, is the same run.
    first = json.dumps(rows[0], sort_keys=True, default=str)
    digest = hashlib.sha256(first.encode()).hexdigest()[:16]
    return ImportedRun(
        identity=f"wandb-history/{path.name}/{digest}",
        name=name or path.stem,
        table=table,
        config={"keel_import": {"source": "wandb-history", "path": str(path.resolve())}},
    )
