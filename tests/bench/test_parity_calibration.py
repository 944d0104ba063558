"""bench/parity_calibration.py: the corpus it grows resumes and reads back what it wrote, and
the pairs it scores are the ones its table names."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.parity_calibration import (
    LOSSES,
    NOISES,
    PLANTED_SEEDS,
    SEEDS,
    Run,
    _grouped,
    plan,
    runs,
)
from learners.lm.runfiles import read_run, write_run


def test_a_run_file_reads_back_as_float32_with_nan_kept(tmp_path: Path) -> None:
    series = {"mismatch/kl": [3.5e-15, 1e-3, math.nan], "mismatch/log_ratio:abs>=0.01": [0.0, 0.25, 1.0]}
    spec = {"loss": "cispo", "lag": 0, "sampler_dtype": "bf16", "seed": 1}
    path = write_run(tmp_path, {"name": "cispo-lag0-bf16-s1", "spec": spec, "wall_s": 1.5, "series": series}, keys=None)
    assert path.name == "cispo-lag0-bf16-s1.run.gz" and not list(tmp_path.glob(".*tmp"))
    body = read_run(path)
    kl = body["series"]["mismatch/kl"]
    assert kl[0] == pytest.approx(3.5e-15, rel=1e-6) and kl[1] == pytest.approx(1e-3, rel=1e-6) and math.isnan(kl[2])
    assert body["series"]["mismatch/log_ratio:abs>=0.01"] == [0.0, 0.25, 1.0]
    (run,) = runs(tmp_path)
    assert (run.engine, run.seed) == (("cispo", 0, "bf16", 0.0), 1)


def test_the_plan_makes_two_seeds_of_every_setting_first_and_names_every_run_once() -> None:
    configs = plan()
    names = [config.name for config in configs]
    assert len(names) == len(set(names)) == len(SEEDS) * (len(LOSSES) * 2 * 3 + len(NOISES)) + len(PLANTED_SEEDS) * (1 + len(NOISES))
    first = len(SEEDS[:2]) * (len(LOSSES) * 2 * 3 + len(NOISES))
    assert {config.seed for config in configs[:first]} == set(SEEDS[:2])
    assert {config.seed for config in configs[-len(PLANTED_SEEDS) * (1 + len(NOISES)) :]} == set(PLANTED_SEEDS)
    assert sorted({config.logit_noise for config in configs}) == [0.0, *NOISES]
    assert all(config.steps == 1000 and config.size == "tiny" for config in configs)


def test_seeds_are_split_into_disjoint_sides_once() -> None:
    group = [Run(f"r{seed}", "cispo", 0, "bf16", 0.0, seed, {}) for seed in (1, 2, 3, 4)]
    splits = _grouped(group, 2)
    assert sorted(tuple(r.seed for r in a) + tuple(r.seed for r in b) for a, b in splits) == [
        (1, 2, 3, 4), (1, 3, 2, 4), (1, 4, 2, 3),
    ]  # fmt: skip


def test_the_planted_change_moves_the_kl_by_about_half_sigma_squared() -> None:
    """`keel lm --sampler-logit-noise σ`: an fp32 sampler's KL is rounding (~1e-15 nats); with
    noise of σ on each logit it is about σ²/2 (less the share the softmax takes back)."""
    import torch

    from learners.lm.learner import LMConfig, Recorder, train

    torch.set_num_threads(1)
    kls = {}
    for sigma in (0.0, 0.1):
        recorder = Recorder()
        train(LMConfig(loss="cispo", sampler_dtype="fp32", steps=3, digits=3, prompts=4, group=4, seed=3, logit_noise=sigma), recorder)
        kls[sigma] = sum(recorder.series["mismatch/kl"]) / 3
    assert kls[0.0] < 1e-12 and 0.3 * 0.1**2 / 2 < kls[0.1] < 1.2 * 0.1**2 / 2
    assert LMConfig(logit_noise=0.1).name.endswith("-noise0.1-s0")
    with pytest.raises(ValueError, match="logit_noise"):
        LMConfig(logit_noise=-1.0).check()
