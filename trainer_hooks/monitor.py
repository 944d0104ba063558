"""`Monitor`: stream a learner loop's per-step metrics to a Keel server.

    monitor = Monitor("http://127.0.0.1:8750", run_name="cispo-lag8")
    for step in range(steps):
        ...
        monitor.log_batch(step, sampler_logprobs, learner_logprobs, mask, rewards=rewards,
                          metrics={"grad/norm": grad_norm})  # stability_metrics + log()
        monitor.log(step, {"eval/score": score})  # tensors or floats; never blocks
    monitor.finish()

The training thread only snapshots values (`capture.py`: one stack + one non-blocking
device-to-host copy per device) and appends to an in-memory queue. A background thread turns the
queue into frames, appends each frame to the disk spool (`spool.py`) and streams the
spool to the server (`sender.py`). On CPU, `log_batch` also leaves the stability metrics
themselves to that thread. A frame leaves the spool only when the server has
acked it, so a server outage, a reconnect or a dead trainer (`keel sync`) lose nothing.

One step may be logged in several calls (docs/integrate.md, "One step, several calls"):
the background thread holds a step that has `log_batch` calls open until it is complete (a
`log_batch` for another step or a `log` for a later one, finish(), or `step_timeout` s
without a call for it) and merges its calls as one batch. Each (key, step) keeps its first value, as on the server; every
value that is not stored is counted in `Monitor.dropped` and warned about once per kind.

torch is optional: it is only touched when a value is a tensor (then torch is already
imported by the caller).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from trainer_hooks.capture import Capture, Captured, HostCopy, to_host
from trainer_hooks.protocol import (
    FINISH_STATUSES,
    Limits,
    Row,
    RunInfo,
    encode_rows,
    hello_message,
    parse_hello,
)
from trainer_hooks.sender import ConnState, Sender, SenderConfig, ingest_url
from trainer_hooks.spool import Spool, default_spool_root

if TYPE_CHECKING:  # batched and metrics import torch, which a floats-only Monitor does without
    from trainer_hooks.batched import BatchInputs
    from trainer_hooks.metrics import Partials

__all__ = ["Monitor"]

logger = logging.getLogger("keel")

_LIMITS = Limits()
# How often the background thread wakes to drain the queue and poll for acks.
_TICK_S = 0.05
# A killed job has a grace period (SLURM and Kubernetes default to 30 s) that checkpointing
# also needs; the spool keeps whatever is not acked by then for `keel sync`.
_KILLED_FINISH_TIMEOUT_S = 10.0
# log_batch() steps whose metrics the background thread has yet to compute; beyond this the
# training thread computes them itself, so a slow background thread bounds memory, not steps.
_MAX_DEFERRED = 64
# Steps whose sent keys the background thread remembers, to count a value logged again for
# a step already sent (the server would keep the first one without a word).
_SENT_STEPS = 1024
# Distinct key sets shared between those steps (most steps log the same keys).
_KEY_SETS = 256
DROP_KINDS = (
    "string",
    "none",
    "not_a_number",
    "key",
    "too_many_keys",
    "step",
    "repeated",
    "queue_full",
    "error",
)
"""What `Monitor.dropped` counts (docs/integrate.md, "What is not stored")."""


@dataclass
class _OpenStep:
    """A step whose log_batch() metrics are still being gathered (background thread)."""

    step: int
    time: float
    """Wall time of its first call: the row's time."""
    last_call: float
    values: dict[str, float] = field(default_factory=dict)
    """The callers' own metrics, the first value of each key."""
    inputs: list[BatchInputs] = field(default_factory=list)
    """log_batch() on CPU: copies of the inputs, computed when the step closes."""
    partials: list[Partials] = field(default_factory=list)
    """log_batch() computed in the training thread (GPU, data parallel, backlog)."""


def dashboard_url(server_url: str, run_id: str) -> str:
    """The dashboard's page of a run (dashboard/app.py PAGE_PATHS: /runs/{run_id})."""
    parts = urlsplit(server_url.strip())
    scheme = parts.scheme.lower()
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    path = parts.path.rstrip("/")
    path = path.removesuffix("/api/v1/ingest")
    return urlunsplit((scheme, parts.netloc, f"{path}/runs/{run_id}", "", ""))


