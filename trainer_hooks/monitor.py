"""`Monitor`: stream a learner loop's per-step metrics to a Keel server.

    monitor = Monitor("http://127.0.0.1:8750", run_name="cispo-lag8")
    for step in range(steps):
        ...
        monitor.log_batch(step, sampler_logprobs, learner_logprobs, mask, rewards=rewards,
                          metrics={"grad/norm": grad_norm})  # stability_metrics + log()
        monitor.log(step, {"eval/score": score})  # tensors or floats; never blocks
    monitor.finish()

The training thread only snapshots values (`capture.py`: CPU values read at once, one
stack + one non-blocking device-to-host copy per device) and writes them to a pipe
(`link.Feed`, never blocking). Everything else happens in a worker process of its own
(`worker.py`, started by `link.Link`), so none of it competes with the training thread for
the interpreter lock: merging the calls of a step (`steps.py`), the stability metrics of
`log_batch`, several steps per call (`batched.py`), cutting frames, the disk spool
(`spool.py`) and the server connection (`sender.py`). A frame leaves the spool only when
the server has acked it, so a server outage, a reconnect, a dead worker (restarted on the
same spool) or a dead trainer (`keel sync`) lose nothing that reached the spool.

One step may be logged in several calls (docs/integrate.md, "One step, several calls"):
see `steps.py`. Every value that is not stored is counted in `Monitor.dropped` and warned
about once per kind, here in the trainer (the worker reports its drops and log records).

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainer_hooks.capture import Capture, Captured, HostCopy, ship_inputs, to_host
from trainer_hooks.channel import (
    Answer,
    Batch,
    Buffer,
    Decoder,
    Finish,
    Listen,
    Log,
    Packed,
    WorkerStart,
    encode,
)
from trainer_hooks.decoder import dumps as dump_decoder
from trainer_hooks.decoder import import_path, same
from trainer_hooks.link import Feed, Link, Pending
from trainer_hooks.sender import SenderConfig
from trainer_hooks.signals import Alert, Command, Signals
from trainer_hooks.spool import Spool, default_spool_root
from wire import (
    FINISH_STATUSES,
    Hello,
    Limits,
    RunInfo,
)
from wire.urls import ingest_url, run_page_url

if TYPE_CHECKING:  # batched imports torch, which a floats-only Monitor does without
    from trainer_hooks.metrics import BatchInputs

__all__ = ["Monitor"]

logger = logging.getLogger("keel")

_SETTLE_S = 5.0
"""How long finish() waits for command handlers still at work."""
LISTENED = ("alerts", "hazard")
"""What every Monitor asks the server for; "commands" is added by `on_command`."""

_LIMITS = Limits()
# A killed job has a grace period (SLURM and Kubernetes default to 30 s) that checkpointing
# also needs; the spool keeps whatever is not acked by then for `keel sync`.
_KILLED_FINISH_TIMEOUT_S = 10.0
# Bytes the training process holds for a worker that is behind (or still starting); past
# half of it log_batch() computes partials here (small), so memory is bounded, not steps.
_MAX_QUEUED_BYTES = 256 * 1024 * 1024
# A GPU log_batch() larger than this (tokens) is reduced on the GPU: the worker's CPU
# would not keep up with copies of it every step.
_MAX_SHIPPED_TOKENS = 1 << 20
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


def dashboard_url(server_url: str, run_id: str) -> str:
    """The dashboard's page of a run (dashboard/app.py PAGE_PATHS: /runs/{run_id})."""
    return run_page_url(server_url, run_id)


