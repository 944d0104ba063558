"""`keel demo` starts its children with keel_command(): the installed Keel, whatever the
working directory holds (a training repository with its own `server/` or `keel/`)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from keel.cli import main
from keel.demo import DEMO_ARMS, LM_ARMS, _demo_runs, keel_command

IMPOSTOR = "import sys; print('not keel'); sys.exit(42)\n"


def _repository_with_impostors(root: Path) -> Path:
    for package in ("server", "keel"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(IMPOSTOR)
        (root / package / "__main__.py").write_text(IMPOSTOR)
    (root / "learners.py").write_text(IMPOSTOR)
    return root


def test_a_demo_child_runs_keel_from_a_directory_with_its_own_server_and_keel(tmp_path: Path) -> None:
    cwd = _repository_with_impostors(tmp_path)
    child = subprocess.run(keel_command("sim", "--help"), cwd=cwd, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stdout + child.stderr
    assert "--mismatch" in child.stdout and "not keel" not in child.stdout


def test_the_plain_module_form_would_have_run_the_impostor(tmp_path: Path) -> None:
    """What the fix is for: `python -m keel` resolves against the working directory first."""
    cwd = _repository_with_impostors(tmp_path)
    child = subprocess.run([sys.executable, "-m", "keel", "--help"], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert child.returncode == 42 and "not keel" in child.stdout


def test_the_demo_help_says_what_a_round_streams(capsys: pytest.CaptureFixture[str]) -> None:
    """`keel demo --help` names the A/Bs a round starts (keel/demo.py _demo_runs)."""
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "toy simulations (importance_sampling vs cispo)" in text
    assert "transformers trained asynchronously on a stale bf16 sampler (ppo vs cispo)" in text
    assert "a guarded ppo beside its twin" in text
    runs = _demo_runs("http://127.0.0.1:8750", 0, 0.0)
    assert {command[2] for command in runs.values()} == set(DEMO_ARMS) | set(LM_ARMS)  # --loss
    assert [name for name in runs if "--guard" in runs[name]] == ["lm-ppo-lag4-bf16-s0-guard"]
    twin, guarded = runs["lm-ppo-lag4-bf16-s0"], runs["lm-ppo-lag4-bf16-s0-guard"]
    assert [arg for arg in guarded if arg not in twin] == ["lm-ppo-guarded", "--guard", "--guard-hazard", "0.5", "lm-ppo-lag4-bf16-s0-guard"]


def test_the_demo_paces_its_trainers_to_the_cores_and_keeps_an_ab_together() -> None:
    """A round's runs start in waves within a budget set from the cores: the toy runs
    together, the guarded run with its twin, each transformer seed's arms together."""
    from keel.demo import LM_WEIGHT, MIN_JOBS, _weight, demo_jobs, demo_waves

    assert demo_jobs(2) == MIN_JOBS and demo_jobs(None) == MIN_JOBS and demo_jobs(16) == 48
    runs = _demo_runs("http://h:1", 0, 0.1)
    waves = demo_waves(runs)
    assert sorted(name for wave in waves for name in wave) == sorted(runs)
    toy, pair, first, second = waves
    assert all(not name.startswith("lm-") for name in toy) and len(toy) == 6
    assert set(pair) == {"lm-ppo-lag4-bf16-s0", "lm-ppo-lag4-bf16-s0-guard"}
    assert set(first) == {"lm-ppo-lag8-bf16-s0", "lm-cispo-lag8-bf16-s0"}
    assert set(second) == {"lm-ppo-lag8-bf16-s1", "lm-cispo-lag8-bf16-s1"}
    # On two cores the waves run one after the other; a transformer wave fits alone.
    for wave in (pair, first, second):
        assert sum(map(_weight, wave)) == 2 * LM_WEIGHT <= demo_jobs(2) < sum(map(_weight, toy)) + sum(map(_weight, wave))


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_ctrl_c_ends_the_demo_and_the_server_with_one_line(command: str, tmp_path: Path) -> None:
    """uvicorn shuts down on Ctrl-C and raises it again: the command says it stopped, exits 0,
    and prints no traceback (the demo's children are in their own session: none of theirs)."""
    import signal
    import time

    from tests.support.local_server import free_port

    port = str(free_port())
    args = ["--dir", str(tmp_path / "demo")] if command == "demo" else ["--database-url", f"sqlite:///{tmp_path / 's.db'}"]
    child = subprocess.Popen(
        [sys.executable, "-m", "keel", command, "--port", port, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # serving: its port answers
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    time.sleep(2.0 if command == "demo" else 0.0)  # the demo's first children are starting
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    assert "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith(f"keel {command}: stopped"), out
