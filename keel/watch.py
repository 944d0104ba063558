"""`keel watch`: follow a trainer's wandb and TensorBoard logs live, one Keel run per source run.

    keel watch ./wandb ./tb_logs --server http://keel-host:8750

Every wandb run directory (`offline-run-*`, and `run-*` of online runs: wandb writes the same
transaction log `run-<id>.wandb` in both modes) and every directory holding TensorBoard
event files under the paths is followed, those that appear later included (the paths are
scanned again every `--scan-interval` seconds). Each source run becomes one Keel run, named
after it, with its config; its metrics are renamed by the framework's name map
(trainer_hooks/integrations/names.py), chosen with `--framework` or recognised (`auto`).

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
for `--finish-after` seconds is marked finished, and reopened if they grow again.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.config_push import ConfigPush, Sent
    from keel.importers import Renamer
    from keel.readers import TensorboardReader, WandbReader
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


class Follower:
    """One source run: its reader, its state, its spool and Sender."""

    def __init__(self, kind: str, source: Path, root: Path, options: Options, say: Callable[[str], None]) -> None:
        import fcntl

        self.kind = kind
        self.source = source.resolve()
        self.root = root
        self.options = options
        self.say = say
        if kind == "wandb" and not self.source.is_relative_to(root.resolve()):
            raise RuntimeError(f"a symbolic link to {self.source}, outside the watched {root.resolve()}")
        key = f"{kind}\0{self.source}\0{options.server}\0{options.project}"
        self.dir = options.state_root / "sources" / hashlib.sha256(key.encode()).hexdigest()[:24]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RuntimeError(f"{source} is followed by another keel watch (state {self.dir})") from None
        self.state: dict[str, Any] = self._load_state()
        self.spool: Spool | None = None
        self.sender: Sender | None = None
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
        self._welcomed = bool(self.state.get("done"))
        """Whether the server holds the run (a sender was welcomed): a PATCH finds it."""
        if "framework" in self.state:  # chosen by an earlier watcher: keep it
            self._use_framework(self.state["framework"])
        if self.state.get("run") is not None and not self.state.get("done"):
            self._open_spool()

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
        if frames and self.state.get("done"):  # a finished source grew again: a new life of its run
            self.state.update(done=False, status=None)
            self.say(f"{self.label}: the source grew again; following it")
        if frames and self.spool is None:
            self._open_spool()
        pending = []
        if frames:
            assert self.spool is not None
            pending = [[self.spool.next_n + i, frame] for i, frame in enumerate(frames)]
        self.state["pending"] = pending
        self.state["cursor"] = self._cursor()
        if exit_code is not None and self.state["status"] is None:
            self.state["status"] = "finished" if exit_code == 0 else "failed"
        self._save()
        self._append(pending)
        if exit_code is not None:
            self._request_finish(f"wandb exit code {exit_code}")

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

    def _frames(self, table: Any) -> list[str]:
        from keel.transfer import _frames
        from wire import encode_rows

        skipped = self.state["skipped"]
        for (key, reason), count in table.skipped.items():
            slot = f"{key}\t{reason}"
            if slot not in skipped:
                self.say(f"{self.label}: values of {key!r} not stored: {reason} (counted)")
            skipped[slot] = skipped.get(slot, 0) + count
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
        """`text` as the server takes a name (wire's Limits): without NUL characters, and at
        most `max_name_length` characters: its start and a hash of the whole, so that it
        stays recognisable and two long names stay two. Said when it changes."""
        from wire import Limits

        limit = Limits().max_name_length
        fitted = text.replace("\x00", "")
        if len(fitted) > limit:
            fitted = f"{fitted[: limit - 9]}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"
        if fitted != text:
            self.say(f"{self.label}: the {what} ({len(text)} characters) is shortened to {fitted!r}: "
                     f"the server takes {limit} characters at most, and no NUL")  # fmt: skip
        return fitted

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
        if run is None or not self._welcomed:
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

    # -- spool and sender -----------------------------------------------------------------

    def _open_spool(self) -> None:
        from trainer_hooks.sender import Sender, SenderConfig
        from trainer_hooks.spool import Spool
        from wire import ProtocolError, RunInfo, hello_message, parse_hello

        raw = self.state["run"]
        info = RunInfo(id=raw["id"], name=raw["name"], project=raw["project"], group=raw["group"], config=raw["config"], tags=raw["tags"])
        self.spool = Spool.open(self.dir / "spool" / raw["id"], run=info, server_url=self.options.server)
        if self.state.get("writer") != self.spool.writer:
            self.state["writer"] = self.spool.writer  # the server numbers this source's frames by it
            self._save()
        self._append(self.state.get("pending") or [])  # frames a killed watcher saved but did not spool
        try:  # the server's own check of a hello: a run it fails is refused whenever it is sent
            parse_hello(hello_message(info))
        except ProtocolError as exc:
            self.say(f"{self.label}: the server would refuse this run ({exc}); not sent, its frames stay in {self.spool.path}")
            return
        self.sender = Sender(self.spool, self.options.server, token=self.options.token, config=SenderConfig(backoff_max=5.0))
        if self.state.get("status"):
            self.sender.request_finish(self.state["status"])

    def _append(self, pending: list[list[Any]]) -> None:
        spool = self.spool
        if spool is None:
            return
        for n, frame in pending:
            if n < spool.next_n:
                continue  # spooled before the last watcher stopped
            if n != spool.next_n:
                raise RuntimeError(f"{self.dir}: frame {n} saved, but the spool is at {spool.next_n}")
            spool.append(frame)

    def _request_finish(self, why: str) -> None:
        if self.sender is not None and self.state["status"]:
            self.sender.request_finish(self.state["status"])
            self.say(f"{self.label}: the source finished ({why}); marking the run {self.state['status']}")

    def _maybe_finish_idle(self, now: float) -> None:
        if (
            self.kind == "tensorboard"
            and self.sender is not None
            and self.state["status"] is None
            and self.reader.waiting == 0
            and now - self.state["last_growth"] >= self.options.finish_after
        ):
            self.state["status"] = "finished"
            self._save()
            self._request_finish(f"no new event for {self.options.finish_after:g} s")

    def pump(self) -> None:
        """Network work for this run, without waiting."""
        self._stream()
        self._follow_config()

    def _stream(self) -> None:
        from trainer_hooks.sender import ConnState

        sender, spool = self.sender, self.spool
        if sender is None or spool is None:
            return
        if not sender.settled and (spool.unacked > 0 or self.state["status"] or sender.state is ConnState.STREAMING):
            sender.step(0)
        spool.fsync_if_due(1.0)
        if sender.state in (ConnState.STREAMING, ConnState.FINISHING, ConnState.DONE):
            self._welcomed = True
        if sender.state is ConnState.DONE:
            self.state.update(done=True, pending=[])
            self._save()
            spool.close(remove=True)
            self.spool = self.sender = None
            self.say(f"{self.label}: {self.state['status']}; {self._summary()}")
        elif sender.state is ConnState.REJECTED and not self.state.get("rejected"):
            self.state["rejected"] = sender.last_error
            self._save()
            self.say(f"{self.label}: the server refused it ({sender.last_error}); its frames stay in {spool.path}")

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
        if self.sender is not None:
            self.sender.close()
        if self.spool is not None:
            self.spool.close()
        os.close(self._lock_fd)



class Watcher:
    """Finds sources under `paths` and follows each; `run()` until `stop()`."""

    def __init__(self, paths: list[Path], options: Options, *, interval: float = 0.5, scan_interval: float = 2.0,
                 say: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.paths = paths
        self.options = options
        self.interval = interval
        self.scan_interval = scan_interval
        self.followers: dict[tuple[str, Path], Follower] = {}
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
                for follower in list(self.followers.values()):
                    try:
                        follower.poll(now)
                    except (ValueError, OSError) as exc:  # a source that is not what its name says
                        self.say(f"{follower.label}: {exc}; no longer followed")
                        follower.close()
                        self.followers = {k: f for k, f in self.followers.items() if f is not follower}
                        self._refused.add((follower.kind, follower.source))
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
                        help="directories to follow: wandb/ directories or run directories, TensorBoard log directories")  # fmt: skip
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
                        help="mark a TensorBoard run finished after this many seconds without a new event (default 600)")  # fmt: skip


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
        "Follow wandb and TensorBoard logs live and stream them to Keel (any framework, no code).",
        _add_watch,
        _watch,
    ),
}
