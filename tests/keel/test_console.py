"""keel/console.py's reader of printed metrics, `keel import console` and `keel import csv`,
on lines the frameworks' own printing code writes (verl's LocalLogger, transformers'
PrinterCallback), and keel/redact.py against the server's own redaction."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import numpy as np
import pytest

from keel.console import ConsoleStream, LineParser, LineSplitter, read_console
from keel.importers import ImportSourceError, read_csv

RAY = "\x1b[36m(main_task pid=48213)\x1b[0m "


def verl_lines(rows: list[tuple[int, dict[str, object]]]) -> list[str]:
    """What verl 0.9.1's console logger prints: verl/utils/logger/aggregate_logger.py
    LocalLogger.log -> concat_dict_to_str (the `console` backend of verl/utils/tracking.py)."""
    from verl.utils.logger.aggregate_logger import LocalLogger

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for step, data in rows:
            LocalLogger(print_to_console=True).log(data, step=step)
    return out.getvalue().splitlines()


def hf_lines(logs: list[dict[str, object]]) -> list[str]:
    """What transformers' PrinterCallback prints per logging call (the Trainer's
    `disable_tqdm=True`; ProgressCallback writes the same str() through tqdm.write)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    out = io.StringIO()
    state = TrainerState()
    with contextlib.redirect_stdout(out):
        for log in logs:
            PrinterCallback().on_log(TrainingArguments(output_dir="/tmp/unused", report_to="none"), state, TrainerControl(), logs=dict(log))
    return out.getvalue().splitlines()


def test_verl_console_lines_behind_ray_prefix_and_colours() -> None:
    lines = verl_lines([
        (1, {"actor/pg_clipfrac": np.float64(0.001), "critic/score/mean": np.float64(0.53), "actor/entropy": float("nan"),
             "timing_s/step": 12, "response_length/max": np.int64(7), "rollout_corr/k3_kl": float("inf"), "tag": "text"}),
        (2, {"actor/pg_clipfrac": 0.25, "critic/score/mean": -0.5, "actor/grad_norm": 1.5e-3}),
    ])  # fmt: skip
    assert lines[0].startswith("step:1 - actor/pg_clipfrac:np.float64(0.001) - ")
    parser = LineParser()
    first, second = (parser.parse(RAY + line + " [repeated 2x across cluster]") for line in lines)
    assert first is not None and second is not None
    assert first.step == 1 and first.kind == "verl"
    assert first.values["actor/pg_clipfrac"] == 0.001 and first.values["critic/score/mean"] == 0.53
    assert math.isnan(first.values["actor/entropy"]) and first.values["rollout_corr/k3_kl"] == math.inf
    assert first.values["timing_s/step"] == 12.0 and first.values["response_length/max"] == 7.0
    assert "tag" not in first.values  # verl prints numbers only
    assert second.step == 2 and second.values == {"actor/pg_clipfrac": 0.25, "critic/score/mean": -0.5, "actor/grad_norm": 1.5e-3}

    stream = ConsoleStream("auto")
    named = stream.feed([RAY + line for line in lines]) + stream.close()
    assert stream.framework == "verl"
    assert named[0].values["reward/mean"] == 0.53 and named[0].values["policy/clip_frac"] == 0.001
    assert named[0].values["perf/step_s"] == 12.0 and named[0].values["response/length_max"] == 7.0
    assert named[1].values["grad/norm"] == 1.5e-3


