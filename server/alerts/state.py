"""What the alert pipeline passes between its stages: a rule's tracked state on a run,
and the lifecycle changes one evaluation produced. No I/O here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from server.alerts.detectors import JOINED
from server.alerts.lifecycle import Lifecycle, Transition
from server.models import Rule

__all__ = ["Change", "Tracked", "definition", "fingerprint", "signature"]


def fingerprint(rule_id: int, run_id: str) -> str:
    """The identity of "this rule on this run" across its alerts (Alertmanager's fingerprint)."""
    return hashlib.sha256(f"{rule_id}\x00{run_id}".encode()).hexdigest()[:16]


def definition(rule: Rule) -> str:
    """What a rule's detector state depends on: its detector, metric and parameters."""
    text = json.dumps([rule.detector, rule.metric, rule.params], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def signature(rule: Rule) -> tuple[Any, ...]:
    """Everything about a rule that evaluation reads: a rule whose signature changed was edited."""
    return (
        rule.id, rule.name, rule.project, rule.group, rule.run_id, rule.metric, rule.detector,
        json.dumps(rule.params, sort_keys=True), rule.severity, rule.for_steps, rule.keep_firing_for, rule.enabled,
    )


@dataclass
class Tracked:
    """One rule's detector and lifecycle state on one run (a rule_states row, in memory)."""

    detector_state: dict[str, Any]
    lifecycle: Lifecycle
    last_step: int | None
    alert_id: int | None = None
    dirty: bool = False
    definition: str = ""
    """`definition(rule)` of the rule this state was computed for."""
    stored_step: int | None = None
    """The `last_step` of the rule_states row as this process last read or wrote it: a
    stored row with another one was written by another replica since (not persisted)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "detector": self.detector_state,
            "definition": self.definition,
            "lifecycle": self.lifecycle.to_json(),
            "alert_id": self.alert_id,
        }

    @classmethod
    def load(
        cls, row: tuple[dict[str, Any], int | None] | None, initial: dict[str, Any], definition: str
    ) -> Tracked:
        """From a rule_states row, or fresh with the detector's initial state. The detector
        state of another definition of the rule (it was edited meanwhile, and a replica that
        had not seen the edit yet wrote it) is replaced by `initial`; the lifecycle stays, so
        an open alert still resolves."""
        if row is None:
            return cls(initial, Lifecycle(), None, definition=definition)
        data, last_step = row
        # Edited since: the detector starts again, on a run it has already seen part of (JOINED).
        detector = data["detector"] if data.get("definition", definition) == definition else {**initial, JOINED: True}
        lifecycle = Lifecycle.from_json(data["lifecycle"])
        return cls(detector, lifecycle, last_step, data.get("alert_id"), definition=definition, stored_step=last_step)


@dataclass
class Change:
    """A lifecycle transition of one rule on one run, at one step."""

    rule: Rule
    transition: Transition
    step: int
    value: float
    message: str
    tracked: Tracked
    metric: str | None = None
