"""The trainer -> worker pipe: framing, the tensors of a batch, and a Feed that never blocks."""

from __future__ import annotations

import os
import threading
import time
import typing

import pytest
import torch

from trainer_hooks import channel
from trainer_hooks.capture import HostCopy, ship_inputs
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
    Start,
    WorkerStart,
    encode,
)  # fmt: skip
from trainer_hooks.link import Feed, Pending
from trainer_hooks.metrics import BatchInputs
from trainer_hooks.sender import SenderConfig
from trainer_hooks.worker import _inputs
from wire.signals import Command, CommandMessage, HazardMessage


def _messages(reader: Reader, data: bytes, cut: int) -> list[tuple[object, bytes]]:
    """Feed `data` in pieces of `cut` bytes, as read(2) may return it."""
    out = []
    for start in range(0, len(data), cut):
        out += [(header, bytes(body)) for header, body in reader.feed(data[start : start + cut])]
    return out


EVERY_MESSAGE = [
    Start(WorkerStart("/tmp/spool", "http://127.0.0.1:1", "tok", SenderConfig(window=3), 5.0, listen=("alerts",), actions={"stop": "stops"})),
    Log(0, 1.5, {"a": 1.0, "nan": float("inf")}),
    Batch(1, 2.5, {}, [("mask", None), ("learner_version", 3), ("rewards", ("float32", (4,), 16))]),
    Packed(2, 3.5, {"b": 2.0}, ((("sums", 3),), 3, ())),
    Decoder(b"\x80\x05blob", ("/src",)),
    Listen(("alerts", "commands"), None),
    Answer("c1", False, "no checkpoint"),
    Finish("killed", 9.0),
    Ready(),
    Drop("error", 2, "log(3) dropped"),
    LogLine(30, "spool full"),
    Relay(HazardMessage("r1", 40, 0.25)),
    Relay(CommandMessage("r1", Command("c2", "rollback", {"to": 12}, "rule mismatch drift", 1.0))),
    Done(delivered=True, rejected=False, unacked=0),
]


def test_every_pipe_message_is_frozen_and_arrives_equal_to_what_was_sent() -> None:
    """Each message of both directions (the Inbox and Reply unions, all of them: a message
    added to a union and not here fails), through the one encoder and the one reader."""
    kinds = {*typing.get_args(channel.Inbox), *typing.get_args(channel.Reply)}
    assert {type(m) for m in EVERY_MESSAGE} == kinds
    for message in EVERY_MESSAGE:
        assert type(message).__dataclass_params__.frozen, type(message).__name__  # type: ignore[attr-defined]
    data = b"".join(b"".join(encode(message)) for message in EVERY_MESSAGE)
    assert [header for header, _ in _messages(Reader(), data, 5)] == EVERY_MESSAGE


@pytest.mark.parametrize("cut", [1, 7, 64, 1 << 20])
def test_messages_survive_any_split_of_the_stream(cut: int) -> None:
    sent = [
        (Log(0, 1.5, {"a": 1.0}), b""),
        (Batch(1, 2.5, {}, [("mask", None)]), b"\x00\x01" * 300),
        (Finish("killed", 9.0), b""),
    ]
    data = b"".join(b"".join(encode(header, [body] if body else [])) for header, body in sent)
    assert _messages(Reader(), data, cut) == sent


def test_a_batch_arrives_with_its_exact_tensors() -> None:
    """Every dtype (bf16 has no numpy twin), 0-dim and non-contiguous tensors, ints, None."""
    learner = torch.randn(5, 3).t()  # non-contiguous [3, 5]
    inputs = BatchInputs(
        sampler_logprobs=torch.randn(3, 5, dtype=torch.float64),
        learner_logprobs=learner,
        mask=torch.rand(3, 5) > 0.3,
        rewards=torch.randn(3, dtype=torch.bfloat16),
        sampler_version=torch.tensor([1, 2, 3]),
        learner_version=torch.tensor(4),
    )
    shipped = ship_inputs(torch, inputs)
    assert shipped.copies == []  # CPU: nothing to wait for
    body = b"".join(shipped.buffers)
    received = _inputs(shipped.fields, memoryview(body))
    for name, value in inputs.arguments().items():
        got = getattr(received, name)
        if value is None:
            assert got is None, name
        else:
            assert got.dtype == value.dtype and torch.equal(got, value), name
    with_int = ship_inputs(torch, BatchInputs(learner, learner, None, learner_version=7))
    assert dict(with_int.fields)["learner_version"] == 7


def _reader_thread(fd: int, into: bytearray, delay: float) -> threading.Thread:
    def read() -> None:
        time.sleep(delay)  # a worker still starting
        while chunk := os.read(fd, 65536):
            into.extend(chunk)

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def test_a_full_pipe_never_blocks_the_caller_and_keeps_the_order() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    received = bytearray()
    reader = _reader_thread(read_fd, received, delay=0.5)
    feed = Feed(linger=0.01, max_messages=10_000, max_bytes=1 << 30, on_error=print)
    feed.connect(write_fd, encode(Start(None)))  # type: ignore[arg-type]
    payload = bytes(range(256)) * 64  # 16 KiB a message: the 64 KiB pipe fills at once
    started = time.monotonic()
    for step in range(200):
        assert feed.put(encode(Log(step, 0.0, {}), [payload]))
    assert time.monotonic() - started < 0.4  # never waited for the reader
    assert feed.flush(30)
    feed.close()
    reader.join(30)
    os.close(read_fd)
    messages = list(Reader().feed(bytes(received)))
    assert [header for header, _ in messages][0] == Start(None)  # type: ignore[arg-type]
    assert [header.step for header, _ in messages[1:]] == list(range(200))
    assert all(bytes(body) == payload for _, body in messages[1:])


class _Copy(HostCopy):
    """A device copy that lands when the test says so."""

    landed = False

    def ready(self) -> bool:
        return self.landed


def test_a_pending_copy_holds_back_later_messages_until_it_lands() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    feed = Feed(linger=60.0, max_messages=100, max_bytes=1 << 20, on_error=print)
    feed.connect(write_fd, [])
    copy = _Copy(torch.zeros(()))
    assert feed.put_pending(Pending([copy], lambda: encode(Log(0, 0.0, {})), 0))
    assert feed.put(encode(Log(1, 0.0, {})))
    assert feed.queued == 2  # step 1 waits behind step 0
    copy.landed = True
    assert feed.put(encode(Log(2, 0.0, {})))  # a later call forwards what landed
    assert feed.idle
    os.set_blocking(read_fd, False)
    steps = [header.step for header, _ in Reader().feed(os.read(read_fd, 65536))]
    assert steps == [0, 1, 2]
    feed.close()
    os.close(read_fd)


def test_the_queue_is_bounded_and_says_so() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    feed = Feed(linger=60.0, max_messages=3, max_bytes=1 << 30, on_error=print)
    feed.connect(write_fd, [])
    copy = _Copy(torch.zeros(()))
    assert feed.put_pending(Pending([copy], lambda: encode(Log(0, 0.0, {})), 0))
    assert [feed.put(encode(Log(step, 0.0, {}))) for step in range(1, 5)] == [
        True,
        True,
        False,
        False,
    ]
    assert feed.put(encode(Finish("finished", 0.0)), always=True)
    feed.close()
    os.close(read_fd)
