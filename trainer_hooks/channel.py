"""The pipe between the training process and the Monitor's worker process (`worker.py`).

Both directions carry the same framing, one message after another:

    <u32 header length> <u32 body length> <header> <body>

`header` is one of the frozen dataclasses below, pickled; `body` is raw bytes (the tensors
of a `log_batch` call, each contiguous, in the order the header lists them). The trainer
writes with one writev(2) of the caller's own buffers, so a CPU batch is copied once, by
the kernel, and the loop may reuse its tensors as soon as the call returns.

Trainer -> worker ("inbox"; `Inbox`): Start (always the first), Log, Batch (body: the
BatchInputs tensors), Packed (body: the partials and details, float64), Decoder, Listen,
Answer, Finish.

Worker -> trainer ("replies"; `Reply`): Ready, Drop, LogLine, Relay, Done.

Both ends are trusted (one user, one machine, a pipe only they hold), which is what makes
pickle acceptable here; nothing read from the network ever goes through it.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_hooks.sender import SenderConfig
from wire.signals import Signal

__all__ = [
    "Answer", "Batch", "Decoder", "Done", "Drop", "FieldSpec", "Finish", "Inbox", "Listen", "Log", "LogLine",
    "Packed", "Reader", "Ready", "Relay", "Reply", "Start", "WorkerStart", "encode", "read_message", "write_all",
]  # fmt: skip

_LENGTHS = struct.Struct("<II")
# Bytes per read(2) of the replies (they are tiny).
_READ_CHUNK = 1 << 16

Buffer = Any
"""bytes, bytearray, memoryview or a numpy array: anything writev(2) takes."""

FieldSpec = tuple[str, Any]
"""One BatchInputs field: (name, None | int | (dtype name, shape, nbytes))."""


@dataclass(frozen=True)
class WorkerStart:
    """What the worker needs to take over a run's spool (sent in the "start" message)."""

    spool_path: str
    server_url: str
    token: str | None
    sender_config: SenderConfig
    step_timeout: float
    samples: int = 4
    """Worst sequences per step in the step details (0: none)."""
    sample_bytes: int = 16 * 1024
    """Bytes of JSON the samples of one step may take."""
    decoder: bytes | None = None
    """The pickled `decode` of log_batch (token ids to strings), once one was given."""
    import_path: tuple[str, ...] = ()
    """The trainer's sys.path when it pickled `decoder` (decoder.py: what it imports)."""
    listen: tuple[str, ...] = ()
    """The signals to ask the server for (docs/protocol.md, "Signals")."""
    actions: dict[str, str] | None = None
    """The command actions the trainer's handlers take, with what each does (None: not said)."""


# -- trainer -> worker -----------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Always the first message: take over the run's spool."""

    worker: WorkerStart


@dataclass(frozen=True)
class Log:
    """`Monitor.log`'s values of a step (floats, already on the host)."""

    step: int
    time: float
    values: dict[str, float]


@dataclass(frozen=True)
class Batch:
    """A `log_batch` whose metrics the worker computes: the body holds the tensors that
    `fields` lists, in order."""

    step: int
    time: float
    values: dict[str, float]
    fields: list[FieldSpec]


@dataclass(frozen=True)
class Packed:
    """A `log_batch` computed in the trainer (partial sums, `Partials.pack()`, then the step
    details' `DetailPartials.pack()`): the body is float64; `layout` is (partials' layout,
    where the details start, details' layout)."""

    step: int
    time: float
    values: dict[str, float]
    layout: tuple[Any, ...]


@dataclass(frozen=True)
class Decoder:
    """log_batch's `decode`, pickled (decoder.py), and the trainer's sys.path when it was."""

    blob: bytes
    import_path: tuple[str, ...]


@dataclass(frozen=True)
class Listen:
    """The signals to ask the server for, and the command actions handled ({name: what it
    does}, or None: not said)."""

    signals: tuple[str, ...]
    actions: dict[str, str] | None


@dataclass(frozen=True)
class Answer:
    """A command handler's answer."""

    command_id: str
    ok: bool
    message: str


@dataclass(frozen=True)
class Finish:
    status: str
    deadline: float
    """time.time() at which to give up."""


Inbox = Start | Log | Batch | Packed | Decoder | Listen | Answer | Finish


# -- worker -> trainer -----------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The spool is open."""


@dataclass(frozen=True)
class Drop:
    """Counted in Monitor.dropped."""

    kind: str
    count: int
    detail: str


@dataclass(frozen=True)
class LogLine:
    """A record for the trainer's "keel" logger."""

    level: int
    message: str


@dataclass(frozen=True)
class Relay:
    """An alert, hazard or command from the server, decoded (wire/signals.py)."""

    signal: Signal


@dataclass(frozen=True)
class Done:
    """The worker's last word: finish is over, the spool is closed."""

    delivered: bool
    """The server acked every frame and the finish status."""
    rejected: bool
    """The server refused the token (or the run)."""
    unacked: int
    """Frames left in the spool for `keel sync`."""


Reply = Ready | Drop | LogLine | Relay | Done


def encode(header: Inbox | Reply, body: Sequence[Buffer] = ()) -> list[Buffer]:
    """One message as the buffers to write, in order (no copy of the body)."""
    head = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    size = sum(memoryview(part).nbytes for part in body)
    return [_LENGTHS.pack(len(head), size) + head, *body]


def write_all(fd: int, parts: Sequence[Buffer]) -> None:
    """Write a message on a blocking fd (the worker's replies; tiny and rare)."""
    data = memoryview(b"".join(parts))
    while data:
        data = data[os.write(fd, data) :]


class Reader:
    """Splits what arrives on a pipe into messages; feed it whatever read(2) returned."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[Any, memoryview]]:
        """The messages that `data` completes: (header, body), the body a copy of its own."""
        self._buffer += data
        start = 0
        messages = []
        while len(self._buffer) - start >= _LENGTHS.size:
            head_size, body_size = _LENGTHS.unpack_from(self._buffer, start)
            end = start + _LENGTHS.size + head_size + body_size
            if len(self._buffer) < end:
                break
            head_start = start + _LENGTHS.size
            header = pickle.loads(self._buffer[head_start : head_start + head_size])
            body = bytes(self._buffer[head_start + head_size : end])
            messages.append((header, memoryview(body)))
            start = end
        del self._buffer[:start]
        return iter(messages)


def read_message(fd: int, reader: Reader) -> Iterator[tuple[Any, memoryview]]:
    """Block for the next chunk on `fd` and return the messages it completes (maybe none
    yet). Raises EOFError when the other end is closed."""
    data = os.read(fd, _READ_CHUNK)
    if not data:
        raise EOFError
    return reader.feed(data)
