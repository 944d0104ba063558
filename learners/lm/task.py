"""The verifiable task: sort a string of digits, with partial credit.

A prompt is `digits` random digits followed by "="; the answer is the same
digits in ascending order, one token each. reward = fraction of answer
positions holding the right digit, in [0, 1]: dense (a random policy scores
~0.1, "all the prompt's digits, in any order" already more), so learning shows
within a few hundred steps, and exact to check. Longer prompts are harder
(`--digits`).

    prompt   3 9 1 3 =      answer  1 3 3 9     reward 1.0
                            sampled 1 3 9 9     reward 0.75
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["EQUALS", "VOCAB", "SortTask", "token_texts"]

EQUALS = 10
"""Token id of "=", which ends the prompt; 0..9 are the digits."""
VOCAB = 11


def token_texts(token_ids: list[int]) -> list[str]:
    """The text of each token: its digit, or "=" (the `decode` Keel's samples show)."""
    return ["=" if t == EQUALS else str(t) for t in token_ids]


@dataclass(frozen=True)
class SortTask:
    digits: int = 6
    """Prompt length; the answer has as many tokens. Sequences are 2·digits + 1 long."""

    @property
    def length(self) -> int:
        return 2 * self.digits + 1

    def prompts(self, count: int, generator: torch.Generator, device: torch.device) -> Tensor:
        """[count, digits + 1] token ids: random digits, then "="."""
        digits_P_D = torch.randint(
            0, 10, (count, self.digits), generator=generator, device=device
        )
        equals_P_1 = torch.full((count, 1), EQUALS, dtype=digits_P_D.dtype, device=device)
        return torch.cat([digits_P_D, equals_P_1], dim=1)

    def reward(self, tokens_B_L: Tensor) -> Tensor:
        """[B] fraction of answer positions equal to the sorted prompt digits."""
        prompt_B_D = tokens_B_L[:, : self.digits]
        answer_B_D = tokens_B_L[:, self.digits + 1 :]
        target_B_D = prompt_B_D.sort(dim=1).values
        return (answer_B_D == target_B_D).float().mean(1)
