"""`keel lm --guard`: a run that protects itself when a critical alert fires on it, or its
collapse hazard rises (docs/lm.md, "The guard").

The guard keeps in memory, every `every` steps, a copy of the weights and the optimizer's
state (the last `keep` of them: `every × keep` steps of history). After each step it reads
the run's alarm (the step a critical alert firing on the run started at, as the server last
said: `Monitor.alerts`), its collapse hazard when `hazard` is set (`Monitor.hazard`, or one
computed beside the loop) and whether a `rollback` command came. When a critical alert fires,
the hazard passes `hazard` (or the command asks), it rolls back: the weights and optimizer
state go back to the newest copy made before the trouble began (before the step the alert
started at, or the first step of the hazard's rise above `hazard / 2`),
the batches already sampled from the damaged weights are not trained on (the loop takes them,
logs them, and skips the update), and a remedy applies for
`cool_steps` steps: the learning rate times `lr_factor`. Then training goes on; the step
count goes on too (the steps after the copy are lost, and counted).

With `confirm_drop` (and the step's mean reward passed in), a high hazard alone does not roll
back: the run's reward must also have fallen, its moving average (over `confirm_span` steps)
`confirm_drop` below its best since the hazard began to rise. The copy it goes back to is the
same (from before the rise), so waiting for the reward costs the steps in between, not the
rescue; what it saves is the rollbacks of runs whose hazard rose and whose reward did not fall.

It never rolls back twice in a row for one rise: after a rollback the alert must resolve and
the hazard fall below `hazard` again (or `cool_steps` pass), and `max_rollbacks` bounds them all. Each rollback is on
the run's charts: `guard/rollback` (1 at the step it happened), `guard/restored_step` (the step
of the copy it went back to), `guard/steps_lost` (in all) and `guard/lr`.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Guard", "GuardConfig"]


@dataclass(frozen=True)
class GuardConfig:
    hazard: float | None = None
    """Roll back when the collapse hazard passes this too (None: on critical alerts only)."""
    every: int = 10
    """Steps between two kept copies of the weights and optimizer state."""
    keep: int = 10
    """Copies kept (the oldest goes)."""
    lr_factor: float = 0.5
    """The remedy: the learning rate times this for `cool_steps` steps after a rollback."""
    cool_steps: int = 100
    max_rollbacks: int = 5
    confirm_drop: float = 0.0
    """Roll back on the hazard only once the reward's moving average has fallen this much below
    its best since the rise began (0: on the hazard alone). A rollback command never waits."""
    confirm_span: int = 10
    """Steps of the reward's moving average (exponential, this span)."""

    def check(self) -> None:
        if (self.hazard is not None and not 0 < self.hazard < 1) or self.every < 1 or self.keep < 1 or not 0 < self.lr_factor <= 1 or self.cool_steps < 0:
            raise ValueError("guard: need 0 < hazard < 1 (or none), every >= 1, keep >= 1, 0 < lr_factor <= 1, cool_steps >= 0")
        if self.confirm_drop < 0 or self.confirm_span < 1:
            raise ValueError("guard: need confirm_drop >= 0 and confirm_span >= 1")


@dataclass
class _Copy:
    step: int
    """The copy holds the weights after this step's update."""
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


class Guard:
    def __init__(self, config: GuardConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        config.check()
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.copies: deque[_Copy] = deque(maxlen=config.keep)
        self.rollbacks = 0
        self.steps_lost = 0
        self._rise_step: int | None = None  # first step of the current rise above hazard / 2
        self._armed = True  # a rollback may happen (the hazard fell below the threshold since the last)
        self._cool_until = -1
        self._reward: float | None = None  # the reward's moving average
        self._best: float | None = None  # its best since the current rise began
        self._asked = threading.Event()  # a `rollback` command came (set from the Monitor's thread)
        self.last_rollback: tuple[int, int] | None = None
        """(step, restored step) of the last rollback."""

    def discards(self, version: int) -> bool:
        """Whether a batch sampled by this policy version came from the weights a rollback
        threw away (it is then not trained on)."""
        return self.last_rollback is not None and self.last_rollback[1] < version <= self.last_rollback[0]

    def ask(self) -> None:
        """Roll back at the end of the next step (a `rollback` command; any thread)."""
        self._asked.set()

    def after_step(
        self, step: int, hazard: float | None, reward: float | None = None, alarm: int | None = None
    ) -> dict[str, float]:
        """Call after step `step`'s update (and before its weights are published), with the
        run's hazard, the step's mean reward and its alarm (the step a critical alert firing on
        the run started at; None: none fires): keeps a copy, or rolls back. The guard's
        metrics for this step."""
        config = self.config
        if reward is not None and reward == reward:
            weight = 2.0 / (config.confirm_span + 1)
            self._reward = reward if self._reward is None else self._reward + weight * (reward - self._reward)
        if config.hazard is None:
            hazard = None  # the hazard is not what it acts on
        if alarm is not None:
            alarm = min(alarm, step)
            self._rise_step = alarm if self._rise_step is None else min(self._rise_step, alarm)
            if self._best is None:
                self._best = self._reward
        elif hazard is not None and config.hazard is not None and hazard > config.hazard / 2:
            if self._rise_step is None:
                self._rise_step = step
                self._best = self._reward
        elif hazard is not None or config.hazard is None:  # calm (a hazard not known yet says nothing)
            self._rise_step = None
            self._best = None
        if self._reward is not None and self._rise_step is not None:
            self._best = self._reward if self._best is None else max(self._best, self._reward)
        danger = alarm is not None or (hazard is not None and config.hazard is not None and hazard > config.hazard)
        if not danger and (hazard is not None or config.hazard is None):
            self._armed = True
        asked = self._asked.is_set()
        rolled = False
        if asked or (danger and self._armed and step >= self._cool_until and self._falling()):
            self._asked.clear()
            if self.copies and self.rollbacks < config.max_rollbacks:
                self._roll_back(step)
                rolled = True
        if not rolled and step % config.every == 0:
            self.copies.append(_Copy(step, _cloned(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict())))
        cooling = step + 1 < self._cool_until  # the next update
        for group, lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = lr * config.lr_factor if cooling else lr
        return {
            "guard/rollback": 1.0 if rolled else 0.0,
            "guard/restored_step": float(self.last_rollback[1]) if self.last_rollback else float("nan"),
            "guard/steps_lost": float(self.steps_lost),
            "guard/lr": float(self.optimizer.param_groups[0]["lr"]),
        }

    def _falling(self) -> bool:
        """Whether the reward has fallen enough to confirm the hazard (always, without
        `confirm_drop` or without a reward to judge by)."""
        if self.config.confirm_drop <= 0 or self._reward is None or self._best is None:
            return True
        return self._best - self._reward >= self.config.confirm_drop

    def _roll_back(self, step: int) -> None:
        rise = self._rise_step if self._rise_step is not None else step
        before = [c for c in self.copies if c.step < rise]
        target = before[-1] if before else self.copies[0]
        self.model.load_state_dict(target.model)
        self.optimizer.load_state_dict(copy.deepcopy(target.optimizer))
        # Copies made after the target hold the damage: drop them.
        while self.copies and self.copies[-1].step > target.step:
            self.copies.pop()
        self.rollbacks += 1
        self.steps_lost += step - target.step
        self.last_rollback = (step, target.step)
        self._armed = False
        self._rise_step = None
        self._best = None
        self._cool_until = step + 1 + self.config.cool_steps


def _cloned(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in state.items()}
