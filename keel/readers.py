"""The one reader of each log format: incremental readers of a trainer's logs while it
writes them (`keel watch`, keel/watch.py), also read to the end for `keel import`
(keel/importers.py, `reads_to_the_end`), so a log reads the same either way.

Each reader keeps a cursor: the byte offset just past the last record it handed out, so a
reader built again from a saved cursor goes on exactly where the last one stopped. A record
that is not all there yet (the logger is mid-write) is not consumed: the next read tries it
again. A record that is all there and still cannot be read (a bad checksum, a payload its
parser refuses) is counted and skipped, never a crash. A record larger than one read (8 MiB: a
big image or tensor) is skipped whole once it is all there, found by its framing alone, and
reported with its size: the reader goes on after it.

- wandb: the run's transaction log `run-<id>.wandb`: wandb's 7-byte header (`:W&B`, 0xBEE1,
  version 0), then LevelDB's log format: 32 KiB blocks of fragments `crc32 u32 | length u16 |
  type u8 | data` (crc32 of type and data; type 1 a whole record, 2/3/4 its first, middle,
  last fragment; a block's last < 7 bytes zero-filled). After a record whose head cannot be
  one the reader resumes at the next block, as LevelDB's reader does. Records are decoded
  with wandb's own protobuf classes (`wandb.proto.wandb_internal_pb2`).
- TensorBoard: each event file is a sequence of TFRecords, `length u64 | masked crc32c of
  the length u32 | data | masked crc32c of the data u32`, each data an `Event` protobuf
  (decoded with tensorboard's classes). A record whose length checksum is wrong leaves no
  way to find the next one: the rest of that file is reported and left. An event file that is
  a symbolic link out of the watched folder, or not a regular file (a FIFO would block the
  read), is not read, and reported once.
- A console log: what a trainer prints, redirected to a file, read in whole lines (a line ends
  at `\n` or `\r`; keel/console.py's LineSplitter and LineParser read the metrics in them). The cursor is the offset past
  the last line end handed out, and the file's identity (device, inode): a file replaced under
  its name (rotated by a rename, written anew) is read to its end, then the new one from its
  start; a file cut below the cursor (truncated, `copytruncate`) is read from its start.

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import stat
import struct
import sys
import types
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from wire import KeelError

__all__ = ["ConsoleLogReader", "HistoryRow", "ReaderNotInstalled", "TensorboardReader", "WandbReader", "masked_crc32c", "reads_to_the_end"]


class ReaderNotInstalled(KeelError, RuntimeError):
    """A log format whose reader's package is not installed: `.wandb` files need wandb,
    TensorBoard event files need tensorboard (`keel import` exits 2, `keel watch` says so
    and does not follow the source)."""

_WANDB_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_BLOCK = 32 * 1024
_RECORD_HEAD = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_READ_LIMIT = 8 * 1024 * 1024
"""Bytes read from one file per poll at most (a long backlog is read over several polls). A
record larger than this is skipped."""


@dataclass
class HistoryRow:
    step: int | None
    time: float | None
    items: dict[str, Any]


@dataclass
class WandbRead:
    rows: list[HistoryRow] = field(default_factory=list)
    run: dict[str, Any] | None = None
    """id, name, project, tags of the run record, when this read met it."""
    config: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    corrupt: int = 0
    too_large: list[int] = field(default_factory=list)
    """Sizes of the records skipped for being larger than a read (`_READ_LIMIT`)."""


@functools.cache
def _wandb_pb2() -> Any:
    """wandb's record classes (by name: the module re-exports those of the installed protobuf).

    wandb's package `__init__` starts its whole SDK (0.6 s of CPU), which the record classes
    do not need: unless wandb is imported already, `wandb` is a bare package while they are
    imported, and every `wandb` module is forgotten after (a later `import wandb` starts
    afresh; protobuf hands it the same classes)."""
    name = "wandb.proto.wandb_internal_pb2"
    try:
        if "wandb" in sys.modules:
            return importlib.import_module(name)
        spec = importlib.util.find_spec("wandb")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("wandb")
        package = types.ModuleType("wandb")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["wandb"] = package
        try:
            return importlib.import_module(name)
        finally:
            for module in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
                del sys.modules[module]
    except ImportError:
        raise ReaderNotInstalled("reading wandb run files needs `pip install wandb`") from None


def _value(value_json: str) -> Any:
    try:
        return float(value_json)  # the common case, NaN and Infinity included, without json
    except ValueError:
        return json.loads(value_json)


def wandb_items(items: Any, *, metrics: bool = False) -> Iterator[tuple[str, Any]]:
    """(key, value) of wandb's items; `metrics`: numbers as floats (json keeps config ints)."""
    decode = _value if metrics else json.loads  # json reads wandb's NaN and Infinity
    for item in items:
        yield item.key or ".".join(item.nested_key), decode(item.value_json)


