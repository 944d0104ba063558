"""The alert lifecycle of one rule on one run, as a pure state machine.

inactive --condition--> pending --held `for_steps`--> firing --clear `keep_firing_for`--> resolved
pending --clear--> inactive (never notified: it was not an alert yet)

With for_steps <= 1 the first true step fires at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Phase(str, enum.Enum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"


class Transition(str, enum.Enum):
    PENDING = "pending"
    FIRING = "firing"
    CANCELLED = "cancelled"
    """pending fell back to inactive before firing."""
    RESOLVED = "resolved"


@dataclass
class Lifecycle:
    phase: Phase = Phase.INACTIVE
    true_steps: int = 0
    clear_steps: int = 0
    started_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase.value, "true": self.true_steps, "clear": self.clear_steps, "started": self.started_step}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Lifecycle:
        if not data:
            return cls()
        return cls(Phase(data["phase"]), data["true"], data["clear"], data["started"])

    def step(self, active: bool, step: int, *, for_steps: int, keep_firing_for: int) -> list[Transition]:
        """Advance by one evaluated step; returns the transitions it caused, in order."""
        out: list[Transition] = []
        if self.phase is Phase.INACTIVE:
            if not active:
                return out
            self.phase, self.true_steps, self.clear_steps, self.started_step = Phase.PENDING, 0, 0, step
            out.append(Transition.PENDING)
        if self.phase is Phase.PENDING:
            if not active:
                self.phase, self.true_steps, self.started_step = Phase.INACTIVE, 0, None
                return [*out, Transition.CANCELLED]
            self.true_steps += 1
            if self.true_steps >= max(1, for_steps):
                self.phase, self.clear_steps = Phase.FIRING, 0
                out.append(Transition.FIRING)
            return out
        # FIRING
        if active:
            self.clear_steps = 0
            return out
        self.clear_steps += 1
        if self.clear_steps >= max(1, keep_firing_for):
            self.phase, self.true_steps, self.clear_steps, self.started_step = Phase.INACTIVE, 0, 0, None
            out.append(Transition.RESOLVED)
        return out
