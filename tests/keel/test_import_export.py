"""`keel import tensorboard|wandb` and `keel export` against a real server, on fixtures
written by TensorBoard's and wandb's own writers (offline, no network)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from keel.client import Client
from keel.importers import run_id_for
from keel.transfer import COMMANDS
from tests.support.raw_client import hello, open_ingest


def keel(*argv: str | Path) -> int:
    """The import and export commands, parsed as `keel` parses them."""
    parser = argparse.ArgumentParser(prog="keel")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        add_arguments(command)
        command.set_defaults(_run=run)
    args = parser.parse_args([str(arg) for arg in argv])
    return int(args._run(args))


def _write_tensorboard(logdir: Path, run: str, steps: range, *, walltime: float = 1_700_000_000.0) -> None:
    """Legacy scalars, a TF2-style scalar tensor, a histogram and text, via torch's writer."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(logdir / run)) as writer:
        for step in steps:
            writer.add_scalar("loss", 1.0 / (step + 1), step, walltime=walltime + step)
            writer.add_scalar("grad/norm", math.inf if step == 3 else math.nan if step == 4 else step * 0.5, step)
            tensor = TensorProto(dtype=2, double_val=[step * 0.25])  # DT_DOUBLE, no float32 rounding
            metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
            summary = Summary(value=[Summary.Value(tag="eval/score", tensor=tensor, metadata=metadata)])
            writer._get_file_writer().add_summary(summary, step, walltime + step)
        writer.add_histogram("weights", np.arange(10.0), 0)
        writer.add_text("notes", "hello", 0)


def _points(client: Client, run_id: str) -> dict[str, int]:
    return {info["key"]: info["count"] for info in client.keys(run_id)}


def test_tensorboard_runs_import_once_however_often_they_are_imported(server, tmp_path: Path, capsys) -> None:
    logdir = tmp_path / "cispo"
    _write_tensorboard(logdir, "seed0", range(6))
    _write_tensorboard(logdir, "seed1", range(3))

    assert keel("import", "tensorboard", logdir, "--server", server.url, "--group", "baselines") == 0
    out = capsys.readouterr().out
    assert "not imported: histograms 'weights'" in out and "not imported: text 'notes/text_summary'" in out
    client = Client(server.url)
    runs = {run["name"]: run for run in client.runs()}
    assert set(runs) == {"cispo/seed0", "cispo/seed1"}
    assert {run["group"] for run in runs.values()} == {"baselines"}
    seed0 = runs["cispo/seed0"]["id"]
    assert _points(client, seed0) == {"eval/score": 6, "grad/norm": 6, "loss": 6}

    loss = client.series(seed0, "loss")
    assert loss.steps.tolist() == list(range(6))
    np.testing.assert_array_equal(loss.values, np.float32([1.0 / (s + 1) for s in range(6)]))
    grad = client.series(seed0, "grad/norm").values
    assert grad[3] == math.inf and math.isnan(grad[4]) and grad[2] == 1.0
    assert client.series(seed0, "eval/score").values.tolist() == [s * 0.25 for s in range(6)]

    assert keel("import", "tensorboard", logdir, "--server", server.url) == 0
    assert len(client.runs()) == 2 and _points(client, seed0) == {"eval/score": 6, "grad/norm": 6, "loss": 6}

    # The run went on in a new event file of the same directory: the same run, new steps only.
    _write_tensorboard(logdir, "seed0", range(6, 9), walltime=1_800_000_000.0)
    assert keel("import", "tensorboard", logdir / "seed0", "--server", server.url) == 0
    assert len(client.runs()) == 2 and _points(client, seed0) == {"eval/score": 9, "grad/norm": 9, "loss": 9}
    assert client.series(seed0, "loss").values[:6].tolist() == loss.values.tolist()


_WANDB_RUN = """
import math, wandb
run = wandb.init(mode="offline", dir={dir!r}, project="rl", name="ppo-s0", id="abc123",
                 config={{"lr": 3e-4, "model": {{"layers": 2}}}}, tags=["baseline"])
for step in range(5):
    wandb.log({{"loss": 1.0 / (step + 1), "kl": math.nan if step == 2 else math.inf if step == 3 else step,
               "note": "text", "done": step == 4, "nested": {{"x": step * 2}}}}, step=step * 10)
run.finish()
"""