class WandbReader:
    """Reads a growing `.wandb` file from `cursor` on."""

    def __init__(self, path: str, cursor: int = 0) -> None:
        self.path = path
        self.cursor = cursor
        self.size_seen = -1
        self.waiting = 0
        """Bytes past the cursor that were not a whole record at the last read."""
        self._pb2 = _wandb_pb2()

    def read(self) -> WandbRead:
        out = WandbRead()
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return out
        if size == self.size_seen or size <= self.cursor:
            return out
        with open(self.path, "rb") as handle:
            if self.cursor == 0:
                head = handle.read(len(_WANDB_HEADER))
                if len(head) < len(_WANDB_HEADER):
                    return out  # not even the header yet
                if head != _WANDB_HEADER:
                    raise ValueError(f"{self.path} is not a wandb transaction log (the header is not ':W&B')")
                self.cursor = len(_WANDB_HEADER)
            handle.seek(self.cursor)
            data = handle.read(min(size - self.cursor, _READ_LIMIT))
            whole = self.cursor + len(data) == size
            payloads, consumed, corrupt = self._frame(data, self.cursor)
            if not consumed and not whole:  # the record at the cursor alone is more than a read
                skipped = self._skip(handle, size)
                if skipped is None:  # its end is not written yet: look again when the file grows
                    self.waiting, self.size_seen = size - self.cursor, size
                    return out
                self.cursor, length = skipped
                self.waiting, self.size_seen = 0, -1
                if length < 0:
                    out.corrupt += 1
                else:
                    out.too_large.append(length)
                return out
        self.cursor += consumed
        self.waiting = max(0, len(data) - consumed)
        self.size_seen = size if whole else -1
        out.corrupt = corrupt
        for payload in payloads:
            self._decode(payload, out)
        return out

    def _skip(self, handle: Any, size: int) -> tuple[int, int] | None:
        """(end, length) of the record at the cursor, one larger than a read, walked by its
        fragments' heads alone (their checksums are not checked); None while its last
        fragment is not all written. A record cut short (a FULL or FIRST where its next
        fragment should be: the writer died) ends where the next one starts, length -1."""
        pos, length = self.cursor, 0
        kinds: tuple[int, ...] = (_FIRST,)
        while True:
            room = _BLOCK - pos % _BLOCK
            if room < _RECORD_HEAD.size:  # a block's zero-filled trailer
                pos += room
                continue
            handle.seek(pos)
            head = handle.read(_RECORD_HEAD.size)
            if len(head) < _RECORD_HEAD.size:
                return None
            checksum, part, kind = _RECORD_HEAD.unpack(head)
            if kind == 0 and part == 0 and checksum == 0:
                return None  # bytes not written yet
            if kind not in kinds or _RECORD_HEAD.size + part > room:
                return pos, -1
            if pos + _RECORD_HEAD.size + part > size:
                return None
            pos += _RECORD_HEAD.size + part
            length += part
            if kind == _LAST:
                return pos, length
            kinds = (_MIDDLE, _LAST)

    def _frame(self, data: bytes, base: int) -> tuple[list[bytes], int, int]:
        """(whole records, bytes consumed, corrupt records skipped) of `data`, which starts at
        file offset `base`, a record boundary."""
        records: list[bytes] = []
        pending: bytes | None = None
        pos = good_end = 0
        corrupt = 0
        while pos + _RECORD_HEAD.size <= len(data):
            room = _BLOCK - (base + pos) % _BLOCK
            if room < _RECORD_HEAD.size:  # a block's zero-filled trailer
                if pos + room > len(data):
                    break
                pos += room
                if pending is None:
                    good_end = pos
                continue
            checksum, length, kind = _RECORD_HEAD.unpack_from(data, pos)
            if kind == 0 and length == 0 and checksum == 0:
                # Zero padding: the rest of the block, or bytes not yet written (wait).
                if pos + room > len(data):
                    break
                pos += room
                if pending is None:
                    good_end = pos
                continue
            end = pos + _RECORD_HEAD.size + length
            bad_head = kind not in (_FULL, _FIRST, _MIDDLE, _LAST) or _RECORD_HEAD.size + length > room
            if not bad_head and end > len(data):
                break  # a record still being written
            if bad_head or zlib.crc32(data[pos + _RECORD_HEAD.size : end], zlib.crc32(bytes([kind]))) != checksum:
                if not bad_head and end == len(data):
                    break  # possibly torn by a write in progress: look again next time
                corrupt += 1 + (pending is not None)
                pending = None
                # A sound head with a bad payload: skip that record alone. A head that cannot
                # be one: resume at the next block, as LevelDB's reader does (the position may
                # lie past the bytes read: read() waits until the file gets there).
                pos = pos + room if bad_head else end
                good_end = pos
                continue
            payload = data[pos + _RECORD_HEAD.size : end]
            pos = end
            if kind == _FULL:
                if pending is not None:
                    corrupt += 1
                    pending = None
                records.append(payload)
                good_end = pos
            elif kind == _FIRST:
                if pending is not None:
                    corrupt += 1
                pending = payload
            elif pending is None:  # a MIDDLE or LAST without its FIRST
                corrupt += 1
                good_end = pos
            elif kind == _MIDDLE:
                pending += payload
            else:
                records.append(pending + payload)
                pending = None
                good_end = pos
        return records, good_end, corrupt

    def _decode(self, payload: bytes, out: WandbRead) -> None:
        record = self._pb2.Record()
        try:
            record.ParseFromString(payload)
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history = record.history
                try:  # every value a number: the common row, without a call per value
                    items = {item.key or ".".join(item.nested_key): float(item.value_json) for item in history.item}
                except ValueError:
                    items = {item.key or ".".join(item.nested_key): _value(item.value_json) for item in history.item}
                step = history.step.num if history.HasField("step") else None
                stamp = items.get("_timestamp")
                out.rows.append(HistoryRow(step, float(stamp) if isinstance(stamp, (int, float)) else None, items))
            elif kind == "run":
                run = record.run
                out.run = {"id": run.run_id, "name": run.display_name, "project": run.project, "tags": list(run.tags)}
                out.config.update(wandb_items(run.config.update))
            elif kind == "config":
                out.config.update(wandb_items(record.config.update))
            elif kind == "exit":
                out.exit_code = int(record.exit.exit_code)
        except Exception:  # a payload wandb's own parser refuses, or a value that is not JSON
            out.corrupt += 1


