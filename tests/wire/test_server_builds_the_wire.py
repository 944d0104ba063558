"""What the server writes of a command signal, a protocol error and the alert JSON of every
surface, read back by the wire's decoders: the server says nothing the contract does not hold."""

from __future__ import annotations

import dataclasses
import math

from server.errors import TooLarge
from server.jsonview import alert_json, wire_alert
from server.models import Alert as StoredAlert
from server.models import Command as StoredCommand
from server.ratelimit import RateLimited
from server.run_commands import signal_message
from wire import ErrorMessage, read_reply
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
    assert read_signal(signal_message(stored)) == CommandMessage("r", Command("c1", "stop", {"why": "kl"}, "ops", 1.5))


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