def _write_wandb_offline_run(root: Path) -> Path:
    """A real offline run, written by wandb itself in a child process (no network, no state here)."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_DIR": str(root)}
    script = _WANDB_RUN.format(dir=str(root))
    child = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    (run_dir,) = (root / "wandb").glob("offline-run-*")
    return run_dir


def test_a_wandb_offline_run_imports_its_history_config_and_tags_once(server, tmp_path: Path, capsys) -> None:
    run_dir = _write_wandb_offline_run(tmp_path)

    assert keel("import", "wandb", run_dir, "--server", server.url, "--project", "old") == 0
    out = capsys.readouterr().out
    assert "5 value(s) of 'note': text" in out and "5 value(s) of 'done': a boolean, not a number" in out
    client = Client(server.url)
    (run,) = client.runs()
    assert run["id"] == run_id_for("wandb/rl/abc123")
    assert (run["name"], run["project"], run["tags"], run["status"]) == ("ppo-s0", "old", ["baseline"], "finished")
    config = client.run(run["id"])["config"]
    assert config["lr"] == 3e-4 and config["model"] == {"layers": 2}
    assert config["keel_import"]["wandb_id"] == "abc123"
    assert _points(client, run["id"]) == {"kl": 5, "loss": 5, "nested.x": 5}
    kl = client.series(run["id"], "kl")
    assert kl.steps.tolist() == [0, 10, 20, 30, 40]
    assert kl.values[1] == 1.0 and math.isnan(kl.values[2]) and kl.values[3] == math.inf
    assert client.series(run["id"], "nested.x").values.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]

    # The wandb/ directory holding it: the same run again, nothing added.
    assert keel("import", "wandb", tmp_path / "wandb", "--server", server.url, "--project", "old") == 0
    assert len(client.runs()) == 1 and _points(client, run["id"]) == {"kl": 5, "loss": 5, "nested.x": 5}

    assert keel("import", "wandb", run_dir, "--server", server.url) == 1  # the run is in "old"
    assert "imported into project 'old' before" in capsys.readouterr().err
    assert [run["project"] for run in client.runs()] == ["old"]


def test_wandb_history_exports_in_csv_and_json_lines(server_factory, sqlite_url, tmp_path: Path, capsys) -> None:
    server = server_factory(sqlite_url)
    history = tmp_path / "ppo-history.csv"
    history.write_text(
        "_step,_timestamp,_runtime,loss,kl,phase\n"
        "0,1700000000.5,1.0,1.5,nan,warmup\n"
        "1,1700000001.5,2.0,,inf,warmup\n"
        "2,1700000002.5,3.0,0.5,-inf,main\n"
    )
    lines = tmp_path / "ppo-history.jsonl"
    lines.write_text("\n".join(json.dumps(row) for row in [{"_step": 0, "r": 1}, {"_step": 5, "r": {"mean": 2.5}}]))

    assert keel("import", "wandb", history, "--server", server.url, "--name", "ppo-baseline") == 0
    assert "3 value(s) of 'phase': text" in capsys.readouterr().out
    assert keel("import", "wandb", lines, "--server", server.url) == 0
    assert keel("import", "wandb", history, "--server", server.url) == 0  # again: a no-op

    client = Client(server.url)
    assert sorted(run["name"] for run in client.runs()) == ["ppo-baseline", "ppo-history"]
    assert _points(client, "ppo-baseline") == {"kl": 3, "loss": 2}
    kl = client.series("ppo-baseline", "kl").values
    assert math.isnan(kl[0]) and kl[1] == math.inf and kl[2] == -math.inf
    assert client.series("ppo-baseline", "loss").steps.tolist() == [0, 2]
    assert _points(client, "ppo-history") == {"r": 1, "r.mean": 1}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tensorboard", "{tmp}/nowhere"], "is not a directory"),
        (["tensorboard", "{tmp}"], "no TensorBoard event files"),
        (["wandb", "{tmp}"], "no wandb run file"),
        (["wandb", "{tmp}/missing.csv"], "does not exist"),
        (["wandb", "{tmp}/no-step.csv"], "no '_step' column"),
        (["wandb", "{tmp}/bad.wandb"], "not a wandb transaction log"),
    ],
)
def test_a_source_that_cannot_be_imported_exits_2_and_says_why(
    argv: list[str], message: str, tmp_path: Path, capsys
) -> None:
    (tmp_path / "no-step.csv").write_text("loss\n1.0\n")
    (tmp_path / "bad.wandb").write_bytes(b"not wandb")
    assert keel("import", *[arg.format(tmp=tmp_path) for arg in argv], "--dry-run") == 2
    assert message in capsys.readouterr().err


def test_tensorboard_logs_without_tensorboard_installed_exit_2_and_say_what_to_install(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    from keel.readers import ReaderNotInstalled, TensorboardReader
    from wire import KeelError

    _write_tensorboard(tmp_path, "run-a", range(3))
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto.event_pb2", None)  # import fails
    with pytest.raises(ReaderNotInstalled) as raised:
        TensorboardReader(str(tmp_path / "run-a"))
    assert isinstance(raised.value, KeelError)
    assert keel("import", "tensorboard", tmp_path, "--dry-run") == 2
    assert "reading TensorBoard logs needs `pip install tensorboard`" in capsys.readouterr().err


def test_a_torn_wandb_file_imports_what_it_holds_and_says_what_it_could_not_read(tmp_path: Path, capsys) -> None:
    run_dir = _write_wandb_offline_run(tmp_path)
    (log,) = run_dir.glob("run-*.wandb")
    data = log.read_bytes()
    log.write_bytes(data[: len(data) - 20])  # killed mid-write: the last record is cut
    assert keel("import", "wandb", run_dir, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "(dry run, not uploaded)" in out and "unreadable: a run killed mid-write?" in out


def test_export_writes_every_point_as_csv_and_parquet(server, tmp_path: Path, capsys, monkeypatch) -> None:
    logdir = tmp_path / "tb"
    _write_tensorboard(logdir, "run", range(5))
    (tmp_path / "sparse.csv").write_text("_step,a,b\n0,1.0,\n1,,nan\n3,2.5,\n")
    assert keel("import", "wandb", tmp_path / "sparse.csv", "--server", server.url) == 0
    assert keel("import", "tensorboard", logdir, "--server", server.url) == 0
    capsys.readouterr()

    assert keel("export", "sparse", "--server", server.url, "-o", "-") == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    # An empty cell is a step the key was not logged at; "nan" is a NaN that was logged.
    assert table == [["step", "a", "b"], ["0", "1.0", ""], ["1", "", "nan"], ["3", "2.5", ""]]

    target = tmp_path / "out.parquet"
    assert keel("export", "sparse", "--server", server.url, "--format", "parquet", "-o", target) == 0
    import pyarrow.parquet as pq

    columns = pq.read_table(target).to_pydict()
    assert columns["step"] == [0, 1, 3] and columns["a"] == [1.0, None, 2.5]
    assert columns["b"][0] is None and math.isnan(columns["b"][1]) and columns["b"][2] is None

    monkeypatch.chdir(tmp_path)  # the default output is <run name>.csv in the working directory
    assert keel("export", "run", "--server", server.url, "--keys", "grad/norm,loss") == 0
    rows = list(csv.reader((tmp_path / "run.csv").open()))
    assert rows[0] == ["step", "grad/norm", "loss"] and [row[1] for row in rows[1:]] == ["0.0", "0.5", "1.0", "inf", "nan"]

    assert keel("export", "run", "--server", server.url, "--keys", "nope") == 2
    assert "has no key(s) 'nope'" in capsys.readouterr().err
    assert keel("export", "missing", "--server", server.url) == 2
    assert "no run with id or name 'missing'" in capsys.readouterr().err


def test_an_export_is_no_spreadsheet_formula_and_a_terminal_shows_names_as_text(server, tmp_path: Path, capsys) -> None:
    """A key that begins as a formula is a text cell in the CSV (a negative number stays a
    number); a run name with terminal controls reaches the terminal escaped, whatever the
    command prints it."""
    (tmp_path / "formula.csv").write_text('_step,"=HYPERLINK(""http://x"",""y"")",-loss\n0,-1.5,2\n')
    assert keel("import", "wandb", tmp_path / "formula.csv", "--server", server.url, "--name", "evil\x1b[2K\rSAME\u202e") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "evil\\x1b[2K\\rSAME\\u202e" in out, out
    assert keel("export", "evil\x1b[2K\rSAME\u202e", "--server", server.url, "-o", tmp_path / "out.csv") == 0
    rows = list(csv.reader((tmp_path / "out.csv").open()))
    assert rows == [["step", "'-loss", "'=HYPERLINK(\"http://x\",\"y\")"], ["0", "2.0", "-1.5"]], rows


def test_export_says_a_run_id_a_trainer_chose_on_its_own_line(server, tmp_path: Path, capsys) -> None:
    """A run's id is the trainer's too: keel export names it escaped on its line (issue 48)."""
    from keel.cli import main
    from tests.support.raw_client import new_run, points, recv

    forged = "keel export: run 'x' (y): 0 key(s) at 0 step(s) to nowhere"
    run = new_run("odd-id", id=f"id\r\n{forged}\x1b[2K")
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": {"m": 1.0}}]))
        assert recv(ws)["type"] == "ack"
    capsys.readouterr()
    assert main(["export", "odd-id", "--server", server.url, "-o", str(tmp_path / "odd.csv")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("keel export: run 'odd-id' (id\\r\\nkeel export:"), lines


def test_export_writes_the_step_details_as_rows_a_server_takes_back(server, tmp_path: Path, capsys) -> None:
    import httpx

    (tmp_path / "detailed.csv").write_text("_step,a\n0,1.0\n1,2.0\n")
    assert keel("import", "wandb", tmp_path / "detailed.csv", "--server", server.url) == 0
    client = Client(server.url)
    run_id = client.run("detailed")["id"]
    sent = [
        {"step": step, "values": {}, "histograms": {"h": {"edges": [0, 1], "counts": [step], "nan": 1}, "g": {"edges": [-1, 1], "counts": [2]}},
         "samples": [{"seq_id": "s", "advantage": "-inf", "tokens": ["é", "\u0000"], "token_ids": [1, 2]}],
         "sequences": {"length": [3, 4], "log_ratio": [0.5, "nan"]}}
        for step in range(3)
    ]
    assert httpx.post(f"{server.url}/api/v1/runs/{run_id}/points", json={"rows": sent}).status_code == 200
    capsys.readouterr()

    assert keel("export", "detailed", "--server", server.url, "-o", tmp_path / "out.csv") == 0
    assert "12 step detail(s) to" in capsys.readouterr().err
    lines = (tmp_path / "out.details.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 * 4  # two histograms, the samples and the sequences of each step

    # The lines are wire rows: posted to another run, that run reads back the same details.
    with httpx.Client(base_url=f"{server.url}/api/v1") as http:
        copy = {"id": "copy", "name": "copy", "project": "default"}
        with open_ingest(server) as ws:
            hello(ws, copy)
        assert http.post("/runs/copy/points", json={"rows": [json.loads(line) for line in lines]}).status_code == 200
        for path, params in (("distributions", {"key": "h"}), ("distributions", {"key": "g"}), ("samples", {"step": 1}), ("sequences", {})):
            assert http.get(f"/runs/copy/{path}", params=params).json() == http.get(f"/runs/{run_id}/{path}", params=params).json()
    assert list(client.details("copy")) == list(client.details(run_id))

    assert keel("export", "detailed", "--server", server.url, "-o", tmp_path / "bare.csv", "--no-details") == 0
    assert not (tmp_path / "bare.details.jsonl").exists()
    assert keel("export", "detailed", "--server", server.url, "-o", "-", "--details", tmp_path / "d.jsonl") == 0
    assert len((tmp_path / "d.jsonl").read_text(encoding="utf-8").splitlines()) == 12
    assert keel("export", "sparse-or-not", "--server", server.url, "-o", "-") == 2  # unknown run: as before


def test_the_commands_module_imports_only_the_standard_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        import keel.transfer
        heavy = {"tensorboard", "wandb", "numpy", "pandas", "pyarrow", "torch", "websockets"}
        print(sorted(heavy & set(sys.modules)))
        """
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert child.stdout.strip() == "[]"


def test_an_old_verl_entropy_name_is_the_entropy_unless_the_current_one_is_logged_beside_it(tmp_path: Path) -> None:
    """verl <= 0.4 logged the entropy only as actor/entropy_loss: imported, it is policy/entropy.
    verl 0.9.1 logs it beside actor/entropy: then actor/entropy is policy/entropy, and the old
    name keeps verl's prefix (one run never puts two numbers under one Keel name)."""
    from keel.importers import read_wandb

    old = tmp_path / "old.csv"
    old.write_text("_step,actor/entropy_loss,critic/score/mean\n0,0.5,0.1\n1,0.4,0.2\n")
    (run,) = read_wandb(old, framework="verl")
    assert run.table.values == {0: {"policy/entropy": 0.5, "reward/mean": 0.1}, 1: {"policy/entropy": 0.4, "reward/mean": 0.2}}
    new = tmp_path / "new.csv"
    new.write_text("_step,actor/entropy_loss,actor/entropy,critic/score/mean\n0,0.6,0.5,0.1\n")
    (run,) = read_wandb(new, framework="verl")
    assert run.table.values == {0: {"verl/actor/entropy_loss": 0.6, "policy/entropy": 0.5, "reward/mean": 0.1}}
    assert not run.table.skipped
