"""The network half of the Monitor: streams a spool's frames to the ingest websocket.

`Sender` is a small explicit state machine driven by `step()` from one thread (the
Monitor's worker process, or `keel sync`). It never reads rows from memory: every
frame it sends is read back from the spool, so a reconnect, a restarted server or a
restarted process all resume the same way, from the last acked frame.

    DISCONNECTED --dial ok (hello/welcome)--> STREAMING --finish sent--> FINISHING --bye--> DONE
         ^                                        |                          |
         +---------- socket error / close --------+--------------------------+
    any state --auth refused (HTTP 401/403, close 4401)--> REJECTED (stop dialing, keep spool)
    any state --run refused (close 4409 run_conflict: the run id is another project's;
                close 4403: the run belongs to another token's name)--> REJECTED

A frame the server answers with `reject` breaks the protocol and will never be stored: it
is copied out of the spool (`Spool.keep_rejected`), warned about once, and counts as done,
so one bad frame never blocks the frames after it.

Signals (docs/protocol.md): the hello asks for those in `listen` (`set_listen` changes them on
the open connection); what the server sends of them goes to `on_signal`, and the trainer's
answers to commands (`answer`) go out as soon as the connection streams, again after a
reconnect if they had not been sent.
"""

from __future__ import annotations

import enum
import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from trainer_hooks.spool import Spool
from wire import (
    ACCEPTS,
    CLOSE_AUTH,
    CLOSE_CONFLICT,
    CLOSE_FORBIDDEN,
    CLOSE_IDLE,
    CLOSE_MALFORMED,
    CLOSE_TOO_LARGE,
    Ack,
    Bye,
    ErrorMessage,
    Finish,
    Hello,
    ProtocolError,
    Reject,
    Welcome,
    points_frame,
    read_reply,
)
from wire.signals import CommandResult, Listen, Signal, read_signal
from wire.urls import ingest_url

__all__ = ["ConnState", "Sender", "SenderConfig", "ingest_url", "upload"]

logger = logging.getLogger("keel")


class SocketLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """websockets' own log of the Sender's connection. Its keepalive failure (the server did
    not answer a ping in time, or the close after it timed out: a busy or stalled server) is
    one warning line, not a traceback in the trainer's terminal: the Sender reconnects and
    resends what was not acked, as after any disconnect."""

    def error(self, msg: object, *args: object, **kwargs: object) -> None:
        if msg == "keepalive ping failed":
            self.logger.warning("keel: the server did not answer a keepalive ping in time; reconnecting")
            return
        self.logger.error(msg, *args, **kwargs)  # type: ignore[arg-type]


_SOCKET_LOG = SocketLog(logging.getLogger("keel.socket"))


@dataclass(frozen=True)
class SenderConfig:
    """How the Monitor batches and sends. The defaults suit a learner step of 10 ms to minutes."""

    flush_interval: float = 0.25
    """Seconds a row may wait in memory before it is cut into a frame and spooled."""
    max_rows_per_frame: int = 1000
    """Rows per frame (the protocol allows 10 000)."""
    max_values_per_frame: int = 50_000
    """Metric values per frame; keeps a frame well under the server's 8 MiB limit."""
    window: int = 8
    """Frames sent and not yet acked at once."""
    connect_timeout: float = 5.0
    """Seconds for the TCP/websocket handshake and for the welcome."""
    backoff_initial: float = 0.25
    """First reconnect delay in seconds; doubles per failed attempt, with jitter."""
    backoff_max: float = 30.0
    """Longest reconnect delay while training runs."""
    backoff_max_finishing: float = 2.0
    """Longest reconnect delay once finish() is waiting, so it does not sleep past its timeout."""
    ack_timeout: float = 60.0
    """Seconds without an ack for the oldest frame in flight before the connection is recycled."""
    fsync_interval: float = 1.0
    """Seconds between fsyncs of the spool (only a machine crash can lose this much)."""
    max_queued_rows: int = 100_000
    """Rows held in memory between log() and the spool; log() drops (and counts) beyond it."""


