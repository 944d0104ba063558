"""`keel watch`: follow a trainer's wandb and TensorBoard logs, or the file its console output
goes to, live: one Keel run per source run.

    keel watch ./wandb ./tb_logs --server http://keel-host:8750
    keel watch train.log --server http://keel-host:8750

Every wandb run directory (`offline-run-*`, and `run-*` of online runs: wandb writes the same
transaction log `run-<id>.wandb` in both modes) and every directory holding TensorBoard
event files under the paths is followed, those that appear later included (the paths are
scanned again every `--scan-interval` seconds). Each source run becomes one Keel run, named
after it, with its config; its metrics are renamed by the framework's name map
(trainer_hooks/integrations/names.py), chosen with `--framework` or recognised (`auto`).

A file named on the command line (not a `.wandb` one) is a console log: the lines appended to it
are read as `keel run` reads a command's output (keel/console.py), and each run in it (a step
that goes back to 0 or 1 starts the next, unless `--resume`) becomes a Keel run of its own
(`ConsoleFollower`: the byte offset and the stream's state are the cursor).

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

Config that the source writes after the run was created (wandb's `config.update` once training
runs) is followed too: the hello carried the config as of the first logged step, and a hello
never changes a stored config, so each time the source's config differs from the one the
server last acknowledged, the whole of it is sent with `PATCH /api/v1/runs/{id}`
(keel/config_push.py), on a thread of its own, retried with backoff while the server is away.
The PATCH merges top-level keys, so a repeat is harmless: the acknowledged config is saved
once the server answered, and a watcher killed before that sends it again (at least once).
Keys the source removes stay in Keel's config.

A finished source marks the Keel run finished: wandb's exit record (exit code 0: finished,
else failed). TensorBoard has no such record: a directory whose event files have not grown
for `--finish-after` seconds is marked finished, and reopened if they grow again; so is a
console log's last run (an earlier one is finished when the next begins).

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.config_push import ConfigPush, Sent
    from keel.console import Named
    from keel.importers import PointTable, Renamer
    from keel.readers import ConsoleLogReader, TensorboardReader, WandbReader
    from trainer_hooks.sender import Sender
    from trainer_hooks.spool import Spool

__all__ = ["COMMANDS", "Watcher", "default_state_root"]

STATE_FORMAT = 1
STATE_FILE = "watch.json"


def default_state_root() -> Path:
    """$XDG_CACHE_HOME/keel/watch, or ~/.cache/keel/watch."""
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "keel" / "watch"


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(payload, separators=(",", ":")))  # the C encoder, unlike json.dump
    os.replace(tmp, path)


def _is_wandb_run_dir(path: Path) -> bool:
    return path.name.startswith(("offline-run-", "run-")) and not path.is_symlink()


def discover(paths: list[Path]) -> Iterator[tuple[str, Path, Path]]:
    """(kind, source, watched root) of every wandb transaction log and TensorBoard event
    directory under `paths`. A wandb run directory is not searched for event files (wandb's
    `sync_tensorboard` copies them there: the same points twice). A log named itself is
    followed wherever it links to: its root is the folder of the file it resolves to."""
    for root in paths:
        if root.is_file():
            if root.suffix == ".wandb":
                yield "wandb", root, root.resolve().parent
            elif "tfevents" not in root.name:  # TensorBoard event files are followed by their directory
                yield "console", root, root.resolve().parent
            continue
        for directory, subdirs, files in os.walk(root):
            here = Path(directory)
            if _is_wandb_run_dir(here) and here != root or (here == root and _is_wandb_run_dir(here)):
                for name in sorted(files):
                    if name.startswith("run-") and name.endswith(".wandb"):
                        yield "wandb", here / name, root
                subdirs[:] = []
                continue
            subdirs[:] = sorted(d for d in subdirs if not (here / d).is_symlink())
            if any("tfevents" in name for name in files):
                yield "tensorboard", here, root


class Options:
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


def _claim(kind: str, source: Path, options: Options) -> tuple[Path, int]:
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


def _fit(text: str, what: str, say: Callable[[str], None]) -> str:
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


def _count_skipped(state: dict[str, Any], skipped: Mapping[tuple[str, str], int], say: Callable[[str], None]) -> None:
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
        from wire import ProtocolError, RunInfo, hello_message, parse_hello

        raw = self.state["run"]
        info = RunInfo(id=raw["id"], name=raw["name"], project=raw["project"], group=raw["group"], config=raw["config"], tags=raw["tags"])
        self.spool = Spool.open(self.spool_root / raw["id"], run=info, server_url=self.options.server)
        if self.state.get("writer") != self.spool.writer:
            self.state["writer"] = self.spool.writer  # the server numbers this run's frames by it
            self.save()
        self.spool_pending()
        try:  # a run the check fails is refused whenever it is sent
            parse_hello(hello_message(info))
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


class Follower:
    """One source run: its reader, its state, its spool and Sender."""

    def __init__(self, kind: str, source: Path, root: Path, options: Options, say: Callable[[str], None]) -> None:
        self.kind = kind
        self.source = source.resolve()
        self.root = root
        self.options = options
        self.say = say
        if kind == "wandb" and not self.source.is_relative_to(root.resolve()):
            raise RuntimeError(f"a symbolic link to {self.source}, outside the watched {root.resolve()}")
        self.dir, self._lock_fd = _claim(kind, self.source, options)
        self.state: dict[str, Any] = self._load_state()
        self.lane = Lane(self.state, self.dir / "spool", options, say, self._save, lambda: self.label)
        self.reader: WandbReader | TensorboardReader = self._reader()
        self.renamer: Renamer | None = None
        """Keel's names of the source's (keel/importers.py, as `keel import` names them);
        None until the framework is decided."""
        self._config_push: ConfigPush | None = None
        self._config_check = True
        """The source's config may differ from the one the server acknowledged: compare them."""
        self._config_refused: dict[str, Any] | None = None
        """A config the server refused for what it is (not sent again unless it changes)."""
        self._config_failing = False
        if "framework" in self.state:  # chosen by an earlier watcher: keep it
            self._use_framework(self.state["framework"])
        if self.state.get("run") is not None and not self.state.get("done"):
            self.lane.open()

    # -- state ----------------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        path = self.dir / STATE_FILE
        if path.is_file():
            state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return state
        return {
            "format": STATE_FORMAT, "kind": self.kind, "source": str(self.source), "cursor": None,
            "meta": None, "config": {}, "run": None, "pending": [], "status": None, "done": False,
            "corrupt": 0, "skipped": {}, "not_stored": [], "points": 0, "last_growth": time.time(),
        }  # fmt: skip

    def _save(self) -> None:
        _write_atomic(self.dir / STATE_FILE, self.state)

    def _reader(self) -> WandbReader | TensorboardReader:
        from keel.readers import TensorboardReader, WandbReader

        cursor = self.state["cursor"]
        if self.kind == "wandb":
            return WandbReader(str(self.source), cursor or 0)
        cursor = cursor or {}
        return TensorboardReader(str(self.source), cursor.get("files"), cursor.get("plugins"), within=str(self.root))

    def _cursor(self) -> Any:
        from keel.readers import WandbReader

        if isinstance(self.reader, WandbReader):
            return self.reader.cursor
        return {"files": self.reader.cursors, "plugins": self.reader.plugins}

    # -- framework ------------------------------------------------------------------------

    def _use_framework(self, framework: str | None) -> Renamer:
        from keel.importers import Renamer

        self.renamer = Renamer(framework)
        return self.renamer

    def _decide(self, names: set[str]) -> Renamer:
        from keel.importers import choose_framework

        framework, why = choose_framework(self.options.framework, names, self.state["config"])
        if self.options.framework == "auto":
            self.say(f"{self.label}: framework {framework or 'none'} ({why})"
                     + ("" if framework else "; names are kept as logged, --framework chooses one"))  # fmt: skip
        self.state["framework"] = framework
        return self._use_framework(framework)

    @property
    def label(self) -> str:
        run = self.state.get("run")
        return f"run {run['name']!r}" if run else f"{self.kind} {self.source}"

    # -- reading --------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        """Read what the source gained, and spool it; finish the run when the source has."""
        from keel.readers import WandbReader

        before = json.dumps(self._cursor())
        if isinstance(self.reader, WandbReader):
            table, exit_code, corrupt = self._read_wandb()
        else:
            table, exit_code, corrupt = self._read_tensorboard()
        grew = json.dumps(self._cursor()) != before
        if not grew:
            self._maybe_finish_idle(now)
            return
        self.state["last_growth"] = now
        if corrupt:
            self.state["corrupt"] += corrupt
            self.say(f"{self.label}: {corrupt} corrupt record(s) skipped in {self.source} "
                     f"({self.state['corrupt']} so far)")  # fmt: skip
        frames = self._frames(table) if table is not None else []
        if frames and self.state["run"] is None:
            self._describe_run()
        self.lane.take(frames)
        self.state["cursor"] = self._cursor()
        if exit_code is not None and self.state["status"] is None:
            self.state["status"] = "finished" if exit_code == 0 else "failed"
        self._save()
        self.lane.spool_pending()
        if exit_code is not None:
            self.lane.request_finish(f"the source finished (wandb exit code {exit_code})")

    def _read_wandb(self) -> tuple[Any, int | None, int]:
        from keel.importers import PointTable
        from keel.readers import WandbReader

        assert isinstance(self.reader, WandbReader)
        read = self.reader.read()
        for size in read.too_large:
            self._too_large(self.source, size)
        if read.run is not None:
            self.state["meta"] = read.run
        if read.config:
            self.state["config"].update(read.config)
            self._config_check = True
        if not read.rows:
            return None, read.exit_code, read.corrupt
        renamer = self.renamer or self._decide({key for row in read.rows for key in row.items})
        table = PointTable()
        renamer.add_wandb_rows(read.rows, table)
        return table, read.exit_code, read.corrupt

    def _read_tensorboard(self) -> tuple[Any, int | None, int]:
        from keel.importers import PointTable
        from keel.readers import TensorboardReader

        assert isinstance(self.reader, TensorboardReader)
        read = self.reader.read()
        for what in sorted(read.not_scalars - set(self.state["not_stored"])):
            self.state["not_stored"].append(what)
            self.say(f"{self.label}: not stored: {what} (only scalars are)")
        for name in read.broken:
            self.say(f"{self.label}: the rest of {name} is unreadable (a bad record length) and is left")
        for name, size in read.too_large:
            self._too_large(self.source / name, size)
        for name, why in read.not_read:
            self.say(f"{self.label}: {self.source / name} not read: {why}")
        if not read.scalars:
            return None, None, read.corrupt
        renamer = self.renamer or self._decide({scalar.tag for scalar in read.scalars})
        table = PointTable()
        renamer.add_scalars(read.scalars, table)
        return table, None, read.corrupt

    def _too_large(self, path: Path, size: int) -> None:
        from keel.readers import _READ_LIMIT

        self.state["too_large"] = self.state.get("too_large", 0) + 1
        self.say(f"{self.label}: skipped a record of {size} bytes in {path}: larger than the "
                 f"{_READ_LIMIT >> 20} MiB keel watch reads at once")  # fmt: skip

    def _frames(self, table: PointTable) -> list[str]:
        from keel.transfer import _frames
        from wire import encode_rows

        _count_skipped(self.state, table.skipped, lambda text: self.say(f"{self.label}: {text}"))
        self.state["points"] += table.points
        rows = table.rows()
        self.state["rows"] = self.state.get("rows", 0) + len(rows)
        frames = _frames(encode_rows(rows)) if rows else []
        self.state["frames"] = self.state.get("frames", 0) + len(frames)
        return frames

    def _describe_run(self) -> None:
        from keel.importers import run_id_for, wandb_run

        source = {"source": self.kind, "path": str(self.source), "framework": self.state.get("framework")}
        if self.kind == "wandb":
            meta, identity, name = wandb_run(self.state.get("meta"), self.source)  # as keel import names it
            source.update(wandb_project=meta["project"], wandb_id=meta["id"])
            tags = list(meta["tags"])
        else:
            files = sorted(self.reader.cursors)  # type: ignore[union-attr]
            identity = f"tensorboard/{self.source.name}/{files[0]}"
            relative = self.source.relative_to(self.root.resolve()).as_posix() if self.source.is_relative_to(self.root.resolve()) else self.source.name
            name = self.root.resolve().name if relative == "." else f"{self.root.resolve().name}/{relative}"
            tags = []
        fitted = self._fit(name, "run name")
        if fitted != name:
            source["name"] = name  # the whole name, in the run's config
        tags = [tag for tag in (self._fit(tag, "tag") for tag in tags) if tag]
        self.state["run"] = {
            "id": run_id_for(identity), "name": fitted, "project": self.options.project, "group": self.options.group,
            "config": self._source_config(source), "tags": list(dict.fromkeys([*tags, *self.options.tags])),
        }  # fmt: skip
        self.say(f"{self.label}: following {self.source} as run {self.state['run']['id']} on {self.options.server}")

    def _fit(self, text: str, what: str) -> str:
        return _fit(text, what, lambda line: self.say(f"{self.label}: {line}"))

    def _source_config(self, source: dict[str, Any]) -> dict[str, Any]:
        """The Keel run's config as the source's is now: wandb's config without its own
        `_wandb`, and `keel_watch` (where it comes from)."""
        config = {k: v for k, v in self.state["config"].items() if k != "_wandb"}
        return {**config, "keel_watch": source}

    # -- config updates -------------------------------------------------------------------

    def _follow_config(self) -> None:
        """PATCH the run's config when the source's differs from the one the server last
        acknowledged (`config_acked` in watch.json; the hello's until a PATCH succeeds).

        The hello carried the config as of the first logged step and a hello never changes a
        stored config, so what wandb's `config.update` writes later arrives this way. The
        acknowledged config is saved once the server answered, so a watcher killed before that
        sends it again: the PATCH merges top-level keys, and a repeat changes nothing."""
        run = self.state.get("run")
        if run is None or not self.lane.welcomed:
            return
        if self._config_push is not None:
            sent = self._config_push.result()
            if sent is not None:
                self._config_answered(sent)
        if not self._config_check:
            return
        wanted = self._source_config(run["config"]["keel_watch"])
        if wanted == self.state.get("config_acked", run["config"]):
            self._config_check = False
            return
        if wanted == self._config_refused:
            return
        if self._config_push is None:
            from keel.config_push import ConfigPush

            self._config_push = ConfigPush(self.options.server, run["id"], self.options.token)
        self._config_push.send(wanted)

    def _config_answered(self, sent: Sent) -> None:
        if sent.error is None:
            acked = self.state.get("config_acked", self.state["run"]["config"])
            changed = [key for key, value in sent.config.items() if key not in acked or acked[key] != value]
            self.state["config_acked"] = sent.config
            self._save()
            self._config_failing = False
            shown = ", ".join(map(repr, changed[:8])) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
            self.say(f"{self.label}: config updated on the server ({shown or 'no key changed'})")
        elif sent.final:
            self._config_refused = sent.config
            self._config_check = False  # until the source's config changes again
            self.say(f"{self.label}: the server refused the run's new config ({sent.error}); "
                     "it is sent again when the config changes or keel watch restarts")  # fmt: skip
        elif not self._config_failing:
            self._config_failing = True
            self.say(f"{self.label}: the run's new config is not on the server yet ({sent.error}); retrying")

    # -- finishing and streaming ------------------------------------------------------------

    def _maybe_finish_idle(self, now: float) -> None:
        if (
            self.kind == "tensorboard"
            and self.lane.sender is not None
            and self.state["status"] is None
            and self.reader.waiting == 0
            and now - self.state["last_growth"] >= self.options.finish_after
        ):
            self.state["status"] = "finished"
            self._save()
            self.lane.request_finish(f"the source finished (no new event for {self.options.finish_after:g} s)")

    def pump(self) -> None:
        """Network work for this run, without waiting."""
        if self.lane.stream():
            self.say(f"{self.label}: {self.state['status']}; {self._summary()}")
        self._follow_config()

    def _summary(self) -> str:
        from keel.readers import _READ_LIMIT

        parts = [f"{self.state['points']} point(s) stored"]
        if self.state["corrupt"]:
            parts.append(f"{self.state['corrupt']} corrupt record(s) skipped")
        if self.state.get("too_large"):
            parts.append(f"{self.state['too_large']} record(s) larger than {_READ_LIMIT >> 20} MiB skipped")
        for slot, count in sorted(self.state["skipped"].items()):
            key, reason = slot.split("\t", 1)
            parts.append(f"{count} value(s) of {key!r} not stored ({reason})")
        parts += [f"not stored: {what}" for what in self.state["not_stored"]]
        waiting = self.reader.waiting
        if waiting:
            parts.append(f"{waiting} byte(s) at the end of the source are not a whole record")
        return "; ".join(parts)

    def close(self) -> None:
        self.lane.close()
        os.close(self._lock_fd)