def test_hugging_face_dicts_count_steps_and_take_wandbs_names() -> None:
    lines = hf_lines([
        {"loss": 0.0123456, "grad_norm": 1.23456, "learning_rate": 1e-5, "reward": 0.4, "reward_std": 0.2, "frac_reward_zero_std": 0.0,
         "kl": float("nan"), "entropy": 2.1, "epoch": 0.5},
        {"loss": 0.02, "grad_norm": 1.1, "learning_rate": 9e-6, "reward": 0.5, "kl": 0.01, "entropy": 2.0, "epoch": 1.0},
        {"eval_loss": 0.7, "epoch": 1.0},
        {"train_runtime": 12.5, "train_loss": 0.015, "epoch": 1.0},
        {"loss": 0.9, "grad_norm": 3.0, "learning_rate": 1e-5, "reward": 0.1, "kl": 0.0, "entropy": 2.5, "epoch": 0.5},
    ])  # fmt: skip
    assert lines[0].startswith("{'loss': '0.01235', 'grad_norm': '1.235'")  # floats as .4g strings
    stream = ConsoleStream("auto")
    named = stream.feed(lines) + stream.close()
    assert stream.framework == "trl", stream.why  # TRL's own names: reward_std, frac_reward_zero_std
    first, second, evaluation, summary, rerun = named
    assert (first.step, second.step, evaluation.step, summary.step) == (1, 2, 2, 2)
    assert first.values["loss/total"] == 0.01235 and first.values["grad/norm"] == 1.235
    assert first.values["reward/mean"] == 0.4 and first.values["policy/entropy"] == 2.1 and math.isnan(first.values["ref/kl"])
    assert first.values["optim/lr"] == 1e-5 and first.values["trl/epoch"] == 0.5
    assert evaluation.values == {"eval/loss": 0.7}  # the epoch is the training log's
    assert summary.values == {"trl/train_runtime": 12.5, "trl/train_loss": 0.015}
    assert not second.new_run and rerun.new_run and rerun.step == 1 and rerun.run == 1  # the epoch went back


def test_json_lines_pairs_and_runs_back_to_back() -> None:
    parser = LineParser()
    lines = [
        "loading weights...",
        '{"step": 3, "loss": NaN, "acc": 0.5, "note": "warmup"}',
        "[Step 12/500] loss=-0.32 reward_avg=0.125 kl: 1e-3 time=1.2s",
        "2026-01-02 10:00:00 INFO step=13 loss=0.3, lr: 1.0e-05 eta: 0:01:02",
        "Step 14: saving checkpoint to /tmp/ckpt-14",
        "iter 15 | loss 0.2 | grad_norm=inf",
        "step:3 - broken",
        "{'loss': 0.1, 'grad': tensor(0.5, device='cuda:0'), 'x': [1, 2], 'step': 16}",
        "{'loss': 0.1, 'step': 17,}}",
        "[Step 1/500] loss=-0.5",
    ]
    records = [parser.parse(line) for line in lines]
    assert [None if r is None else r.step for r in records] == [None, 3, 12, 13, None, 15, None, 16, None, 1]
    assert math.isnan(records[1].values["loss"]) and records[1].skipped == [("note", "text")]  # type: ignore[union-attr]
    assert records[2].values == {"loss": -0.32, "reward_avg": 0.125, "kl": 0.001}  # type: ignore[union-attr]
    assert records[3].values == {"loss": 0.3, "lr": 1e-5}  # type: ignore[union-attr]
    assert records[5].values == {"grad_norm": math.inf}  # type: ignore[union-attr]
    assert records[7].values == {"loss": 0.1, "grad": 0.5}  # type: ignore[union-attr]
    assert records[9].new_run and not any(r.new_run for r in records[:9] if r)  # type: ignore[union-attr]
    assert parser.unreadable == 2 and parser.first_unreadable == "step:3 - broken"

    resumed = LineParser(resume=True)
    assert [resumed.parse(f"step={s} loss=1").new_run for s in (5, 6, 1)] == [False, False, False]  # type: ignore[union-attr]


def test_splitter_ends_lines_at_carriage_returns_and_holds_partial_utf8() -> None:
    splitter = LineSplitter()
    data = "10%|█ | 1/10\r[Step 1/2] loss=0.5\n[Step 2/2] lo".encode()
    assert splitter.feed(data[:5]) == []
    assert splitter.feed(data[5:]) == ["10%|█ | 1/10", "[Step 1/2] loss=0.5"]
    assert splitter.feed(b"ss=0.25") == [] and splitter.close() == ["[Step 2/2] loss=0.25"]


