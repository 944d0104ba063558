"""The on-disk spool: every frame lives here from the moment it is cut until the server acks it.

One directory per run (default `~/.keel/spool/<run_id>`):

    run.json       {"format": 1, "run": RunInfo, "server_url": ..., "seq_base": int | null,
                    "status": null | "finished" | "failed" | "killed", "writer": str}
                   written whole to a temp file, fsynced, then renamed over (atomic).
    frames.jsonl   append-only, one frame per line: {"n": <local index>,"rows": [...]}
                   `rows` is exactly the wire `rows` array of a points frame.
    acked.json     {"n": last acked local index, "offset": byte offset just past its line},
                   renamed into place at most every 5 s (and at compaction and close),
                   never fsynced: a stale or lost one only resends frames the server
                   already holds, and the server acks those again without storing.
    lock           flock()ed by the one process that owns the spool (a trainer or `keel sync`);
                   the kernel drops the lock when that process dies, even by SIGKILL.

Why a local index `n` and not the wire seq: a frame may be cut before the server has told
us (in `welcome.acked_seq`) where this run's numbering stands, e.g. when a run is resumed
by id on another machine. The wire seq is `seq_base + n`; `seq_base` is fixed by the first
welcome this spool sees and persisted in run.json.

`writer` names this spool's own frame sequence on the server (sent in the hello), so two
spools of one run, say a run resumed on another machine while the first still streams,
never take each other's frames for resends. Spools written before writers existed have
none and use the unnamed writer "" their seqs belong to.

A frame the server rejects (it breaks the protocol; it will never be stored) is copied to
`<root>/rejected/<run_id>.jsonl` before it counts as done, so it outlives the spool.

Crash safety: a line is appended with a single write(2) of the whole line. After a crash
only the last line can be torn; `open` drops it. fsync is done off the training thread
at most once per `fsync_interval` seconds (a process crash loses nothing that reached
write(2); only a machine crash can lose the last interval).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wire import KeelError, RunInfo

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one writer per spool is then the user's job
    fcntl = None  # type: ignore[assignment]

__all__ = ["Frame", "Spool", "SpoolBusyError", "default_spool_root", "find_spools"]

logger = logging.getLogger("keel")

SPOOL_FORMAT = 1
RUN_FILE = "run.json"
FRAMES_FILE = "frames.jsonl"
ACKED_FILE = "acked.json"
LOCK_FILE = "lock"
_LINE_HEAD = b'{"n":'
_ROWS_HEAD = b',"rows":'
_LINE_TAIL = b"}\n"
# Start frames.jsonl over once everything in it is acked and it is bigger than this.
_COMPACT_BYTES = 16 * 1024 * 1024
_ACKED_INTERVAL_S = 5.0
"""acked.json is rewritten at most this often (an atomic write per ack costs more CPU than
the ack itself when frames are small and frequent)."""
_FIRST_READ = 8 * 1024


def default_spool_root() -> Path:
    """Where run spools live unless `spool_dir` says otherwise: $KEEL_SPOOL_DIR or ~/.keel/spool."""
    configured = os.environ.get("KEEL_SPOOL_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".keel" / "spool"


def find_spools(path: Path) -> list[Path]:
    """`path` itself if it is a run spool, else the run spools directly inside it."""
    if (path / RUN_FILE).is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(child for child in path.iterdir() if (child / RUN_FILE).is_file())


class SpoolBusyError(KeelError, RuntimeError):
    """Another live process (a trainer or `keel sync`) owns this spool."""


@dataclass(frozen=True)
class Frame:
    n: int
    """Local index of the frame in this spool."""
    rows_json: str
    """The wire `rows` array, already JSON-encoded."""
    end_offset: int
    """Byte offset just past this frame's line in frames.jsonl."""


def _write_atomic(path: Path, payload: dict[str, Any], *, durable: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(payload, separators=(",", ":")))
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


def _parse_line(line: bytes) -> tuple[int, str] | None:
    """(n, rows_json) of one complete frames.jsonl line, or None if it is torn or foreign."""
    if not (line.startswith(_LINE_HEAD) and line.endswith(_LINE_TAIL)):
        return None
    split = line.find(_ROWS_HEAD, len(_LINE_HEAD))
    if split < 0:
        return None
    try:
        n = int(line[len(_LINE_HEAD) : split])
        rows_json = line[split + len(_ROWS_HEAD) : -len(_LINE_TAIL)].decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return n, rows_json