# -- TensorBoard ------------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass
class Scalar:
    step: int
    time: float
    tag: str
    value: Any


@dataclass
class TensorboardRead:
    scalars: list[Scalar] = field(default_factory=list)
    not_scalars: set[str] = field(default_factory=set)
    """`kind 'tag'` of values left out (histograms, images, text...)."""
    corrupt: int = 0
    broken: list[str] = field(default_factory=list)
    """Files whose rest cannot be read (a bad length checksum)."""
    too_large: list[tuple[str, int]] = field(default_factory=list)
    """(file, size) of the records skipped for being larger than a read (`_READ_LIMIT`)."""
    not_read: list[tuple[str, str]] = field(default_factory=list)
    """(file, why) of event files not read: a symbolic link out of `within`, not a regular
    file. Each is in one read's list only."""


class TensorboardReader:
    """Reads every event file of one directory, each from its own cursor.

    `cursors` maps file name -> offset (-1: the rest of the file is unreadable); `plugins`
    maps tag -> plugin name, which an event file gives only with a tag's first value. An event
    file whose real path is outside `within` (the watched folder; default `directory`) is not
    read: a symbolic link there is followed only when it stays inside.
    """

    def __init__(self, directory: str, cursors: dict[str, int] | None = None, plugins: dict[str, str] | None = None,
                 within: str | None = None) -> None:  # fmt: skip
        self.directory = directory
        self.within = os.path.realpath(within or directory)
        self.cursors = dict(cursors or {})
        self.plugins = dict(plugins or {})
        self.sizes: dict[str, int] = {}
        self.waiting = 0
        self._not_read: set[str] = set()
        try:
            self._event_pb2: Any = importlib.import_module("tensorboard.compat.proto.event_pb2")
            self._tensor_util: Any = importlib.import_module("tensorboard.util.tensor_util")
        except ImportError:
            raise ReaderNotInstalled("reading TensorBoard logs needs `pip install tensorboard`") from None

    def files(self) -> list[str]:
        try:
            return sorted(name for name in os.listdir(self.directory) if "tfevents" in name)
        except OSError:
            return []

    def read(self) -> TensorboardRead:
        out = TensorboardRead()
        self.waiting = 0
        for name in self.files():
            cursor = self.cursors.get(name, 0)
            if cursor < 0:
                continue
            path = os.path.realpath(os.path.join(self.directory, name))
            try:
                info = os.stat(path)
            except OSError:
                continue
            if os.path.commonpath([path, self.within]) != self.within:
                why = f"a symbolic link to {path}, outside {self.within}"
            elif not stat.S_ISREG(info.st_mode):
                why = "not a regular file"
            else:
                why = ""
            if why:
                if name not in self._not_read:
                    self._not_read.add(name)
                    out.not_read.append((name, why))
                continue
            self.cursors[name] = cursor
            size = info.st_size
            if size == self.sizes.get(name):
                continue
            with open(path, "rb") as handle:
                handle.seek(cursor)
                data = handle.read(min(size - cursor, _READ_LIMIT))
            consumed = self._records(data, out, name)
            if consumed < 0:
                self.cursors[name] = -1
                out.broken.append(name)
                continue
            if not consumed and cursor + len(data) < size:  # the record at the cursor alone is more than a read
                (length,) = struct.unpack_from("<Q", data)
                if cursor + 16 + length > size:
                    self.sizes[name] = size  # its end is not written yet: look again when the file grows
                    self.waiting += size - cursor
                    continue
                out.too_large.append((name, length))
                consumed = 16 + length
            self.cursors[name] = cursor + consumed
            self.waiting += max(0, len(data) - consumed)
            if cursor + len(data) == size:
                self.sizes[name] = size
        return out

    def _records(self, data: bytes, out: TensorboardRead, name: str) -> int:
        pos = 0
        while pos + 12 <= len(data):
            head = data[pos : pos + 8]
            (length,) = struct.unpack("<Q", head)
            (length_crc,) = struct.unpack_from("<I", data, pos + 8)
            if masked_crc32c(head) != length_crc:
                if pos + 12 == len(data):
                    break  # perhaps still being written
                out.corrupt += 1
                return -1 if pos == 0 else pos  # nothing after it can be found; stop here next time too
            end = pos + 12 + length + 4
            if end > len(data):
                break
            payload = data[pos + 12 : pos + 12 + length]
            (data_crc,) = struct.unpack_from("<I", data, end - 4)
            pos = end
            if masked_crc32c(payload) != data_crc:
                out.corrupt += 1
                continue
            try:
                self._event(payload, out)
            except Exception:
                out.corrupt += 1
        return pos

    def _event(self, payload: bytes, out: TensorboardRead) -> None:
        event = self._event_pb2.Event()
        event.ParseFromString(payload)
        if event.WhichOneof("what") != "summary":
            return
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
                self.plugins[value.tag] = value.metadata.plugin_data.plugin_name
            if kind == "simple_value":
                out.scalars.append(Scalar(event.step, event.wall_time, value.tag, float(value.simple_value)))
            elif kind == "tensor" and self.plugins.get(value.tag) == "scalars":
                array = self._tensor_util.make_ndarray(value.tensor)
                number = float(array.reshape(-1)[0]) if array.size == 1 else None
                out.scalars.append(Scalar(event.step, event.wall_time, value.tag, number))
            else:
                plugin = self.plugins.get(value.tag) or {"histo": "histograms", "image": "images", "audio": "audio"}.get(kind or "", kind or "value")
                out.not_scalars.add(f"{plugin} {value.tag!r}")


