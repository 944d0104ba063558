"""`keel lm --guard`: copies kept, the rollback to the copy from before the hazard rose, the
remedy, the batches of the thrown-away weights skipped; and through a real server, a
`rollback` command."""

from __future__ import annotations

import time

import httpx
import pytest
import torch

from learners.lm.guard import Guard, GuardConfig
from learners.lm.learner import LMConfig, Recorder, train
from tests.support.monitor import keel, python_process, wait_until


def _net() -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _update(model: torch.nn.Linear, optimizer: torch.optim.AdamW) -> None:
    optimizer.zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()


def test_the_guard_rolls_back_to_the_copy_from_before_the_rise_and_cools_the_learning_rate() -> None:
    model, optimizer = _net()
    guard = Guard(GuardConfig(hazard=0.5, every=5, keep=4, lr_factor=0.25, cool_steps=10), model, optimizer)
    weights = {}
    hazards = {step: 0.1 for step in range(40)} | {22: 0.3, 23: 0.4, 24: 0.45, 25: 0.7}
    for step in range(26):
        _update(model, optimizer)
        weights[step] = model.weight.detach().clone()
        out = guard.after_step(step, hazards[step])
    # The rise above 0.25 began at step 22: back to the copy of step 20, not 25 nor 15.
    assert out["guard/rollback"] == 1.0 and out["guard/restored_step"] == 20.0
    assert torch.equal(model.weight, weights[20]) and not torch.equal(model.weight, weights[25])
    assert guard.steps_lost == 5 and [c.step for c in guard.copies] == [5, 10, 15, 20]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025) and out["guard/lr"] == pytest.approx(0.025)
    # Batches sampled by versions 21..25 came from the thrown-away weights.
    assert [v for v in range(18, 30) if guard.discards(v)] == [21, 22, 23, 24, 25]
    # Still above the threshold: no second rollback until it falls back below it.
    for step in range(26, 30):
        _update(model, optimizer)
        assert guard.after_step(step, 0.8)["guard/rollback"] == 0.0
    for step in range(30, 36):
        _update(model, optimizer)
        guard.after_step(step, 0.1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # cooled for 10 steps only
    assert guard.rollbacks == 1


def test_with_confirm_drop_a_high_hazard_waits_for_the_reward_to_fall_and_goes_back_before_the_rise() -> None:
    model, optimizer = _net()
    guard = Guard(GuardConfig(hazard=0.5, every=5, keep=10, confirm_drop=0.1, confirm_span=1), model, optimizer)
    weights = {}
    # The hazard rises at step 22 and stays high; the reward holds at 0.8 until step 30, then falls.
    reward = {step: 0.8 if step < 30 else 0.8 - 0.04 * (step - 29) for step in range(40)}
    rolled = []
    for step in range(40):
        _update(model, optimizer)
        weights[step] = model.weight.detach().clone()
        out = guard.after_step(step, 0.1 if step < 22 else 0.9, reward[step])
        if out["guard/rollback"]:
            rolled.append((step, out["guard/restored_step"]))
            break
    # 0.8 - 0.04 * 3 = 0.68: the first step 0.1 or more below the best since the rise.
    assert rolled == [(32, 20.0)]
    assert torch.equal(model.weight, weights[20]) and guard.steps_lost == 12
    # The same hazard with a reward that holds: never a rollback.
    model, optimizer = _net()
    steady = Guard(GuardConfig(hazard=0.5, every=5, keep=10, confirm_drop=0.1), model, optimizer)
    for step in range(60):
        _update(model, optimizer)
        assert steady.after_step(step, 0.1 if step < 22 else 0.9, 0.8 + 0.02 * (-1) ** step)["guard/rollback"] == 0.0
    # A rollback command does not wait for the reward.
    steady.ask()
    _update(model, optimizer)
    assert steady.after_step(60, 0.9, 0.8)["guard/rollback"] == 1.0
    with pytest.raises(ValueError, match="confirm_drop"):
        GuardConfig(confirm_drop=-0.1).check()


def test_a_rollback_command_rolls_back_at_once_and_rollbacks_are_bounded() -> None:
    model, optimizer = _net()
    guard = Guard(GuardConfig(every=1, keep=3, max_rollbacks=2, cool_steps=0), model, optimizer)
    rolled = []
    for step in range(12):
        _update(model, optimizer)
        if step in (5, 8, 11):
            guard.ask()
        rolled.append(guard.after_step(step, None)["guard/rollback"])
    assert [s for s, r in enumerate(rolled) if r] == [5, 8]  # the third is past max_rollbacks
    with pytest.raises(ValueError, match="guard"):
        GuardConfig(hazard=1.5).check()


def test_a_critical_alert_rolls_back_to_before_it_started_once_until_it_resolves() -> None:
    """By default the guard acts on the server's critical alerts, not on a raw hazard: back to
    the newest copy from before the step the alert started at; while the same alert fires no
    second rollback; once it resolved (and the cool-down passed) a new one acts again."""
    model, optimizer = _net()
    guard = Guard(GuardConfig(every=5, keep=10, cool_steps=5), model, optimizer)
    rolled = []
    for step in range(60):
        _update(model, optimizer)
        alarm = 17 if 22 <= step < 40 else (50 if step >= 52 else None)
        rolled.append(guard.after_step(step, 0.99, 0.5, alarm))  # a high hazard alone does nothing
    steps = [s for s, metrics in enumerate(rolled) if metrics["guard/rollback"]]
    assert steps == [22, 52]
    assert rolled[22]["guard/restored_step"] == 15.0 and rolled[52]["guard/restored_step"] == 45.0
    assert rolled[-1]["guard/steps_lost"] == (22 - 15) + (52 - 45)


def test_a_guarded_run_logs_its_rollbacks_and_skips_the_thrown_away_batches() -> None:
    recorder = Recorder()
    config = LMConfig(steps=40, prompts=4, group=4, digits=4, lag=3)
    step = {"n": 0}

    def hazard() -> float:
        step["n"] += 1
        return 0.9 if step["n"] == 25 else 0.0  # after step 24

    train(config, recorder, guard=GuardConfig(hazard=0.5, every=5, keep=4), hazard=hazard)
    series = recorder.series
    assert [s for s, r in enumerate(series["guard/rollback"]) if r] == [24]
    assert series["guard/restored_step"][24] == 20.0 and series["guard/steps_lost"][-1] == 4.0
    versions = series["provenance/sampler_version"]
    skipped = [s for s, d in enumerate(series["guard/discarded"]) if d]
    assert skipped and all(20 < versions[s] <= 24 for s in skipped) and all(s > 24 for s in skipped)
    assert all(series["grad/norm"][s] == 0.0 for s in skipped)
    assert series["guard/lr"][30] == pytest.approx(config.lr * 0.5)


def test_keel_lm_guard_rolls_back_on_a_rollback_command(server_factory, sqlite_url, tmp_path) -> None:
    server = server_factory(sqlite_url)
    name = "lm-guard-test"
    argv = [
        "-m", "keel", "lm", "--loss", "ppo", "--lag", "2", "--steps", "400", "--prompts", "2", "--samples", "2",
        "--digits", "2", "--guard", "--step-delay", "0.02", "--server", server.url, "--name", name,
    ]  # fmt: skip
    code = f"import sys, runpy; sys.argv = ['keel', *{argv[2:]!r}]; runpy.run_module('keel', run_name='__main__')"
    with python_process(code, env={"KEEL_SPOOL_DIR": str(tmp_path / "spool")}) as process:

        def run_id() -> str | None:
            runs = [r for r in httpx.get(f"{server.url}/api/v1/runs").json() if r["name"] == name]
            return runs[0]["id"] if runs and (runs[0]["last_step"] or 0) >= 30 else None

        wait_until(lambda: run_id() is not None, timeout=120, what="the guarded run past step 30")
        rid = run_id()
        assert httpx.get(f"{server.url}/api/v1/runs/{rid}").json()["config"]["guard"]["hazard"] is None  # on critical alerts
        sent = httpx.post(f"{server.url}/api/v1/runs/{rid}/commands", json={"action": "rollback"}).json()

        def rollbacks() -> list[int]:
            series = httpx.get(f"{server.url}/api/v1/runs/{rid}/series", params={"key": "guard/rollback"}).json()
            return [s for s, v in zip(series["steps"], series["values"], strict=True) if v == 1.0]

        wait_until(lambda: bool(rollbacks()), timeout=60, what="a rollback on the run's charts")
        commands = {c["id"]: c for c in httpx.get(f"{server.url}/api/v1/runs/{rid}/commands").json()}
        assert commands[sent["id"]]["state"] == "acked"
        run = httpx.get(f"{server.url}/api/v1/runs/{rid}").json()
        assert list(run["actions"]) == ["rollback"] and "restores the last good weights" in run["actions"]["rollback"]
        wrong = httpx.post(f"{server.url}/api/v1/runs/{rid}/commands", json={"action": "checkpoint"})
        assert wrong.status_code == 409 and "takes rollback, not 'checkpoint'" in wrong.json()["detail"]
        process.kill()
    time.sleep(0.1)
    assert len(rollbacks()) == 1


def test_keel_lm_refuses_a_bad_guard() -> None:
    result = keel("lm", "--loss", "ppo", "--guard", "--guard-hazard", "2", "--server", "http://127.0.0.1:9")
    assert result.returncode == 2 and "guard" in result.stderr
