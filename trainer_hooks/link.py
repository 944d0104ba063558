"""The trainer's side of the Monitor's worker process: start it, feed it, hear from it.

`Feed` writes the training thread's messages (`channel.py`) to the worker's inbox pipe
without ever blocking: a message goes out with one non-blocking writev(2) of the caller's
buffers; whatever the pipe cannot take yet (the worker is still starting, or busy) is
copied into an in-memory queue, bounded in messages and bytes. A message whose tensors are
still being copied off a GPU (`Pending`) waits in the same queue, in call order; each
later call forwards the ones whose copies have landed (a non-blocking event query).

`Feed` has a thread, started only once something has to wait (a full pipe, a device copy):
it sleeps on an Event, then `linger` s more, so a training loop that logs every step wakes
it at most once per `linger`, and otherwise it blocks in select(2) or on a CUDA event with
the interpreter lock released. A CPU loop that the worker keeps up with never starts it.

`Link` starts the worker (`python -c "from trainer_hooks.worker import run; run()"`: a fresh
interpreter, so a CUDA context is never forked and a script without a `__main__` guard is
never run twice), and a thread that blocks reading the worker's replies (drops, log
records, "done"). When the worker dies before "done", `Link` starts another one on the same
spool (the spool lock died with it), up to `_MAX_RESTARTS` times, then runs the worker on a
thread of this process instead. Only what the dead worker held in memory is lost.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer_hooks.capture import HostCopy
from trainer_hooks.channel import (
    Buffer,
    Done,
    Drop,
    LogLine,
    Reader,
    Ready,
    Relay,
    Reply,
    Start,
    WorkerStart,
    encode,
    read_message,
)
from wire.signals import Signal

__all__ = ["Done", "Feed", "Link", "Pending"]

logger = logging.getLogger("keel")

# Linux's largest pipe for an unprivileged process (/proc/sys/fs/pipe-max-size): the
# worker's first second (its start-up) and a few CPU batches fit without a copy.
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
# Worker processes started for one run after the first died; then a thread takes over.
_MAX_RESTARTS = 3
_ENTRY = "from trainer_hooks.worker import run; run()"
# The directory that holds the trainer_hooks package, for the worker's sys.path.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


@dataclass
class Pending:
    """A message whose tensors are on their way to host memory: `encode()` it once
    every copy has landed."""

    copies: list[HostCopy]
    encode: Callable[[], list[Buffer]]
    nbytes: int
    """What it holds in host memory (counted against the Feed's bound)."""

    def ready(self) -> bool:
        return all(copy.ready() for copy in self.copies)

    def wait(self) -> None:
        for copy in self.copies:
            copy.wait()


def _size(parts: Sequence[Buffer]) -> int:
    return sum(memoryview(part).nbytes for part in parts)


class Feed:
    """Ordered, never-blocking writes to the worker's inbox (see the module docstring)."""

    def __init__(
        self,
        *,
        linger: float,
        max_messages: int,
        max_bytes: int,
        on_error: Callable[[str], None],
    ) -> None:
        self._linger = linger
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._on_error = on_error
        self._fd: int | None = None
        self._broken = False  # the worker is gone: queue until Link connects another
        self._queue: deque[Buffer | Pending] = deque()
        self._partial: memoryview | None = None  # the rest of a message begun on the pipe
        self.queued_bytes = 0
        self._bytes_lock = threading.Lock()  # queued_bytes changes outside `_lock` too
        self._lock = threading.Lock()  # held by whoever writes to the pipe
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    @property
    def idle(self) -> bool:
        """Everything is in the pipe."""
        return self._partial is None and not self._queue

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _count(self, change: int) -> None:
        with self._bytes_lock:
            self.queued_bytes += change

    def connect(self, fd: int, first: list[Buffer]) -> None:
        """Write to `fd` from now on, `first` before anything queued (a new worker's start)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._broken = fd, False
            if self._partial is not None:  # the dead worker's half message
                self._count(-self._partial.nbytes)
            self._partial = memoryview(b"".join(first))
            self._count(self._partial.nbytes)
            self._pump(None)
            if not self.idle:
                self._kick()

    def put(self, parts: list[Buffer], *, always: bool = False) -> bool:
        """Send a message now, or queue a copy of it; False when the queue is full
        (`always`: queue it anyway, for the one "finish")."""
        if os.getpid() != self._pid:  # a fork of the trainer: the pipe is not its own
            return False
        size = _size(parts)
        if self._lock.acquire(blocking=False):
            try:
                self._pump(None)
                if self.idle and self._fd is not None and not self._broken:
                    written = self._writev(parts)
                    if written == size:
                        return True
                    if written:  # the pipe took the head: keep the rest first in line
                        self._partial = memoryview(b"".join(parts))[written:]
                        self._count(size - written)
                        self._kick()
                        return True
            finally:
                self._lock.release()
        return self._enqueue(b"".join(parts), size, always=always)

    def put_pending(self, pending: Pending) -> bool:
        if os.getpid() != self._pid:
            return False
        if self._lock.acquire(blocking=False):
            try:
                self._pump(None)
            finally:
                self._lock.release()
        return self._enqueue(pending, pending.nbytes)

    def _enqueue(self, entry: Buffer | Pending, size: int, *, always: bool = False) -> bool:
        full = len(self._queue) >= self._max_messages or self.queued_bytes + size > self._max_bytes
        if full and not always:
            return False
        self._queue.append(entry)
        self._count(size)
        self._kick()
        return True

    def flush(self, timeout: float) -> bool:
        """Block until everything is in the pipe (finish); False after `timeout` s."""
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            self._pump(deadline)
            return self.idle
        finally:
            self._lock.release()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- writing (with the lock held) --------------------------------------------------

    def _kick(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="keel-feed", daemon=True)
            self._thread.start()
        if not self._wake.is_set():
            self._wake.set()

    def _drain(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                return
            time.sleep(self._linger)  # let the training thread's own calls forward most
            self._wake.clear()
            while not (self.idle or self._closed or self._broken):
                with self._lock:  # let go now and then: finish() may want to flush
                    self._pump(time.monotonic() + 0.5)

    def _pump(self, deadline: float | None) -> None:
        """Write what is queued, in order. `deadline` None: only what goes at once; else
        wait for the pipe and for device copies (not past `deadline`, time.monotonic())."""
        while self._fd is not None and not self._broken:
            if self._partial is not None:
                written = self._write(self._partial, deadline)
                self._count(-written)
                self._partial = self._partial[written:] if written < self._partial.nbytes else None
                if self._partial is not None:
                    if deadline is None or time.monotonic() >= deadline or self._broken:
                        return
                continue
            if not self._queue:
                return
            head = self._queue[0]
            data: Buffer
            if isinstance(head, Pending):
                if not head.ready():
                    if deadline is None:
                        return
                    head.wait()  # the CUDA event releases the interpreter lock meanwhile
                self._queue.popleft()
                self._count(-head.nbytes)
                try:
                    data = b"".join(head.encode())
                except Exception as exc:  # e.g. a CUDA error surfacing at the event
                    self._on_error(f"tensors lost: {exc!r}")
                    continue
                self._count(len(data))
            else:
                data = head
                self._queue.popleft()
            self._partial = memoryview(data)

    def _writev(self, parts: list[Buffer]) -> int:
        assert self._fd is not None
        try:
            return os.writev(self._fd, parts)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:  # EPIPE: the worker died; Link connects another
            self._broken = True
            return 0

    def _write(self, data: memoryview, deadline: float | None) -> int:
        assert self._fd is not None
        while True:
            try:
                return os.write(self._fd, data)
            except InterruptedError:
                continue
            except BlockingIOError:
                if deadline is None:
                    return 0
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                select.select([], [self._fd], [], min(left, 1.0))
            except OSError:
                self._broken = True
                return 0


class Link:
    """Starts the worker, restarts it if it dies, relays its replies."""

    def __init__(
        self,
        worker_start: WorkerStart,
        feed: Feed,
        *,
        on_drop: Callable[[str, int, str], None],
        name: str,
        on_signal: Callable[[Signal], None] = lambda signal: None,
    ) -> None:
        self.worker_start = worker_start
        """Sent to each worker started; `Monitor` updates it (the decoder) for restarts."""
        self._feed = feed
        self._on_drop = on_drop
        self._on_signal = on_signal
        self._name = name
        self._starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None  # the fallback: a worker on a thread
        self._lock = threading.Lock()
        self.ready = threading.Event()
        self.done: Done | None = None
        self.finish_message: list[Buffer] | None = None
        """Sent by finish(); sent again to a worker started after that."""
        self._over = threading.Event()  # "done" received, or no worker will come back

    @property
    def pid(self) -> int | None:
        """The worker process (None while it runs on a thread)."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start a worker; returns at once (the worker imports in the background)."""
        with self._lock:
            self._starts += 1
            inbox_read, inbox_write = os.pipe()
            replies_read, replies_write = os.pipe()
            _grow(inbox_write)
            process = None
            if self._starts <= 1 + _MAX_RESTARTS and sys.executable:
                try:
                    process = self._spawn(inbox_read, replies_write)
                except (OSError, ValueError) as exc:  # ValueError: no pass_fds (Windows)
                    logger.warning("keel: could not start the worker process (%r)", exc)
                    self._starts = 2 + _MAX_RESTARTS
            if process is None:  # the fallback: the same worker, on a thread of this process
                self._thread = threading.Thread(
                    target=_serve_here,
                    args=(inbox_read, replies_write),
                    name=f"keel-worker-{self._name}",
                    daemon=True,
                )
                self._thread.start()
            else:
                os.close(inbox_read)
                os.close(replies_write)
            self._process = process
            os.set_blocking(inbox_write, False)
            threading.Thread(
                target=self._listen,
                args=(replies_read, process),
                name=f"keel-replies-{self._name}",
                daemon=True,
            ).start()
            self._feed.connect(inbox_write, encode(Start(self.worker_start)))

    def _spawn(self, inbox: int, replies: int) -> subprocess.Popen[bytes]:
        path = os.environ.get("PYTHONPATH")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, path])),
            # One CPU thread for torch: the metrics of a few steps are small ops, and the
            # learner owns the other cores.
            "OMP_NUM_THREADS": "1",
        }
        return subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(inbox), str(replies)],
            pass_fds=(inbox, replies),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the trainer's stdout is its own; stderr is shared
            env=env,
        )

    def wait(self, timeout: float) -> Done | None:
        """The worker's "done", or None if it did not come within `timeout` s."""
        self._over.wait(timeout)
        return self.done

    def kill(self) -> None:
        """Stop a worker that outstayed finish (SIGKILL; its spool stays for `keel sync`)."""
        self._over.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def _listen(self, fd: int, process: subprocess.Popen[bytes] | None) -> None:
        reader = Reader()
        try:
            while True:
                try:
                    messages = read_message(fd, reader)
                except EOFError:
                    break
                except InterruptedError:
                    continue
                for header, _ in messages:
                    self._handle(header)
        finally:
            os.close(fd)
        code = process.wait() if process is not None else None
        if self.done is not None or self._over.is_set():
            return
        logger.warning(
            "keel: the Monitor's worker %s exited (%s) before the run finished; starting "
            "another on the same spool (rows it had not spooled yet are lost)",
            f"process {process.pid}" if process is not None else "thread",
            f"code {code}" if code is not None else "no code",
        )
        if process is None:
            self._over.set()  # even the thread gave up; finish() reports the spool
            return
        self.start()
        if self.finish_message is not None:  # the dead worker took it along
            self._feed.put(self.finish_message, always=True)

    def _handle(self, reply: Reply) -> None:
        match reply:
            case Drop(kind, count, detail):
                self._on_drop(kind, count, detail)
            case LogLine(level, message):
                logger.log(level, "%s", message)
            case Relay(signal):
                self._on_signal(signal)
            case Ready():
                self.ready.set()
            case Done():
                self.done = reply
                self._over.set()


def _serve_here(inbox: int, replies: int) -> None:
    from trainer_hooks.worker import Worker

    try:
        Worker(inbox, replies).serve()
    finally:
        os.close(inbox)
        os.close(replies)


def _grow(fd: int) -> None:
    """Make the pipe as large as an unprivileged process may (Linux; elsewhere as it is)."""
    try:
        import fcntl

        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, OSError):
        pass
