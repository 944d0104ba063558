"""What the server sends besides replies: each signal decoded once, in the worker's sender,
and handed on typed (wire/signals.py); a malformed one is dropped there, with a debug line."""

from __future__ import annotations

import logging

from trainer_hooks.sender import Sender
from trainer_hooks.spool import Spool
from wire import RunInfo
from wire.signals import AlertsMessage, Command, CommandMessage, HazardMessage


def test_signals_reach_the_trainer_decoded_and_a_malformed_one_does_not(tmp_path, caplog) -> None:
    spool = Spool.open(tmp_path / "spool", run=RunInfo(id="6e1d4b63-7f1b-4a68-8b66-2e5d1f8f00a1", name="signals"))
    got: list[object] = []
    sender = Sender(spool, "http://127.0.0.1:1", on_signal=got.append)
    command = {"id": "c1", "action": "stop", "payload": {"why": "test"}, "requested_by": "me", "created_at": 5.0}
    with caplog.at_level(logging.DEBUG, logger="keel"):
        sender._handle({"type": "hazard", "run_id": "r", "step": 7, "hazard": 0.5})
        sender._handle({"type": "hazard", "run_id": "r", "step": "seven", "hazard": 0.5})  # malformed
        sender._handle({"type": "command", "run_id": "r", "command": command})
        sender._handle({"type": "alerts", "run_id": "r", "firing": []})
        sender._handle({"type": "something-newer", "run_id": "r"})  # a type this client does not know
    assert got == [
        HazardMessage("r", 7, 0.5),
        CommandMessage("r", Command("c1", "stop", {"why": "test"}, "me", 5.0)),
        AlertsMessage("r", ()),
    ]
    dropped = [r.getMessage() for r in caplog.records if "signal not understood" in r.getMessage()]
    assert len(dropped) == 1 and "step" in dropped[0]
    spool.close(remove=True)
