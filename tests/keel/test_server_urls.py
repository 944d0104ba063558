"""`keel import`, `keel export` and `keel.client.Client` against a real server given as a ws://
URL (the Monitor's own form, wire/urls.py): each reaches the same server as with http://."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from keel.cli import main as keel
from keel.client import Client


def test_import_export_and_the_client_take_the_server_as_a_ws_url(server_factory, sqlite_url, tmp_path: Path, capsys) -> None:
    server = server_factory(sqlite_url)
    socket_url = server.url.replace("http://", "ws://", 1)
    history = tmp_path / "sparse.csv"
    history.write_text("_step,a\n0,1.0\n1,2.0\n")

    assert keel(["import", "wandb", str(history), "--server", f"{socket_url}/api/v1/ingest"]) == 0, capsys.readouterr().err
    history.write_text("_step,a\n0,1.0\n1,2.0\n2,3.5\n")  # the run is finished: the new point is POSTed
    assert keel(["import", "wandb", str(history), "--server", f"{socket_url}/"]) == 0, capsys.readouterr().err
    capsys.readouterr()

    assert keel(["export", "sparse", "--server", f"{socket_url}/api/v1", "-o", "-"]) == 0, capsys.readouterr().err
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [["step", "a"], ["0", "1.0"], ["1", "2.0"], ["2", "3.5"]]

    client = Client(socket_url)
    assert client.base == f"{server.url}/api/v1"
    (run,) = client.runs()
    assert run["name"] == "sparse" and run["status"] == "finished"
    series = client.series(run["id"], "a")
    assert series.steps.tolist() == [0, 1, 2] and series.values.tolist() == [1.0, 2.0, 3.5]


def test_every_command_that_must_reach_a_server_defaults_to_keel_url_else_the_local_one() -> None:
    """`--server` means one thing everywhere: left out, `$KEEL_URL`, else the local server.
    The corpus commands (grid, lm-grid, lm-corpus) run offline and only
    *also* stream when given one: their --server has no default."""
    import argparse

    from keel.cli import build_parser
    from wire.urls import DEFAULT_SERVER_URL

    parser = build_parser()
    (sub,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    reach, offline = set(), set()

    def walk(name: str, command: argparse.ArgumentParser) -> None:
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:
            for child, child_parser in action.choices.items():
                walk(f"{name} {child}", child_parser)
        for action in command._actions:
            if "--server" in action.option_strings:
                assert action.default is None and not action.required, name
                said = action.help or ""
                (reach if f"$KEEL_URL, else {DEFAULT_SERVER_URL})" in said else offline).add(name)

    for name, command in sub.choices.items():
        walk(name, command)
    assert {"lm", "parity", "run", "watch", "import wandb", "export", "sim", "sync"} <= reach, reach
    assert offline == {"grid", "lm-grid", "lm-corpus"}, offline
