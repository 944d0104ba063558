"""The alert corpus's design (learners/lm/corpus.py, `keel lm-corpus`)."""

from __future__ import annotations

from collections import Counter

from learners.lm.corpus import DIGITS, LAGS, LRS, MIX, corpus_configs
from learners.lm.learner import LMConfig
from learners.lm_cli import _seed_list


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
