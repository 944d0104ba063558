"""Keel as a verl tracking backend, streaming to a real server.

Two kinds of test:

- `KeelBackend` fed a metric stream whose names and value types are copied from verl's
  source (verl 0.9.1, the PyPI wheel verl-0.9.1-py3-none-any.whl, sha256 db6e6f2a8d9d5808
  d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14): verl/trainer/ppo/rollout_corr_helper.py
  (compute_offpolicy_metrics, compute_is_metrics, prefixed at lines 888-894),
  verl/trainer/ppo/metric_utils.py (compute_data_metrics), verl/trainer/ppo/v1/trainer_base.py
  (actor/* via rename_dict, actor/entropy, training/off_policy/*). These always run.
- verl's real `Tracking` class and its real `compute_rollout_correction_and_rejection_mask`.
  verl 0.9.1 pins transformers<5.11, which TRL 1.16 cannot use, so `make install` puts it
  beside TRL without its dependency pins (requirements/verl.txt).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.support.monitor import FAST, REPO_ROOT
from tests.support.stored_runs import run_named, stored
from trainer_hooks.integrations.verl import VERL_TO_KEEL, KeelBackend, keel_metrics
from trainer_hooks.metrics import stability_metrics
from trainer_hooks.monitor import Monitor


def keys_of(url: str, run_id: str) -> set[str]:
    return {k["key"] for k in httpx.get(f"{url}/api/v1/runs/{run_id}/keys").json()}


def verl_step(step: int) -> dict[str, Any]:
    """One step's metrics as verl 0.9.1's v1 trainer hands them to Tracking.log."""
    return {
        # rollout_corr_helper.compute_offpolicy_metrics / compute_is_metrics (.item() floats)
        "rollout_corr/kl": 0.001 * step,
        "rollout_corr/k3_kl": 0.0004 * step,
        "rollout_corr/training_ppl": 1.8,
        "rollout_corr/rollout_ppl": 1.75,
        "rollout_corr/log_ppl_diff": -0.01,
        "rollout_corr/chi2_token": 0.002,
        "rollout_corr/rollout_is_max": 2.0,  # truncated at rollout_is_threshold: not Keel's
        "rollout_corr/rollout_is_eff_sample_size": 0.97,
        # metric_utils.compute_data_metrics
        "critic/score/mean": 0.25 * step,
        "response_length/mean": 310.5,
        "response_length/clip_ratio": 0.0,
        # trainer_base: actor/* from the workers' update_actor, reduced with np.mean
        "actor/pg_loss": np.float64(-0.02),
        "actor/grad_norm": np.float64(0.75),
        "actor/lr": 1e-6,
        "actor/pg_clipfrac": np.float32(0.125),
        "actor/entropy": 0.6,
        # trainer_base._compute_metrics: numpy / torch reductions, not .item()'d
        "training/off_policy/trajectory_staleness/mean": np.float64(0.5),
        "training/off_policy/trajectory_staleness/max": np.int64(1),
        "training/global_step": step,
        "timing_s/step": torch.tensor(12.5),
        # not numbers: left out with one warning
        "training/note": "resumed",
        "val-aux/bad": [1.0, 2.0],
        "actor/flag": True,
    }


def test_keel_metrics_maps_verl_names_and_prefixes_the_rest() -> None:
    metrics, skipped = keel_metrics(verl_step(2))
    assert metrics["mismatch/kl"] == 0.0008
    assert metrics["mismatch/kl_k1"] == 0.002
    assert metrics["reward/mean"] == 0.5
    assert metrics["grad/norm"] == 0.75 and type(metrics["grad/norm"]) is float
    assert metrics["staleness/lag_max"] == 1.0
    assert metrics["verl/rollout_corr/rollout_is_max"] == 2.0
    assert "mismatch/ratio_max" not in metrics and "mismatch/ess_frac" not in metrics
    assert isinstance(metrics["perf/step_s"], torch.Tensor)  # left to the Monitor's copy
    assert skipped == ["training/note", "val-aux/bad", "actor/flag"]
    assert len(set(VERL_TO_KEEL.values())) == len(VERL_TO_KEEL)  # no two verl names collide


def test_backend_streams_a_verl_stream_under_keel_names(
    sqlite_url: str, server_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = server_factory(sqlite_url)
    monitor = Monitor(
        server.url, run_name="verl-stream", spool_dir=tmp_path / "spool", sender_config=FAST
    )
    backend = KeelBackend(monitor)
    with caplog.at_level("WARNING", logger="keel"):
        for step in (1, 2, 3):
            backend.log(verl_step(step), step=step)
    backend.finish()
    assert [r.message for r in caplog.records if "not numbers" in r.message] == [
        "keel: verl logged values that are not numbers (training/note, val-aux/bad, "
        "actor/flag); they are left out"
    ]
    assert backend.skipped == 9

    run_id = monitor.run_id
    assert run_named(server.url, "verl-stream")["status"] == "finished"
    assert stored(server.url, run_id, "mismatch/kl") == {1: 0.0004, 2: 0.0008, 3: 0.0004 * 3}
    assert stored(server.url, run_id, "mismatch/kl_k1") == {1: 0.001, 2: 0.002, 3: 0.001 * 3}
    assert stored(server.url, run_id, "reward/mean") == {1: 0.25, 2: 0.5, 3: 0.75}
    assert stored(server.url, run_id, "grad/norm") == {1: 0.75, 2: 0.75, 3: 0.75}
    assert stored(server.url, run_id, "staleness/lag_mean") == {1: 0.5, 2: 0.5, 3: 0.5}
    assert stored(server.url, run_id, "perf/step_s") == {1: 12.5, 2: 12.5, 3: 12.5}
    assert stored(server.url, run_id, "policy/clip_frac") == {1: 0.125, 2: 0.125, 3: 0.125}
    assert stored(server.url, run_id, "response/length_mean") == {1: 310.5, 2: 310.5, 3: 310.5}
    assert stored(server.url, run_id, "verl/training/global_step") == {1: 1.0, 2: 2.0, 3: 3.0}
    keys = keys_of(server.url, run_id)
    assert "verl/training/note" not in keys and "verl/actor/flag" not in keys
    assert len(keys) == len(verl_step(1)) - 3


# -- verl's real classes ------------------------------------------------------------------


def _tracking() -> Any:
    import verl.utils.tracking as tracking

    from trainer_hooks.integrations.verl import register

    register()
    register()  # idempotent
    assert tracking.Tracking.supported_backend.count("keel") == 1
    return tracking.Tracking


def _config(url: str, tmp_path: Path, **keel: Any) -> dict[str, Any]:
    """What verl's trainer passes: OmegaConf.to_container of its resolved config."""
    return {
        "trainer": {
            "project_name": "verl-tests",
            "logger": ["console", "keel"],
            "keel": {"server_url": url, "spool_dir": str(tmp_path / "spool"), **keel},
        },
        "algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}},
    }