class Spool:
    """One run's spool directory. Not thread-safe: one thread of one process uses it."""

    def __init__(self, path: Path, meta: dict[str, Any], lock_fd: int | None) -> None:
        self.path = path
        self._meta = meta
        self._lock_fd = lock_fd
        self._frames_fd = os.open(path / FRAMES_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # Unbuffered on purpose: a buffered reader may serve bytes from before a truncation
        # (compaction, torn-tail repair) when seeking back into its buffer.
        self._reader = open(path / FRAMES_FILE, "rb", buffering=0)  # lives as long as the spool
        self.acked_n, self.acked_offset = self._load_acked()
        self.next_n, self.end_offset = self._recover()
        self._dirty = False
        self._last_fsync = time.monotonic()
        self._acked_stale = False  # acked_n moved past what acked.json says
        self._acked_written = float("-inf")

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls, path: Path, *, run: RunInfo | None = None, server_url: str | None = None
    ) -> Spool:
        """Open the spool at `path`, creating it for `run` if it does not exist.

        Raises SpoolBusyError if another live process holds it, FileNotFoundError if
        it does not exist and no `run` was given.
        """
        run_file = path / RUN_FILE
        if not run_file.is_file() and run is None:
            raise FileNotFoundError(f"{path} is not a Keel spool (no {RUN_FILE})")
        path.mkdir(parents=True, exist_ok=True)
        lock_fd = cls._lock(path)
        try:
            if run_file.is_file():
                meta = json.loads(run_file.read_text(encoding="utf-8"))
                if run is not None:
                    # The live Monitor's description wins (the server keeps the first config).
                    meta["run"] = run.to_json()
                    meta["server_url"] = server_url or meta.get("server_url")
                    _write_atomic(run_file, meta, durable=True)
            else:
                assert run is not None
                meta = {
                    "format": SPOOL_FORMAT,
                    "run": run.to_json(),
                    "server_url": server_url,
                    "seq_base": None,
                    "status": None,
                    "writer": uuid.uuid4().hex,
                }
                _write_atomic(run_file, meta, durable=True)
            return cls(path, meta, lock_fd)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise

    @staticmethod
    def _lock(path: Path) -> int | None:
        if fcntl is None:
            return None
        lock_fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise SpoolBusyError(
                f"spool {path} is in use by another process (a running trainer or keel sync)"
            ) from None
        return lock_fd

    def _load_acked(self) -> tuple[int, int]:
        try:
            acked = json.loads((self.path / ACKED_FILE).read_text(encoding="utf-8"))
            return int(acked["n"]), int(acked["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1, 0

    def _recover(self) -> tuple[int, int]:
        """Find the next local index and drop a torn last line left by a crash.

        Scans from the acked offset (the acked prefix may be long and is never reread).
        Lines with n <= acked_n are skipped: they are what a crash between compaction
        steps can leave behind.
        """
        size = os.fstat(self._frames_fd).st_size
        offset = self.acked_offset if self.acked_offset <= size else 0
        next_n = self.acked_n + 1
        with open(self.path / FRAMES_FILE, "rb") as scan:
            if offset:
                scan.seek(offset - 1)
                if scan.read(1) != b"\n":  # the marker does not point at a line start
                    offset = 0
            scan.seek(offset)
            good_end = position = offset
            for line in scan:
                parsed = _parse_line(line)
                position += len(line)
                if parsed is None:
                    if position >= size:
                        break  # torn tail: cut below
                    logger.warning("keel: skipping a corrupt line in %s", self.path / FRAMES_FILE)
                    good_end = position
                    continue
                next_n = max(next_n, parsed[0] + 1)
                good_end = position
        self.acked_offset = offset
        if good_end < size:
            logger.warning(
                "keel: dropping %d bytes of a torn last frame in %s (crash while writing)",
                size - good_end,
                self.path / FRAMES_FILE,
            )
            os.ftruncate(self._frames_fd, good_end)
        return next_n, good_end

    # -- metadata ------------------------------------------------------------------------

    @property
    def run(self) -> RunInfo:
        raw = self._meta["run"]
        return RunInfo(
            id=raw["id"],
            name=raw["name"],
            project=raw.get("project", "default"),
            group=raw.get("group"),
            config=raw.get("config") or {},
            tags=list(raw.get("tags") or []),
        )

    @property
    def server_url(self) -> str | None:
        return self._meta.get("server_url")

    @property
    def seq_base(self) -> int | None:
        base = self._meta.get("seq_base")
        return None if base is None else int(base)

    @property
    def writer(self) -> str:
        """This spool's writer id on the server ("" for a spool older than writers)."""
        return str(self._meta.get("writer", ""))

    @property
    def rejected_path(self) -> Path:
        return self.path.parent / "rejected" / f"{self.path.name}.jsonl"

    def keep_rejected(self, offset: int) -> Path:
        """Copy the frame whose line starts at `offset` to `rejected_path` (durably)."""
        line = self._read_line(offset)
        self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.rejected_path, "ab") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())
        return self.rejected_path

    def keep_left_out(self, record: dict[str, Any]) -> Path:
        """Append `record` (what a server would not store of a frame) to `rejected_path`."""
        self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.rejected_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        return self.rejected_path

    @property
    def status(self) -> str | None:
        """The finish status the owner asked for, if it got that far."""
        return self._meta.get("status")

    def record_status(self, status: str) -> None:
        self._set_meta(status=status)

    def _set_meta(self, **changes: Any) -> None:
        self._meta.update(changes)
        _write_atomic(self.path / RUN_FILE, self._meta, durable=True)

    # -- frames --------------------------------------------------------------------------

    @property
    def unacked(self) -> int:
        """Frames written but not yet acknowledged."""
        return self.next_n - self.acked_n - 1

    def append(self, rows_json: str) -> int:
        """Append one frame; return its local index. One write(2), no fsync here."""
        n = self.next_n
        line = b"".join(
            (_LINE_HEAD, str(n).encode(), _ROWS_HEAD, rows_json.encode("utf-8"), _LINE_TAIL)
        )
        written = os.write(self._frames_fd, line)
        if written != len(line):  # only on a full disk; keep the log parseable
            os.ftruncate(self._frames_fd, self.end_offset)
            raise OSError(f"short write to {self.path / FRAMES_FILE} ({written}/{len(line)})")
        self.next_n = n + 1
        self.end_offset += len(line)
        self._dirty = True
        return n

    def read(self, offset: int) -> Frame | None:
        """The frame whose line starts at `offset`, or None at the end of the log."""
        if offset >= self.end_offset:
            return None
        line = self._read_line(offset)
        parsed = _parse_line(line)
        if parsed is None:  # a corrupt line skipped at open: step over it
            return Frame(n=-1, rows_json="", end_offset=offset + len(line)) if line else None
        return Frame(n=parsed[0], rows_json=parsed[1], end_offset=offset + len(line))

    def _read_line(self, offset: int) -> bytes:
        """The bytes from `offset` through the next newline (or the end of the log)."""
        self._reader.seek(offset)
        chunks: list[bytes] = []
        position, size = offset, _FIRST_READ
        while position < self.end_offset:
            chunk = self._reader.read(min(size, self.end_offset - position))
            if not chunk:
                break
            newline = chunk.find(b"\n")
            if newline >= 0:
                chunks.append(chunk[: newline + 1])
                break
            chunks.append(chunk)
            position += len(chunk)
            size *= 2  # big frames (a backlog) in a few reads, small ones in one
        return b"".join(chunks)

    def mark_acked(self, n: int, end_offset: int) -> None:
        """Frames up to local index `n` (ending at `end_offset`) are stored by the server."""
        if n <= self.acked_n:
            return
        self.acked_n, self.acked_offset = n, end_offset
        self._acked_stale = True
        if self.unacked == 0 and self.end_offset > _COMPACT_BYTES:
            self._compact()
            self._write_acked()  # at once: the old marker points into the truncated log
        else:
            self._write_acked_if_due()

    def _write_acked_if_due(self) -> None:
        if self._acked_stale and time.monotonic() - self._acked_written >= _ACKED_INTERVAL_S:
            self._write_acked()

    def _write_acked(self) -> None:
        _write_atomic(
            self.path / ACKED_FILE, {"n": self.acked_n, "offset": self.acked_offset}, durable=False
        )
        self._acked_stale = False
        self._acked_written = time.monotonic()

    def _compact(self) -> None:
        # Everything is acked: start the log over. Truncate first, then the acked marker;
        # a crash in between leaves a marker past the end, which `_recover` treats as 0.
        os.ftruncate(self._frames_fd, 0)
        self.end_offset = self.acked_offset = 0

    def anchor(self, acked_seq: int) -> None:
        """Apply a welcome's `acked_seq` (the highest seq of this run the server holds).

        The first welcome fixes `seq_base` so that every frame of this spool numbers after
        what the server already has. Later welcomes mark frames acked; if the server claims
        seqs this spool never produced, someone else wrote to the run, and our unacked
        frames are renumbered past its seq (the server ignores points it already has, so
        a resend can never store a point twice).
        """
        base = self.seq_base
        if base is None or acked_seq >= base + self.next_n:
            self._set_meta(seq_base=acked_seq + 1 - (self.acked_n + 1))
            return
        self.advance_acked(acked_seq - base)

    def advance_acked(self, n: int) -> None:
        """Mark frames up to local index `n` acked when their offsets are not at hand."""
        offset = self.acked_offset
        last = self.acked_n
        while last < n:
            frame = self.read(offset)
            if frame is None or (frame.n > n):
                break
            offset, last = frame.end_offset, max(last, frame.n)
        self.mark_acked(last, offset)

    def fsync_if_due(self, interval: float) -> None:
        """Called regularly by the spool's owner: the fsync, and an acked marker left stale."""
        now = time.monotonic()
        if self._dirty and now - self._last_fsync >= interval:
            self.fsync()
        self._write_acked_if_due()

    def fsync(self) -> None:
        if self._dirty:
            os.fsync(self._frames_fd)
            self._dirty = False
        self._last_fsync = time.monotonic()

    # -- closing -------------------------------------------------------------------------

    def close(self, *, remove: bool = False) -> None:
        """Release the spool; with `remove`, delete it (everything is on the server)."""
        if not remove:
            self.fsync()
            if self._acked_stale:
                self._write_acked()
        os.close(self._frames_fd)
        self._reader.close()
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
