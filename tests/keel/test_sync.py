"""`keel sync` against a real server: what a trainer chose (its run's id) is said escaped on
the command's own line (issue 48). Its uploads are tests/trainer_hooks/test_monitor_sync.py's."""

from __future__ import annotations

import json
from pathlib import Path

from keel.cli import main
from trainer_hooks.spool import Spool
from wire import RunInfo


def test_keel_sync_says_a_run_id_a_trainer_chose_on_its_own_line(server_factory, database_url, tmp_path: Path, capsys) -> None:
    server = server_factory(database_url)
    forged = "keel sync: run 'x' (y): 0 frame(s) uploaded to nowhere, status finished"
    spool = Spool.open(tmp_path / "odd", run=RunInfo(id=f"id\r\n{forged}\x1b[2K", name="odd"), server_url=server.url)
    spool.append(json.dumps([{"step": 0, "values": {"m": 1.0}}]))
    spool.close()
    capsys.readouterr()
    assert main(["sync", str(tmp_path / "odd")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("keel sync: run 'odd' (id\\r\\nkeel sync:"), lines