def test_real_tracking_streams_verls_rollout_correction_metrics(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    Tracking = _tracking()
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    server = server_factory(sqlite_url)
    name = f"verl-real-{uuid.uuid4().hex[:8]}"
    tracking = Tracking(
        project_name="verl-tests",
        experiment_name=name,
        default_backend=["console", "keel"],
        config=_config(server.url, tmp_path, group="ppo", token="secret"),
    )
    generator = torch.Generator().manual_seed(0)
    sampler_logp = -torch.rand(8, 16, generator=generator) * 3
    learner_logp = sampler_logp + 0.3 * torch.randn(8, 16, generator=generator)
    mask = torch.ones(8, 16)
    mask[:, 12:] = 0
    expected: dict[int, dict[str, float]] = {}
    for step in (1, 2):
        _, _, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=learner_logp * step,
            rollout_log_prob=sampler_logp * step,
            response_mask=mask,
            rollout_is="token",
            rollout_is_threshold=2.0,
        )
        tracking.log(data=metrics, step=step)
        expected[step] = metrics
    tracking.finish(exit_code=0)

    run = run_named(server.url, name)
    assert run["status"] == "finished"
    assert run["project"] == "verl-tests" and run["group"] == "ppo"
    assert run["config"]["verl/version"] == "0.9.1"
    assert "token" not in run["config"]["trainer"]["keel"]  # never stored
    for verl_name, key in [
        ("rollout_corr/k3_kl", "mismatch/kl"),
        ("rollout_corr/kl", "mismatch/kl_k1"),
        ("rollout_corr/rollout_is_max", "verl/rollout_corr/rollout_is_max"),
        ("rollout_corr/rollout_is_eff_sample_size", "verl/rollout_corr/rollout_is_eff_sample_size"),
        ("rollout_corr/training_ppl", "verl/rollout_corr/training_ppl"),
        ("rollout_corr/rollout_ppl", "verl/rollout_corr/rollout_ppl"),
    ]:
        assert stored(server.url, run["id"], key) == {s: m[verl_name] for s, m in expected.items()}
    # The mapping is a statement about meaning: verl's numbers are Keel's own formulas.
    for step, metrics in expected.items():
        ours = stability_metrics(sampler_logp * step, learner_logp * step, mask)
        assert metrics["rollout_corr/k3_kl"] == pytest.approx(float(ours["mismatch/kl"]), rel=1e-5)
        assert metrics["rollout_corr/kl"] == pytest.approx(float(ours["mismatch/kl_k1"]), rel=1e-5)
    # ...and the truncated IS max is not the raw ratio max, hence not mapped.
    assert expected[2]["rollout_corr/rollout_is_max"] == 2.0 < float(ours["mismatch/ratio_max"])