# -- console logs -------------------------------------------------------------------------


_LONG_LINE = 4 * 256 * 1024
"""Bytes without a line end after which the line is dropped: keel/console.py's MAX_LINE
characters at 4 UTF-8 bytes each at most (a longer line is not a metrics line)."""


_TAIL = 32
"""Bytes before a console log's cursor kept to check that the file under it is the one read."""


@dataclass
class ConsoleRead:
    data: bytes = b""
    """Whole lines: the bytes read up to the last line end (so a line splitter fed them never
    holds a partial line or a partial UTF-8 character)."""
    restarted: str | None = None
    """Why the file is read from its start again, when this read does ("truncated ...")."""
    too_long: int = 0
    """Lines longer than `_LONG_LINE` bytes dropped (counted when their start is met)."""


class ConsoleLogReader:
    """A plain-text log that grows: whole lines' bytes out, the cursor past the last line end.

    The open file is kept between reads, so a file renamed away (rotated) is read to its end
    before the new file under its name is followed, as `tail -F` does. A partial last line is
    not consumed: the next read takes it whole once its end is written."""

    def __init__(self, path: str, cursor: dict[str, Any] | None = None) -> None:
        saved = cursor or {}
        self.path = path
        self.offset: int = int(saved.get("offset", 0))
        self.identity: list[int] | None = saved.get("file")
        """[device, inode] of the file the offset is in; None before the first read."""
        self.long_line: bool = bool(saved.get("long_line", False))
        """The bytes at the offset are the rest of a dropped line, up to its end."""
        self.tail = bytes.fromhex(saved.get("tail", ""))
        """The last bytes before the offset, as read: the file still holds them there unless it
        was cut and written again past the offset between two reads."""
        self.waiting = 0
        """Bytes after the cursor that are not a whole line yet."""
        self._fd: int | None = None

    @property
    def cursor(self) -> dict[str, Any]:
        return {"offset": self.offset, "file": self.identity, "long_line": self.long_line, "tail": self.tail.hex()}

    def read(self) -> ConsoleRead:
        """The whole lines written since the last read (at most `_READ_LIMIT` bytes of them)."""
        out = ConsoleRead()
        if self._fd is None and not self._open(out):
            return out
        if self._read_open(out) == 0 and self._replaced():
            self._read_open(out)  # what the old file got between that read and the rename
            self.close()
            self.identity, self.offset, self.long_line, self.tail = None, 0, False, b""
            out.restarted = "replaced by a new file"
            if self._open(out):
                self._read_open(out)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self, out: ConsoleRead) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        except FileNotFoundError:
            return False  # rotated away, the new one not there yet
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise ValueError(f"{self.path} is not a regular file")
        identity = [info.st_dev, info.st_ino]
        if self.identity is not None and identity != self.identity:
            out.restarted = "replaced by a new file while it was not followed"
            self.offset, self.long_line, self.tail = 0, False, b""
        self.identity, self._fd = identity, fd
        return True

    def _replaced(self) -> bool:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return False
        return [info.st_dev, info.st_ino] != self.identity

    def _read_open(self, out: ConsoleRead) -> int:
        """Reads the open file from the cursor; the bytes consumed."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self.offset:
            out.restarted = f"truncated to {size} bytes"
            self.offset, self.long_line, self.tail = 0, False, b""
        elif self.tail and os.pread(self._fd, len(self.tail), self.offset - len(self.tail)) != self.tail:
            out.restarted = "truncated and written again"
            self.offset, self.long_line, self.tail = 0, False, b""
        data = os.pread(self._fd, min(size - self.offset, _READ_LIMIT), self.offset)
        start = 0
        if self.long_line:
            ends = [at for at in (data.find(b"\n"), data.find(b"\r")) if at >= 0]
            if not ends:
                return self._consumed(len(data), size)
            start = min(ends) + 1
            self.long_line = False
        end = max(start, data.rfind(b"\n") + 1, data.rfind(b"\r") + 1)
        out.data += data[start:end]
        if len(data) - end > _LONG_LINE:  # no line end in that much: not a metrics line, dropped
            out.too_long += 1
            self.long_line = True
            end = len(data)
        return self._consumed(end, size)

    def _consumed(self, count: int, size: int) -> int:
        assert self._fd is not None
        self.offset += count
        self.waiting = size - self.offset
        if count:
            kept = min(self.offset, _TAIL)
            self.tail = os.pread(self._fd, kept, self.offset - kept)
        return count


# -- to the end -------------------------------------------------------------------------


def reads_to_the_end(reader: WandbReader | TensorboardReader) -> Iterator[Any]:
    """Every read of `reader` (a WandbRead or TensorboardRead each) until one leaves its cursor
    where it was: a log read whole the way `keel watch` reads it as it grows (`keel import`).
    What is left then, `reader.waiting` bytes, is not a whole record (a writer killed
    mid-write); a record larger than a read is skipped and reported by both alike."""
    while True:
        before = reader.cursor if isinstance(reader, WandbReader) else dict(reader.cursors)
        yield reader.read()
        if (reader.cursor if isinstance(reader, WandbReader) else reader.cursors) == before:
            return
