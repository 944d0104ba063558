"""Advantages of the learner's batch (`keel lm --adv`), and the share of groups with no signal.

- `group` (GRPO as this learner always did, Dr. GRPO's): A = R − the mean of the prompt's
  `group` answers.
- `group_std` (GRPO as DeepSeekMath, TRL and verl compute it): A = (R − mean) / (std + eps),
  std the sample standard deviation (n − 1) of the prompt's answers, eps = 1e-6; a group whose
  rewards are all equal gets A = 0.
- `batch` (FlashREINFORCE): A = R − the mean of the whole batch.

The first two are `trainer_hooks.losses.compute_advantages(..., "group")` and the standard
deviation on top of it; `batch` is its "batch" mode.
"""

from __future__ import annotations

from torch import Tensor

from trainer_hooks.losses import compute_advantages

__all__ = ["ADVANTAGES", "STD_EPS", "advantages", "zero_std_frac"]

ADVANTAGES = ("group", "group_std", "batch")
STD_EPS = 1e-6


def advantages(rewards_B: Tensor, mode: str, group: int, eps: float = STD_EPS) -> Tensor:
    """[B] advantages of `rewards_B` (the `group` answers of a prompt consecutive)."""
    if mode == "group":
        return compute_advantages(rewards_B, "group", group)
    if mode == "group_std":
        if group < 2:
            raise ValueError("group_std advantages need at least 2 answers per prompt")
        centred_B = compute_advantages(rewards_B, "group", group)
        std_B = rewards_B.unflatten(-1, (-1, group)).std(-1, keepdim=True).expand(-1, group).flatten(-2)
        return centred_B / (std_B + eps)
    if mode == "batch":
        return compute_advantages(rewards_B, "batch")
    raise ValueError(f"unknown advantage mode {mode!r}; one of {', '.join(ADVANTAGES)}")


def zero_std_frac(rewards_B: Tensor, mode: str, group: int) -> Tensor:
    """`reward/zero_std_frac`: the share of the groups the baseline is taken over (a prompt's
    answers; the whole batch for `batch`) whose rewards are all equal, so whose advantages
    are all zero. A 0-dim float32 tensor (no host sync)."""
    size = rewards_B.shape[-1] if mode == "batch" else group
    grouped = rewards_B.unflatten(-1, (-1, size))
    flat = grouped.amax(-1) == grouped.amin(-1)
    return flat.float().mean()
