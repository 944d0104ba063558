"""What the server writes of a command signal, a protocol error and the alert JSON of every
surface, read back by the wire's decoders: the server says nothing the contract does not hold."""

from __future__ import annotations

import dataclasses
import math

import pytest

from server.errors import TooLarge
from server.jsonview import alert_json, wire_alert
from server.live import FOR_BROWSERS
from server.models import Alert as StoredAlert
from server.models import Command as StoredCommand
from server.ratelimit import RateLimited
from server.run_commands import signal_message
from wire import (
    LIVE_TYPES,
    ErrorMessage,
    encode_value,
    read_reply,
)
from wire.signals import Alert, Command, CommandMessage, read_signal


def _stored_alert(**changes: object) -> StoredAlert:
    fields: dict[str, object] = {
        "id": 4, "fingerprint": "abc", "rule_id": 2, "rule_name": "non-finite", "run_id": "r",
        "metric": "reward/mean,grad/norm", "severity": "critical", "state": "firing", "started_step": 7,
        "fired_step": 7, "resolved_step": None, "value": math.inf, "message": "grad/norm = inf",
        "started_at": 1.7e9, "resolved_at": None, "silenced": False, "acknowledged_at": None,
        "acknowledged_by": None,
    }
    fields.update(changes)
    return StoredAlert(**fields)


def test_the_servers_alert_json_has_exactly_the_wire_alerts_fields_in_order() -> None:
    stored = _stored_alert()
    written = alert_json(stored)
    assert list(written) == [field.name for field in dataclasses.fields(Alert)]
    assert Alert.from_json(written) == wire_alert(stored)
    assert written["value"] == "inf" and written["keys"] == ["reward/mean", "grad/norm"]
    assert written["started_at"] == "2023-11-14T22:13:20+00:00"


def test_a_command_signal_is_the_wire_command_message() -> None:
    stored = StoredCommand(
        id="c1", run_id="r", action="stop", payload={"why": "kl"}, state="pending", requested_by="ops",
        created_at=1.5, delivered_at=None, finished_at=None, message="", answered_by=None,
    )
    assert signal_message(stored) == CommandMessage("r", Command("c1", "stop", {"why": "kl"}, "ops", 1.5))
    assert read_signal(signal_message(stored).to_json()) == signal_message(stored)


def test_the_hub_sends_browsers_the_live_types_of_the_wire() -> None:
    assert FOR_BROWSERS == frozenset(LIVE_TYPES)


def test_the_servers_protocol_errors_are_wire_error_messages() -> None:
    assert read_reply(TooLarge("too many keys").to_message()) == ErrorMessage("too_large", "too many keys")
    limited = read_reply(RateLimited(1.25).to_message())
    assert limited == ErrorMessage("rate_limited", "rate limit exceeded; retry in 1.2 s", 1.25)


def test_the_alerts_api_declares_the_wire_alert() -> None:
    """GET /alerts and the ack answer with AlertOut: exactly the wire Alert's fields, in its
    order, so the OpenAPI schema, the JSON and the decoders describe one thing."""
    from server.routes.alerts import AlertOut

    assert list(AlertOut.model_fields) == [field.name for field in dataclasses.fields(Alert)]
    written = alert_json(_stored_alert(value=math.nan))
    assert AlertOut.model_validate(written).model_dump(mode="json") == written


def _stored_command(**changes: object) -> StoredCommand:
    fields: dict[str, object] = {
        "id": "c1", "run_id": "r", "action": "stop", "payload": {"why": "kl", "at": [1, 2.5]}, "state": "acked",
        "requested_by": "ops", "created_at": 1.5, "delivered_at": 2.0, "finished_at": 2.25,
        "message": "saved step-40.pt", "answered_by": "w1",
    }
    fields.update(changes)
    return StoredCommand(**fields)


def test_the_commands_api_declares_and_writes_the_wire_command() -> None:
    """GET/POST /runs/{id}/commands answer with CommandOut: exactly wire.api.ApiCommand's
    fields in order, and what the server writes decodes to the same command and back."""
    from server.routes.run_commands import CommandOut
    from server.run_commands import command_json
    from wire.api import ApiCommand

    assert list(CommandOut.model_fields) == [field.name for field in dataclasses.fields(ApiCommand)]
    for stored in (_stored_command(), _stored_command(state="pending", delivered_at=None, finished_at=None, answered_by=None, message="")):
        written = command_json(stored)
        decoded = ApiCommand.from_json(written)
        assert decoded.to_json() == written
        assert CommandOut.model_validate(written).model_dump(mode="json") == written
        assert (decoded.id, decoded.state, decoded.payload, decoded.finished_at) == (stored.id, stored.state, stored.payload, stored.finished_at)


