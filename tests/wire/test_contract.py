"""Every ingest message, in both directions, is what docs/protocol.md shows: each built by
its one encoder in `wire` is the JSON the document writes (its placeholders filled in), and
the document still writes it so (the contract old clients were built against)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from wire import (
    ACCEPTS,
    Ack,
    Bye,
    ErrorMessage,
    Finish,
    Hello,
    Points,
    Reject,
    Row,
    RunInfo,
    Welcome,
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
)

DOC = re.sub(r"\s+", " ", (Path(__file__).parents[2] / "docs" / "protocol.md").read_text())
"""docs/protocol.md with its line breaks and indentation as single spaces."""

ALERT = Alert(7, "r", "m high", "m", "critical", "firing", 20, None, "m = 5")


def _filled(snippet: str, *replacements: tuple[str, str]) -> str:
    """The document's `snippet` with each placeholder replaced by a value (each must occur)."""
    for placeholder, value in replacements:
        assert placeholder in snippet, placeholder
        snippet = snippet.replace(placeholder, value, 1)
    return snippet


CASES: list[tuple[str, str, tuple[tuple[str, str], ...], dict[str, Any]]] = [
    (
        "hello",
        '{"type": "hello", "protocol": 1, "run": {"id": "<uuid chosen by the client>", "name": "cispo-lag8-s0", '
        '"project": "default", "group": "cispo", "config": {...}, "tags": ["toy"]}, "writer": "<id>"}',
        (("{...}", '{"lr": 0.001}'),),
        Hello(
            RunInfo("<uuid chosen by the client>", "cispo-lag8-s0", "default", "cispo", {"lr": 0.001}, ["toy"]), "<id>"
        ).to_json(),
    ),
    (
        "welcome",
        '{"type": "welcome", "run_id": "<uuid>", "acked_seq": N}',
        (("N", "-1"),),
        Welcome("<uuid>", -1).to_json(),
    ),
    (
        "points",
        '{"type": "points", "seq": k, "rows": [{"step": 12, "time": 1764400000.25, "values": '
        '{"reward/mean": 0.5, "grad/norm": "inf"}}, ...]}',
        (('"seq": k', '"seq": 3'), (", ...]", "]")),
        Points(3, [Row(12, 1764400000.25, {"reward/mean": 0.5, "grad/norm": math.inf})]).to_json(),
    ),
    ("ack", '{"type": "ack", "seq": k}', (('"seq": k', '"seq": 3'),), Ack(3).to_json()),
    (
        "reject",
        '{"type": "reject", "seq": k, "code": "malformed" | "too_large", "message": "..."}',
        (('"seq": k', '"seq": 3'), ('"malformed" | "too_large"', '"too_large"'), ('"..."', '"11 rows in one frame"')),
        Reject(3, "too_large", "11 rows in one frame").to_json(),
    ),
    (
        "finish",
        '{"type": "finish", "status": "finished" | "failed" | "killed"}',
        (('"finished" | "failed" | "killed"', '"failed"'),),
        Finish("failed").to_json(),
    ),
    ("bye", '{"type": "bye"}', (), Bye().to_json()),
    (
        "error",
        '{"type": "error", "code": "...", "message": "..."}',
        (('"..."', '"seq_gap"'), ('"..."', '"frame 5 after 3"')),
        ErrorMessage("seq_gap", "frame 5 after 3").to_json(),
    ),
    (
        "listen",
        '{"type": "listen", "listen": [...]}',
        (("[...]", '["alerts", "hazard"]'),),
        Listen(frozenset({"hazard", "alerts"})).to_json(),
    ),
    (
        "command_result",
        '{"type": "command_result", "id": ..., "ok": true | false, "message": "..."}',
        (("...", '"c1"'), ("true | false", "true"), ('"..."', '"saved"')),
        CommandResult("c1", True, "saved").to_json(),
    ),
    (
        "alerts",
        '{"type": "alerts", "run_id", "firing": [alert, ...]}',
        (('"run_id",', '"run_id": "r",'), ("alert, ...", json.dumps(ALERT.to_json()))),
        AlertsMessage("r", (ALERT,)).to_json(),
    ),
    (
        "alert",
        '{"type": "alert", "run_id", "alert": alert}',
        (('"run_id",', '"run_id": "r",'), ("alert}", json.dumps(ALERT.to_json()) + "}")),
        AlertMessage("r", ALERT).to_json(),
    ),
    (
        "hazard",
        '{"type": "hazard", "run_id", "step": s, "hazard": p}',
        (('"run_id",', '"run_id": "r",'), ("s,", "120,"), ("p}", "0.25}")),
        HazardMessage("r", 120, 0.25).to_json(),
    ),
    (
        "command",
        '{"type": "command", "run_id", "command": {"id", "action", "payload", "requested_by", "created_at"}}',
        (
            ('"run_id",', '"run_id": "r",'),
            ('"id",', '"id": "c1",'),
            ('"action",', '"action": "stop",'),
            ('"payload",', '"payload": {},'),
            ('"requested_by",', '"requested_by": "ops",'),
            ('"created_at"}', '"created_at": 1.5}'),
        ),
        CommandMessage("r", Command("c1", "stop", {}, "ops", 1.5)).to_json(),
    ),
]


@pytest.mark.parametrize(("kind", "snippet", "replacements", "encoded"), CASES, ids=[case[0] for case in CASES])
def test_each_message_is_the_json_the_protocol_document_shows(
    kind: str, snippet: str, replacements: tuple[tuple[str, str], ...], encoded: dict[str, Any]
) -> None:
    assert snippet in DOC, f"docs/protocol.md no longer shows the {kind} message as {snippet}"
    assert json.dumps(encoded) == _filled(snippet, *replacements)
    assert encoded["type"] == kind


def test_a_welcome_lists_what_the_server_accepts_and_the_signals_it_sends_as_documented() -> None:
    accepts = '"accepts": ["histograms", "samples", "sequences"]'
    signals = '"signals": ["alerts", "hazard", "commands"]'
    assert accepts in DOC and signals in DOC
    welcome = Welcome("<uuid>", 4, ACCEPTS, SIGNALS).to_json()
    assert json.dumps(welcome) == f'{{"type": "welcome", "run_id": "<uuid>", "acked_seq": 4, {accepts}, {signals}}}'
    # A server without signals leaves the field out (a client never asks), as before them.
    assert "signals" not in Welcome("<uuid>", 4, ACCEPTS).to_json()


def test_an_alert_starts_with_the_fields_the_protocol_document_lists() -> None:
    listed = re.search(r"GET /alerts\?[^`]*` -> list of `(\{[^}]*\})`", DOC)
    assert listed is not None
    fields = re.findall(r'"(\w+)"', listed.group(1))
    assert fields == ["id", "run_id", "rule", "metric", "severity", "state", "started_step", "resolved_step", "message"]
    assert list(ALERT.to_json())[: len(fields)] == fields