class ConnState(enum.Enum):
    DISCONNECTED = "disconnected"
    """No socket; the next dial is due at `Sender.next_dial`."""
    STREAMING = "streaming"
    """Welcomed: frames go out, acks come back."""
    FINISHING = "finishing"
    """Every frame is acked and `finish` was sent; waiting for `bye`."""
    DONE = "done"
    """`bye` received: the server holds every frame and the final status."""
    REJECTED = "rejected"
    """The server refused our credentials or the run; dialing again cannot help."""


class Sender:
    """Streams one spool to the server. Call `step()` in a loop from one thread."""

    def __init__(
        self,
        spool: Spool,
        server_url: str,
        *,
        token: str | None = None,
        config: SenderConfig | None = None,
        rng: random.Random | None = None,
        listen: frozenset[str] = frozenset(),
        actions: dict[str, str] | None = None,
        on_signal: Callable[[Signal], None] | None = None,
    ) -> None:
        self.url = ingest_url(server_url)
        self.state = ConnState.DISCONNECTED
        self.next_dial = 0.0
        self.last_error: str | None = None
        self._server_error: str | None = None  # the error message before a close, if any
        self._spool = spool
        self._config = config or SenderConfig()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._rng = rng or random.Random()
        self._ws: Any = None
        self._socket_scope = ExitStack()
        self._send_offset = spool.acked_offset
        # (n, start_offset, end_offset, sent_at) of each frame sent and not yet answered
        self._inflight: deque[tuple[int, int, int, float]] = deque()
        self._failures = 0
        self._finish_status: str | None = None
        self._ended_early = False  # finish_unacked sent `finish` with frames not acked
        self._server_code: str | None = None  # the `code` of the server's last error message
        self._outage_logged = False
        self.rejected_frames = 0
        """Frames the server refused as malformed (copied to the spool's rejected file)."""
        self._accepts: frozenset[str] = frozenset(ACCEPTS)  # the welcome says
        self._left_out: set[int] = set()  # frames whose details were kept aside already
        self._listen = listen
        self._actions = actions
        self._listen_sent = True  # the hello carries it
        self._on_signal = on_signal
        self._answers: deque[tuple[str, bool, str]] = deque()  # to send

    # -- driving ------------------------------------------------------------------------

    def set_listen(self, signals: frozenset[str], actions: dict[str, str] | None = None) -> None:
        """Listen to these signals from now on (on the open connection too); `actions`: the
        command actions the trainer's handlers take, with what each does (None: not said)."""
        if signals != self._listen or actions != self._actions:
            self._listen = signals
            self._actions = actions
            self._listen_sent = False

    def answer(self, command_id: str, ok: bool, message: str) -> None:
        """The trainer's answer to a command: sent once the connection streams."""
        self._answers.append((command_id, ok, message))

    def request_finish(self, status: str) -> None:
        """Send `finish` with this status once every spooled frame is acked."""
        self._finish_status = status

    def finish_unacked(self, status: str, grace: float = 2.0) -> None:
        """The trainer waits no longer: on an open connection, say how the run ended even
        though frames are not acked yet (`finish` with the seq of the spool's last frame: the
        server stores those in flight, counts those it never got, and shows the run as ended,
        not silent), then read its answers for up to `grace` s. The frames not acked stay in
        the spool for `keel sync`."""
        base = self._spool.seq_base
        if self.state is not ConnState.STREAMING or base is None:
            return
        self._ended_early = True
        ends = time.monotonic() + grace
        try:
            self._ws.send(json.dumps(Finish(status, last_seq=base + self._spool.next_n - 1).to_json()))
            while self._ws is not None and not self.settled and time.monotonic() < ends:
                self._receive(max(0.01, ends - time.monotonic()))
        except Exception as exc:  # the connection went: the run shows as silent, as it is
            self._disconnect(exc)

    @property
    def settled(self) -> bool:
        """True when nothing more will happen: DONE or REJECTED."""
        return self.state in (ConnState.DONE, ConnState.REJECTED)

    def step(self, wait: float) -> None:
        """Do one slice of network work, blocking for about `wait` seconds at most."""
        if self.settled:
            time.sleep(wait)
            return
        if self.state is ConnState.DISCONNECTED:
            delay = self.next_dial - time.monotonic()
            if delay > 0:
                time.sleep(min(wait, delay))
                return
            self._dial()
            if self.state is not ConnState.STREAMING:
                return
        try:
            self._send_signals()
            self._send_ready()
            self._maybe_send_finish()
            self._receive(wait)
            self._check_ack_timeout()
        except Exception as exc:  # ConnectionClosed, OSError, TimeoutError, bad JSON...
            self._disconnect(exc)

    def close(self) -> None:
        """Drop the socket, if any (the spool keeps whatever is unacked)."""
        self._close_socket()
        if not self.settled:
            self.state = ConnState.DISCONNECTED

    # -- states -------------------------------------------------------------------------

    def _dial(self) -> None:
        try:
            # The connection outlives this call; ExitStack enters it as a context manager
            # (what websockets >= 17 expects) and `_close_socket` exits it.
            self._socket_scope = ExitStack()
            self._ws = self._socket_scope.enter_context(
                connect(
                    self.url,
                    additional_headers=self._headers,
                    open_timeout=self._config.connect_timeout,
                    close_timeout=1.0,
                    compression=None,  # metric frames are small; save the trainer's CPU
                    max_size=2**20,
                    logger=_SOCKET_LOG,
                )
            )
            listen = frozenset(self._listen)
            hello = Hello(self._spool.run, self._spool.writer, listen, self._actions if listen else None)
            self._ws.send(json.dumps(hello.to_json()))
            raw = self._ws.recv(timeout=self._config.connect_timeout)
            welcome = read_reply(json.loads(raw))
            if isinstance(welcome, ErrorMessage):
                # The close that follows carries the code (4401: bad token, 1013: busy).
                self._server_error = str(welcome)
                self._server_code = welcome.code
                self._ws.recv(timeout=self._config.connect_timeout)
            if not isinstance(welcome, Welcome):
                raise RuntimeError(f"expected welcome, got {str(raw)[:200]}")
            acked_seq = welcome.acked_seq
            self._accepts = frozenset(welcome.accepts or ())  # not said: a server that stores none
        except InvalidStatus as exc:
            status = exc.response.status_code
            self._disconnect(exc, rejected=status in (401, 403))
            return
        except Exception as exc:  # refused, timed out, closed during hello, bad welcome...
            self._disconnect(exc, at_hello=True)
            return
        self._listen_sent = True
        self._spool.anchor(acked_seq)
        self._send_offset = self._spool.acked_offset
        self._inflight.clear()
        self.state = ConnState.STREAMING
        self._failures = 0
        if self._outage_logged:
            logger.warning(
                "keel: connected to %s again; sending %d spooled frame(s)",
                self.url,
                self._spool.unacked,
            )
            self._outage_logged = False

    def _send_signals(self) -> None:
        if self.state is not ConnState.STREAMING:
            return
        if not self._listen_sent:
            self._ws.send(json.dumps(Listen(frozenset(self._listen), self._actions).to_json()))
            self._listen_sent = True
        while self._answers:
            self._ws.send(json.dumps(CommandResult(*self._answers[0]).to_json()))
            self._answers.popleft()

    def _send_ready(self) -> None:
        if self.state is not ConnState.STREAMING:
            return
        base = self._spool.seq_base
        assert base is not None  # anchored by the welcome
        while len(self._inflight) < self._config.window:
            start = self._send_offset
            frame = self._spool.read(start)
            if frame is None:
                return
            self._send_offset = frame.end_offset
            if frame.n < 0:  # a corrupt line kept in the log; nothing to send
                continue
            rows_json = frame.rows_json
            if not self._accepts.issuperset(ACCEPTS) and any(
                f'"{name}":' in rows_json for name in ACCEPTS
            ):
                rows_json = self._without_details(frame.n, rows_json)
            self._ws.send(points_frame(base + frame.n, rows_json))
            self._inflight.append((frame.n, start, frame.end_offset, time.monotonic()))

    def _without_details(self, n: int, rows_json: str) -> str:
        """A frame's rows without the step details a server (older Keel) does not store:
        those are appended to the spool's rejected file, with one warning per run."""
        rows = json.loads(rows_json)
        left_out = []
        for row in rows:
            kept = {name: row.pop(name) for name in ACCEPTS if name in row and name not in self._accepts}
            if kept:
                left_out.append({"step": row["step"], **kept})
        if left_out and n not in self._left_out:
            self._left_out.add(n)
            path = self._spool.keep_left_out({"n": n, "left_out": left_out})
            if len(self._left_out) == 1:
                logger.warning(
                    "keel: the server at %s does not store step details (histograms, samples, "
                    "sequences: it is older than this Monitor); the points go on without them "
                    "and the details are kept in %s",
                    self.url,
                    path,
                )
        return json.dumps(rows, separators=(",", ":"))

    def _maybe_send_finish(self) -> None:
        if (
            self.state is ConnState.STREAMING
            and self._finish_status is not None
            and not self._inflight
            and self._spool.unacked == 0
        ):
            self._ws.send(json.dumps(Finish(self._finish_status).to_json()))
            self.state = ConnState.FINISHING

    def _receive(self, wait: float) -> None:
        timeout = wait
        while self._ws is not None:
            try:
                raw = self._ws.recv(timeout=timeout)
            except TimeoutError:
                return
            self._handle(json.loads(raw))
            timeout = 0  # take what already arrived, then let the caller feed us more

    def _handle(self, message: dict[str, Any]) -> None:
        """One message from the server: a reply (wire/replies.py) read by its type, a signal
        (wire/signals.py) decoded and handed on (the training process acts on it,
        trainer_hooks/signals.py); a malformed signal says nothing to the trainer."""
        reply = read_reply(message)
        if isinstance(reply, Ack):
            self._on_ack(reply.seq)
        elif isinstance(reply, Reject):
            self._on_reject(reply.seq, str(reply))
        elif isinstance(reply, Bye):
            if self.state is ConnState.FINISHING or (self._ended_early and self._spool.unacked == 0):
                self.state = ConnState.DONE
                self._close_socket()
        elif isinstance(reply, ErrorMessage):
            # The server closes right after; the close code decides what we do.
            self._server_error = str(reply)
            self._server_code = reply.code
            logger.error("keel: server error: %s", self._server_error)
        elif reply is None and self._on_signal is not None:
            try:
                signal = read_signal(message)
            except ProtocolError as exc:
                logger.debug("keel: signal not understood: %s", exc)
                return
            if signal is not None:
                self._on_signal(signal)

    def _on_reject(self, seq: int, reason: str) -> None:
        base = self._spool.seq_base
        assert base is not None
        rejected = next((entry for entry in self._inflight if entry[0] == seq - base), None)
        if rejected is not None:
            kept = self._spool.keep_rejected(rejected[1])
            self.rejected_frames += 1
            if self.rejected_frames == 1:
                logger.error(
                    "keel: the server refused a frame of run %s as malformed (%s); it is kept "
                    "in %s and the run goes on (later refusals are counted, not logged)",
                    self._spool.run.id,
                    reason,
                    kept,
                )
        self._on_ack(seq)  # the seq is used up: the frames after it go on

    def _on_ack(self, seq: int) -> None:
        base = self._spool.seq_base
        assert base is not None
        n = seq - base
        last: tuple[int, int, int, float] | None = None
        while self._inflight and self._inflight[0][0] <= n:
            last = self._inflight.popleft()
        if last is not None:
            self._spool.mark_acked(last[0], last[2])
        if not self._inflight:
            # Everything sent is acked, so the next frame starts where the acks end
            # (and the spool may just have compacted its log back to offset 0).
            self._send_offset = self._spool.acked_offset

    def _check_ack_timeout(self) -> None:
        if self._inflight and time.monotonic() - self._inflight[0][3] > self._config.ack_timeout:
            raise TimeoutError(f"no ack for {self._config.ack_timeout:.0f} s")

    def _disconnect(self, exc: BaseException, *, rejected: bool = False, at_hello: bool = False) -> None:
        close_code = _close_code(exc)
        server_code, self._server_code = self._server_code, None
        self._close_socket()
        self._inflight.clear()
        self._send_offset = self._spool.acked_offset
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._server_error:
            self.last_error += f" [{self._server_error}]"
            self._server_error = None
        if rejected or close_code == CLOSE_AUTH:
            self.state = ConnState.REJECTED
            logger.error("keel: %s refused our credentials (%s)", self.url, self.last_error)
            return
        if (close_code == CLOSE_CONFLICT and server_code == "run_conflict") or close_code == CLOSE_FORBIDDEN or (
            at_hello and close_code in (CLOSE_MALFORMED, CLOSE_TOO_LARGE)
        ):
            # The run itself is refused (another project's id; another token's run; a config
            # over the server's limit): the same hello can never be welcomed. The spool stays
            # for keel sync (with the run's own token).
            self.state = ConnState.REJECTED
            logger.error("keel: %s refused run %s (%s)", self.url, self._spool.run.id, self.last_error)
            return
        self.state = ConnState.DISCONNECTED
        if close_code == CLOSE_IDLE:
            # The server closes a connection that sent nothing for its idle timeout (a long
            # evaluation, say): not an outage. Dial again at once, without a warning.
            self.next_dial = time.monotonic()
            return
        self._failures += 1
        cap = (
            self._config.backoff_max_finishing
            if self._finish_status is not None
            else self._config.backoff_max
        )
        if close_code in (CLOSE_MALFORMED, CLOSE_TOO_LARGE):
            # The server rejected something we sent: a client/server version mismatch,
            # not an outage. Keep the data, retry slowly, say it loudly.
            logger.error("keel: %s rejected a frame (close %s): %s", self.url, close_code, exc)
            delay = cap
        else:
            delay = min(cap, self._config.backoff_initial * 2 ** (self._failures - 1))
        # Jitter, so trainers cut off by the same server restart do not reconnect in lockstep.
        self.next_dial = time.monotonic() + delay * self._rng.uniform(0.5, 1.0)
        if not self._outage_logged:
            logger.warning(
                "keel: cannot reach %s (%s); spooling to %s and retrying",
                self.url,
                self.last_error,
                self._spool.path,
            )
            self._outage_logged = True

    def _close_socket(self) -> None:
        ws, self._ws = self._ws, None
        scope, self._socket_scope = self._socket_scope, ExitStack()
        try:
            scope.close()
        except Exception:  # already broken; nothing left to release but the socket
            if ws is not None:
                ws.close_socket()


def _close_code(exc: BaseException) -> int | None:
    received = getattr(exc, "rcvd", None)
    return getattr(received, "code", None)


def upload(
    spool: Spool,
    server_url: str,
    *,
    status: str,
    token: str | None = None,
    timeout: float = 60.0,
    config: SenderConfig | None = None,
) -> Sender:
    """Send every unacked frame of `spool`, then `finish` with `status`.

    Returns the Sender; `sender.state is ConnState.DONE` when the server holds it all.
    Gives up after `timeout` seconds (the spool is left as it is).
    """
    config = config or SenderConfig(backoff_max=2.0)
    sender = Sender(spool, server_url, token=token, config=config)
    sender.request_finish(status)
    deadline = time.monotonic() + timeout
    while not sender.settled and time.monotonic() < deadline:
        sender.step(0.05)
    sender.close()
    return sender
