"""What every follower of `keel watch` shares (keel/watch.py finds the sources; a wandb or
TensorBoard log is followed by keel/watch_tracker.py, a console log by keel/watch_console.py):
the command's options, a source's state directory and its lock, the names fitted to what the
server takes, and `Lane`, one Keel run a source feeds with its spool and Sender. It is apart
so that both kinds of follower stream a run, and keep it exact, the same way.

Exact across failures. Per source, a state directory (under `--state`) holds:

    watch.json   the source's cursor (byte offsets, keel/readers.py), the run's description,
                 the source's config as read so far and the config the server last
                 acknowledged ("config_acked"), the framework chosen, the counts of what was
                 not stored, and the frames cut from the last read ("pending"); written whole
                 to a temp file and renamed over (atomic), before those frames are appended
                 to the spool.
    spool/<run_id>/  the Monitor's own spool (trainer_hooks/spool.py): frames until acked,
                 and the stable writer id the server numbers this source's frames by.
    lock         flock()ed by the watcher that follows the source.

A console log's watch.json holds, instead of one run's, a list of runs ("runs": each its
description, pending frames and status, a spool of its own) and, beside the byte offset, the
reader's snapshot (keel/console.py ConsoleStream.snapshot), saved in the same rename.

A read goes: records -> rows -> frames -> watch.json (cursor past those records, the frames
as pending) -> spool. Killed between the last two steps, the next watcher finds pending frames
the spool does not have yet and appends them; killed before, it reads the same records again.
Either way every record becomes exactly one frame, and the Sender (trainer_hooks/sender.py)
streams the spool as it does for a trainer: resends after a server restart are acked by the
server (writer id + seq) and never stored twice.

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_hooks.sender import Sender
    from trainer_hooks.spool import Spool

__all__ = ["STATE_FILE", "STATE_FORMAT", "Lane", "Options", "claim_source", "count_skipped", "default_state_root",
           "fit_name", "write_atomic"]  # fmt: skip

STATE_FORMAT = 1
STATE_FILE = "watch.json"


def default_state_root() -> Path:
    """$XDG_CACHE_HOME/keel/watch, or ~/.cache/keel/watch."""
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "keel" / "watch"


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(payload, separators=(",", ":")))  # the C encoder, unlike json.dump
    os.replace(tmp, path)


class Options:
    """What the command line says about every source, as the followers read it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.server: str = args.server
        self.token: str | None = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
        self.project: str = args.project
        self.group: str | None = args.group
        self.tags: list[str] = list(args.tag)
        self.framework: str = args.framework
        self.state_root: Path = (args.state or default_state_root()).expanduser()
        self.finish_after: float = args.finish_after
        self.resume: bool = args.resume
        """A console log's step going back to 1 goes on in the same run."""


def claim_source(kind: str, source: Path, options: Options) -> tuple[Path, int]:
    """The source's state directory under `--state` (one per source, server and project), and
    the descriptor of its lock, held while this watcher follows it."""
    import fcntl

    key = f"{kind}\0{source}\0{options.server}\0{options.project}"
    directory = options.state_root / "sources" / hashlib.sha256(key.encode()).hexdigest()[:24]
    directory.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise RuntimeError(f"{source} is followed by another keel watch (state {directory})") from None
    return directory, lock_fd


def fit_name(text: str, what: str, say: Callable[[str], None]) -> str:
    """`text` as the server takes a name (wire's Limits): without NUL characters, and at most
    `max_name_length` characters: its start and a hash of the whole, so that it stays
    recognisable and two long names stay two. Said when it changes."""
    from wire import Limits

    limit = Limits().max_name_length
    fitted = text.replace("\x00", "")
    if len(fitted) > limit:
        fitted = f"{fitted[: limit - 9]}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    if fitted != text:
        say(f"the {what} ({len(text)} characters) is shortened to {fitted!r}: "
            f"the server takes {limit} characters at most, and no NUL")  # fmt: skip
    return fitted


def count_skipped(state: dict[str, Any], skipped: Mapping[tuple[str, str], int], say: Callable[[str], None]) -> None:
    """Adds what was not stored, by key and reason, to the source's counts; a key's first is said."""
    counts = state["skipped"]
    for (key, reason), count in skipped.items():
        slot = f"{key}\t{reason}"
        if slot not in counts:
            say(f"values of {key!r} not stored: {reason} (counted)")
        counts[slot] = counts.get(slot, 0) + count


