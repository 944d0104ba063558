"""The alert corpus: real-learner runs over the settings people train with, drawn per seed.

`keel lm-corpus --seeds 100-114 --json fit.json` runs, for every seed, one run per
entry of MIX (PPO three times and importance sampling twice, because those are the
losses that collapse here; CISPO, TIS, MIS, GSPO and FlashREINFORCE once each: ten
runs per seed), each with its settings drawn from the seed:

- lag uniform in 0..16 (versions the sampler may run behind),
- sampler dtype bf16 or fp32,
- learning rate 1e-3, 2e-3 or 3e-3 (AdamW),
- gradient clipping off (0.7) or at norm 1 (0.3),
- task difficulty: 3, 4 or 5 digits to sort.

Every loss uses GRPO's group advantages (reward minus the mean of the prompt's 8
samples). The draw depends only on the seed, so one command regenerates a corpus
exactly on one machine (the learner itself is chaotic across floating-point kernels,
docs/alerts.md). Run seeds are `10 * seed + index`, so no two runs share one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from learners.lm.learner import LMConfig

__all__ = ["CLIPS", "DIGITS", "LAGS", "LRS", "MIX", "corpus_configs"]

MIX = ("ppo", "ppo", "ppo", "importance_sampling", "importance_sampling",
       "cispo", "tis", "mis", "gspo", "flash_reinforce")  # fmt: skip
LAGS = range(0, 17)
LRS = (1e-3, 2e-3, 3e-3)
CLIPS = ((0.0, 0.7), (1.0, 0.3))
"""(max grad norm, probability); 0 is no clipping."""
DIGITS = (3, 4, 5)
DTYPES = ("bf16", "fp32")


def corpus_configs(base: LMConfig, seeds: Sequence[int], mix: Sequence[str] = MIX) -> list[LMConfig]:
    """Per seed, one config per entry of `mix`, settings drawn from `random.Random(seed)`."""
    configs = []
    for seed in seeds:
        rng = random.Random(seed)
        for index, loss in enumerate(mix):
            clip = rng.choices([c for c, _ in CLIPS], weights=[p for _, p in CLIPS])[0]
            configs.append(
                replace(
                    base, loss=loss, lag=rng.choice(LAGS), sampler_dtype=rng.choice(DTYPES),
                    lr=rng.choice(LRS), clip=clip, digits=rng.choice(DIGITS), seed=10 * seed + index,
                )  # fmt: skip
            )
    return configs