def _is_rank_zero() -> bool:
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return bool(dist.get_rank() == 0)
    # Launchers (torchrun, deepspeed, accelerate) set RANK before the process group exists.
    return os.environ.get("RANK", "0") == "0"


class Monitor:
    """Streams one training run to a Keel server. See docs/integrate.md.

    Args:
        server_url: the server, e.g. "http://127.0.0.1:8750" (ws:// and https:// work too).
        run_name: shown in the dashboard.
        project, group, config, tags: stored with the run; `config` must be JSON-able
            (other values are stored as their str()).
        token: API token with ingest scope; defaults to $KEEL_TOKEN.
        run_id: resume this run (a UUID); a new one is made when omitted.
        spool_dir: root of the disk spool; this run's frames go to `<spool_dir>/<run_id>`.
            Defaults to $KEEL_SPOOL_DIR or ~/.keel/spool.
        sender_config: batching, window and backoff knobs (`SenderConfig`).
        step_timeout: seconds without a call for a step after which a step with
            `log_batch` calls is complete and sent (another step's log_batch, a later
            step's log, or finish() completes it at once). Raise it above the time
            between two micro-batches of one step.

    Under torch.distributed (or a launcher that sets RANK) only rank 0 sends; on every
    other rank the Monitor does nothing. Used as a context manager, an exception marks
    the run "failed" and Ctrl-C or SIGTERM marks it "killed".

    `dropped` counts what was not stored, by kind (`DROP_KINDS`); finish() logs it.
    """

    def __init__(
        self,
        server_url: str,
        *,
        run_name: str,
        project: str = "default",
        group: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: Iterable[str] = (),
        token: str | None = None,
        run_id: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        sender_config: SenderConfig | None = None,
        step_timeout: float = 30.0,
    ) -> None:
        self.run_id = run_id or str(uuid.uuid4())
        self.server_url = server_url
        self.enabled = _is_rank_zero()
        self.spool_path: Path | None = None
        self.step_timeout = step_timeout
        self._config = sender_config or SenderConfig()
        self._queue: deque[Captured] = deque()
        self._dropped: dict[str, int] = {}
        self._first_drop: dict[str, str] = {}  # kind -> the first one, for finish()'s summary
        self._drop_lock = threading.Lock()  # counted from both threads
        self._warned: set[str] = set()
        self._capture = Capture(self._drop, _LIMITS)
        self._deferred_slots = threading.BoundedSemaphore(_MAX_DEFERRED)
        self._closed = False  # finish() started: log() is a no-op from here on
        self._delivered: bool | None = None  # what finish() returned
        self._exit_status: str | None = None  # set by the SIGTERM handler
        if not self.enabled:
            return

        # Fail here, loudly, rather than on every reconnect later.
        ingest_url(server_url)
        run = RunInfo(
            id=self.run_id,
            name=run_name,
            project=project,
            group=group,
            config=json.loads(json.dumps(dict(config or {}), default=str)),
            tags=list(tags),
        )
        parse_hello(hello_message(run), _LIMITS)

        root = Path(spool_dir).expanduser() if spool_dir is not None else default_spool_root()
        self.spool_path = root / self.run_id
        self._spool = Spool.open(self.spool_path, run=run, server_url=server_url)
        self._sender = Sender(
            self._spool,
            server_url,
            token=token if token is not None else os.environ.get("KEEL_TOKEN"),
            config=self._config,
        )
        self._rows: list[Row] = []  # rows not yet cut into a frame (background thread only)
        self._rows_values = 0
        self._open: dict[int, _OpenStep] = {}  # steps with log_batch() calls, not yet complete
        self._complete: list[_OpenStep] = []  # completed by a later step, not yet computed
        self._sent: dict[int, frozenset[str]] = {}  # step -> keys sent, the last _SENT_STEPS
        self._key_sets: dict[frozenset[str], frozenset[str]] = {}
        self._finish_status: str | None = None
        self._finish_requested = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"keel-{run_name}", daemon=True)
        self._thread.start()
        self._install_exit_hooks()
        self._announce(run_name)

    @property
    def dropped(self) -> dict[str, int]:
        """Values not stored so far, by kind (`DROP_KINDS`); `error` and `queue_full`
        count calls. A kind appears once something of it was dropped."""
        with self._drop_lock:
            return dict(self._dropped)

    @property
    def url(self) -> str:
        """The run's page on the dashboard."""
        return dashboard_url(self.server_url, self.run_id)

    def _announce(self, run_name: str) -> None:
        """Say once where the run can be watched: through the "keel" logger when it shows
        INFO, else on stderr (an unconfigured logger would swallow it)."""
        message = f"keel: run {run_name!r} ({self.run_id}) is live at {self.url}"
        if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
            logger.info("%s", message)
        else:
            print(message, file=sys.stderr, flush=True)

    # -- the training thread -----------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` (floats or single-element tensors on any device) for `step`.

        Never raises and never waits for the network or the GPU: values are snapshotted
        with one asynchronous device-to-host copy and handed to the background thread.
        Several calls for one step add up to one row; a key given again for a step keeps
        its first value (the later one is counted in `dropped`). Strings (even "0.5"),
        None and other non-numbers are dropped and counted, never coerced.
        """
        if self._closed or not self.enabled:
            return
        try:
            self._enqueue(step, metrics)
        except Exception as exc:  # a bad metric must never stop training
            self._drop("error", 1, f"log({step!r}) dropped: {exc!r}")

    def log_batch(
        self,
        step: int,
        sampler_logprobs: Any,
        learner_logprobs: Any,
        mask: Any,
        *,
        metrics: Mapping[str, Any] | None = None,
        rewards: Any = None,
        advantages: Any = None,
        gate_mask: Any = None,
        logits: Any = None,
        sampler_version: Any = None,
        learner_version: Any = None,
    ) -> None:
        """`log(step, {**stability_metrics(sampler_logprobs, ...), **metrics})`, cheaper.

        The arguments are those of `trainer_hooks.metrics.stability_metrics`. On CPU the
        tensors are copied (one copy each, so the loop may reuse its buffers) and the
        background thread computes the metrics, several steps per call (`batched.py`): the
        training thread spends the copies, not the ~100 small tensor ops. On a GPU their
        mergeable partial sums are computed here, which only queues asynchronous kernels,
        and copied to the host. Under torch.distributed they are computed here on every
        rank, because each rank takes part in their all-reduces. Never raises.

        Calls for the same step (micro-batches) are merged: the step's metrics are those
        of its batches concatenated along the batch dim, sent once the step is complete.
        """
        if self._closed:
            return
        try:
            import torch

            from trainer_hooks.batched import BatchInputs
            from trainer_hooks.metrics import data_parallel

            inputs = BatchInputs(
                sampler_logprobs,
                learner_logprobs,
                mask,
                rewards=rewards,
                advantages=advantages,
                gate_mask=gate_mask,
                logits=logits,
                sampler_version=sampler_version,
                learner_version=learner_version,
            )
            parallel = data_parallel()  # then every rank takes part in the all-reduces
            if not (self.enabled or parallel):
                return
            on_cpu = learner_logprobs.device.type == "cpu"
            if not parallel and on_cpu and self._deferred_slots.acquire(blocking=False):
                queued = False
                try:
                    queued = self._enqueue(step, metrics or {}, deferred=inputs.copy())
                finally:
                    if not queued:
                        self._deferred_slots.release()
                return
            partials = inputs.partials()  # queued kernels on a GPU; all-reduced on every rank
            if self.enabled:
                packed, layout = partials.pack()
                self._enqueue(step, metrics or {}, partials=(layout, to_host(torch, packed)))
        except Exception as exc:  # a bad input must never stop training
            self._drop("error", 1, f"log_batch({step!r}) dropped: {exc!r}")

    def _enqueue(
        self,
        step: int,
        metrics: Mapping[str, Any],
        deferred: BatchInputs | None = None,
        partials: tuple[tuple[Any, ...], HostCopy] | None = None,
    ) -> bool:
        if not self.enabled:
            return False
        if len(self._queue) >= self._config.max_queued_rows:
            self._drop("queue_full", 1, "the send queue is full (is the disk stalled?)")
            return False
        queued = self._capture(step, metrics)
        if queued is None:
            return False
        queued.deferred = deferred
        queued.partials = partials
        self._queue.append(queued)  # deque.append is atomic; no lock on the hot path
        return True

    def _drop(self, kind: str, count: int, detail: str) -> None:
        """Count `count` values (calls, for error and queue_full) not stored; warn once per kind."""
        with self._drop_lock:
            self._dropped[kind] = self._dropped.get(kind, 0) + count
            first = kind not in self._first_drop
            if first:
                self._first_drop[kind] = detail
        if first:
            logger.warning("keel: %s; dropped (%s). Counted in Monitor.dropped", detail, kind)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning("keel: %s", message)

    # -- finishing ---------------------------------------------------------------------

    def finish(self, status: str = "finished", *, timeout: float = 30.0) -> bool:
        """Flush, wait up to `timeout` s for the server to ack everything, mark the run `status`.

        Returns True when the server holds every row and the status. Otherwise the spool
        is left on disk and a warning gives the `keel sync` command that uploads it.
        """
        if status not in FINISH_STATUSES:
            raise ValueError(f"status must be one of {FINISH_STATUSES}, got {status!r}")
        if not self.enabled:
            return True
        if self._delivered is not None:  # finished already
            return self._delivered
        self._request_finish(status)
        if not self._done.wait(timeout):
            self._stop.set()
        # The thread spools what is left and releases the spool before it exits.
        self._thread.join(self._config.connect_timeout + 5.0)
        self._uninstall_exit_hooks()
        delivered = self._sender.state is ConnState.DONE
        dropped = self.dropped
        if dropped:
            logger.warning(
                "keel: not stored in run %r (%s): %s",
                self._spool.run.name,
                self.run_id,
                "; ".join(
                    f"{kind} {count} (first: {self._first_drop[kind]})"
                    for kind, count in dropped.items()
                ),
            )
        if not delivered:
            rejected = self._sender.state is ConnState.REJECTED
            hint = " (the server refused the token; pass one with --token)" if rejected else ""
            logger.warning(
                "keel: the server at %s did not acknowledge all of run %r (%s) within %g s%s; "
                "its %d unacknowledged frame(s) are kept in %s. Upload them with:\n    keel sync %s",
                self.server_url,
                self._spool.run.name,
                self.run_id,
                timeout,
                hint,
                self._spool.unacked,
                self.spool_path,
                shlex.quote(str(self.spool_path)),
            )
        self._delivered = delivered
        return delivered

    def _request_finish(self, status: str) -> None:
        """Start finishing without waiting (lets a caller finish many Monitors at once)."""
        if self._finish_status is None:
            self._closed = True
            self._finish_status = status
            self._finish_requested.set()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        status = status_for_exit(exc_type, exc, self._exit_status)
        self.finish(status, timeout=_KILLED_FINISH_TIMEOUT_S if status == "killed" else 30.0)

    def _install_exit_hooks(self) -> None:
        atexit.register(self._at_exit)
        # Python records an uncaught exception in sys.last_exc (3.12+) / sys.last_value;
        # remember any older one (interactive sessions) so it is not taken for this run's.
        self._uncaught_at_start = _last_uncaught()
        self._previous_sigterm: Any = None
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_DFL or callable(previous):
            self._previous_sigterm = previous
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _uninstall_exit_hooks(self) -> None:
        atexit.unregister(self._at_exit)
        if (
            self._previous_sigterm is None
            or threading.current_thread() is not threading.main_thread()
        ):
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._exit_status = "killed"
        if callable(self._previous_sigterm):
            self._previous_sigterm(signum, frame)
            return
        # Unwind the training loop like Ctrl-C does: `with Monitor(...)` (or atexit) then
        # finishes the run as "killed" and the process exits with 128 + SIGTERM. A second
        # SIGTERM during that finish stops its wait (the spool keeps what is unacked).
        raise SystemExit(128 + signum)

    def _at_exit(self) -> None:
        if self._finish_status is not None:  # finish() ran, or was cut short by a 2nd SIGTERM
            return
        status = self._exit_status
        if status is None:
            uncaught = _last_uncaught()
            failed = uncaught is not None and uncaught is not self._uncaught_at_start
            status = "failed" if failed else "finished"
        self.finish(status, timeout=_KILLED_FINISH_TIMEOUT_S if status == "killed" else 30.0)

    # -- the background thread ---------------------------------------------------------

    def _pump(self) -> None:
        failures = 0
        try:
            # After a REJECTED the loop goes on spooling until finish(): `keel sync` with
            # the right token can upload it all later.
            while not self._stop.is_set() and not (
                self._sender.settled and self._finish_requested.is_set()
            ):
                try:
                    self._pump_once()
                    failures = 0
                except Exception:  # keep going: a bug here must not lose later rows
                    failures += 1
                    if failures == 1:
                        logger.exception("keel: background sender error (retrying)")
                    time.sleep(min(5.0, _TICK_S * 2**failures))
        finally:
            self._shutdown()

    def _pump_once(self) -> None:
        finishing = self._finish_requested.is_set()
        self._drain(force=finishing)
        self._close_steps(everything=finishing)
        self._cut_frame(force=finishing)
        idle = not (self._queue or self._open or self._complete or self._rows)
        if finishing and idle and self._finish_status is not None:
            if self._spool.status != self._finish_status:
                self._spool.record_status(self._finish_status)  # so `keel sync` knows
            self._sender.request_finish(self._finish_status)
        self._sender.step(_TICK_S)
        self._spool.fsync_if_due(self._config.fsync_interval)

    def _drain(self, *, force: bool = True) -> None:
        """Queue -> rows and open steps. Unless `force`d, waits (like the frame window) until
        the oldest entry is `flush_interval` old, so that log_batch() metrics are computed
        several steps at once."""
        limit = self._config.max_rows_per_frame
        if not self._queue:
            return
        if not force and len(self._queue) < limit:
            if time.time() - self._queue[0].time < self._config.flush_interval:
                return
        taken = 0
        while self._queue and len(self._rows) + taken < limit:
            captured = self._queue.popleft()
            taken += 1
            try:
                row = captured.row()
                partials = self._read_partials(captured)
            except Exception as exc:  # e.g. a CUDA error surfacing at the event
                self._drop("error", 1, f"tensors of step {captured.step} lost: {exc!r}")
                if captured.deferred is not None:
                    self._deferred_slots.release()
                continue
            self._take(captured, row.values, partials)

    @staticmethod
    def _read_partials(captured: Captured) -> Partials | None:
        if captured.partials is None:
            return None
        from trainer_hooks.metrics import Partials

        layout, copy = captured.partials
        return Partials.unpack(copy.wait(), layout)

    def _take(
        self, captured: Captured, values: dict[str, float], partials: Partials | None
    ) -> None:
        """One call, in call order: a log_batch() call completes the open steps of other
        steps (micro-batches of a step come one after another) and opens its own; a log()
        call completes the open steps before its step (a late log() for an earlier step
        leaves the current one open); a call for an open step joins it; any other log()
        call is a row at once."""
        step = captured.step
        batch = captured.deferred is not None or partials is not None
        if self._open:
            for other in sorted(self._open):
                if other < step or (batch and other != step):
                    self._complete.append(self._open.pop(other))
        open_step = self._open.get(step)
        if open_step is None and not batch:
            if any(done.step == step for done in self._complete):
                self._close_steps(everything=False)  # its first values go first
            self._emit(step, captured.time, values)
            return
        if open_step is None:
            open_step = self._open[step] = _OpenStep(step, captured.time, captured.time)
        open_step.last_call = captured.time
        for key, value in values.items():
            if key in open_step.values:
                self._drop("repeated", 1, f"step {step}: {key!r} was given twice; the first kept")
            else:
                open_step.values[key] = value
        if captured.deferred is not None:
            open_step.inputs.append(captured.deferred)
        if partials is not None:
            open_step.partials.append(partials)

    def _close_steps(self, *, everything: bool) -> None:
        """Send the complete steps: those a later step completed, those without a call for
        `step_timeout` s, and all of them when finishing. Their CPU metrics are computed
        together, several steps per call."""
        if self._open:
            now = time.time()
            for step, open_step in list(self._open.items()):
                if everything or now - open_step.last_call >= self.step_timeout:
                    self._complete.append(self._open.pop(step))
        if not self._complete:
            return
        steps, self._complete = self._complete, []
        try:
            computed = self._metrics_of(steps)
        finally:
            for open_step in steps:
                for _ in open_step.inputs:
                    self._deferred_slots.release()
        for open_step, values in zip(steps, computed, strict=True):
            # The callers' own metrics win over computed ones of the same name.
            values = {**values, **open_step.values}
            self._emit(open_step.step, open_step.time, values, merged=True)

    def _metrics_of(self, steps: list[_OpenStep]) -> list[dict[str, float]]:
        """The stability metrics of each complete step: the CPU inputs of a step joined
        into one batch (`batched.concat`) and computed with the other steps' in one call;
        partials from the training thread (or inputs that do not join) merged."""
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

    def _emit(
        self, step: int, wall_time: float, values: dict[str, float], *, merged: bool = False
    ) -> None:
        """A row for the spool, without the keys this Monitor already sent for the step (the
        server would keep their first values and ignore these). `merged`: a step whose
        log_batch() calls were merged."""
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
        if not values:
            return
        keys = frozenset(values) if sent is None else sent.union(values)
        if len(self._key_sets) >= _KEY_SETS:
            self._key_sets.clear()
        self._sent[step] = self._key_sets.setdefault(keys, keys)
        if len(self._sent) > _SENT_STEPS:
            del self._sent[next(iter(self._sent))]
        self._rows.append(Row(step=step, time=wall_time, values=values))
        self._rows_values += len(values)

    def _cut_frame(self, *, force: bool) -> None:
        if not self._rows:
            return
        full = (
            len(self._rows) >= self._config.max_rows_per_frame
            or self._rows_values >= self._config.max_values_per_frame
        )
        oldest = self._rows[0].time or 0.0
        if not (force or full or time.time() - oldest >= self._config.flush_interval):
            return
        rows_json = json.dumps(encode_rows(self._rows), separators=(",", ":"), allow_nan=False)
        self._spool.append(rows_json)  # on OSError the rows stay and are retried next tick
        self._rows = []
        self._rows_values = 0

    def _shutdown(self) -> None:
        """Last words of the background thread: nothing logged may stay only in memory."""
        try:
            if self._sender.state is not ConnState.DONE:
                self._drain()
                self._close_steps(everything=True)
                while self._rows:
                    self._cut_frame(force=True)
                    self._drain()
                    self._close_steps(everything=True)
                if self._finish_status is not None and self._spool.status != self._finish_status:
                    self._spool.record_status(self._finish_status)
        except Exception:
            logger.exception("keel: could not spool the last rows")
        finally:
            delivered = self._sender.state is ConnState.DONE
            self._sender.close()
            self._spool.close(remove=delivered)
            self._done.set()


def _last_uncaught() -> BaseException | None:
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def status_for_exit(
    exc_type: type[BaseException] | None, exc: BaseException | None, signalled: str | None
) -> str:
    """The finish status for leaving a `with` block this way (`signalled`: set by SIGTERM)."""
    if signalled is not None:
        return signalled
    if exc_type is None:
        return "finished"
    if issubclass(exc_type, KeyboardInterrupt):
        return "killed"
    if issubclass(exc_type, SystemExit) and getattr(exc, "code", 1) in (0, None):
        return "finished"
    return "failed"