class Lane:
    """One Keel run a source feeds, and how far it got: its description ("run"), the frames cut
    and not yet spooled ("pending"), the status to finish it with, "done" once the server
    took the finish, in `state` (a source's watch.json, or one entry of a console log's
    "runs" in it, saved whole with the source's cursor by `save`); its spool and its Sender."""

    def __init__(self, state: dict[str, Any], spool_root: Path, options: Options, say: Callable[[str], None],
                 save: Callable[[], None], label: Callable[[], str]) -> None:  # fmt: skip
        self.state = state
        self.spool_root = spool_root
        self.options = options
        self.say = say
        self.save = save
        self.label = label
        self.spool: Spool | None = None
        self.sender: Sender | None = None
        self.welcomed = bool(state.get("done"))
        """Whether the server holds the run (a sender was welcomed): a PATCH finds it."""

    def open(self) -> None:
        """The run's spool (appending the frames a killed watcher saved but did not spool) and
        its Sender, unless the server's own check of a hello refuses the run."""
        from trainer_hooks.sender import Sender, SenderConfig
        from trainer_hooks.spool import Spool
        from wire import Hello, ProtocolError, RunInfo

        raw = self.state["run"]
        info = RunInfo(id=raw["id"], name=raw["name"], project=raw["project"], group=raw["group"], config=raw["config"], tags=raw["tags"])
        self.spool = Spool.open(self.spool_root / raw["id"], run=info, server_url=self.options.server)
        if self.state.get("writer") != self.spool.writer:
            self.state["writer"] = self.spool.writer  # the server numbers this run's frames by it
            self.save()
        self.spool_pending()
        try:  # a run the check fails is refused whenever it is sent
            Hello.from_json(Hello(info).to_json())
        except ProtocolError as exc:
            self.say(f"{self.label()}: the server would refuse this run ({exc}); not sent, its frames stay in {self.spool.path}")
            return
        self.sender = Sender(self.spool, self.options.server, token=self.options.token, config=SenderConfig(backoff_max=5.0))
        if self.state.get("status"):
            self.sender.request_finish(self.state["status"])

    def take(self, frames: list[str]) -> None:
        """`frames` numbered as the spool will number them, as the state's pending: saved with
        the cursor past what they hold, then spooled (`spool_pending`)."""
        if frames and self.state.get("done"):  # a finished source grew again: a new life of its run
            self.state.update(done=False, status=None)
            self.say(f"{self.label()}: the source grew again; following it")
        if frames and self.spool is None:
            self.open()
        spool = self.spool
        self.state["pending"] = [[spool.next_n + i, frame] for i, frame in enumerate(frames)] if spool and frames else []

    def spool_pending(self) -> None:
        spool = self.spool
        if spool is None:
            return
        for n, frame in self.state.get("pending") or []:
            if n < spool.next_n:
                continue  # spooled before the last watcher stopped
            if n != spool.next_n:
                raise RuntimeError(f"{spool.path}: frame {n} saved, but the spool is at {spool.next_n}")
            spool.append(frame)

    def request_finish(self, why: str) -> None:
        if self.sender is not None and self.state["status"]:
            self.sender.request_finish(self.state["status"])
            self.say(f"{self.label()}: {why}; marking the run {self.state['status']}")

    def stream(self) -> bool:
        """Network work for the run, without waiting; True when the server has just taken its
        finish (the spool is then removed)."""
        from trainer_hooks.sender import ConnState

        sender, spool = self.sender, self.spool
        if sender is None or spool is None:
            return False
        if not sender.settled and (spool.unacked > 0 or self.state["status"] or sender.state is ConnState.STREAMING):
            sender.step(0)
        spool.fsync_if_due(1.0)
        if sender.state in (ConnState.STREAMING, ConnState.FINISHING, ConnState.DONE):
            self.welcomed = True
        if sender.state is ConnState.DONE:
            self.state.update(done=True, pending=[])
            self.save()
            spool.close(remove=True)
            self.spool = self.sender = None
            return True
        if sender.state is ConnState.REJECTED and not self.state.get("rejected"):
            self.state["rejected"] = sender.last_error
            self.save()
            self.say(f"{self.label()}: the server refused it ({sender.last_error}); its frames stay in {spool.path}")
        return False

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        if self.spool is not None:
            self.spool.close()
