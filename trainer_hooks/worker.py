"""The Monitor's worker process: everything but the snapshot, away from the learner's interpreter.

    python -c "from trainer_hooks.worker import run; run()" INBOX_FD REPLIES_FD

`link.py` starts it (a fresh interpreter, never a fork: a CUDA context does not survive
fork) and writes the trainer's calls to INBOX_FD (`channel.py`). The worker merges the
calls of a step (`steps.py`), computes `log_batch` metrics several steps at once
(`batched.py`), cuts frames, appends them to the disk spool (`spool.py`) and streams the
spool to the server (`sender.py`). It may poll as often as it likes: it holds its own
interpreter lock, so none of this competes with the training thread's.

How it ends:
- "finish" from the trainer: as `Monitor.finish` always did (spool everything, record the
  status, wait for the server's acks until the deadline), then ("done", ...) and exit.
- the trainer is gone (EOF on the inbox, or a new parent pid): whatever it received is
  spooled, the status is left unset (`keel sync` then reports the run "killed"), and it
  exits at once, so `keel sync` can take the spool; `_ORPHAN_GRACE_S` bounds a stalled disk.
SIGINT and SIGTERM are ignored: a Ctrl-C or a job's SIGTERM reaches the whole process
group, and the trainer's own handler then asks this process to finish.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_hooks.channel import (
    Answer,
    Batch,
    Decoder,
    Done,
    Drop,
    Finish,
    Listen,
    Log,
    LogLine,
    Packed,
    Reader,
    Ready,
    Relay,
    Reply,
    Start,
    WorkerStart,
    encode,
    write_all,
)
from trainer_hooks.decoder import loads as load_decoder
from trainer_hooks.sender import ConnState, Sender
from trainer_hooks.spool import Spool
from trainer_hooks.steps import Call, DetailOptions, StepMerger
from wire import encode_rows

if TYPE_CHECKING:
    from trainer_hooks.metrics import BatchInputs

__all__ = ["Worker", "run"]

logger = logging.getLogger("keel")

# How long one turn of the loop may wait for the server before it reads the inbox again.
_TICK_S = 0.05
# Bytes read from the inbox per read(2).
_READ_CHUNK = 1 << 20
# Once the trainer is gone: the longest the last spooling may take (a stalled disk). With
# a dial in progress when it goes (connect_timeout, 5 s) the worker outlives the trainer by
# at most ~10 s, the finish timeout of a killed run, inside a killed job's grace period.
_ORPHAN_GRACE_S = 5.0


def run() -> None:
    """The worker process's entry point (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox, replies = int(sys.argv[1]), int(sys.argv[2])
    parent = os.getppid()
    Worker(inbox, replies, parent_alive=lambda: os.getppid() == parent).serve()