def test_the_runs_api_declares_the_wire_run() -> None:
    """RunOut is wire.api.ApiRun's every-answer fields in order; the list adds the hazard's
    two, the detail the config and acked seq: the same names, in ApiRun's order."""
    from server.schemas import ListedRun, RunDetail, RunOut
    from wire.api import RUN_EXTRAS, ApiRun

    names = [field.name for field in dataclasses.fields(ApiRun)]
    base = names[: -len(RUN_EXTRAS)]
    assert list(RunOut.model_fields) == base
    assert list(ListedRun.model_fields) == base + ["hazard", "collapsed_at"]
    assert list(RunDetail.model_fields) == base + ["config", "acked_seq"]


def test_a_run_the_server_writes_decodes_to_the_wire_run_and_back() -> None:
    from server.models import Run as StoredRun
    from server.schemas import LatestPoint, ListedRun, RunDetail
    from wire.api import ApiRun

    stored = StoredRun(
        id="r", name="ppo-s0", project="p", group="ppo", config={"lr": 1e-3, "nested": {"a": [1, "x"]}},
        tags=["ab"], status="running", acked_seq=41, last_step=40, started_at=1.7e9, last_seen_at=1.7e9 + 60,
        finished_at=None, owner=None, unsent=None, actions={"rollback": "rolls back to the weights before the rise"},
    )  # fmt: skip
    detail = RunDetail.from_run(stored, now=1.7e9 + 61, silent_after_s=30).model_dump(mode="json")
    decoded = ApiRun.from_json(detail)
    assert (decoded.status, decoded.config, decoded.acked_seq, decoded.actions) == ("running", stored.config, 41, stored.actions)
    assert decoded.to_json() == {key: value for key, value in detail.items() if value is not None or key not in ("hazard", "collapsed_at", "config", "acked_seq")}
    listed = ListedRun.from_run(stored, now=1.7e9 + 200, silent_after_s=30)
    listed.latest = {"reward/mean": LatestPoint(step=40, value="nan")}
    listed.hazard = 0.25
    written = listed.model_dump(mode="json", exclude_unset=True)
    decoded = ApiRun.from_json(written)
    assert decoded.status == "silent" and decoded.hazard == 0.25 and math.isnan(decoded.latest["reward/mean"].value)  # type: ignore[index]
    assert decoded.to_json() == {**written, "latest": {"reward/mean": {"step": 40, "value": "nan"}}}


@pytest.mark.parametrize(
    ("change", "field"),
    [({"status": "paused"}, "run.status"), ({"tags": "ab"}, "run.tags"), ({"last_step": "4"}, "run.last_step"),
     ({"latest": {"k": {"step": 1, "value": "lots"}}}, "run.latest"), ({"actions": {"stop": 3}}, "run.actions"),
     ({"id": None}, "run.id")],
)  # fmt: skip
def test_a_malformed_run_is_a_protocol_error_naming_the_field(change: dict[str, object], field: str) -> None:
    from wire import ProtocolError
    from wire.api import ApiRun

    good = {
        "id": "r", "name": "n", "project": "p", "group": None, "status": "finished", "last_step": 3,
        "started_at": "2026-01-01T00:00:00+00:00", "last_seen_at": "2026-01-01T00:00:00+00:00",
        "finished_at": None, "tags": [], "unsent": None, "actions": None, "latest": None,
    }  # fmt: skip
    assert ApiRun.from_json(good).to_json() == good
    with pytest.raises(ProtocolError, match=field.replace(".", r"\.")):
        ApiRun.from_json({**good, **change})


def test_the_latest_points_api_declares_the_wire_latest_point() -> None:
    """GET /runs/{id}/latest (and each run's `latest` in GET /runs) answers with LatestPoint:
    exactly wire.api.LatestPoint's fields, in its order; what it writes decodes and back."""
    from server.schemas import LatestPoint
    from wire.api import LatestPoint as WireLatestPoint

    assert list(LatestPoint.model_fields) == [field.name for field in dataclasses.fields(WireLatestPoint)]
    for value in (0.5, math.nan, -math.inf):
        written = LatestPoint(step=40, value=encode_value(value)).model_dump(mode="json")
        decoded = WireLatestPoint.from_json(written)
        assert decoded.step == 40 and decoded.to_json() == written
    assert written == {"step": 40, "value": "-inf"}
