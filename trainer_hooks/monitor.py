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
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainer_hooks.capture import Capture, Captured
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

if TYPE_CHECKING:  # batched imports torch, which a floats-only Monitor does without
    from trainer_hooks.batched import BatchInputs

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

    Under torch.distributed (or a launcher that sets RANK) only rank 0 sends; on every
    other rank the Monitor does nothing. Used as a context manager, an exception marks
    the run "failed" and Ctrl-C or SIGTERM marks it "killed".
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
    ) -> None:
        self.run_id = run_id or str(uuid.uuid4())
        self.server_url = server_url
        self.enabled = _is_rank_zero()
        self.spool_path: Path | None = None
        self._config = sender_config or SenderConfig()
        self._queue: deque[Captured] = deque()
        self._dropped_rows = 0
        self._warned: set[str] = set()
        self._capture = Capture(self._warn_once, _LIMITS)
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
        self._finish_status: str | None = None
        self._finish_requested = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"keel-{run_name}", daemon=True)
        self._thread.start()
        self._install_exit_hooks()

    # -- the training thread -----------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` (floats or single-element tensors on any device) for `step`.

        Never raises and never waits for the network or the GPU: values are snapshotted
        with one asynchronous device-to-host copy and handed to the background thread.
        """
        if self._closed or not self.enabled:
            return
        try:
            self._enqueue(step, metrics)
        except Exception as exc:  # a bad metric must never stop training
            self._warn_once(f"log:{type(exc).__name__}", f"log({step!r}) dropped: {exc!r}")

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
        training thread spends the copies, not the ~100 small tensor ops. On a GPU they
        are computed here, which only queues asynchronous kernels. Under torch.distributed
        they are computed here on every rank, because each rank takes part in their
        all-reduces. Never raises.
        """
        if self._closed:
            return
        try:
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
            self.log(step, {**inputs.compute(), **(metrics or {})})
        except Exception as exc:  # a bad input must never stop training
            self._warn_once(
                f"log_batch:{type(exc).__name__}", f"log_batch({step!r}) dropped: {exc!r}"
            )

    def _enqueue(
        self, step: int, metrics: Mapping[str, Any], deferred: BatchInputs | None = None
    ) -> bool:
        if not self.enabled:
            return False
        if len(self._queue) >= self._config.max_queued_rows:
            self._dropped_rows += 1
            self._warn_once("queue", "the send queue is full; dropping rows (is the disk stalled?)")
            return False
        queued = self._capture(step, metrics)
        if queued is None:
            return False
        queued.deferred = deferred
        self._queue.append(queued)  # deque.append is atomic; no lock on the hot path
        return True

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
        if self._dropped_rows:
            logger.warning(
                "keel: %d rows were dropped because the queue was full", self._dropped_rows
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
        self._cut_frame(force=finishing)
        if finishing and not self._queue and not self._rows and self._finish_status is not None:
            if self._spool.status != self._finish_status:
                self._spool.record_status(self._finish_status)  # so `keel sync` knows
            self._sender.request_finish(self._finish_status)
        self._sender.step(_TICK_S)
        self._spool.fsync_if_due(self._config.fsync_interval)

    def _drain(self, *, force: bool = True) -> None:
        """Queue -> rows. Unless `force`d, waits (like the frame window) until the oldest entry
        is `flush_interval` old, so that log_batch() metrics are computed several steps at once."""
        limit = self._config.max_rows_per_frame
        if not self._queue:
            return
        if not force and len(self._queue) < limit:
            if time.time() - self._queue[0].time < self._config.flush_interval:
                return
        drained: list[tuple[Captured, Row | None]] = []
        while self._queue and len(self._rows) + len(drained) < limit:
            captured = self._queue.popleft()
            try:
                drained.append((captured, captured.row()))
            except Exception as exc:  # e.g. a CUDA error surfacing at the event
                self._warn_once("device", f"tensors of step {captured.step} lost: {exc!r}")
                drained.append((captured, None))
        deferred = [captured.deferred for captured, _ in drained if captured.deferred is not None]
        computed = iter(self._compute(deferred) if deferred else [])
        for captured, row in drained:
            values = next(computed) if captured.deferred is not None else {}
            if row is None or not (row.values or values):
                continue
            row.values = {**values, **row.values}  # the caller's own metrics win
            self._rows.append(row)
            self._rows_values += len(row.values)

    def _compute(self, batches: list[BatchInputs]) -> list[dict[str, float]]:
        """The stability metrics that log_batch() left to this thread, several steps per call."""
        from trainer_hooks.batched import compute

        try:
            return compute(batches, warn=self._warn_once)
        finally:
            for _ in batches:
                self._deferred_slots.release()

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
                while self._rows:
                    self._cut_frame(force=True)
                    self._drain()
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