def test_import_console_splits_a_log_of_two_runs(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    lines = verl_lines([(s, {"critic/score/mean": s / 10, "actor/pg_loss": -s}) for s in (1, 2, 3)])
    lines += ["some noise", "step:1 - critic/score/mean:np.float64(0.9)"]
    log.write_text("\n".join(RAY + line for line in lines) + "\n")
    first, second = read_console(log)
    assert first.framework == "verl" and first.name == "train/1" and second.name == "train/2"
    assert first.table.values == {1: {"reward/mean": 0.1, "loss/pg": -1.0}, 2: {"reward/mean": 0.2, "loss/pg": -2.0},
                                  3: {"reward/mean": 0.3, "loss/pg": -3.0}}  # fmt: skip
    assert second.table.values == {1: {"reward/mean": 0.9}}
    assert first.run_id != second.run_id and read_console(log)[1].run_id == second.run_id
    (only,) = read_console(log, resume=True, name="one")
    assert only.name == "one" and only.table.values[1] == {"reward/mean": 0.1, "loss/pg": -1.0}  # the first value kept
    with pytest.raises(ImportSourceError):
        read_console(tmp_path / "missing.log")
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(ImportSourceError, match="no line of metrics"):
        read_console(tmp_path / "empty.log")


def test_import_csv_with_a_step_column_a_run_column_and_wandbs_panel_export(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("global_step,loss,reward,note\n0,1.5,0.1,a\n1,nan,0.2,b\n2,1.0,inf,c\n")
    (run,) = read_csv(plain)
    assert run.name == "plain" and run.table.values[0] == {"loss": 1.5, "reward": 0.1}
    assert math.isnan(run.table.values[1]["loss"]) and run.table.values[2]["reward"] == math.inf
    assert run.table.skipped[("note", "text")] == 3

    by_run = tmp_path / "sweep.csv"
    by_run.write_text("it,seed,loss\n0,a,1\n1,a,2\n0,b,3\n")
    a, b = read_csv(by_run, step_column="it", run_column="seed")
    assert (a.name, b.name) == ("sweep/a", "sweep/b")
    assert a.table.values == {0: {"loss": 1.0}, 1: {"loss": 2.0}} and b.table.values == {0: {"loss": 3.0}}
    with pytest.raises(ImportSourceError, match="--step-column"):
        read_csv(by_run)

    panel = tmp_path / "wandb_export.csv"
    panel.write_text(
        '"Step","grpo-a - train/reward","grpo-a - train/reward__MIN","grpo-a - train/reward__MAX","grpo-b - train/reward"\n'
        "1,0.25,0.2,0.3,0.5\n2,0.375,0.3,0.4,\n"
    )
    a, b = read_csv(panel, framework="trl")
    assert (a.name, b.name) == ("grpo-a", "grpo-b")
    assert a.table.values == {1: {"reward/mean": 0.25}, 2: {"reward/mean": 0.375}} and b.table.values == {1: {"reward/mean": 0.5}}
    assert a.config["keel_import"]["source"] == "wandb-panel" and "__MIN/__MAX" in a.not_imported[0]


def test_command_lines_are_masked_like_the_servers_logs() -> None:
    from keel.redact import redact, redact_argv

    argv = ["python", "train.py", "--hf_token=hf_abcdefghijklmnopqrstuvwxyz0123456789", "--api-key", "s3cr3t",
            "--db", "postgresql://u:pw@h/db", "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "--lr", "1e-6",
            "--token", "--next", "sk-proj-abcdefghijklmnopqrstuvwx"]  # fmt: skip
    assert redact_argv(argv) == ["python", "train.py", "--hf_token=***", "--api-key", "***", "--db",
                                 "postgresql://u:***@h/db", "WANDB_API_KEY=***", "--lr", "1e-6", "--token", "--next", "***"]  # fmt: skip
    from server.redaction import redact as server_redact

    for text in ("GET /api/v1/runs?token=abc&x=1", "Authorization: Bearer keel_" + "a" * 43, "pg://u:p@h", "whsec_" + "b" * 20):
        assert redact(text) == server_redact(text), text