def test_real_tracking_marks_a_failed_run(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    """verl's TaskRunner calls tracking.finish(exit_code=1) when training raised."""
    Tracking = _tracking()
    server = server_factory(sqlite_url)
    name = f"verl-failed-{uuid.uuid4().hex[:8]}"
    tracking = Tracking("verl-tests", name, "keel", config=_config(server.url, tmp_path))
    tracking.log(data={"critic/score/mean": 0.5, "actor/grad_norm": math.inf}, step=1)
    tracking.finish(exit_code=1)
    tracking.finish(exit_code=0)  # Tracking.__del__ does this later; the status stays

    run = run_named(server.url, name)
    assert run["status"] == "failed"
    assert stored(server.url, run["id"], "reward/mean") == {1: 0.5}
    assert stored(server.url, run["id"], "grad/norm") == {1: math.inf}


def test_tracking_without_keel_is_untouched(tmp_path: Path) -> None:
    Tracking = _tracking()
    tracking = Tracking("verl-tests", "no-keel", default_backend=["console"], config={})
    assert set(tracking.logger) == {"console"}
    tracking.finish()


def _entry_point(tmp_path: Path) -> dict[str, str]:
    """A distribution declaring the `verl.plugins` entry point keel-rl's pyproject would."""
    dist_info = tmp_path / "plugins" / "keel_verl_plugin-0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: keel-verl-plugin\nVersion: 0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[verl.plugins]\nkeel = trainer_hooks.integrations.verl\n"
    )
    path = os.pathsep.join(filter(None, [str(dist_info.parent), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


@pytest.mark.parametrize("mechanism", ["VERL_USE_EXTERNAL_MODULES", "entry point"])
def test_verls_plugin_loader_registers_the_backend_in_every_process(
    tmp_path: Path, mechanism: str
) -> None:
    """What a Ray worker does at `import verl`, in a fresh process."""
    if mechanism == "entry point":
        extra = _entry_point(tmp_path)
    else:
        extra = {"VERL_USE_EXTERNAL_MODULES": "trainer_hooks.integrations.verl"}
    script = (
        "import verl\nfrom verl.utils.tracking import Tracking\nprint(Tracking.supported_backend)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **extra},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "'keel'" in result.stdout.strip().splitlines()[-1]
