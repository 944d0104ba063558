"""`keel sync`: upload the spools a trainer left behind (server away, process killed).

Standard library only at module level (see keel/cli.py): `keel sync` must work on a
GPU node with neither the server's dependencies nor torch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["COMMANDS"]


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


def _add_sync(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        type=Path,
        help="a run spool (…/<run_id>) or a directory of them (default root: ~/.keel/spool)",
    )
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument(
        "--server", default=None,
        help=f"Keel server URL (default: the one the trainer used, else $KEEL_URL, else {DEFAULT_SERVER_URL})",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=None, help="API token with ingest scope (default: $KEEL_TOKEN)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to keep trying per run before giving up (default 120)",
    )


def _sync(args: argparse.Namespace) -> int:
    from keel.cli import one_line
    from trainer_hooks.sender import ConnState, upload
    from trainer_hooks.spool import Spool, SpoolBusyError, find_spools
    from wire.urls import default_server

    _setup_logging()
    spools = find_spools(args.path.expanduser())
    if not spools:
        print(f"keel sync: no run spool in {args.path}", file=sys.stderr)
        return 1
    token = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
    failures = 0
    for path in spools:
        try:
            spool = Spool.open(path)
        except (SpoolBusyError, OSError, ValueError) as exc:
            print(f"keel sync: skipping {path}: {exc}", file=sys.stderr)
            failures += 1
            continue
        run = spool.run
        server_url = args.server or spool.server_url or default_server()
        # A spool without a recorded status belongs to a trainer that died before finish().
        status = spool.status or "killed"
        frames = spool.unacked
        sender = upload(spool, server_url, status=status, token=token, timeout=args.timeout)
        done = sender.state is ConnState.DONE
        spool.close(remove=done)
        if done:
            print(
                f"keel sync: run {run.name!r} ({one_line(run.id)}): {frames} frame(s) uploaded to "
                f"{server_url}, status {status}"
            )
        else:
            failures += 1
            print(
                f"keel sync: run {run.name!r} ({one_line(run.id)}) not uploaded ({one_line(str(sender.last_error))}); "
                f"{spool.unacked} frame(s) kept in {path}",
                file=sys.stderr,
            )
    return 1 if failures else 0


COMMANDS = {
    "sync": (
        "Upload the spool a trainer left behind (server away, process killed).",
        _add_sync,
        _sync,
    ),
}