class _Forward(logging.Handler):
    """The worker's "keel" log records, sent to the trainer's logger."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(logging.INFO)
        self._worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        self._worker.reply(LogLine(record.levelno, self.format(record)))


class Worker:
    """Serves one run's inbox until finish or until the trainer is gone.

    `parent_alive`: checked every turn (in a worker process: is the parent still ours); a
    worker on a thread of the trainer itself (`link.py`'s fallback) passes None.
    """

    def __init__(self, inbox: int, replies: int, *, parent_alive: Any = None) -> None:
        self._inbox = inbox
        self._replies = replies
        self._parent_alive = parent_alive
        self._reader = Reader()
        self._calls: deque[Call] = deque()  # waiting for the batching window
        self._finish: tuple[str, float] | None = None  # (status, deadline)
        self._start: WorkerStart | None = None
        self._decoder: tuple[bytes, tuple[str, ...]] | None = None  # the latest "decoder" message
        self._merger: StepMerger | None = None  # once "start" is served
        self._made_sender: Sender | None = None  # once "start" is served
        self._listen: tuple[tuple[str, ...], dict[str, str] | None] | None = None  # the latest "listen" message
        self._answers: list[tuple[str, bool, str]] = []  # "answer"s that came before the sender

    def reply(self, message: Reply) -> None:
        try:
            write_all(self._replies, encode(message))
        except OSError:
            pass  # the trainer is gone; what matters is in the spool

    def _drop(self, kind: str, count: int, detail: str) -> None:
        self.reply(Drop(kind, count, detail))

    def _warn(self, message: str) -> None:
        logger.warning("keel: %s", message)

    @property
    def _sender(self) -> Sender:
        """The server connection: serve() sets it up before the loop's first turn."""
        assert self._made_sender is not None
        return self._made_sender

    @property
    def _steps(self) -> StepMerger:
        """The step merger: serve() sets it up before the loop's first turn."""
        assert self._merger is not None
        return self._merger

    # -- set-up ------------------------------------------------------------------------

    def serve(self) -> None:
        if self._parent_alive is not None:  # a process of its own: log through the trainer
            logger.handlers = [_Forward(self)]
            logger.propagate = False
            logger.setLevel(logging.INFO)
        start = self._wait_for_start()
        if start is None:
            return
        spool = Spool.open(Path(start.spool_path))
        self._spool = spool
        self._config = start.sender_config
        self._made_sender = Sender(
            spool,
            start.server_url,
            token=start.token,
            config=start.sender_config,
            listen=frozenset(self._listen[0] if self._listen is not None else start.listen),
            actions=self._listen[1] if self._listen is not None else start.actions,
            on_signal=lambda signal: self.reply(Relay(signal)),
        )
        for answer in self._answers:
            self._sender.answer(*answer)
        self._answers.clear()
        self._merger = StepMerger(
            self._drop,
            self._warn,
            start.step_timeout,
            DetailOptions(worst=start.samples, max_sample_bytes=start.sample_bytes),
        )
        if self._decoder is None and start.decoder is not None:
            self._decoder = (start.decoder, start.import_path)
        self._set_decoder()
        os.set_blocking(self._inbox, False)
        self.reply(Ready())
        orphaned = False
        try:
            orphaned = self._loop()
        finally:
            self._shutdown(orphaned)

    def _wait_for_start(self) -> WorkerStart | None:
        while self._start is None:
            try:
                data = os.read(self._inbox, _READ_CHUNK)
            except InterruptedError:
                continue
            if not data:
                return None
            self._receive(data)
        return self._start

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> bool:
        """Returns True when the trainer went away without finishing."""
        failures = 0
        while True:
            try:
                gone = self._read_inbox() or (
                    self._parent_alive is not None and not self._parent_alive()
                )
                if gone:
                    if self._finish is None:
                        _exit_after(_ORPHAN_GRACE_S)
                    return self._finish is None
                if self._turn():
                    return False
                failures = 0
            except Exception:  # keep going: a bug here must not lose later rows
                failures += 1
                if failures == 1:
                    logger.exception("keel: background sender error (retrying)")
                time.sleep(min(5.0, _TICK_S * 2**failures))
                if self._finish is not None and time.time() >= self._finish[1]:
                    return False

    def _turn(self) -> bool:
        """One turn; True when finishing is over (acked, refused, or out of time)."""
        finishing = self._finish is not None
        self._drain(force=finishing)
        self._steps.close(everything=finishing, now=time.time())
        self._cut_frame(force=finishing)
        if self._finish is not None:
            status, deadline = self._finish
            if not self._calls and self._steps.idle:
                if self._spool.status != status:
                    self._spool.record_status(status)  # so `keel sync` knows
                self._sender.request_finish(status)
                if self._sender.settled:
                    return True
            if time.time() >= deadline:
                self._sender.finish_unacked(status)
                return True
        self._sender.step(_TICK_S)
        self._spool.fsync_if_due(self._config.fsync_interval)
        return False

    def _read_inbox(self) -> bool:
        """Take what the trainer wrote; True at EOF (the trainer is gone)."""
        while True:
            try:
                data = os.read(self._inbox, _READ_CHUNK)
            except BlockingIOError:
                return False
            except InterruptedError:
                continue
            if not data:
                return True
            self._receive(data)

    def _receive(self, data: bytes) -> None:
        for message, body in self._reader.feed(data):
            match message:
                case Start(worker):
                    self._start = worker
                case Finish(status, deadline):
                    self._finish = (status, deadline)
                case Listen(signals, actions):
                    self._listen = (tuple(signals), actions)
                    if self._made_sender is not None:
                        self._made_sender.set_listen(frozenset(self._listen[0]), self._listen[1])
                case Answer(command_id, ok, said):
                    if self._made_sender is not None:
                        self._made_sender.answer(command_id, ok, said)
                    else:
                        self._answers.append((command_id, ok, said))
                case Decoder(blob, path):
                    self._decoder = (blob, tuple(path))
                    if self._merger is not None:
                        self._set_decoder()
                case Log() | Batch() | Packed():
                    try:
                        call = _call(message, body)
                        call.received = time.time()
                        self._calls.append(call)
                    except Exception as exc:
                        self._drop("error", 1, f"step {message.step} lost: {exc!r}")
                case _:
                    self._drop("error", 1, f"unknown message from the trainer: {type(message).__name__}")

    def _set_decoder(self) -> None:
        """log_batch's `decode`, pickled by the trainer (decoder.py): token ids to strings."""
        if self._decoder is None:
            return
        blob, path = self._decoder
        try:
            self._steps.details.decode = load_decoder(blob, path, own_process=self._parent_alive is not None)
        except Exception as exc:  # the samples then carry token ids without text
            self._drop("error", 1, f"decode could not be loaded in the worker: {exc!r}")

    def _drain(self, *, force: bool) -> None:
        """Calls -> the merger. Unless `force`d, waits (like the frame window) until the
        oldest call is `flush_interval` old, so log_batch() metrics are computed several
        steps at once."""
        limit = self._config.max_rows_per_frame
        if not self._calls:
            return
        if not force and len(self._calls) < limit:
            if time.time() - self._calls[0].time < self._config.flush_interval:
                return
        taken = 0
        while self._calls and len(self._steps.rows) + taken < limit:
            self._steps.take(self._calls.popleft())
            taken += 1

    def _cut_frame(self, *, force: bool) -> None:
        rows = self._steps.rows
        if not rows:
            return
        full = (
            len(rows) >= self._config.max_rows_per_frame
            or self._steps.rows_values >= self._config.max_values_per_frame
        )
        oldest = rows[0].time or 0.0
        if not (force or full or time.time() - oldest >= self._config.flush_interval):
            return
        rows_json = json.dumps(encode_rows(rows), separators=(",", ":"), allow_nan=False)
        self._spool.append(rows_json)  # on OSError the rows stay and are retried next turn
        self._steps.take_rows()

    def _shutdown(self, orphaned: bool) -> None:
        """Nothing received may stay only in memory; then release the spool and report."""
        try:
            if self._sender.state is not ConnState.DONE:
                while self._calls or not self._steps.idle:
                    self._drain(force=True)
                    self._steps.close(everything=True)
                    self._cut_frame(force=True)
                if self._finish is not None and self._spool.status != self._finish[0]:
                    self._spool.record_status(self._finish[0])
                if orphaned:
                    self._spool.fsync()
        except Exception:
            logger.exception("keel: could not spool the last rows")
        finally:
            delivered = self._sender.state is ConnState.DONE
            rejected = self._sender.state is ConnState.REJECTED
            unacked = self._spool.unacked
            self._sender.close()
            self._spool.close(remove=delivered)
            self.reply(Done(delivered, rejected, unacked))


def _call(message: Log | Batch | Packed, body: memoryview) -> Call:
    step, wall_time, values = message.step, message.time, message.values
    if isinstance(message, Log):
        return Call(step, wall_time, values)
    if isinstance(message, Batch):
        return Call(step, wall_time, values, inputs=_inputs(message.fields, body))
    if isinstance(message, Packed):
        import torch

        from trainer_hooks.details import DetailPartials
        from trainer_hooks.metrics import Partials

        packed = torch.frombuffer(bytearray(body), dtype=torch.float64)
        layout, details_at, details_layout = message.layout
        partials = Partials.unpack(packed[:details_at], layout)
        details = None
        if details_layout is not None:
            details = DetailPartials.unpack(packed[details_at:], details_layout)
        return Call(step, wall_time, values, partials=partials, details=details)
    raise ValueError(f"unknown message {type(message).__name__}")


def _inputs(fields: list[tuple[str, Any]], body: memoryview) -> BatchInputs:
    """The BatchInputs of a "batch" message (each tensor copied out, aligned)."""
    import torch

    from trainer_hooks.metrics import BatchInputs

    values: dict[str, Any] = {}
    offset = 0
    for name, spec in fields:
        if not isinstance(spec, tuple):  # None, or an int learner_version
            values[name] = spec
            continue
        dtype_name, shape, nbytes = spec
        dtype = getattr(torch, dtype_name)
        chunk = body[offset : offset + nbytes]
        offset += nbytes
        flat = torch.frombuffer(bytearray(chunk), dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        values[name] = flat.reshape(shape)
    return BatchInputs(**values)


def _exit_after(seconds: float) -> None:
    """Bound the last spooling of an orphaned worker: exit even if the disk stalls."""
    timer = threading.Timer(seconds, os._exit, args=(1,))
    timer.daemon = True
    timer.start()

