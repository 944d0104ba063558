"""Hostile frames on a real ingest socket (hypothesis): every one is acked, rejected or
refused with a 44xx close and a message; never a server fault (1011), and what was
acknowledged before it is still there."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series

scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=8)
values = st.dictionaries(st.text(max_size=6), scalars, max_size=4)
row = st.fixed_dictionaries({"step": scalars, "values": values | scalars}, optional={"time": scalars})
frames = st.one_of(
    st.fixed_dictionaries({"type": st.just("points"), "seq": scalars, "rows": st.lists(row, max_size=4) | scalars}),
    st.fixed_dictionaries({"type": st.sampled_from(["points", "finish", "hello", "nope"]), "status": scalars}),
    st.dictionaries(st.text(max_size=5), scalars, max_size=3),
    scalars,
)


def _encode(frame: Any) -> str:
    return json.dumps(frame, allow_nan=True)  # NaN/Infinity literals are hostile JSON too


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=frames)
def test_a_hostile_frame_never_faults_the_server_nor_loses_acked_rows(server_factory, sqlite_url, frame: Any) -> None:
    server = _server(server_factory, sqlite_url)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": {"kept": 1.5}}]))
        assert recv(ws) == {"type": "ack", "seq": 0}
        ws.send(_encode(frame))
        try:
            reply = recv(ws)
        except (ConnectionClosed, TimeoutError):
            reply = {"type": "closed"}
        if reply["type"] == "error":
            assert reply["code"] != "server_fault", reply
            try:
                ws.recv(timeout=10)
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and 4400 <= closed.rcvd.code < 4500, closed.rcvd
        else:
            assert reply["type"] in ("ack", "reject", "bye", "closed"), reply
    assert series(_server(server_factory, sqlite_url), run["id"], "kept")["values"][:1] == [1.5]


_started: dict[str, Any] = {}


def _server(server_factory, sqlite_url: str):  # type: ignore[no-untyped-def]
    """One server for all the examples of a test (hypothesis calls the test many times)."""
    key = sqlite_url
    if key not in _started:
        _started.clear()
        _started[key] = server_factory(sqlite_url)
    return _started[key]
