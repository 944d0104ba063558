"""The alert corpus's design (learners/lm/corpus.py, `keel lm-corpus`)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import pytest

from keel.eval_alerts import load_corpus
from learners.lm.corpus import (
    DIGITS,
    LAGS,
    LRS,
    MIX,
    REGIME_BATCHES,
    REGIME_LRS,
    REGIME_STEPS,
    corpus_configs,
    regime_configs,
)
from learners.lm.learner import LMConfig
from learners.lm.runfiles import done_names, read_dir, read_run, write_run
from learners.lm_cli import _seed_list
from trainer_hooks.losses import LOSSES


def test_ten_runs_per_seed_drawn_from_the_seed_alone_with_unique_names() -> None:
    base = LMConfig(steps=500)
    configs = corpus_configs(base, range(100, 130))
    assert len(configs) == 10 * 30 and len({c.name for c in configs}) == len(configs)
    assert Counter(c.loss for c in configs) == Counter({loss: 30 * MIX.count(loss) for loss in MIX})
    assert {c.lag for c in configs} == set(LAGS)  # every lag 0..16
    assert {c.lr for c in configs} == {lr for lr, _ in LRS} and {c.digits for c in configs} == set(DIGITS)
    assert {c.clip for c in configs} == {0.0, 1.0} and {c.sampler_dtype for c in configs} == {"bf16", "fp32"}
    assert all(c.steps == 500 for c in configs)
    # a seed's runs do not depend on which other seeds are asked for
    assert corpus_configs(base, [117]) == [c for c in configs if c.seed // 10 == 117]
    for config in configs:
        config.check()


def test_names_say_every_setting_that_is_not_the_default() -> None:
    assert LMConfig(loss="ppo", lag=8, seed=3).name == "ppo-lag8-bf16-s3"
    assert LMConfig(loss="ppo", lag=8, lr=2e-3, clip=0, digits=4, seed=3).name == "ppo-lag8-bf16-lr0.002-clip0-d4-s3"


def test_seed_lists_take_ranges() -> None:
    assert _seed_list("100-103,7") == [100, 101, 102, 103, 7]


def test_the_regime_corpus_spans_every_axis_the_issue_names() -> None:
    configs = regime_configs(LMConfig(steps=REGIME_STEPS), range(60))
    assert len(configs) == 600 and len({c.name for c in configs}) == 600
    assert {c.loss for c in configs} == set(LOSSES)  # every loss
    assert {c.lr for c in configs} == {lr for lr, _ in REGIME_LRS} and {c.lr for c in configs} >= {5e-4, 5e-3}
    assert {c.digits for c in configs} == {2, 3, 4, 5}
    assert {c.clip for c in configs} == {0.0, 0.5, 1.0, 2.0}
    assert {c.lag for c in configs} == set(range(17))
    assert {c.sampler_dtype for c in configs} == {"bf16", "fp16", "fp32"}
    assert {(c.prompts, c.group) for c in configs} == set(REGIME_BATCHES)
    small = [c for c in configs if c.size == "small"]
    assert 10 <= len(small) <= 60 and all(c.digits <= 3 for c in small)
    assert regime_configs(LMConfig(steps=REGIME_STEPS), [17]) == [c for c in configs if c.seed // 10 == 17]
    for config in configs:
        config.check()


def test_run_files_round_trip_float32_nan_and_inf(tmp_path) -> None:
    series = {"reward/mean": [0.1, 0.25, math.nan], "grad/norm": [1.0, math.inf, -math.inf], "perf/step_s": [1.0, 2.0, 3.0]}
    run = {"name": "ppo-lag2-bf16-s1", "spec": {"loss": "ppo", "lag": 2}, "wall_s": 3.5, "series": series}
    path = write_run(tmp_path, run)
    assert path.name == "ppo-lag2-bf16-s1.run.gz" and done_names(tmp_path) == {"ppo-lag2-bf16-s1"}
    back = read_run(path)
    assert back["spec"] == {"loss": "ppo", "lag": 2} and set(back["series"]) == {"reward/mean", "grad/norm"}
    assert back["series"]["reward/mean"][:2] == [pytest.approx(0.1), 0.25] and math.isnan(back["series"]["reward/mean"][2])
    assert back["series"]["grad/norm"] == [1.0, math.inf, -math.inf]
    (tmp_path / "broken.run.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="broken.run.gz"):
        list(read_dir(tmp_path))


@pytest.mark.slow
def test_lm_regimes_resumes_where_it_stopped(tmp_path) -> None:
    """Two runs, then the rest of the seed: the first two are not run again."""
    folder = tmp_path / "regimes"
    args = [sys.executable, "-m", "keel", "lm-regimes", "--seeds", "3", "--dir", str(folder), "--steps", "8", "--jobs", "2"]
    first = subprocess.run([*args, "--limit", "2"], capture_output=True, text=True, timeout=240, check=True)
    assert "0 already in" in first.stderr and len(done_names(folder)) == 2
    stamps = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    second = subprocess.run(args, capture_output=True, text=True, timeout=240, check=True)
    assert "2 already in" in second.stderr and "running 8" in second.stderr
    assert done_names(folder) == {c.name for c in regime_configs(LMConfig(steps=8), [3])}
    assert all(folder.joinpath(name).stat().st_mtime_ns == stamp for name, stamp in stamps.items())
    corpus = load_corpus(str(folder))
    assert len(corpus) == 10 and all(len(run.series["reward/mean"]) == 8 for run in corpus)
    assert all("mismatch/low_tail_frac" in run.series for run in corpus)
    # Warm-started: the same settings from a trained policy, runs of their own names.
    warm = subprocess.run([*args, "--sft-steps", "5", "--limit", "1"], capture_output=True, text=True, timeout=240, check=True)
    assert "0 already in" in warm.stderr
    (added,) = done_names(folder) - {c.name for c in regime_configs(LMConfig(steps=8), [3])}
    assert added == regime_configs(LMConfig(steps=8, sft_steps=5), [3])[0].name and "-sft5-" in added
    # Ten runs spread over the axes leave no value with 10 runs to hold out: said, exit 2.
    held = subprocess.run([sys.executable, "-m", "keel", "eval-alerts", "--corpus", str(folder), "--regimes", "--no-rlwatch"],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert held.returncode == 2 and "no axis with two values of at least 10 runs" in held.stderr
