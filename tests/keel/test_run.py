"""`keel run -- CMD` against a real `keel serve`: the child's output passed through byte for
byte, its printed metrics streamed, its exit status the run's; a stop command ending a child
that ignores SIGINT; Ctrl-C at a real (pseudo-)terminal; a real TRL GRPOTrainer whose script
has no line of Keel, its logged values stored exactly as TRL printed them."""

from __future__ import annotations

import json
import math
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.monitor import wait_until
from tests.support.server import REPO_ROOT, ServerProcess, keel_serve
from tests.support.stored_runs import run_named, stored


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("keel-run-server")
    process = keel_serve(f"sqlite:///{tmp / 'keel.db'}", tmp / "server.log", "--log-level", "warning")
    process.start()
    yield process
    process.stop()


def keel_run(url: str, tmp: Path, name: str, *command: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "keel", "run", "--server", url, "--name", name, "--finish-timeout", "20", *extra, "--", *command]


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "KEEL_SPOOL_DIR": str(tmp / "spool")}


def script(tmp: Path, name: str, code: str) -> str:
    path = tmp / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def runs_named(url: str, name: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/runs").json()
    return [run for run in (body["items"] if isinstance(body, dict) else body) if run["name"] == name]


def test_output_passes_through_unchanged_and_a_failure_is_recorded(server: ServerProcess, tmp_path: Path) -> None:
    out = b"\x1b[32m[Step 1/3]\x1b[0m loss=0.5 reward=0.25\nprogress 10%\rprogress 50%\r[Step 2/3] loss=nan reward=0.5\n"
    err = b"Traceback (most recent call last):\n  File \"train.py\"\n\x1b[31mValueError: boom\x1b[0m\n"
    child = script(tmp_path, "train.py", f"""
        import os, sys, time
        os.write(1, {out[:40]!r}); time.sleep(0.2)
        os.write(2, {err[:30]!r}); os.write(1, {out[40:]!r}); os.write(2, {err[30:]!r})
        sys.exit(3)
    """)  # fmt: skip
    done = subprocess.run(keel_run(server.url, tmp_path, "passthrough", sys.executable, child, "--api-key", "hunter22",
                                   "--hf_token=hf_abcdefghijklmnopqrstuvwxyz0123456789"),  # fmt: skip
                          cwd=REPO_ROOT, env=env_for(tmp_path), capture_output=True, timeout=120)  # fmt: skip
    assert done.returncode == 3, done.stderr.decode()
    assert done.stdout == out  # exactly the child's bytes: keel run's own words go to stderr
    assert err in done.stderr
    assert b"run 'passthrough'" in done.stderr and b"failed, exit 3" in done.stderr

    run = run_named(server.url, "passthrough")
    assert run["status"] == "failed"
    assert stored(server.url, run["id"], "reward") == {1: 0.25, 2: 0.5}
    loss = stored(server.url, run["id"], "loss")
    assert loss[1] == 0.5 and math.isnan(loss[2])
    keel_run_config = wait_until(lambda: run_named(server.url, "passthrough")["config"]["keel_run"].get("exit") and
                                 run_named(server.url, "passthrough")["config"]["keel_run"], 20, "the exit in the config")  # fmt: skip
    assert keel_run_config["command"] == [sys.executable, child, "--api-key", "***", "--hf_token=***"]
    assert keel_run_config["exit"]["code"] == 3 and keel_run_config["exit"]["status"] == "failed"
    assert keel_run_config["exit"]["stderr_tail"] == ["Traceback (most recent call last):", 'File "train.py"', "ValueError: boom"]
    assert "hunter22" not in json.dumps(run) and "hf_abc" not in json.dumps(run)


def test_a_stop_command_ends_a_child_that_ignores_sigint(server: ServerProcess, tmp_path: Path) -> None:
    child = script(tmp_path, "stubborn.py", """
        import signal, sys, time
        signal.signal(signal.SIGINT, lambda *_: print("ignored SIGINT", flush=True))
        step = 0
        while True:
            step += 1
            print(f"step={step} loss={1 / step}", flush=True)
            time.sleep(0.1)
    """)
    process = subprocess.Popen(keel_run(server.url, tmp_path, "stubborn", sys.executable, child, extra=("--stop-grace", "1")),
                               cwd=REPO_ROOT, env=env_for(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        run = wait_until(lambda: runs_named(server.url, "stubborn"), 60, "the run")[0]
        wait_until(lambda: len(stored(server.url, run["id"], "loss")) >= 5, 60, "points while it runs")
        assert process.poll() is None
        sent = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "stop"})
        assert sent.status_code == 202, sent.text
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err.decode()
    assert b"ignored SIGINT" in out  # SIGINT first; it went on; SIGTERM a second later ended it
    assert b"sending SIGTERM" in err
    final = wait_until(lambda: (r := run_named(server.url, "stubborn"))["status"] != "running" and r, 30, "the end")
    assert final["status"] == "killed"
    (command,) = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/commands").json()
    assert command["state"] == "acked" and "SIGINT sent" in (command.get("message") or command.get("result") or json.dumps(command))
    steps = stored(server.url, run["id"], "loss")
    assert len(steps) >= 5 and all(value == 1 / step for step, value in steps.items())
    # Every step but, at most, the one whose line the SIGINT handler's print cut in two.
    assert len(set(range(1, max(steps) + 1)) - set(steps)) <= 1


def test_who_sent_a_stop_is_said_on_one_line(server: ServerProcess, tmp_path: Path) -> None:
    """A stop from a rule is said with the rule's name; a name with a line break and a
    terminal control in it is shown escaped on keel run's own line, never as a line of its
    own (issue 48)."""
    forged = "keel run: the command ended (finished, exit 0); 0 step(s)"
    rule = httpx.post(f"{server.url}/api/v1/rules", json={
        "name": f"forge\n{forged}\x1b[2K", "metric": "forge_me", "detector": "threshold",
        "params": {"op": ">", "threshold": 1.0}, "action": "stop",
    })  # fmt: skip
    assert rule.status_code == 201, rule.text
    child = script(tmp_path, "forge.py", """
        import time
        for step in range(1, 600):
            print(f"step={step} forge_me={2.0 if step > 3 else 0.0}", flush=True)
            time.sleep(0.1)
    """)
    try:
        done = subprocess.run(keel_run(server.url, tmp_path, "forged-stop", sys.executable, child),
                              cwd=REPO_ROOT, env=env_for(tmp_path), capture_output=True, timeout=120)  # fmt: skip
    finally:
        httpx.delete(f"{server.url}/api/v1/rules/{rule.json()['id']}")
    lines = done.stderr.decode().splitlines()
    said = [line for line in lines if "stop command from rule forge" in line]
    assert len(said) == 1 and said[0].startswith("keel run: stop command from rule forge\\nkeel run:"), lines
    assert not any(line.startswith(forged) for line in lines) and b"\x1b" not in done.stderr, lines


def test_at_a_terminal_colours_stay_and_ctrl_c_reaches_the_child_once(server: ServerProcess, tmp_path: Path) -> None:
    child = script(tmp_path, "tty.py", """
        import signal, sys, time
        got = []
        signal.signal(signal.SIGINT, lambda *_: got.append(1))
        print("isatty", sys.stdout.isatty(), sys.stderr.isatty(), flush=True)
        print("\\x1b[1;32m[Step 1/2]\\x1b[0m reward=0.75", flush=True)
        print("ready", flush=True)
        deadline = time.time() + 30
        while not got and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second SIGINT (a forwarded copy) would arrive here
        print(f"SIGINTs: {len(got)}", flush=True)
        sys.exit(0 if len(got) == 1 else 9)
    """)
    argv = keel_run(server.url, tmp_path, "terminal", sys.executable, child)
    pid, master = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pseudo-terminal
        os.chdir(REPO_ROOT)
        os.execve(sys.executable, argv, env_for(tmp_path))
    output = b""
    try:
        deadline = time.monotonic() + 120
        sent = False
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
            if b"ready" in output and not sent:
                os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground process group
                sent = True
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0, output.decode(errors="replace")
    assert b"isatty True True" in output and b"SIGINTs: 1" in output
    assert b"\x1b[1;32m[Step 1/2]\x1b[0m reward=0.75" in output  # the colour codes as written
    run = run_named(server.url, "terminal")
    assert stored(server.url, run["id"], "reward") == {1: 0.75} and run["status"] == "finished"


_TRL_SCRIPT = """
    import json, sys
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    CHARS = "abcdefgh "
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(CHARS) + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=1))
    model.save_pretrained(sys.argv[1] + "/tiny")  # a local path: beta > 0 loads the reference model from it, no hub

    def reward_a(completions, **kwargs):
        return [c.count("a") / max(1, len(c)) for c in completions]

    args = GRPOConfig(output_dir=sys.argv[1] + "/out", per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                      max_steps=4, logging_steps=1, learning_rate=1e-2, beta=0.04, report_to="none", use_cpu=True,
                      save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=sys.argv[1] + "/tiny", reward_funcs=reward_a, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": ["ab", "cd", "ef", "gh"] * 8}))
    trainer.train()
    with open(sys.argv[1] + "/log_history.json", "w") as f:
        json.dump(trainer.state.log_history, f)
    trainer.state.save_to_json(sys.argv[1] + "/trainer_state.json")  # as the Trainer writes it in a checkpoint
"""


def test_a_real_trl_grpo_run_streams_what_trl_logged(server: ServerProcess, tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", _TRL_SCRIPT)
    assert "keel" not in Path(train).read_text().lower()
    done = subprocess.run(keel_run(server.url, tmp_path, "grpo-console", sys.executable, train, str(tmp_path)),
                          cwd=REPO_ROOT, env=env_for(tmp_path), capture_output=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert b"framework trl" in done.stderr
    history = json.loads((tmp_path / "log_history.json").read_text())
    logged = [entry for entry in history if "reward" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3, 4]
    run = run_named(server.url, "grpo-console")
    assert run["status"] == "finished"
    for trl_key, keel_key in (("reward", "reward/mean"), ("kl", "ref/kl"), ("entropy", "policy/entropy"), ("grad_norm", "grad/norm"),
                              ("loss", "loss/total")):  # fmt: skip
        # The Trainer prints each float as f"{v:.4g}" (transformers' ProgressCallback.on_log): Keel stores what it printed.
        expected = {entry["step"]: float(f"{entry[trl_key]:.4g}") for entry in logged}
        assert stored(server.url, run["id"], keel_key) == expected, trl_key
    # The same run's trainer_state.json, imported as a user would: TRL's names as the Trainer
    # logged them (no `train/`), mapped to Keel's, every value as logged.
    done = subprocess.run([sys.executable, "-m", "keel", "import", "wandb", str(tmp_path / "trainer_state.json"), "--name", "grpo-state",
                           "--server", server.url], cwd=REPO_ROOT, capture_output=True, timeout=120)  # fmt: skip
    said = (done.stdout + done.stderr).decode()
    assert done.returncode == 0 and "framework trl" in said, said
    state = run_named(server.url, "grpo-state")
    for trl_key, keel_key in (("reward", "reward/mean"), ("kl", "ref/kl"), ("entropy", "policy/entropy"), ("grad_norm", "grad/norm"),
                              ("loss", "loss/total"), ("frac_reward_zero_std", "reward/zero_std_frac"),
                              ("completions/mean_length", "response/length_mean"), ("completions/clipped_ratio", "response/truncated_frac")):  # fmt: skip
        assert stored(server.url, state["id"], keel_key) == {entry["step"]: entry[trl_key] for entry in logged}, trl_key


def test_a_server_away_never_holds_the_command_up_and_keel_sync_uploads_later(server: ServerProcess, tmp_path: Path) -> None:
    from tests.support.local_server import free_port

    child = script(tmp_path, "fast.py", """
        import time
        started = time.monotonic()
        for step in range(1, 201):
            print(f"step:{step} - critic/score/mean:{step / 200} - actor/pg_loss:np.float64({-step / 10})", flush=True)
        print(f"took {time.monotonic() - started:.3f}", flush=True)
    """)
    away = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(keel_run(away, tmp_path, "away", sys.executable, child, extra=("--finish-timeout", "1")),
                          cwd=REPO_ROOT, env=env_for(tmp_path), capture_output=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 201 and lines[0] == "step:1 - critic/score/mean:0.005 - actor/pg_loss:np.float64(-0.1)"
    assert float(lines[-1].split()[1]) < 1.0  # 200 lines printed at the pace of a pipe, Keel or not
    assert b"keel sync" in done.stderr  # the Monitor says where the spool is
    synced = subprocess.run([sys.executable, "-m", "keel", "sync", str(tmp_path / "spool"), "--server", server.url],
                            cwd=REPO_ROOT, capture_output=True, timeout=120)  # fmt: skip
    assert synced.returncode == 0, synced.stderr.decode()
    run = run_named(server.url, "away")
    assert run["status"] == "finished" and run["config"]["keel_run"]["command"] == [sys.executable, child]
    assert stored(server.url, run["id"], "reward/mean") == {step: step / 200 for step in range(1, 201)}  # verl's names mapped
    assert stored(server.url, run["id"], "loss/pg") == {step: -step / 10 for step in range(1, 201)}


def test_keel_import_console_and_csv_upload_their_runs(server: ServerProcess, tmp_path: Path) -> None:
    log = tmp_path / "sweep.log"
    log.write_text("\n".join([*(f"[Step {s}/3] loss={s / 4} reward=nan" for s in (1, 2, 3)), "Traceback: not metrics",
                              *(f"[Step {s}/2] loss={-s}" for s in (1, 2))]) + "\n")  # fmt: skip
    panel = tmp_path / "panel.csv"
    panel.write_text('"Step","a - reward","a - reward__MIN","b - reward"\n0,0.5,0.1,0.75\n')
    for argv in (["console", str(log)], ["console", str(log)], ["csv", str(panel)]):  # the console log twice: idempotent
        done = subprocess.run([sys.executable, "-m", "keel", "import", *argv, "--server", server.url],
                              cwd=REPO_ROOT, capture_output=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
    first, second = run_named(server.url, "sweep/1"), run_named(server.url, "sweep/2")
    assert stored(server.url, first["id"], "loss") == {1: 0.25, 2: 0.5, 3: 0.75}
    assert all(math.isnan(v) for v in stored(server.url, first["id"], "reward").values())
    assert stored(server.url, second["id"], "loss") == {1: -1.0, 2: -2.0} and second["status"] == "finished"
    assert stored(server.url, run_named(server.url, "a")["id"], "reward") == {0: 0.5}
    assert stored(server.url, run_named(server.url, "b")["id"], "reward") == {0: 0.75}
