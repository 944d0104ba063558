"""bench/support.py: the one percentile every benchmark reports and the one `keel serve`
they all start."""

from __future__ import annotations

import http.client
import random
import time
from pathlib import Path

import numpy as np
import pytest

from bench.support import keel_server, percentile


def test_percentile_takes_a_percentage_and_returns_the_nearest_sample() -> None:
    samples = [float(k) for k in range(101)]  # sample k is k: the percentile is its rank
    random.Random(0).shuffle(samples)
    assert [percentile(samples, q) for q in (0, 50, 90, 95, 99, 100)] == [0, 50, 90, 95, 99, 100]
    # 11 samples: rank q/100 * 10, a half rounded to the even rank, never interpolated.
    eleven = [float(k) for k in range(11)]
    assert (
        percentile(eleven, 95) == 10 and percentile(eleven, 85) == 8 and percentile(eleven, 33) == 3
    )


def test_percentile_is_numpys_nearest_method() -> None:
    rng = random.Random(1)
    for _ in range(500):
        samples = [rng.expovariate(1.0) for _ in range(rng.randint(1, 300))]
        q = rng.choice([50, 90, 95, 99, rng.uniform(0, 100)])
        assert percentile(samples, q) == np.percentile(samples, q, method="nearest")


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_refuses_a_q_outside_0_to_100(q: float) -> None:
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0, 2.0], q)


def test_percentile_of_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)


def _status(url: str, path: str) -> int:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def test_keel_server_is_ready_when_entered_and_gone_after(sqlite_url: str, tmp_path: Path) -> None:
    with keel_server(sqlite_url, log=tmp_path / "server.log") as server:
        assert _status(server.url, "/readyz") == 200
        assert server.ws_url == server.url.replace("http://", "ws://")
        assert Path(f"/proc/{server.pid}").exists()
    assert not Path(f"/proc/{server.pid}").exists()
    with pytest.raises(OSError):
        _status(server.url, "/healthz")


def test_keel_server_gives_up_as_soon_as_the_server_exits(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    started = time.monotonic()
    with (
        pytest.raises(RuntimeError, match="did not start; see .*server.log"),
        keel_server("bogus://x", log=log),
    ):
        pass
    assert time.monotonic() - started < 30  # not the 60 s start timeout
    assert "unsupported database 'bogus'" in log.read_text()
