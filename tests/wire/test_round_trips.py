"""Every message of the ingest socket survives its encoder, JSON text and its decoder unchanged,
and each decoder refuses a malformed message with a ProtocolError that says what is wrong."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from wire import (
    ACCEPTS,
    FINISH_STATUSES,
    Ack,
    Bye,
    ErrorMessage,
    Finish,
    Hello,
    Points,
    ProtocolError,
    Reject,
    Row,
    RunInfo,
    Welcome,
    encode_rows,
    points_frame,
    read_reply,
)
from wire.signals import (
    SIGNALS,
    Alert,
    AlertMessage,
    AlertsMessage,
    Command,
    CommandMessage,
    CommandResult,
    HazardMessage,
    Listen,
    read_signal,
)

ALERT = Alert(
    id=12,
    run_id="r",
    rule="kl climbing",
    metric="mismatch/kl,grad/*",
    severity="critical",
    state="resolved",
    started_step=40,
    resolved_step=90,
    message="kl = 0.3 > 0.1",
    keys=("mismatch/kl", "grad/*"),
    rule_id=3,
    fingerprint="f" * 16,
    fired_step=45,
    value=0.3,
    started_at="2026-01-02T03:04:05+00:00",
    resolved_at="2026-01-02T03:09:05+00:00",
    silenced=True,
    acknowledged_at="2026-01-02T03:05:00+00:00",
    acknowledged_by="ops",
)
COMMAND = Command("c1", "checkpoint", {"tag": "before"}, "rule kl climbing", 1.7e9)


def _through_text(message: dict[str, Any]) -> Any:
    """What the other side decodes: the message as JSON text, read back."""
    return json.loads(json.dumps(message))


# -- the client's messages -------------------------------------------------------------


def test_a_hello_round_trips_with_its_run_writer_signals_and_actions() -> None:
    run = RunInfo("run-1", "cispo-lag8-s0", "p", "cispo", {"lr": 1e-3, "nested": {"a": [1, 2]}}, ["toy", "x"])
    for hello in (
        Hello(run, "spool-1"),
        Hello(run),  # the unnamed writer
        Hello(run, "w", frozenset(SIGNALS), {"stop": "saves a checkpoint and stops"}),
        Hello(run, "w", frozenset({"commands"}), {}),
    ):
        assert Hello.from_json(_through_text(hello.to_json())) == hello
    assert "listen" not in Hello(run).to_json() and "actions" not in Hello(run).to_json()


def test_points_round_trip_with_every_kind_of_value() -> None:
    rows = [Row(0, 1.7e9, {"a": 0.5, "b": -2.0}), Row(1, None, {"a": math.inf, "b": -math.inf})]
    assert Points.from_json(_through_text(Points(9, rows).to_json())) == Points(9, rows)
    nan = Points.from_json(_through_text(Points(10, [Row(2, None, {"a": math.nan})]).to_json()))
    assert nan.seq == 10 and math.isnan(nan.rows[0].values["a"])
    assert json.loads(points_frame(9, json.dumps(encode_rows(rows)))) == json.loads(json.dumps(Points(9, rows).to_json()))


@pytest.mark.parametrize("status", FINISH_STATUSES)
def test_a_finish_round_trips(status: str) -> None:
    assert Finish.from_json(_through_text(Finish(status).to_json())) == Finish(status)
    assert Finish.from_json(_through_text(Finish(status, last_seq=41).to_json())) == Finish(status, 41)


@pytest.mark.parametrize("actions", [None, {}, {"stop": "saves a checkpoint and stops", "rollback": "back"}])
def test_a_listen_round_trips_with_its_actions(actions: dict[str, str] | None) -> None:
    assert Listen.from_json(_through_text(Listen(frozenset(SIGNALS), actions).to_json())) == Listen(frozenset(SIGNALS), actions)
    assert Listen.from_json(_through_text(Listen().to_json())) == Listen()


@pytest.mark.parametrize("ok", [True, False])
def test_a_command_result_round_trips(ok: bool) -> None:
    result = CommandResult("c1", ok, "saved at step 3")
    assert CommandResult.from_json(_through_text(result.to_json())) == result


# -- the server's replies and signals --------------------------------------------------

MESSAGES: list[Any] = [
    Welcome("run-1", -1),
    Welcome("run-1", 41, ACCEPTS),
    Welcome("run-1", 2**63 - 1, ACCEPTS, SIGNALS),
    Ack(0),
    Ack(2**63 - 1),
    Reject(5, "malformed", "rows[0].step must be an integer in 0..2**62-1"),
    Bye(),
    ErrorMessage("seq_gap", "frame 7 after 5"),
    ErrorMessage("rate_limited", "rate limit exceeded; retry in 1.5 s", 1.5),
    AlertsMessage("r", ()),
    AlertsMessage("r", (ALERT, Alert(13, "r", "nan", "*", "warning", "firing", 3, None))),
    AlertMessage("r", ALERT),
    HazardMessage("r", 120, 0.25),
    CommandMessage("r", COMMAND),
]


@pytest.mark.parametrize("message", MESSAGES, ids=[type(m).__name__ for m in MESSAGES])
def test_each_server_message_round_trips(message: Any) -> None:
    received = _through_text(message.to_json())
    assert type(message).from_json(received) == message
    read = read_reply if received["type"] in ("welcome", "ack", "reject", "bye", "error") else read_signal
    assert read(received) == message


def test_the_alert_and_the_command_round_trip_on_their_own() -> None:
    assert Alert.from_json(_through_text(ALERT.to_json())) == ALERT
    assert Command.from_json(_through_text(COMMAND.to_json())) == COMMAND
    for value, wire_value in ((math.inf, "inf"), (-math.inf, "-inf"), (None, None)):
        alert = Alert(1, "r", "x", "m", "critical", "firing", 1, None, value=value)
        assert alert.to_json()["value"] == wire_value
        assert Alert.from_json(_through_text(alert.to_json())) == alert
    nan = Alert.from_json(Alert(1, "r", "x", "m", "critical", "firing", 1, None, value=math.nan).to_json())
    assert nan.value is not None and math.isnan(nan.value)


def test_a_reject_says_what_the_protocol_error_said() -> None:
    error = ProtocolError("11 rows in one frame; the limit is 10", code="too_large")
    assert Reject.of(4, error) == Reject(4, "too_large", "11 rows in one frame; the limit is 10")
    assert str(Reject.of(4, error)) == "too_large: 11 rows in one frame; the limit is 10"
    assert ErrorMessage.from_json(ProtocolError("no hello").to_message()) == ErrorMessage("malformed", "no hello")


def test_a_reply_reader_and_a_signal_reader_leave_each_others_messages_alone() -> None:
    assert read_reply(HazardMessage("r", 1, 0.5).to_json()) is None
    assert read_signal(Ack(1).to_json()) is None
    assert read_reply({"type": "something_newer", "x": 1}) is None


def test_fields_a_newer_server_adds_are_ignored_and_an_older_ones_absent_fields_are_none() -> None:
    assert Welcome.from_json({"type": "welcome", "run_id": "r", "acked_seq": 3, "later": True}) == Welcome("r", 3)
    assert Ack.from_json({"type": "ack", "seq": 3, "later": 1}) == Ack(3)
    minimal = Alert.from_json({"id": 1, "run_id": "r", "rule": "x", "severity": "warning", "state": "firing"})
    assert minimal == Alert(1, "r", "x", "", "warning", "firing", None, None)


MALFORMED: list[tuple[Callable[[Any], Any], Any, str]] = [
    (read_reply, ["ack", 1], "JSON object with a string 'type'"),
    (read_reply, {"seq": 1}, "JSON object with a string 'type'"),
    (Welcome.from_json, {"type": "ack", "seq": 1}, "not a welcome message"),
    (Welcome.from_json, "welcome", "must be a JSON object"),
    (Welcome.from_json, {"type": "welcome", "acked_seq": 1}, r"welcome\.run_id must be a string"),
    (Welcome.from_json, {"type": "welcome", "run_id": "r"}, r"welcome\.acked_seq must be an integer in -1\.\."),
    (Welcome.from_json, {"type": "welcome", "run_id": "r", "acked_seq": -2}, r"welcome\.acked_seq"),
    (Welcome.from_json, {"type": "welcome", "run_id": "r", "acked_seq": True}, r"welcome\.acked_seq"),
    (Welcome.from_json, {"type": "welcome", "run_id": "r", "acked_seq": 1, "accepts": "samples"}, r"welcome\.accepts must be a list of strings"),
    (Welcome.from_json, {"type": "welcome", "run_id": "r", "acked_seq": 1, "signals": [1]}, r"welcome\.signals must be a list of strings"),
    (read_reply, {"type": "ack"}, r"ack\.seq must be an integer in 0\.\."),
    (Ack.from_json, {"type": "ack", "seq": "3"}, r"ack\.seq must be an integer"),
    (Ack.from_json, {"type": "ack", "seq": 2**63}, r"ack\.seq must be an integer"),
    (read_reply, {"type": "reject", "seq": 1, "message": "x"}, r"reject\.code must be a string"),
    (Reject.from_json, {"type": "reject", "code": "malformed"}, r"reject\.seq must be an integer"),
    (Bye.from_json, {"type": "byebye"}, "not a bye message"),
    (read_reply, {"type": "error", "message": "x"}, r"error\.code must be a string"),
    (ErrorMessage.from_json, {"type": "error", "code": "x", "message": 3}, r"error\.message must be a string"),
    (ErrorMessage.from_json, {"type": "error", "code": "x", "retry_after_s": "soon"}, r"error\.retry_after_s must be a number"),
    (read_signal, "alerts", "JSON object with a string 'type'"),
    (read_signal, {"type": "alerts", "run_id": "r"}, r"alerts\.firing must be a list of alerts"),
    (read_signal, {"type": "alerts", "run_id": "r", "firing": [{"id": 1}]}, r"alert\.run_id must be a string"),
    (read_signal, {"type": "alerts", "firing": []}, r"alerts\.run_id must be a string"),
    (read_signal, {"type": "alert", "run_id": "r"}, "an alert must be a JSON object, not NoneType"),
    (read_signal, {"type": "hazard", "run_id": "r", "step": 3}, r"hazard\.hazard must be a number"),
    (read_signal, {"type": "hazard", "run_id": "r", "step": -1, "hazard": 0.1}, r"hazard\.step must be an integer"),
    (read_signal, {"type": "command", "run_id": "r", "command": {"id": "c"}}, "not a command"),
    (Alert.from_json, [1], "an alert must be a JSON object, not list"),
    (Alert.from_json, {**ALERT.to_json(), "id": "7"}, r"alert\.id must be an integer"),
    (Alert.from_json, {**ALERT.to_json(), "severity": None}, r"alert\.severity must be a string \(it is missing\)"),
    (Alert.from_json, {**ALERT.to_json(), "started_step": 1.5}, r"alert\.started_step must be an integer or null"),
    (Alert.from_json, {**ALERT.to_json(), "keys": "a,b"}, r"alert\.keys must be a list of strings"),
    (Alert.from_json, {**ALERT.to_json(), "value": "high"}, r"alert\.value: metric value 'high' is not a number"),
    (Alert.from_json, {**ALERT.to_json(), "silenced": 0}, r"alert\.silenced must be true or false"),
    (Alert.from_json, {**ALERT.to_json(), "started_at": 1.7e9}, r"alert\.started_at must be a string or null"),
    (Command.from_json, {"id": "c", "action": "stop", "created_at": "now"}, r"command\.created_at must be a number"),
    (Hello.from_json, {"type": "hello", "protocol": 1}, r"hello\.run must be a JSON object"),
    (Hello.from_json, {"type": "hello", "protocol": 1, "run": {"id": "r"}, "writer": "a b"}, r"hello\.writer must be"),
    (Hello.from_json, {"type": "hello", "protocol": 1, "run": {"id": "r"}, "listen": "alerts"}, "listen must be a list"),
    (Points.from_json, {"type": "points", "seq": -1, "rows": []}, r"points\.seq must be an integer"),
    (Points.from_json, {"type": "points", "seq": 1, "rows": {}}, "rows must be a list"),
    (Finish.from_json, {"type": "finish", "status": "done"}, "finish.status must be one of finished, failed, killed"),
    (Finish.from_json, {"type": "finish", "status": "finished", "last_seq": "7"}, "finish.last_seq must be an integer"),
    (Listen.from_json, {"type": "listen", "listen": "alerts"}, "listen must be a list of signal names"),
    (Listen.from_json, {"type": "listen", "actions": {"": "x"}}, "is not an action name"),
    (Listen.from_json, {"type": "hello"}, "not a listen message"),
    (CommandResult.from_json, {"type": "command_result", "id": "c"}, "command_result needs ok: true or false"),
]


@pytest.mark.parametrize(("decode", "raw", "says"), MALFORMED)
def test_a_malformed_message_is_a_protocol_error_that_says_what_is_wrong(
    decode: Callable[[Any], Any], raw: Any, says: str
) -> None:
    with pytest.raises(ProtocolError, match=says):
        decode(raw)
