"""`keel watch` of what a tracker writes: `Follower`, one wandb run's transaction log
(`run-<id>.wandb`, offline or online) or one directory of TensorBoard event files, followed
into one Keel run (a `Lane`, keel/watch_lane.py) named after it, with its config; its metrics
renamed by the framework's name map (trainer_hooks/integrations/names.py), chosen with
`--framework` or recognised (`auto`). It is apart from the scan loop (keel/watch.py) and from
the console log's follower (keel/watch_console.py): each of these sources feeds one run, and
carries a config that is followed as it changes.

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

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.watch_lane import (
    STATE_FILE,
    STATE_FORMAT,
    Lane,
    Options,
    claim_source,
    count_skipped,
    fit_name,
    write_atomic,
)

if TYPE_CHECKING:
    from keel.config_push import ConfigPush, Sent
    from keel.importers import PointTable, Renamer
    from keel.readers import TensorboardReader, WandbReader

__all__ = ["Follower"]


class Follower:
    """One wandb run or TensorBoard event directory: its reader, its state, its Lane (spool and
    Sender) and its config updates."""

    def __init__(self, kind: str, source: Path, root: Path, options: Options, say: Callable[[str], None]) -> None:
        self.kind = kind
        self.source = source.resolve()
        self.root = root
        self.options = options
        self.say = say
        if kind == "wandb" and not self.source.is_relative_to(root.resolve()):
            raise RuntimeError(f"a symbolic link to {self.source}, outside the watched {root.resolve()}")
        self.dir, self._lock_fd = claim_source(kind, self.source, options)
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
        write_atomic(self.dir / STATE_FILE, self.state)

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

        count_skipped(self.state, table.skipped, lambda text: self.say(f"{self.label}: {text}"))
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
        return fit_name(text, what, lambda line: self.say(f"{self.label}: {line}"))

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
