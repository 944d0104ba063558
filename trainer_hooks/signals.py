"""What the server tells the trainer, as the Monitor holds it (docs/integrate.md, "Acting on alerts").

The Monitor's worker receives the run's signals on its ingest socket (docs/protocol.md,
"Signals"), decodes each (wire/signals.py) and hands it to the training process (`channel.py`:
`Relay`),
where `Signals` keeps the run's firing alerts and latest hazard, and calls the command
handlers the trainer registered, one command after another, on a thread of its own. Each
answer goes back to the worker, which sends it to the server (and again after a reconnect
until it is sent). A command delivered twice (the connection dropped before its answer
reached the server) is answered again from what the handlers said the first time: a
handler runs at most once per command in this process.

Nothing here ever blocks or raises in the training thread: the properties copy under a
lock, and a handler's exception is the command's failure, never the trainer's.

`Alert` (a firing alert, `Monitor.alerts`) and `Command` are the wire's own (wire/signals.py),
as every signal is read by its type there.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from wire.signals import (
    Alert,
    AlertMessage,
    AlertsMessage,
    Command,
    CommandMessage,
    HazardMessage,
    Signal,
    parse_action,
)

__all__ = ["Alert", "Command", "Signals"]

logger = logging.getLogger("keel")

ANSWERS_KEPT = 10_000
"""Commands whose answers are remembered (for repeats)."""


Handler = Callable[[Command], Any]
Answer = Callable[[str, bool, str], None]
"""Hands (command id, ok, message) to the worker."""


class Signals:
    def __init__(self, answer: Answer, name: str = "") -> None:
        self._answer = answer
        self._name = name
        self._lock = threading.Lock()
        self._alerts: dict[int, Alert] = {}
        self._hazard: tuple[int, float] | None = None
        self._handlers: list[tuple[Handler, dict[str, str] | None]] = []  # (handler, its actions)
        self._answers: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self._queue: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._open = 0  # commands received and not answered yet
        self._settled = threading.Condition(self._lock)

    # -- what the trainer reads --------------------------------------------------------

    @property
    def alerts(self) -> list[Alert]:
        with self._lock:
            return sorted(self._alerts.values(), key=lambda alert: alert.id)

    @property
    def hazard(self) -> float | None:
        with self._lock:
            return self._hazard[1] if self._hazard is not None else None

    @property
    def hazard_step(self) -> int | None:
        with self._lock:
            return self._hazard[0] if self._hazard is not None else None

    def on_command(self, handler: Handler, actions: Mapping[str, str] | None = None) -> None:
        """Register a handler, for the actions named (None: every command)."""
        if not callable(handler):
            raise TypeError("on_command takes a function of one argument, the command")
        declared = None if actions is None else {parse_action(name): str(text) for name, text in dict(actions).items()}
        if declared == {}:
            raise ValueError("on_command: name at least one action, or give actions=None for every command")
        with self._lock:
            self._handlers.append((handler, declared))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=f"keel-commands-{self._name}", daemon=True)
                self._thread.start()

    @property
    def actions(self) -> dict[str, str] | None:
        """The actions the handlers take, with what each does, as the server is told; None
        when a handler takes every command (it did not say which)."""
        with self._lock:
            taken: dict[str, str] = {}
            for _handler, declared in self._handlers:
                if declared is None:
                    return None
                for name, text in declared.items():
                    taken[name] = f"{taken[name]}; {text}" if taken.get(name) and text else text or taken.get(name, "")
            return taken

    # -- what the worker hands over (the replies thread) -------------------------------

    def receive(self, signal: Signal) -> None:
        """One signal, as the worker decoded it (a malformed one never gets here)."""
        if isinstance(signal, AlertsMessage):
            with self._lock:
                self._alerts = {alert.id: alert for alert in signal.firing}
        elif isinstance(signal, AlertMessage):
            alert = signal.alert
            with self._lock:
                if alert.state == "firing":
                    self._alerts[alert.id] = alert
                else:
                    self._alerts.pop(alert.id, None)
        elif isinstance(signal, HazardMessage):
            with self._lock:
                if self._hazard is None or signal.step >= self._hazard[0]:
                    self._hazard = (signal.step, signal.hazard)
        elif isinstance(signal, CommandMessage):
            with self._lock:
                self._open += 1
            self._queue.put(signal.command)

    def settle(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until every command received is answered, so the
        answers leave before the run's finish; False if some are still open."""
        with self._settled:
            return self._settled.wait_for(lambda: self._open == 0 or not self._handlers, timeout=timeout)

    # -- the command thread ------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            command = self._queue.get()
            answered = self._answers.get(command.id)
            if answered is None:
                answered = self._run(command)
                self._answers[command.id] = answered
                while len(self._answers) > ANSWERS_KEPT:
                    self._answers.popitem(last=False)
            try:
                self._answer(command.id, *answered)
            except Exception:  # the worker is gone: the server sends the command again
                logger.debug("keel: could not pass on the answer to command %s", command.id, exc_info=True)
            with self._settled:
                self._open -= 1
                self._settled.notify_all()

    def _run(self, command: Command) -> tuple[bool, str]:
        with self._lock:
            handlers = [h for h, declared in self._handlers if declared is None or command.action in declared]
        if not handlers:
            return False, f"no handler here takes {command.action!r} (this trainer takes {sorted(self.actions or ())})"
        said = []
        for handler in handlers:
            try:
                result = handler(command)
            except Exception as exc:
                logger.warning("keel: command %s (%s) failed in %r: %r", command.id, command.action, handler, exc)
                return False, f"{type(exc).__name__}: {exc}"
            if result is not None:
                said.append(str(result))
        return True, "; ".join(said)
