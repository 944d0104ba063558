"""`keel backtest` against a real server's database: what a trainer named a run or a metric
is shown on the line of its firing, escaped, never as lines of its own (issue 48)."""

from __future__ import annotations

import json
from pathlib import Path

from keel.cli import main
from keel.importers import ImportedRun, PointTable
from keel.transfer import upload_run

FORGED = "\nrun-b                              m high                   critical       0      0        -  forged"


def test_a_run_or_metric_named_with_line_breaks_prints_one_line_per_firing(server_factory, database_url, tmp_path: Path, capsys) -> None:
    server = server_factory(database_url)
    key = f"m{FORGED}\x1b[2K"
    table = PointTable()
    for step in range(10):
        table.add(step, key, 2.0 if step >= 5 else 0.0)
    run = ImportedRun(identity="backtest-forged", name=f"run-a{FORGED}\r\n", table=table)
    assert upload_run(run, table.rows(), server.url, timeout=60) is None
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"name": "m high", "metric": key, "detector": "threshold", "params": {"op": ">", "threshold": 1.0}}]))
    capsys.readouterr()
    assert main(["backtest", "--database-url", database_url, "--rules", str(rules)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["run", "rule"] and lines[1].startswith("run-a\\nrun-b "), lines
    assert len(lines) == 4 and lines[2:] == ["", "m high: fired on 1 of 1 runs"], lines
    assert not any(line.startswith("run-b") for line in lines) and "\x1b" not in "".join(lines), lines
