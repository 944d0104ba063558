"""Open-step merging: the calls of one step become one row (runs in the worker, `worker.py`).

One step may be logged in several calls (docs/integrate.md, "One step, several calls").
A step that has `log_batch` calls stays open until it is complete: a `log_batch` for
another step or a `log` for a later one, `close(everything=True)` (finish), or
`step_timeout` s without a call for it. Its calls are merged as one batch: CPU inputs are
concatenated (`batched.concat`) and computed with the other complete steps' in one call
(`batched.compute`), partials computed by the trainer are merged (`merge_partials`).

Each (key, step) keeps its first value, as on the server; every value that is not stored
is reported to `drop(kind, count, detail)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from wire import Histogram, Row, Sequences

if TYPE_CHECKING:  # batched and metrics import torch, which a floats-only run does without
    from trainer_hooks.details import DetailPartials, Details
    from trainer_hooks.metrics import BatchInputs, Partials

__all__ = ["Call", "StepMerger"]

# Steps whose sent keys are remembered, to count a value logged again for a step already
# sent (the server would keep the first one without a word).
_SENT_STEPS = 1024
# Distinct key sets shared between those steps (most steps log the same keys).
_KEY_SETS = 256


@dataclass
class Call:
    """One log() or log_batch() call, as the worker received it."""

    step: int
    time: float
    values: dict[str, float]
    inputs: BatchInputs | None = None
    """log_batch(): the inputs, whose metrics are computed when the step closes."""
    partials: Partials | None = None
    """log_batch() whose partials the trainer computed (data parallel, logits, backlog)."""
    details: DetailPartials | None = None
    """The step details the trainer computed with those partials."""
    received: float = 0.0
    """When the worker read it: `step_timeout` counts from here, so a worker that lags
    (importing torch for its first batch) does not take the lag for a silent step."""


@dataclass
class _OpenStep:
    step: int
    time: float
    """Wall time of its first call: the row's time."""
    last_call: float
    """When its last call was made, or received if later (`Call.received`)."""
    values: dict[str, float] = field(default_factory=dict)
    """The callers' own metrics, the first value of each key."""
    inputs: list[BatchInputs] = field(default_factory=list)
    partials: list[Partials] = field(default_factory=list)
    details: list[DetailPartials] = field(default_factory=list)


@dataclass
class DetailOptions:
    """How the worker finalises a step's details (`details.finalize_details`)."""

    worst: int = 4
    """Worst sequences kept per step; 0 sends no samples (histograms and pairs still)."""
    max_sample_bytes: int = 16 * 1024
    decode: Callable[[list[int]], list[str]] | None = None
    """Token ids to strings (the trainer's `decode`, unpickled), or None: ids only."""


