"""`ConfigPush` (keel watch's config updates) against a real server: what is stored, what is
retried, what is given up, and that a request never blocks its caller."""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from keel.config_push import ConfigPush, Sent, api_url
from tests.support.raw_client import hello, new_run, open_ingest


def _outcome(push: ConfigPush, timeout: float = 30.0) -> Sent:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sent = push.result()
        if sent is not None:
            return sent
        time.sleep(0.02)
    raise AssertionError("no answer")


def test_api_url_of_every_server_url_keel_watch_takes() -> None:
    assert api_url("http://h:8750") == "http://h:8750/api/v1"
    assert api_url("https://h/keel/") == "https://h/keel/api/v1"
    assert api_url("ws://h:1/api/v1/ingest") == "http://h:1/api/v1"
    assert api_url("wss://h/p/api/v1") == "https://h/p/api/v1"
    with pytest.raises(ValueError, match="http://host:port"):
        api_url("h:8750")


def test_a_config_is_stored_an_unknown_run_retried_and_a_refused_one_given_up(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    run = new_run("pushed", config={"lr": 1, "seed": 3})
    push = ConfigPush(server.url.replace("http://", "ws://"), run["id"], backoff_initial=0.2, backoff_max=0.4)
    # Before the run's hello the server does not know it: a 404, retried after the backoff.
    assert push.send({"lr": 2}) and push.busy
    assert not push.send({"lr": 3})  # one request at a time
    missed = _outcome(push)
    assert missed.config == {"lr": 2} and missed.error is not None and "HTTP 404" in missed.error and not missed.final
    assert not push.busy and not push.send({"lr": 2})  # the retry is not due yet
    with open_ingest(server) as ws:
        assert hello(ws, run)["type"] == "welcome"
    time.sleep(0.25)
    assert push.send({"lr": 2, "late": [1, 2]})
    assert _outcome(push) == Sent({"lr": 2, "late": [1, 2]}, None)
    url = f"{server.url}/api/v1/runs/{run['id']}"
    assert httpx.get(url).json()["config"] == {"lr": 2, "seed": 3, "late": [1, 2]}
    # Refusals that sending again cannot change are final, and come back at once (no backoff).
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(40):
        deep = {"k": deep}
    assert push.send({"deep": deep})
    refused = _outcome(push)
    assert refused.final and refused.error is not None and "HTTP 422" in refused.error and "32 levels" in refused.error
    assert push.send({"lr": math.nan})
    not_json = _outcome(push)
    assert not_json.final and not_json.error is not None and "JSON" in not_json.error
    assert httpx.get(url).json()["config"] == {"lr": 2, "seed": 3, "late": [1, 2]}


def test_a_silent_server_never_blocks_the_caller() -> None:
    """A server that accepts the connection and never answers: `send` and `result` return at
    once; the request ends with its timeout, as an error to retry."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    try:
        push = ConfigPush(f"http://127.0.0.1:{listener.getsockname()[1]}", "r", timeout=1.0)
        started = time.monotonic()
        assert push.send({"a": 1})
        assert push.result() is None and push.busy
        assert time.monotonic() - started < 0.5
        sent = _outcome(push, 10)
        assert sent.error is not None and not sent.final
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