def _name(function: Any) -> str:
    """A callable's name for a message (its repr may hold a whole tokenizer)."""
    return str(getattr(function, "__qualname__", None) or type(function).__name__)


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
        samples: the worst sequences of each `log_batch` step sent with their tokens
            (docs/metrics.md, "Where the mismatch lives"); 0 sends none.
        sample_bytes: the most JSON those samples may take per step (windows around the
            worst tokens are narrowed, then the least bad samples left out, to fit).

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
        samples: int = 4,
        sample_bytes: int = 16 * 1024,
    ) -> None:
        if samples < 0 or sample_bytes < 0:
            raise ValueError("samples and sample_bytes must be >= 0")
        self.samples = samples
        self._decode: Any = None  # the last decode given to log_batch (sent to the worker)
        self._decode_refused = False  # a decode could not be pickled (said once)
        self.run_id = run_id or str(uuid.uuid4())
        self.server_url = server_url
        self.enabled = _is_rank_zero()
        self.spool_path: Path | None = None
        self.step_timeout = step_timeout
        self._config = sender_config or SenderConfig()
        self._dropped: dict[str, int] = {}
        self._first_drop: dict[str, str] = {}  # kind -> the first one, for finish()'s summary
        self._drop_lock = threading.Lock()  # counted from the training and replies threads
        self._capture = Capture(self._drop, _LIMITS)
        self._feed = Feed(
            linger=self._config.flush_interval,
            max_messages=self._config.max_queued_rows,
            max_bytes=_MAX_QUEUED_BYTES,
            on_error=self._feed_error,
        )
        self._closed = False  # finish() started: log() is a no-op from here on
        self._finish_status: str | None = None
        self._delivered: bool | None = None  # what finish() returned
        self._exit_status: str | None = None  # set by the SIGTERM handler
        self._pid = os.getpid()
        self._signals = Signals(self._answer, name=run_name)
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
        Hello.from_json(Hello(run).to_json(), _LIMITS)
        self._run = run

        root = Path(spool_dir).expanduser() if spool_dir is not None else default_spool_root()
        self.spool_path = root / self.run_id
        # Made (or checked: a resumed run's spool may be in use) here, so that a bad
        # spool_dir fails the constructor; the worker opens it again as its owner.
        Spool.open(self.spool_path, run=run, server_url=server_url).close()
        worker_start = WorkerStart(
            spool_path=str(self.spool_path),
            server_url=server_url,
            token=token if token is not None else os.environ.get("KEEL_TOKEN"),
            sender_config=self._config,
            step_timeout=step_timeout,
            samples=samples,
            sample_bytes=sample_bytes,
            listen=LISTENED,
        )
        self._link = Link(worker_start, self._feed, on_drop=self._drop, name=run_name, on_signal=self._signals.receive)
        self._link.start()  # returns at once; calls wait in the pipe while it starts
        self._install_exit_hooks()
        self._announce(run_name)

    @property
    def dropped(self) -> dict[str, int]:
        """Values not stored so far, by kind (`DROP_KINDS`); `error` and `queue_full`
        count calls. A kind appears once something of it was dropped."""
        with self._drop_lock:
            return dict(self._dropped)

    # -- what the server says (docs/integrate.md, "Acting on alerts") -------------------

    @property
    def alerts(self) -> list[Alert]:
        """This run's firing alerts (rule, severity, started_step, message), as of the
        server's last word; empty while it has not spoken (or on a rank that does not send)."""
        return self._signals.alerts

    @property
    def hazard(self) -> float | None:
        """The run's latest collapse hazard (docs/alerts.md), or None (warming up, no
        server, a server without the hazard's metrics)."""
        return self._signals.hazard

    def on_command(self, handler: Callable[[Command], Any], actions: Mapping[str, str] | None = None) -> None:
        """Call `handler(command)` for each command sent to this run (`POST
        /api/v1/runs/{id}/commands`, or a rule's action), on a thread of the Monitor's, one
        command at a time. Its return acknowledges the command (a value returned is its
        message), an exception reports it failed. Commands are asked for only once a
        handler is registered (before, they stay pending on the server). A command may be
        delivered twice (after a reconnect): handlers run once per command id here.

        `actions`: the actions this handler takes, each with a line on what it does
        (`{"stop": "saves a checkpoint and stops"}`): the handler is called for those only,
        and the run page offers exactly these, worded by what they do; the server refuses
        any other. None: it is called for every command (the page offers Checkpoint and
        Stop)."""
        self._signals.on_command(handler, actions)
        if self.enabled:
            listen, taken = (*LISTENED, "commands"), self._signals.actions
            self._link.worker_start = replace(self._link.worker_start, listen=listen, actions=taken)
            self._feed.put(encode(Listen(tuple(listen), taken)), always=True)

    def _answer(self, command_id: str, ok: bool, message: str) -> None:
        self._feed.put(encode(Answer(command_id, ok, message)), always=True)

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
        at once on CPU, with one asynchronous device-to-host copy elsewhere, and written
        to the worker's pipe.
        Several calls for one step add up to one row; a key given again for a step keeps
        its first value (the later one is counted in `dropped`). Strings (even "0.5"),
        None and other non-numbers are dropped and counted, never coerced.
        """
        if self._closed or not self.enabled or os.getpid() != self._pid:
            return  # (a fork of the trainer, say a data loader worker, is not the run)
        try:
            captured = self._capture(step, metrics)
            if captured is not None:
                self._send_log(captured)
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
        token_ids: Any = None,
        seq_ids: Any = None,
        decode: Any = None,
        sampler_topk_ids: Any = None,
        sampler_topk_logprobs: Any = None,
        max_length: int | None = None,
    ) -> None:
        """`log(step, {**stability_metrics(sampler_logprobs, ...), **metrics})`, cheaper.

        The arguments are those of `trainer_hooks.metrics.stability_metrics`. The tensors
        go to the Monitor's worker process, which computes the metrics, several steps per
        call (`batched.py`): on CPU they are written to its pipe before this returns (so
        the loop may reuse its buffers), on a GPU copied asynchronously to pinned memory
        and sent once the copies land. The training thread spends the copies, not the ~100
        small tensor ops. Under torch.distributed, with `logits` on a GPU, or while the
        worker is far behind, the mergeable partial sums are computed here instead (each
        rank takes part in their all-reduces). Never raises.

        Calls for the same step (micro-batches) are merged: the step's metrics are those
        of its batches concatenated along the batch dim, sent once the step is complete.

        The step also sends where its mismatch lives (docs/metrics.md): histograms of ℓ,
        (length, Σℓ) pairs and its `samples` worst sequences with the tokens around their
        worst token. `token_ids` [B, T] are the sampled ids; `seq_ids` [B] integer ids of
        the sequences (else their row in the step's batch); `decode` maps a list of ids to
        a list of strings (a Hugging Face tokenizer's `convert_ids_to_tokens`, or a lambda
        or a function of the script). `decode` is pickled once (with cloudpickle: a lambda,
        a closure or a function of `__main__` by value; see trainer_hooks/decoder.py) and
        runs in the worker; without it (or if it cannot be pickled: it holds a socket or a
        lock, said once) the samples show ids.

        `sampler_topk_ids` and `sampler_topk_logprobs` [B, T, k] are the sampler's top-k at
        each position (vLLM's `logprobs=k`, SGLang's `top_logprobs_num=k`; an id < 0 marks
        a missing entry). With `logits`, the step gets `mismatch/topk_tv`, `_tv_max` and
        `_kl` (docs/metrics.md, "Both engines' view of a token"), and its worst samples carry
        both engines' top-k at their worst tokens. Without them nothing of this is computed.
        """
        if self._closed or os.getpid() != self._pid:
            return
        try:
            from trainer_hooks.metrics import BatchInputs

            inputs = BatchInputs(
                sampler_logprobs, learner_logprobs, mask, rewards=rewards, advantages=advantages,
                gate_mask=gate_mask, logits=logits, sampler_version=sampler_version,
                learner_version=learner_version, token_ids=token_ids, seq_ids=seq_ids,
                sampler_topk_ids=sampler_topk_ids, sampler_topk_logprobs=sampler_topk_logprobs,
                max_length=max_length,
            )  # fmt: skip
        except Exception as exc:  # a bad input must never stop training
            self._drop("error", 1, f"log_batch({step!r}) dropped: {exc!r}")
            return
        self.log_inputs(step, inputs, metrics=metrics, decode=decode)

    def log_inputs(
        self, step: int, inputs: BatchInputs, *, metrics: Mapping[str, Any] | None = None, decode: Any = None
    ) -> None:
        """`log_batch` with its tensors in one `trainer_hooks.BatchInputs` (a loop that hands
        its batch to several sinks builds it once). Never raises."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            import torch

            from trainer_hooks.batched import details_of
            from trainer_hooks.metrics import data_parallel

            if decode is not None and self.enabled and not same(decode, self._decode):
                self._send_decoder(decode)
            parallel = data_parallel()  # then every rank takes part in the all-reduces
            if not (self.enabled or parallel):
                return
            if not parallel and self._ships(inputs):
                self._send_batch(torch, step, metrics or {}, inputs)
                return
            partials = inputs.partials()  # queued kernels on a GPU; all-reduced on every rank
            details = details_of(inputs, self.samples)  # likewise
            if self.enabled:
                packed, layout = partials.pack()
                packed_details, details_layout = details.pack()
                whole = torch.cat([packed, packed_details.to(packed.dtype)])
                layouts = (layout, packed.numel(), details_layout)
                self._send_partials(torch, step, metrics or {}, layouts, to_host(torch, whole))
        except Exception as exc:  # a bad input must never stop training
            self._drop("error", 1, f"log_batch({step!r}) dropped: {exc!r}")

    def _send_decoder(self, decode: Any) -> None:
        """Give the worker `decode` (pickled, decoder.py), now and at any restart. One that
        cannot be pickled is reported once (the samples keep their token ids)."""
        self._decode = decode
        try:
            blob = dump_decoder(decode)
        except Exception as exc:
            if not self._decode_refused:
                self._decode_refused = True
                detail = (
                    f"log_batch's decode {_name(decode)} cannot be sent to the Monitor's worker process "
                    f"({type(exc).__name__}: {exc}); the samples show token ids without text. Pass a "
                    "decode that pickles (one that holds no socket, lock or open file), e.g. a "
                    "tokenizer's convert_ids_to_tokens"
                )
                self._drop("error", 1, detail, warn=True)
            return
        path = import_path()
        self._link.worker_start = replace(self._link.worker_start, decoder=blob, import_path=path)
        if not self._feed.put(encode(Decoder(blob, tuple(path))), always=True):
            self._drop("queue_full", 1, "the send queue is full (is the worker stalled?)")

    def _ships(self, inputs: BatchInputs) -> bool:
        """Send the inputs themselves (the worker computes), not partials computed here?"""
        device = inputs.learner_logprobs.device.type
        if self._feed.queued_bytes > _MAX_QUEUED_BYTES // 2:
            return False  # the worker is far behind: bound memory, not steps
        if device == "cpu":
            return True
        return (
            device == "cuda"
            and inputs.logits is None  # [B, T, V] is too big to copy; reduced on the GPU
            and inputs.learner_logprobs.numel() <= _MAX_SHIPPED_TOKENS
        )

    # -- to the worker -----------------------------------------------------------------

    def _send_log(self, captured: Captured) -> None:
        if not captured.snapshots:
            message = encode(Log(captured.step, captured.time, captured.values))
            queued = self._feed.put(message)
        else:

            def encode_log() -> list[Buffer]:
                row = captured.row()
                return encode(Log(row.step, captured.time, row.values))

            queued = self._feed.put_pending(Pending(captured.copies, encode_log, 0))
        if not queued:
            self._drop("queue_full", 1, "the send queue is full (is the worker stalled?)")

    def _send_batch(
        self, torch: Any, step: int, metrics: Mapping[str, Any], inputs: BatchInputs
    ) -> None:
        captured = self._capture(step, metrics)
        if captured is None:
            return
        shipped = ship_inputs(torch, inputs)
        copies = captured.copies + shipped.copies
        if not copies:
            queued = self._feed.put(encode(Batch(step, captured.time, captured.values, shipped.fields), shipped.buffers))
        else:

            def encode_batch() -> list[Buffer]:
                row = captured.row()
                return encode(Batch(step, captured.time, row.values, shipped.fields), shipped.buffers)

            nbytes = sum(memoryview(buffer).nbytes for buffer in shipped.buffers)
            queued = self._feed.put_pending(Pending(copies, encode_batch, nbytes))
        if not queued:
            self._drop("queue_full", 1, "the send queue is full (is the worker stalled?)")

    def _send_partials(
        self,
        torch: Any,
        step: int,
        metrics: Mapping[str, Any],
        layout: tuple[Any, ...],
        packed: HostCopy,
    ) -> None:
        captured = self._capture(step, metrics)
        if captured is None:
            return

        def encode_partials() -> list[Buffer]:
            row = captured.row()
            values = packed.wait().to(torch.float64).contiguous()
            return encode(Packed(step, captured.time, row.values, layout), [values.numpy()])

        copies = [*captured.copies, packed]
        if all(copy.ready() for copy in copies):
            queued = self._feed.put(encode_partials())
        else:
            queued = self._feed.put_pending(Pending(copies, encode_partials, 0))
        if not queued:
            self._drop("queue_full", 1, "the send queue is full (is the worker stalled?)")

    def _feed_error(self, detail: str) -> None:
        self._drop("error", 1, detail)

    def _drop(self, kind: str, count: int, detail: str, *, warn: bool = False) -> None:
        """Count `count` values (calls, for error and queue_full) not stored; warn once per
        kind (and whenever `warn`: a caller that says why once)."""
        with self._drop_lock:
            self._dropped[kind] = self._dropped.get(kind, 0) + count
            first = kind not in self._first_drop
            if first:
                self._first_drop[kind] = detail
        if first or warn:
            logger.warning("keel: %s; dropped (%s). Counted in Monitor.dropped", detail, kind)

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
        if os.getpid() != self._pid:  # a fork of the trainer (a data loader) exiting
            return True
        # Answers to commands in hand go out before the finish (a `stop` is answered so).
        self._signals.settle(min(_SETTLE_S, timeout / 4))
        self._request_finish(status, timeout)
        started = time.monotonic()
        self._feed.flush(timeout)
        # The worker gives up waiting for the server at the deadline, spools what is left
        # and releases the spool; a dial in progress may take connect_timeout more.
        left = max(0.0, timeout - (time.monotonic() - started))
        done = self._link.wait(left + self._config.connect_timeout + 5.0)
        if done is None:
            self._link.kill()
        self._feed.close()
        self._uninstall_exit_hooks()
        delivered = done is not None and done.delivered
        dropped = self.dropped
        if dropped:
            logger.warning(
                "keel: not stored in run %r (%s): %s",
                self._run.name,
                self.run_id,
                "; ".join(
                    f"{kind} {count} (first: {self._first_drop[kind]})"
                    for kind, count in dropped.items()
                ),
            )
        if not delivered:
            rejected = done is not None and done.rejected
            hint = " (the server refused the token; pass one with --token)" if rejected else ""
            logger.warning(
                "keel: the server at %s did not acknowledge all of run %r (%s) within %g s%s; "
                "its %s unacknowledged frame(s) are kept in %s. Upload them with:\n    keel sync %s",
                self.server_url,
                self._run.name,
                self.run_id,
                timeout,
                hint,
                done.unacked if done is not None else "all",
                self.spool_path,
                shlex.quote(str(self.spool_path)),
            )
        self._delivered = delivered
        return delivered

    def _request_finish(self, status: str, timeout: float = 30.0) -> None:
        """Start finishing without waiting (lets a caller finish many Monitors at once)."""
        if self._finish_status is None:
            self._closed = True
            self._finish_status = status
            message = encode(Finish(status, time.time() + timeout))
            self._link.finish_message = message
            self._feed.put(message, always=True)

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