DECIDE_AFTER = 30.0
"""Seconds a console log stays still before the records held while `--framework auto` has
not recognised a framework (keel/console.py holds up to HOLD_RECORDS) are named without one,
so that a trainer that printed one or two steps is not held back (or `--finish-after`, when
shorter)."""


class ConsoleFollower:
    """A console log: what a trainer prints, redirected to a file. One Keel run per run in it
    (a step going back to 0 or 1 starts the next, unless `--resume`), each a Lane of its own
    in `runs` of the source's watch.json.

    A read goes: lines (keel/readers.py ConsoleLogReader) -> Named records (keel/console.py
    ConsoleStream) -> each run's frames -> watch.json (the byte offset past those lines, the
    stream's snapshot: its step bookkeeping, framework, held records and run number; the frames
    as each run's pending) -> the runs' spools. A restarted watcher restores the stream from
    the snapshot and reads on from the offset: no line is read twice, none skipped, and no
    run is started or described again."""

    kind = "console"

    def __init__(self, source: Path, options: Options, say: Callable[[str], None]) -> None:
        from keel.console import ConsoleStream, LineSplitter
        from keel.readers import ConsoleLogReader

        self.path = source
        """As named: a log rotated under this name is followed into the new file."""
        self.source = source.resolve()
        self.options = options
        self.say = say
        self.dir, self._lock_fd = _claim(self.kind, source.absolute(), options)
        self.state: dict[str, Any] = self._load_state()
        self.reader: ConsoleLogReader = ConsoleLogReader(str(source), self.state["cursor"])
        self.splitter = LineSplitter()
        """Fed whole lines only (the reader's), so it holds nothing between reads to save."""
        self.stream = ConsoleStream(options.framework, resume=options.resume)
        if self.state["stream"] is not None:
            self.stream.restore(self.state["stream"])
        self.lanes = [self._lane(entry) for entry in self.state["runs"]]
        self._ended: list[tuple[Lane, str]] = []
        """Runs a read found over (the next began), to be finished once it is saved."""
        for lane in self.lanes:
            if not lane.state["done"]:
                lane.open()

    def _load_state(self) -> dict[str, Any]:
        path = self.dir / STATE_FILE
        if path.is_file():
            state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return state
        return {
            "format": STATE_FORMAT, "kind": self.kind, "source": str(self.path.absolute()), "cursor": None, "stream": None,
            "runs": [], "skipped": {}, "points": 0, "rows": 0, "frames": 0, "too_long": 0, "last_growth": time.time(),
        }  # fmt: skip

    def _save(self) -> None:
        _write_atomic(self.dir / STATE_FILE, self.state)

    def _lane(self, entry: dict[str, Any]) -> Lane:
        return Lane(entry, self.dir / "spool", self.options, self.say, self._save, lambda: f"run {entry['run']['name']!r}")

    @property
    def label(self) -> str:
        return self.lanes[-1].label() if self.lanes else f"console log {self.path}"

    # -- reading --------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        """Read the lines the log gained, and spool their metrics; finish the last run when the
        log has not grown for `--finish-after` seconds."""
        before = self.reader.cursor
        read = self.reader.read()
        if read.restarted:
            self.say(f"{self.label}: {self.path} was {read.restarted}; reading it from its start "
                     "(its steps say whether the run goes on or a new one begins)")  # fmt: skip
        if read.too_long:
            self.state["too_long"] += read.too_long
            self.say(f"{self.label}: a line of more than 1 MiB in {self.path} skipped ({self.state['too_long']} so far)")
        if self.reader.cursor == before:
            self._idle(now)
            return
        self.state["last_growth"] = now
        self._take(self.stream.feed(self.splitter.feed(read.data)))

    def _idle(self, now: float) -> None:
        still = now - self.state["last_growth"]
        if not self.stream.decided and still >= min(DECIDE_AFTER, self.options.finish_after):
            held = self.stream.close()  # the log may say no more for a long while: name what it held
            if held:
                self._take(held)
        last = self.lanes[-1] if self.lanes else None
        if last is not None and last.sender is not None and last.state["status"] is None and still >= self.options.finish_after:
            last.state["status"] = "finished"
            self._save()
            last.request_finish(f"the log has not grown for {self.options.finish_after:g} s")

    def _take(self, records: list[Named]) -> None:
        """`records` into their runs' frames, saved with the reader's cursor, then spooled."""
        from keel.importers import PointTable

        self._report()
        tables: dict[int, PointTable] = {}
        for named in records:
            while named.run >= len(self.lanes):
                self._begin(named)
            tables.setdefault(named.run, PointTable()).add_row(named.step, named.values.items())
        for index, lane in enumerate(self.lanes):
            lane.take(self._frames(lane, tables[index]) if index in tables else [])
        self.state["cursor"] = self.reader.cursor
        self.state["stream"] = self.stream.snapshot()
        self._save()
        for lane in self.lanes:
            lane.spool_pending()
        ended, self._ended = self._ended, []
        for lane, why in ended:
            lane.request_finish(why)

    def _report(self) -> None:
        """Say once what the stream decided or could not read, and count what it did not keep."""
        stream, parser = self.stream, self.stream.parser
        if stream.decided and "framework" not in self.state:
            self.state["framework"] = stream.framework
            if self.options.framework == "auto":
                self.say(f"{self.label}: framework {stream.framework or 'none'} ({stream.why})"
                         + ("" if stream.framework else "; names are kept as printed, --framework chooses one"))  # fmt: skip
        if parser.unreadable and not self.state.get("unreadable_said"):
            self.state["unreadable_said"] = True
            self.say(f"{self.label}: a line that looks like metrics could not be read (skipped, counted): {parser.first_unreadable!r}")
        _count_skipped(self.state, stream.table.skipped, lambda text: self.say(f"{self.label}: {text}"))
        stream.table.skipped.clear()

    def _begin(self, first: Named) -> None:
        """The log's next run, described by its first record; the run before it is over.

        Its id is the one `keel import console` gives the same run of the same log (the file's
        name, the run's place in it, its first record), so importing the log later lands in
        the runs watched."""
        from keel.importers import run_id_for

        index = len(self.lanes)
        if self.lanes and self.lanes[-1].state["status"] is None:
            self.lanes[-1].state["status"] = "finished"
            self._ended.append((self.lanes[-1], f"the step went back to {first.step}: the next run began"))
        digest = hashlib.sha256(json.dumps([first.step, first.values], sort_keys=True).encode()).hexdigest()[:16]
        stem = self.path.stem or self.path.name
        say = lambda line: self.say(f"{self.label}: {line}")  # noqa: E731
        name = _fit(stem if index == 0 else f"{stem} ({index + 1})", "run name", say)
        source = {"source": "console", "path": str(self.path.absolute()), "run": index + 1, "framework": self.stream.framework}
        run = {
            "id": run_id_for(f"console/{self.path.name}/{index}/{digest}"), "name": name, "project": self.options.project,
            "group": self.options.group, "config": {"keel_watch": source},
            "tags": list(dict.fromkeys(tag for tag in (_fit(tag, "tag", say) for tag in self.options.tags) if tag)),
        }  # fmt: skip
        entry: dict[str, Any] = {"run": run, "pending": [], "status": None, "done": False, "points": 0}
        self.state["runs"].append(entry)
        self.lanes.append(self._lane(entry))
        self.say(f"{self.label}: following {self.path} (its run {index + 1}) as run {run['id']} on {self.options.server}")

    def _frames(self, lane: Lane, table: PointTable) -> list[str]:
        from keel.transfer import _frames
        from wire import encode_rows

        _count_skipped(self.state, table.skipped, lambda text: self.say(f"{lane.label()}: {text}"))
        rows = table.rows()
        lane.state["points"] += table.points
        self.state["points"] += table.points
        self.state["rows"] += len(rows)
        frames = _frames(encode_rows(rows)) if rows else []
        self.state["frames"] += len(frames)
        return frames

    # -- streaming ------------------------------------------------------------------------

    def pump(self) -> None:
        """Network work for the log's runs, without waiting."""
        for lane in self.lanes:
            if lane.stream():
                self.say(f"{lane.label()}: {lane.state['status']}; {self._summary(lane)}")

    def _summary(self, lane: Lane) -> str:
        parts = [f"{lane.state['points']} point(s) stored"]
        parser = self.stream.parser
        if parser.unreadable:
            parts.append(f"{parser.unreadable} line(s) of the log that look like metrics could not be read")
        if self.state["too_long"]:
            parts.append(f"{self.state['too_long']} line(s) of more than 1 MiB skipped")
        for slot, count in sorted(self.state["skipped"].items()):
            key, reason = slot.split("\t", 1)
            parts.append(f"{count} value(s) of {key!r} in the log not stored ({reason})")
        return "; ".join(parts)

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
        self.reader.close()
        os.close(self._lock_fd)


class Watcher:
    """Finds sources under `paths` and follows each; `run()` until `stop()`."""

    def __init__(self, paths: list[Path], options: Options, *, interval: float = 0.5, scan_interval: float = 2.0,
                 say: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.paths = paths
        self.options = options
        self.interval = interval
        self.scan_interval = scan_interval
        self.followers: dict[tuple[str, Path], Follower | ConsoleFollower] = {}
        self._refused: set[tuple[str, Path]] = set()
        self._stopping = False
        self.say = say or (lambda line: print(f"keel watch: {line}", flush=True))

    def stop(self) -> None:
        self._stopping = True

    def scan(self) -> None:
        for kind, source, root in discover(self.paths):
            key = (kind, source)
            if key in self.followers or key in self._refused:
                continue
            try:
                if kind == "console":
                    self.followers[key] = ConsoleFollower(source, self.options, self.say)
                else:
                    self.followers[key] = Follower(kind, source, root, self.options, self.say)
            except (RuntimeError, OSError, ValueError) as exc:
                self._refused.add(key)
                self.say(f"not following {source}: {exc}")

    def run(self) -> None:
        next_scan = 0.0
        try:
            while not self._stopping:
                started = time.monotonic()
                if started >= next_scan:
                    self.scan()
                    next_scan = started + self.scan_interval
                now = time.time()
                for key, follower in list(self.followers.items()):
                    try:
                        follower.poll(now)
                    except (ValueError, OSError) as exc:  # a source that is not what its name says
                        self.say(f"{follower.label}: {exc}; no longer followed")
                        follower.close()
                        del self.followers[key]
                        self._refused.add(key)  # as found: not followed again by the next scan
                        continue
                    follower.pump()
                time.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            for follower in self.followers.values():
                follower.close()


def _add_watch(parser: argparse.ArgumentParser) -> None:
    from keel.importers import FRAMEWORK_CHOICES
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="what to follow: wandb/ directories or run directories, TensorBoard log directories, "
                             "or a file a trainer's console output is written to (train.log)")  # fmt: skip
    parser.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
    parser.add_argument("--framework", choices=FRAMEWORK_CHOICES, default="auto",
                        help="whose metric names to map to Keel's (default auto: recognised from the names and the config)")  # fmt: skip
    parser.add_argument("--project", default="default", help="Keel project of the runs (default: default)")
    parser.add_argument("--group", default=None, help="Keel group of the runs")
    parser.add_argument("--tag", action="append", default=[], help="a tag to add (repeatable)")
    parser.add_argument("--token", default=None, help="API token with ingest scope (default: $KEEL_TOKEN)")
    parser.add_argument("--state", type=Path, default=None,
                        help="where cursors and spools are kept (default: ~/.cache/keel/watch)")  # fmt: skip
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between reads of the sources (default 0.5)")
    parser.add_argument("--scan-interval", type=float, default=2.0, help="seconds between searches for new sources (default 2)")
    parser.add_argument("--finish-after", type=float, default=600.0,
                        help="mark a TensorBoard run, or a console log's last run, finished after this many seconds "
                             "without a new event or line (default 600)")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="in a console log, a step that goes back to 1 goes on in the same run (default: a new run)")  # fmt: skip


def _watch(args: argparse.Namespace) -> int:
    import logging

    from trainer_hooks.sender import ingest_url
    from wire.urls import default_server

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    args.server = default_server(args.server)
    try:
        ingest_url(args.server)
    except ValueError as exc:
        print(f"keel watch: {exc}", file=sys.stderr)
        return 2
    missing = [str(path) for path in args.paths if not path.expanduser().exists()]
    if missing:
        print(f"keel watch: no such path: {', '.join(missing)}", file=sys.stderr)
        return 2
    watcher = Watcher([path.expanduser() for path in args.paths], Options(args), interval=args.interval, scan_interval=args.scan_interval)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: watcher.stop())
    print(f"keel watch: following {', '.join(map(str, args.paths))} for {args.server} (Ctrl-C to stop)", flush=True)
    watcher.run()
    print("keel watch: stopped; what was read and not yet acked is kept and sent by the next keel watch", flush=True)
    return 0


COMMANDS = {
    "watch": (
        "Follow wandb and TensorBoard logs, or a console log file, live and stream them to Keel (any framework, no code).",
        _add_watch,
        _watch,
    ),
}
