"""The live pushes (server -> browser on /api/v1/live) are the JSON docs/protocol.md's "Live"
section shows, survive their encoder, JSON text and their decoder (non-finite values as the
wire writes them), and each decoder refuses a malformed push with a ProtocolError that says
what is wrong."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from wire import (
    LIVE_TYPES,
    Histogram,
    Limits,
    LivePoints,
    LiveStatus,
    ProtocolError,
    Row,
    encode_rows,
    read_live,
)
from wire.signals import Alert, AlertMessage, HazardMessage

DOC = re.sub(r"\s+", " ", (Path(__file__).parents[2] / "docs" / "protocol.md").read_text())
"""docs/protocol.md with its line breaks and indentation as single spaces."""

ROWS = [Row(12, 1764400000.25, {"reward/mean": 0.5, "grad/norm": math.inf}), Row(13, None, {"kl": -2.0})]
ALERT = Alert(7, "r", "m high", "m", "critical", "firing", 20, None, "m = 5", value=-math.inf)


def _through_text(message: dict[str, Any]) -> Any:
    """What the browser decodes: the message as JSON text, read back."""
    return json.loads(json.dumps(message))


# -- the contract --------------------------------------------------------------------


def test_a_points_push_is_the_json_the_protocol_document_shows() -> None:
    snippet = '{"type": "points", "run_id": ..., "rows": [...]}'
    assert snippet in DOC, f"docs/protocol.md no longer shows the live points push as {snippet}"
    rows = json.dumps(encode_rows(ROWS, details=False))
    expected = snippet.replace('"run_id": ...', '"run_id": "r"').replace("[...]", rows)
    assert json.dumps(LivePoints("r", ROWS).to_json()) == expected
    assert rows == (
        '[{"step": 12, "time": 1764400000.25, "values": {"reward/mean": 0.5, "grad/norm": "inf"}}, '
        '{"step": 13, "values": {"kl": -2.0}}]'
    )


def test_a_status_push_is_the_json_the_protocol_document_shows() -> None:
    snippet = '{"type": "status", "run_id": ..., "status": ...}'
    assert snippet in DOC, f"docs/protocol.md no longer shows the live status push as {snippet}"
    expected = snippet.replace('"run_id": ...', '"run_id": "r"').replace('"status": ...', '"status": "failed"')
    assert json.dumps(LiveStatus("r", "failed").to_json()) == expected


def test_the_live_socket_pushes_the_three_types_the_document_names() -> None:
    assert LIVE_TYPES == ("points", "alert", "status")
    for kind in LIVE_TYPES:
        assert f'{{"type": "{kind}",' in DOC
    assert AlertMessage("r", ALERT).to_json()["type"] == "alert"


def test_a_points_push_leaves_the_rows_step_details_out() -> None:
    detailed = Row(3, None, {"a": 1.0}, histograms={"h": Histogram([0.0, 1.0], [4])}, samples=[{"reward": 1.0}])
    assert LivePoints("r", [detailed]).to_json() == {"type": "points", "run_id": "r", "rows": [{"step": 3, "values": {"a": 1.0}}]}
    assert LivePoints.from_json(_through_text(LivePoints("r", [detailed]).to_json())) == LivePoints("r", [Row(3, None, {"a": 1.0})])


# -- round trips -----------------------------------------------------------------------


MESSAGES: list[Any] = [
    LivePoints("r", []),
    LivePoints("run-1", ROWS),
    LiveStatus("run-1", "finished"),
    LiveStatus("run-1", "killed"),
    AlertMessage("r", ALERT),
]


@pytest.mark.parametrize("message", MESSAGES, ids=[f"{type(m).__name__}-{i}" for i, m in enumerate(MESSAGES)])
def test_each_live_push_round_trips(message: Any) -> None:
    received = _through_text(message.to_json())
    assert type(message).from_json(received) == message
    assert read_live(received) == message


def test_non_finite_values_survive_a_points_push_as_the_wire_writes_them() -> None:
    rows = [Row(0, None, {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "big": 1e308, "zero": -0.0})]
    encoded = LivePoints("r", rows).to_json()
    assert encoded["rows"][0]["values"] == {"nan": "nan", "inf": "inf", "-inf": "-inf", "big": 1e308, "zero": -0.0}
    decoded = LivePoints.from_json(_through_text(encoded))
    values = decoded.rows[0].values
    assert math.isnan(values["nan"])
    assert values["inf"] == math.inf and values["-inf"] == -math.inf and values["big"] == 1e308
    assert values["zero"] == 0.0 and math.copysign(1.0, values["zero"]) == -1.0
    alert = read_live(_through_text(AlertMessage("r", ALERT).to_json()))
    assert isinstance(alert, AlertMessage) and alert.alert.value == -math.inf


def test_the_live_reader_leaves_other_messages_alone() -> None:
    assert read_live({"type": "something_newer", "run_id": "r"}) is None
    assert read_live(HazardMessage("r", 1, 0.5).to_json()) is None  # a trainer's signal, not a push


def test_fields_a_newer_server_adds_are_ignored() -> None:
    assert LiveStatus.from_json({"type": "status", "run_id": "r", "status": "finished", "at": 1.5}) == LiveStatus("r", "finished")
    assert LivePoints.from_json({"type": "points", "run_id": "r", "rows": [], "later": True}) == LivePoints("r", [])


# -- malformed pushes ------------------------------------------------------------------


MALFORMED: list[tuple[Callable[[Any], Any], Any, str]] = [
    (read_live, ["points"], "live message must be a JSON object with a string 'type'"),
    (read_live, {"run_id": "r", "status": "finished"}, "live message must be a JSON object with a string 'type'"),
    (LivePoints.from_json, "points", "a points message must be a JSON object, not str"),
    (LivePoints.from_json, {"type": "status", "run_id": "r", "status": "x"}, "not a points message"),
    (read_live, {"type": "points", "rows": []}, r"points\.run_id must be a string \(it is missing\)"),
    (read_live, {"type": "points", "run_id": 3, "rows": []}, r"points\.run_id must be a string"),
    (read_live, {"type": "points", "run_id": "r"}, "live points: rows must be a list"),
    (read_live, {"type": "points", "run_id": "r", "rows": [{"step": -1, "values": {}}]}, r"live points: rows\[0\]\.step must be an integer"),
    (read_live, {"type": "points", "run_id": "r", "rows": [{"step": 1, "values": {"a": "high"}}]}, r"rows\[0\]\.values\['a'\]: metric value 'high'"),
    (read_live, {"type": "points", "run_id": "r", "rows": [{"step": 1, "values": {"a": True}}]}, "not booleans"),
    (read_live, {"type": "points", "run_id": "r", "rows": [{"step": 1, "time": "now", "values": {}}]}, r"rows\[0\]\.time must be a number"),
    (LiveStatus.from_json, {"type": "points", "run_id": "r"}, "not a status message"),
    (read_live, {"type": "status", "run_id": "r"}, r"status\.status must be a string \(it is missing\)"),
    (read_live, {"type": "status", "status": "finished"}, r"status\.run_id must be a string"),
    (read_live, {"type": "status", "run_id": "r", "status": 1}, r"status\.status must be a string"),
    (read_live, {"type": "alert", "run_id": "r"}, "an alert must be a JSON object, not NoneType"),
]


@pytest.mark.parametrize(("decode", "raw", "says"), MALFORMED)
def test_a_malformed_live_push_is_a_protocol_error_that_says_what_is_wrong(
    decode: Callable[[Any], Any], raw: Any, says: str
) -> None:
    with pytest.raises(ProtocolError, match=says):
        decode(raw)


def test_a_points_push_over_the_limits_is_refused_as_too_large() -> None:
    raw = LivePoints("r", [Row(step, None, {"a": 1.0}) for step in range(3)]).to_json()
    with pytest.raises(ProtocolError, match="live points: 3 rows in one frame; the limit is 2") as refused:
        LivePoints.from_json(raw, Limits(max_rows=2))
    assert refused.value.code == "too_large"
    assert LivePoints.from_json(raw, Limits(max_rows=3)).rows == [Row(step, None, {"a": 1.0}) for step in range(3)]