class StepMerger:
    """Calls in, rows out (`rows`, taken by whoever cuts frames)."""

    def __init__(
        self,
        drop: Callable[[str, int, str], None],
        warn: Callable[[str], None],
        step_timeout: float,
        details: DetailOptions | None = None,
    ) -> None:
        self.details = details or DetailOptions()
        self._drop = drop
        self._warn = warn
        self._warned: set[str] = set()
        self.step_timeout = step_timeout
        self.rows: list[Row] = []
        self.rows_values = 0
        self._open: dict[int, _OpenStep] = {}  # steps with log_batch() calls, not yet complete
        self._complete: list[_OpenStep] = []  # completed by a later step, not yet computed
        self._sent: dict[int, frozenset[str]] = {}  # step -> keys sent, the last _SENT_STEPS
        self._key_sets: dict[frozenset[str], frozenset[str]] = {}

    @property
    def idle(self) -> bool:
        return not (self._open or self._complete or self.rows)

    def take_rows(self) -> list[Row]:
        rows, self.rows, self.rows_values = self.rows, [], 0
        return rows

    def take(self, call: Call) -> None:
        """One call, in call order: a log_batch() call completes the open steps of other
        steps (micro-batches of a step come one after another) and opens its own; a log()
        call completes the open steps before its step (a late log() for an earlier step
        leaves the current one open); a call for an open step joins it; any other log()
        call is a row at once."""
        step = call.step
        batch = call.inputs is not None or call.partials is not None
        if self._open:
            for other in sorted(self._open):
                if other < step or (batch and other != step):
                    self._complete.append(self._open.pop(other))
        open_step = self._open.get(step)
        if open_step is None and not batch:
            if any(done.step == step for done in self._complete):
                self.close(everything=False)  # its first values go first
            self._emit(step, call.time, call.values)
            return
        if open_step is None:
            open_step = self._open[step] = _OpenStep(step, call.time, call.time)
        open_step.last_call = max(call.time, call.received)
        for key, value in call.values.items():
            if key in open_step.values:
                self._drop("repeated", 1, f"step {step}: {key!r} was given twice; the first kept")
            else:
                open_step.values[key] = value
        if call.inputs is not None:
            open_step.inputs.append(call.inputs)
        if call.partials is not None:
            open_step.partials.append(call.partials)
        if call.details is not None:
            open_step.details.append(call.details)

    def close(self, *, everything: bool, now: float = 0.0) -> None:
        """Emit the complete steps: those a later step completed, those without a call for
        `step_timeout` s before `now`, and all of them when `everything`. Their CPU metrics
        are computed together, several steps per call."""
        for step, open_step in list(self._open.items()):
            if everything or (now and now - open_step.last_call >= self.step_timeout):
                self._complete.append(self._open.pop(step))
        if not self._complete:
            return
        steps, self._complete = self._complete, []
        for open_step, values in zip(steps, self._metrics_of(steps), strict=True):
            details = self._details_of(open_step)
            # The callers' own metrics win over computed ones of the same name.
            values = {**values, **open_step.values}
            self._emit(open_step.step, open_step.time, values, merged=True, details=details)

    def _details_of(self, open_step: _OpenStep) -> Details | None:
        """The step's details: its calls' merged (`details.merge_details`), finalised."""
        if not (open_step.details or open_step.inputs):
            return None
        from trainer_hooks.batched import details_of
        from trainer_hooks.details import finalize_details, merge_details

        options = self.details
        try:
            parts = list(open_step.details)
            parts.extend(details_of(inputs, options.worst) for inputs in open_step.inputs)
            return finalize_details(
                merge_details(parts),
                decode=options.decode,
                max_sample_bytes=options.max_sample_bytes if options.worst else 0,
            )
        except Exception as exc:
            self._drop("error", 1, f"step {open_step.step}: step details lost: {exc!r}")
            return None

    def _metrics_of(self, steps: list[_OpenStep]) -> list[dict[str, float]]:
        """The stability metrics of each complete step: the CPU inputs of a step joined
        into one batch (`batched.concat`) and computed with the other steps' in one call;
        partials from the trainer (or inputs that do not join) merged."""
        from trainer_hooks.batched import compute, concat

        computed: list[dict[str, float]] = [{} for _ in steps]
        joined: list[tuple[int, BatchInputs]] = []
        for index, open_step in enumerate(steps):
            if not open_step.partials:
                try:
                    joined.append((index, concat(open_step.inputs)))
                    continue
                except Exception:
                    pass  # other kinds of inputs across calls: merged from partials below
            computed[index] = self._merged(open_step)
        results = compute([batch for _, batch in joined], warn=self._lost) if joined else []
        for (index, _), values in zip(joined, results, strict=True):
            computed[index] = values
        return computed

    def _merged(self, open_step: _OpenStep) -> dict[str, float]:
        """The metrics of a step from its calls' partials (computed here for CPU inputs)."""
        from trainer_hooks.metrics import finalize, merge_partials

        try:
            parts = list(open_step.partials)
            parts.extend(inputs.partials() for inputs in open_step.inputs)
            if len({(tuple(p.sums), tuple(p.maxes)) for p in parts}) > 1:
                self._warn_once(
                    "mixed_inputs",
                    f"the log_batch calls of step {open_step.step} give different optional "
                    "inputs (rewards, gate_mask, logits, versions); a metric that needs one "
                    "is left out of a step where some calls lack it",
                )
            merged = finalize(merge_partials(parts))
            return {name: float(value) for name, value in merged.items()}
        except Exception as exc:
            self._lost("", f"step {open_step.step}: {exc!r}")
            return {}

    def _lost(self, what: str, message: str) -> None:
        """batched.compute's report of a batch whose metrics it could not compute."""
        self._drop("error", 1, f"stability metrics lost: {message}")

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            self._warn(message)

    def _emit(
        self,
        step: int,
        wall_time: float,
        values: dict[str, float],
        *,
        merged: bool = False,
        details: Details | None = None,
    ) -> None:
        """A row, without the keys already sent for the step (the server would keep their
        first values and ignore these). `merged`: a step whose log_batch() calls were merged."""
        sent = self._sent.get(step)
        if sent is not None:
            repeated = [key for key in values if key in sent]
            if repeated:
                self._drop(
                    "repeated",
                    len(repeated),
                    f"step {step}: {repeated[0]!r} was logged again after the Monitor sent "
                    "it; the server keeps the first value",
                )
                if merged:
                    self._warn_once(
                        "late_batch",
                        f"log_batch() for step {step} came after the step was sent: a step is "
                        "complete once another step is logged, or step_timeout="
                        f"{self.step_timeout:g} s after its last call (log the micro-batches "
                        "of a step one after another; raise step_timeout for slow ones)",
                    )
                values = {key: value for key, value in values.items() if key not in sent}
        if not values and details is None:
            return
        keys = frozenset(values) if sent is None else sent.union(values)
        if len(self._key_sets) >= _KEY_SETS:
            self._key_sets.clear()
        self._sent[step] = self._key_sets.setdefault(keys, keys)
        if len(self._sent) > _SENT_STEPS:
            del self._sent[next(iter(self._sent))]
        histograms, samples, sequences = None, None, None
        if details is not None:
            histograms = {key: Histogram(h["edges"], h["counts"], h.get("nan", 0)) for key, h in details.histograms.items()} or None
            samples = details.samples or None
            pairs = details.sequences
            sequences = Sequences(pairs["length"], pairs["log_ratio"]) if pairs["length"] else None
        self.rows.append(Row(step, wall_time, values, histograms, samples, sequences))
        self.rows_values += len(values)
