"""Rate limits (server/ratelimit.py): token buckets per token, or per client address with
auth off. REST writes over the limit get 429 + Retry-After; ingest frames over it are
paced, and a flood that pacing cannot absorb is closed with 1013 and `retry_after_s`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from server.ratelimit import RateLimiter, TokenBucket
from tests.support.raw_client import hello, new_run, open_ingest, points, recv


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=5.0, now=clock())
    assert [bucket.reserve(1, clock(), max_wait_s=0).granted for _ in range(6)] == [True] * 5 + [False]
    refused = bucket.reserve(1, clock(), max_wait_s=0)
    assert refused.wait_s == pytest.approx(0.1)  # one token at 10/s
    clock.now += 0.25
    assert [bucket.reserve(1, clock(), max_wait_s=0).granted for _ in range(3)] == [True, True, False]
    # Waiting is granted up to max_wait_s: the caller sleeps, the tokens are spent now.
    paced = bucket.reserve(3, clock(), max_wait_s=1.0)
    assert paced.granted and paced.wait_s == pytest.approx(0.3 - 0.05)
    # In debt now: the next caller waits for the debt too (0.75 s), more than it may.
    assert not bucket.reserve(5, clock(), max_wait_s=0.5).granted


def test_a_cost_above_the_burst_drains_a_full_bucket_instead_of_never_passing() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=5.0, now=clock())
    assert bucket.reserve(50, clock(), max_wait_s=0).granted
    assert not bucket.reserve(1, clock(), max_wait_s=0).granted


def test_limiter_keys_are_independent_and_bounded() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=1.0, clock=clock, max_keys=3)
    assert limiter.reserve("a", 1).granted and not limiter.reserve("a", 1).granted
    assert limiter.reserve("b", 1).granted
    for key in "cdefg":
        limiter.reserve(key, 1)
    assert len(limiter) <= 3
    assert RateLimiter(rate=0, burst=0, clock=clock).reserve("x", 1e9).granted  # 0 turns it off


def _client(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def test_a_rest_write_flood_gets_429_and_another_client_still_gets_through(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, write_requests_per_s=5.0, write_requests_burst=10)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}/points"
    body = {"rows": [{"step": 0, "values": {"a": 1.0}}]}
    with _client("127.0.0.2") as flood:
        statuses = [flood.post(url, json=body) for _ in range(40)]
    assert [r.status_code for r in statuses[:10]] == [200] * 10  # the burst
    limited = [r for r in statuses if r.status_code == 429]
    assert len(limited) >= 20
    assert all(1 <= int(r.headers["Retry-After"]) <= 2 for r in limited)
    assert "rate limit" in limited[0].json()["detail"]
    with _client("127.0.0.1") as trainer:
        assert trainer.post(url, json=body).status_code == 200
        assert trainer.get(f"{server.url}/api/v1/runs").status_code == 200  # reads are not limited
    with _client("127.0.0.2") as flood:
        assert flood.get(f"{server.url}/api/v1/runs").status_code == 200
        time.sleep(int(limited[-1].headers["Retry-After"]))
        assert flood.post(url, json=body).status_code == 200  # after Retry-After, it may write again


def test_rest_writes_are_limited_per_token(server_factory, sqlite_url: str) -> None:
    admin = "keel_test_admin_token_0123456789abcdef"
    server = server_factory(sqlite_url, auth=True, bootstrap_token=admin, write_requests_per_s=1.0, write_requests_burst=3)
    silence = {"matchers": {"run_name": "x"}, "duration_s": 5}
    headers = {"Authorization": f"Bearer {admin}"}
    codes = [httpx.post(f"{server.url}/api/v1/silences", json=silence, headers=headers).status_code for _ in range(5)]
    assert codes == [201, 201, 201, 429, 429]
    # Another token (here: none at all, so refused by auth, not by the limiter) has its own bucket.
    assert httpx.post(f"{server.url}/api/v1/silences", json=silence).status_code == 401


def test_rest_write_bodies_are_charged_by_the_bytes_read_chunked_too(server_factory, sqlite_url: str) -> None:
    """A chunked body has no Content-Length: it is charged as it is read, so the byte rate
    holds it as it holds one with a length (five chunked posts of points all passed where
    the third should have been refused)."""
    rows = [{"step": step, "values": {"loss": 0.5}} for step in range(2500)]
    body = json.dumps({"rows": rows}).encode()
    server = server_factory(sqlite_url, ingest_bytes_per_s=1.0, ingest_bytes_burst=int(2.5 * len(body)))
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}/points"

    def chunked() -> Iterator[bytes]:
        for start in range(0, len(body), 16 * 1024):
            yield body[start : start + 16 * 1024]

    with _client("127.0.0.2") as streamer:
        responses = [streamer.post(url, content=chunked()) for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 429, 429, 429], [r.text[:80] for r in responses]
    refused = responses[-1]
    assert "rate limit" in refused.json()["detail"] and int(refused.headers["Retry-After"]) >= 1
    with _client("127.0.0.3") as sender:  # with a Content-Length: charged whole, before it is read
        codes = [sender.post(url, content=body).status_code for _ in range(5)]
    assert codes == [200, 200, 429, 429, 429], codes


def _ingest_from(server, address: str):  # type: ignore[no-untyped-def]
    import socket

    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), source_address=(address, 0))
    return connect(f"{server.ws_url}/api/v1/ingest", sock=sock, max_size=None, open_timeout=10)


def test_an_ingest_flood_is_held_to_the_rate_and_closed_with_1013(server_factory, sqlite_url: str) -> None:
    # The outside tester's flood: many connections writing as fast as they can, one identity.
    frame_rows = [{"step": s, "values": {"m": 0.5}} for s in range(100)]
    frame_bytes = len(points(0, frame_rows))
    server = server_factory(
        sqlite_url, ingest_bytes_per_s=4 * frame_bytes, ingest_bytes_burst=8 * frame_bytes, ingest_max_pacing_s=0.5
    )
    floods = [_ingest_from(server, "127.0.0.2") for _ in range(4)]
    start = time.monotonic()
    for ws in floods:
        hello(ws, new_run())
    for ws in floods:
        for seq in range(20):
            ws.send(points(seq, frame_rows))
    acked, errors = 0, []
    for ws in floods:
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = json.loads(ws.recv(timeout=15))
                if message["type"] == "ack":
                    acked += 1
                    if message["seq"] == 19:
                        ws.close()
                else:
                    errors.append(message)
        assert closed.value.rcvd is not None and closed.value.rcvd.code in (1000, 1013)
    elapsed = time.monotonic() - start
    assert errors and all(e["code"] == "rate_limited" and e["retry_after_s"] > 0 for e in errors)
    assert acked <= 8 + 4 * elapsed + 2  # the burst, then the rate: whatever the number of sockets
    # A trainer from elsewhere, at its own pace, is not slowed by the flood's bucket.
    with open_ingest(server) as ws:
        hello(ws, new_run())
        start = time.monotonic()
        for seq in range(4):
            ws.send(points(seq, frame_rows))
            assert recv(ws) == {"type": "ack", "seq": seq}
        assert time.monotonic() - start < 2


def test_ingest_slightly_over_the_rate_is_paced_not_refused(server_factory, sqlite_url: str) -> None:
    frame_rows = [{"step": s, "values": {"m": 0.5}} for s in range(100)]
    frame_bytes = len(points(0, frame_rows))
    server = server_factory(
        sqlite_url, ingest_bytes_per_s=10 * frame_bytes, ingest_bytes_burst=2 * frame_bytes, ingest_max_pacing_s=5.0
    )
    with open_ingest(server) as ws:
        hello(ws, new_run())
        start = time.monotonic()
        for seq in range(12):
            ws.send(points(seq, frame_rows))
        assert [recv(ws)["seq"] for _ in range(12)] == list(range(12))
        took = time.monotonic() - start
    assert 0.8 < took < 5  # 10 frames beyond the burst at 10 frames/s: about a second


def test_peek_says_what_reserve_would_and_spends_nothing() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=2.0, clock=clock)
    assert limiter.peek("a", 1).granted and len(limiter) == 0  # an unknown key: a full bucket, not stored
    assert limiter.reserve("a", 1).granted and limiter.reserve("a", 1).granted
    for _ in range(3):
        refused = limiter.peek("a", 1)
        assert not refused.granted and refused.wait_s == pytest.approx(1.0)
    clock.now += 1.0
    assert limiter.peek("a", 1).granted and limiter.reserve("a", 1).granted
    assert RateLimiter(rate=0, burst=0, clock=clock).peek("a", 1e9).granted  # off
