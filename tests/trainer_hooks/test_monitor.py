"""Monitor against a real `keel serve` subprocess: exact values, server killed and restarted, server late."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from tests.support.monitor import (
    FAST,
    assert_every_step_once,
    headline,
    learner_batches,
    metric_per_step,
    python_process,
    servers,
    spooled_steps,
    wait_until,
)
from trainer_hooks.monitor import Monitor
from trainer_hooks.sender import ingest_url

make_server = pytest.fixture(name="make_server")(servers)


def test_streams_floats_and_tensors_with_exact_values(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    leaf = torch.tensor(3.0, requires_grad=True)
    with Monitor(
        server.url,
        run_name="exact",
        project="keel-tests",
        group="cispo",
        config={"lr": 2.0, "path": Path("/x")},
        tags=("toy", "exact"),
        spool_dir=tmp_path / "spool",
        sender_config=FAST,
    ) as monitor:
        for step in range(20):
            monitor.log(
                step,
                {
                    "py/float": step / 3,
                    "py/int": step,
                    "t/f32": torch.tensor(step / 3, dtype=torch.float32),
                    "t/f64": torch.tensor(step / 3, dtype=torch.float64),
                    "t/bf16": torch.tensor(step / 3, dtype=torch.bfloat16),
                    "t/i64": torch.tensor(step * 1000, dtype=torch.int64),
                    "t/1d": torch.tensor([step + 0.5]),
                    "t/grad": leaf * step,
                    "t/nonfinite": torch.tensor([math.nan, math.inf, -math.inf][step % 3]),
                    "py/nonfinite": [math.inf, -math.inf, math.nan][step % 3],
                },
            )
        monitor.log(5, {"py/float": 123.0})  # a second value for a stored step is ignored
    run = server.run(monitor.run_id)
    assert (run["status"], run["name"], run["project"], run["group"]) == (
        "finished",
        "exact",
        "keel-tests",
        "cispo",
    )
    assert run["config"] == {"lr": 2.0, "path": "/x"}
    assert run["tags"] == ["toy", "exact"]
    assert run["last_step"] == 19
    assert server.keys(monitor.run_id) == {
        key: 20
        for key in (
            "py/float",
            "py/int",
            "py/nonfinite",
            "t/1d",
            "t/bf16",
            "t/f32",
            "t/f64",
            "t/grad",
            "t/i64",
            "t/nonfinite",
        )
    }
    steps = list(range(20))
    expected = {
        "py/float": [s / 3 for s in steps],
        "py/int": [float(s) for s in steps],
        "t/f32": [float(torch.tensor(s / 3, dtype=torch.float32)) for s in steps],
        "t/f64": [s / 3 for s in steps],
        "t/bf16": [float(torch.tensor(s / 3, dtype=torch.bfloat16)) for s in steps],
        "t/i64": [float(s * 1000) for s in steps],
        "t/1d": [s + 0.5 for s in steps],
        "t/grad": [3.0 * s for s in steps],
        "t/nonfinite": [["nan", "inf", "-inf"][s % 3] for s in steps],
        "py/nonfinite": [["inf", "-inf", "nan"][s % 3] for s in steps],
    }
    for key, values in expected.items():
        assert server.series(monitor.run_id, key) == (steps, values), key
    assert monitor.spool_path is not None and not monitor.spool_path.exists()


def test_bad_values_are_dropped_without_raising(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="bad", spool_dir=tmp_path, sender_config=FAST)
    monitor.log(0, {"ok": 1.0, "text": "high", "vector": torch.ones(3), "": 2.0, "k" * 201: 3.0})
    monitor.log(-1, {"ok": 9.0})
    monitor.log("seven", {"ok": 9.0})  # type: ignore[arg-type]
    monitor.log(1, None)  # type: ignore[arg-type]
    monitor.log(2, {"ok": 2.0})
    assert monitor.finish()
    assert server.keys(monitor.run_id) == {"ok": 2}
    assert server.series(monitor.run_id, "ok") == ([0, 2], [1.0, 2.0])


def test_log_batch_logs_what_stability_metrics_computes(make_server, sqlite_url, tmp_path) -> None:
    """On CPU the metrics are computed off the training thread from copies of the inputs:
    the loop may reuse its buffers in place right after log_batch() returns."""
    server = make_server(sqlite_url)
    batches = learner_batches(20, 6, 9, seed=3)
    sampler, learner, mask, rewards = batches
    sampler_buffer, learner_buffer = torch.empty(6, 9), torch.empty(6, 9)
    with Monitor(server.url, run_name="batch", spool_dir=tmp_path, sender_config=FAST) as monitor:
        for step in range(20):
            sampler_buffer.copy_(sampler[step])
            learner_buffer.copy_(learner[step])
            monitor.log_batch(
                step,
                sampler_buffer,
                learner_buffer,
                mask[step],
                rewards=rewards[step],
                metrics={"grad/norm": float(step), **({"mismatch/kl": -1.0} if step == 7 else {})},
                max_length=7,
            )
            sampler_buffer.fill_(math.nan)  # reused in place before the metrics are computed
            learner_buffer.fill_(math.nan)
        monitor.log_batch(20, sampler[0], learner[0], "not a mask")  # reported, not raised
    keys = server.keys(monitor.run_id)
    assert keys["grad/norm"] == 20 and keys["mismatch/ratio_max"] == 20
    for key in ("mismatch/kl", "mismatch/ratio_max", "reward/std", "nonfinite/count"):
        expected = metric_per_step(batches, key, range(20))
        if key == "mismatch/kl":
            expected[7] = -1.0  # the caller's value wins over the computed one
        steps, values = server.series(monitor.run_id, key)
        assert steps == list(range(20))
        assert values == pytest.approx(expected, rel=1e-6), key
    from trainer_hooks.metrics import stability_metrics

    truncated = [stability_metrics(sampler[s], learner[s], mask[s], max_length=7)["response/truncated_frac"].item() for s in range(20)]
    assert 0 < max(truncated) and min(truncated) < 1  # the cap cuts some answers, not all
    assert server.series(monitor.run_id, "response/truncated_frac") == (list(range(20)), pytest.approx(truncated, rel=1e-6))
    assert server.series(monitor.run_id, "nonfinite/count")[1] == [0.0] * 20


@pytest.mark.postgres
def test_server_sigkilled_mid_run_and_restarted(make_server, database_url, tmp_path) -> None:
    server = make_server(database_url)
    steps = 600
    monitor = Monitor(server.url, run_name="kill-restart", spool_dir=tmp_path, sender_config=FAST)
    for step in range(steps):
        monitor.log(
            step,
            {
                key: torch.tensor(value, dtype=torch.float64)
                for key, value in headline(step).items()
            },
        )
        time.sleep(0.003)
        if step == 200:
            # Kill only once the server holds part of the run, so frames are in flight.
            wait_until(lambda: server.last_step(monitor.run_id) >= 100, what="steps on the server")
            server.kill()
        if step == 400:
            server.start()
    assert monitor.finish(timeout=60)
    assert_every_step_once(server, monitor.run_id, steps)
    run = server.run(monitor.run_id)
    assert (run["status"], run["last_step"]) == ("finished", steps - 1)
    assert monitor.spool_path is not None and not monitor.spool_path.exists()


def test_server_down_before_the_run_starts(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url, start=False)
    steps = 300
    monitor = Monitor(server.url, run_name="late-server", spool_dir=tmp_path, sender_config=FAST)
    for step in range(steps):
        monitor.log(step, headline(step))
    # Everything is on disk before the server exists.
    assert monitor.spool_path is not None
    deadline = time.monotonic() + 30
    while spooled_steps(monitor.spool_path) != list(range(steps)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    server.start()
    assert monitor.finish(timeout=60)
    assert_every_step_once(server, monitor.run_id, steps)
    assert server.run(monitor.run_id)["status"] == "finished"


def test_memory_stays_bounded_while_the_server_is_away(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url, start=False)
    steps = 20_000
    monitor = Monitor(server.url, run_name="away", spool_dir=tmp_path, sender_config=FAST)
    for step in range(steps):
        monitor.log(step, headline(step))
    assert monitor.spool_path is not None
    deadline = time.monotonic() + 60
    while len(spooled_steps(monitor.spool_path)) < steps:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # The rows left the training process for the disk: nothing queued in the trainer.
    assert monitor._feed.idle and monitor._feed.queued_bytes == 0
    assert spooled_steps(monitor.spool_path) == list(range(steps))
    server.start()
    assert monitor.finish(timeout=120)
    assert_every_step_once(server, monitor.run_id, steps)


def test_floats_only_monitor_works_without_torch(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    with python_process(
        f"""
        import sys
        sys.modules["torch"] = None  # any `import torch` now fails
        from trainer_hooks.monitor import Monitor
        with Monitor({server.url!r}, run_name="no-torch", spool_dir={str(tmp_path)!r}) as monitor:
            for step in range(50):
                monitor.log(step, {{"reward/mean": step / 50, "grad/norm": float(step)}})
        print(monitor.run_id)
        """
    ) as trainer:
        out, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 0, err
    run_id = out.strip()
    assert server.keys(run_id) == {"grad/norm": 50, "reward/mean": 50}
    assert server.series(run_id, "reward/mean") == (list(range(50)), [s / 50 for s in range(50)])


def test_resuming_a_run_by_id_from_another_spool_stores_both_spools_frames(
    make_server, sqlite_url, tmp_path
) -> None:
    server = make_server(sqlite_url)
    first = Monitor(server.url, run_name="resumed", spool_dir=tmp_path / "a", sender_config=FAST)
    for step in range(100):
        first.log(step, headline(step))
    assert first.finish()
    # Same run id, fresh spool (another machine): a second writer, with frames numbered
    # from 0 in its own sequence, none of them taken for the first writer's resends.
    second = Monitor(
        server.url,
        run_name="resumed",
        run_id=first.run_id,
        spool_dir=tmp_path / "b",
        sender_config=FAST,
    )
    for step in range(100, 200):
        second.log(step, headline(step))
    assert second.finish()
    assert_every_step_once(server, first.run_id, 200)


@pytest.mark.parametrize(
    ("server_url", "expected"),
    [
        ("http://127.0.0.1:8750", "ws://127.0.0.1:8750/api/v1/ingest"),
        ("https://keel.example.org/", "wss://keel.example.org/api/v1/ingest"),
        ("http://host:80/keel", "ws://host:80/keel/api/v1/ingest"),
        ("ws://host:1/api/v1/ingest", "ws://host:1/api/v1/ingest"),
    ],
)
def test_ingest_url_is_derived_from_the_server_url(server_url: str, expected: str) -> None:
    assert ingest_url(server_url) == expected


def test_bad_arguments_fail_at_construction(tmp_path) -> None:
    with pytest.raises(ValueError, match="server URL"):
        Monitor("127.0.0.1:8750", run_name="x", spool_dir=tmp_path)
    with pytest.raises(ValueError, match="run.name"):
        Monitor("http://127.0.0.1:8750", run_name="n" * 201, spool_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
