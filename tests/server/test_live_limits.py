"""Live subscribers are bounded in bytes: a page that stops reading is dropped with close
1013 once its queue passes `live_buffer_bytes`, and all queues together stay under
`live_total_buffer_bytes` (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from server.live import LiveHub
from tests.support.raw_client import new_run, points
from tests.support.server import ServerProcess, keel_serve

STATUS = {"type": "status", "run_id": "r", "status": "x" * 90}
STATUS_BYTES = len(orjson.dumps(STATUS))


def test_subscriber_is_dropped_once_its_queue_passes_its_byte_budget() -> None:
    async def scenario() -> None:
        hub = LiveHub(buffer_bytes=10 * STATUS_BYTES, total_buffer_bytes=1_000 * STATUS_BYTES)
        slow = hub.subscribe(None)
        for _ in range(10):
            hub.publish("r", STATUS)
        assert not slow.dropped and slow.queued_bytes == 10 * STATUS_BYTES
        assert hub.buffered_bytes == 10 * STATUS_BYTES
        assert orjson.loads(await slow.get() or "") == STATUS  # reading frees budget...
        assert slow.queued_bytes == 9 * STATUS_BYTES
        hub.publish("r", STATUS)
        hub.publish("r", STATUS)  # ...and the eleventh message queued is one too many
        assert slow.dropped and slow.queued_bytes == 0 and hub.buffered_bytes == 0
        assert await slow.get() is None
        assert hub.subscriber_count == 0

    asyncio.run(scenario())


def test_the_total_cap_drops_the_subscriber_furthest_behind() -> None:
    async def scenario() -> None:
        hub = LiveHub(buffer_bytes=100 * STATUS_BYTES, total_buffer_bytes=15 * STATUS_BYTES)
        behind, current = hub.subscribe(frozenset({"a"})), hub.subscribe(frozenset({"b"}))
        for _ in range(10):
            hub.publish("a", STATUS)
        for _ in range(5):
            hub.publish("b", STATUS)
        assert not behind.dropped and hub.buffered_bytes == 15 * STATUS_BYTES
        hub.publish("b", STATUS)
        assert behind.dropped and not current.dropped
        assert current.queued_bytes == 6 * STATUS_BYTES == hub.buffered_bytes

    asyncio.run(scenario())


def test_a_message_is_encoded_once_for_all_subscribers() -> None:
    async def scenario() -> None:
        hub = LiveHub(buffer_bytes=10_000, total_buffer_bytes=100_000)
        subscribers = [hub.subscribe(None) for _ in range(3)]
        hub.publish("r", STATUS)
        texts = [await s.get() for s in subscribers]
        assert texts[0] is texts[1] is texts[2]
        assert hub.buffered_bytes == 0

    asyncio.run(scenario())


# -- a real server process that a never-reading page must not grow --------------------

BUFFER_BYTES = 2 * 1024 * 1024
ROWS_PER_FRAME = 1_000


def _rss(pid: int) -> int:
    psutil = pytest.importorskip("psutil")
    return int(psutil.Process(pid).memory_info().rss)


def _ingest(ws: Any, first_seq: int, frames: int) -> None:
    """`frames` frames of 1000 one-key rows (a lot of live message per stored point), 10 in flight."""
    for start in range(first_seq, first_seq + frames, 10):
        batch = range(start, min(start + 10, first_seq + frames))
        for seq in batch:
            rows = [{"step": seq * ROWS_PER_FRAME + i, "values": {"m": i / 7}} for i in range(ROWS_PER_FRAME)]
            ws.send(points(seq, rows))
        for seq in batch:
            assert json.loads(ws.recv(timeout=60)) == {"type": "ack", "seq": seq}


def _never_reading(url: str) -> Any:
    """A live socket with a small receive buffer that is never read: the server's
    queue is what has to hold everything that follows."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])))
    return connect(url, sock=sock, max_size=None, max_queue=1, compression=None)


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[ServerProcess]:
    env = {
        "KEEL_LIVE_BUFFER_BYTES": str(BUFFER_BYTES),
        "KEEL_LIVE_TOTAL_BUFFER_BYTES": str(4 * BUFFER_BYTES),
    }
    database_url = f"sqlite:///{tmp_path / 'keel.db'}"
    with keel_serve(database_url, tmp_path / "serve.log", "--log-level", "warning", env=env) as server:
        yield server


def test_a_page_that_never_reads_holds_at_most_its_buffer(serve_process: ServerProcess) -> None:
    ws_url = serve_process.ws_url
    assert serve_process.process is not None
    pid = serve_process.process.pid
    run = new_run("firehose")
    live_url = f"{ws_url}/api/v1/live?runs={run['id']}"
    seen_steps: list[int] = []

    def read_promptly(live: Any) -> None:
        try:
            for text in live:
                seen_steps.extend(row["step"] for row in json.loads(text)["rows"])
        except ConnectionClosed:
            pass

    with connect(f"{ws_url}/api/v1/ingest", max_size=None) as ingest, connect(live_url, max_size=None) as prompt:
        reader = threading.Thread(target=read_promptly, args=(prompt,), daemon=True)
        reader.start()
        time.sleep(0.2)
        ingest.send(json.dumps({"type": "hello", "protocol": 1, "run": run}))
        assert json.loads(ingest.recv(timeout=30))["type"] == "welcome"
        _ingest(ingest, 0, 40)  # warm-up: the allocator has seen this traffic already
        baseline = _rss(pid)
        with _never_reading(live_url) as slow:
            time.sleep(0.2)
            # ~15 MB of live messages as text, ~130 MB as Python objects; up to ~4 MB of
            # text fit in the kernel's socket buffers, the rest is the server's to hold.
            _ingest(ingest, 40, 300)
            grown = _rss(pid) - baseline
            assert grown < 30 * 1024 * 1024, f"server memory grew by {grown / 2**20:.0f} MiB"
            # The page that never read gets what was in flight, then the reason.
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    slow.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert "fell behind" in closed.value.rcvd.reason
        deadline = time.monotonic() + 60
        while len(seen_steps) < 340 * ROWS_PER_FRAME and time.monotonic() < deadline:
            time.sleep(0.05)
        prompt.close()
        reader.join(timeout=30)
    # The page that kept up saw every point, once, in order.
    assert seen_steps == list(range(340 * ROWS_PER_FRAME))
