"""`keel watch` of a console log: `ConsoleFollower`, a file a trainer's console output is
written to, read as `keel run` reads a command's output (keel/console.py), each run in it (a
step that goes back to 0 or 1 starts the next, unless `--resume`) a Keel run of its own, a
`Lane` each (keel/watch_lane.py). It is apart from the wandb and TensorBoard follower
(keel/watch_tracker.py) because one log feeds many runs, and its cursor is the byte offset
and the stream's state (keel/console.py ConsoleStream.snapshot) rather than a reader's alone.

A console log's last run is finished when the log has not grown for `--finish-after` seconds
(and reopened if it grows again); an earlier one when the next begins.

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import hashlib
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
    from keel.console import Named
    from keel.importers import PointTable
    from keel.readers import ConsoleLogReader

__all__ = ["DECIDE_AFTER", "ConsoleFollower"]

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
        self.dir, self._lock_fd = claim_source(self.kind, source.absolute(), options)
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
        write_atomic(self.dir / STATE_FILE, self.state)

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
        count_skipped(self.state, stream.table.skipped, lambda text: self.say(f"{self.label}: {text}"))
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
        name = fit_name(stem if index == 0 else f"{stem} ({index + 1})", "run name", say)
        source = {"source": "console", "path": str(self.path.absolute()), "run": index + 1, "framework": self.stream.framework}
        run = {
            "id": run_id_for(f"console/{self.path.name}/{index}/{digest}"), "name": name, "project": self.options.project,
            "group": self.options.group, "config": {"keel_watch": source},
            "tags": list(dict.fromkeys(tag for tag in (fit_name(tag, "tag", say) for tag in self.options.tags) if tag)),
        }  # fmt: skip
        entry: dict[str, Any] = {"run": run, "pending": [], "status": None, "done": False, "points": 0}
        self.state["runs"].append(entry)
        self.lanes.append(self._lane(entry))
        self.say(f"{self.label}: following {self.path} (its run {index + 1}) as run {run['id']} on {self.options.server}")

    def _frames(self, lane: Lane, table: PointTable) -> list[str]:
        from keel.transfer import _frames
        from wire import encode_rows

        count_skipped(self.state, table.skipped, lambda text: self.say(f"{lane.label()}: {text}"))
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
