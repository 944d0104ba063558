"""`keel watch`: follow a trainer's wandb and TensorBoard logs, or the file its console output
goes to, live: one Keel run per source run.

    keel watch ./wandb ./tb_logs --server http://keel-host:8750
    keel watch train.log --server http://keel-host:8750

This module holds the command: its arguments, the search for sources (`discover`) and the
loop that reads and streams them (`Watcher`). What follows one source lives beside it: a wandb
or TensorBoard log in keel/watch_tracker.py (`Follower`), a console log in
keel/watch_console.py (`ConsoleFollower`), and what both share (the options, a source's state
directory and lock, `Lane`: one Keel run's spool and Sender; the state's format and why a
killed watcher loses and repeats nothing) in keel/watch_lane.py.

Every wandb run directory (`offline-run-*`, and `run-*` of online runs: wandb writes the same
transaction log `run-<id>.wandb` in both modes) and every directory holding TensorBoard
event files under the paths is followed, those that appear later included (the paths are
scanned again every `--scan-interval` seconds). A file named on the command line (not a
`.wandb` one, nor an event file) is a console log. Each source run becomes one Keel run, named
after it; its metrics are renamed by the framework's name map
(trainer_hooks/integrations/names.py), chosen with `--framework` or recognised (`auto`).

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from keel.watch_console import ConsoleFollower
from keel.watch_lane import Options, default_state_root
from keel.watch_tracker import Follower

__all__ = ["COMMANDS", "Options", "Watcher", "default_state_root"]


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
