"""The verifiable tasks: `sort` (fixed-length answers, the default) and `copy` (answers that
end with an end-of-sequence token under a length cap).

**sort.** A prompt is `digits` random digits followed by "="; the answer is the same
digits in ascending order, one token each. reward = fraction of answer
positions holding the right digit, in [0, 1]: dense (a random policy scores
~0.1, "all the prompt's digits, in any order" already more), so learning shows
within a few hundred steps, and exact to check. Longer prompts are harder
(`--digits`).

    prompt   3 9 1 3 =      answer  1 3 3 9     reward 1.0
                            sampled 1 3 9 9     reward 0.75

**copy.** A 64-token vocabulary: the ten digits, "=", an end-of-sequence token `<eos>`
and 52 filler letters (a–z, A–Z). A prompt is 2·`digits` tokens and "=": k digits
(k uniform in 1..`digits`), then filler letters. The answer is the prompt's k digits, in
order, then `<eos>`: 2 to `digits` + 1 tokens. The sampler stops an answer at its `<eos>`
or after `max_new_tokens` tokens (the length cap, `<eos>` included); an answer with no
`<eos>` within the cap is cut (truncated). The reward, like sort's, is the share of the
k + 1 places of the right answer (its digits and its `<eos>`) that the answer holds: a
digit counts where the answer has it in its place before its own `<eos>`, the `<eos>` where
the answer ends right after k tokens. 1 only for the exact answer. A cut answer gets 0,
or minus `truncation_penalty`.

    prompt   3 9 1 k Q x =    answer  3 9 1 <eos>        reward 1.0
                              sampled 3 9 <eos>          reward 0.5   (3, 9; no 1, <eos> early)
                              sampled 3 9 1 1 <eos>      reward 0.75  (<eos> late)
                              sampled 3 9 1 w w w w w    reward 0     (no <eos> within the cap 8)

The policy starts from a prior (the head's bias, `prior_logits`), as RL starts from a
pretrained model that knows the format: digits and `<eos>` are likelier than the fillers,
which are a tail of rare tokens (each 0.3 %, 19 % together with "="). A first answer is
about 5 tokens long (`<eos>` has probability 0.18 at each place), and at the default cap
a fifth of them run into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

__all__ = [
    "COPY_VOCAB",
    "DECODERS",
    "EOS",
    "EQUALS",
    "FILLERS",
    "TASKS",
    "VOCAB",
    "CopyTask",
    "SortTask",
    "Task",
    "copy_texts",
    "make_task",
    "token_texts",
]

EQUALS = 10
"""Token id of "=", which ends the prompt; 0..9 are the digits."""
VOCAB = 11
"""The sort task's vocabulary: the digits and "="."""

EOS = 11
"""The copy task's end-of-sequence token `<eos>`; it also pads an answer after its end."""
FILLERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""The copy task's filler tokens, ids 12..63."""
_FIRST_FILLER = 12
COPY_VOCAB = _FIRST_FILLER + len(FILLERS)
"""64: digits, "=", <eos> and 52 fillers."""
# The prior of the copy policy's head (log-weights): a digit 0, <eos> 1, the rest -3.
_PRIOR_DIGIT, _PRIOR_EOS, _PRIOR_OTHER = 0.0, 1.0, -3.0


def token_texts(token_ids: list[int]) -> list[str]:
    """The text of each token: its digit, or "=" (the `decode` Keel's samples show)."""
    return ["=" if t == EQUALS else str(t) for t in token_ids]


def copy_texts(token_ids: list[int]) -> list[str]:
    """The copy task's token texts: digits, "=", "<eos>" and the filler letters."""
    out = []
    for t in token_ids:
        if 0 <= t < 10:
            out.append(str(t))
        elif t == EQUALS:
            out.append("=")
        elif t == EOS:
            out.append("<eos>")
        elif _FIRST_FILLER <= t < COPY_VOCAB:
            out.append(FILLERS[t - _FIRST_FILLER])
        else:
            out.append(f"<{t}>")
    return out


@dataclass(frozen=True)
class SortTask:
    digits: int = 6
    """Prompt length; the answer has as many tokens. Sequences are 2·digits + 1 long."""

    name: ClassVar[str] = "sort"
    vocab: ClassVar[int] = VOCAB
    eos: ClassVar[int | None] = None
    """No end-of-sequence token: every answer has `digits` tokens."""

    @property
    def length(self) -> int:
        return 2 * self.digits + 1

    @property
    def prompt_len(self) -> int:
        """Tokens before the answer (the digits and "=")."""
        return self.digits + 1

    @property
    def max_new_tokens(self) -> int:
        """Answer tokens the sampler generates: always `digits`."""
        return self.digits

    @property
    def context(self) -> int:
        """The model's position table (16, as the task was built with)."""
        return 16

    def prior_logits(self) -> Tensor | None:
        """No prior: the policy starts uniform."""
        return None

    def prompts(self, count: int, generator: torch.Generator, device: torch.device) -> Tensor:
        """[count, digits + 1] token ids: random digits, then "="."""
        digits_P_D = torch.randint(
            0, 10, (count, self.digits), generator=generator, device=device
        )
        equals_P_1 = torch.full((count, 1), EQUALS, dtype=digits_P_D.dtype, device=device)
        return torch.cat([digits_P_D, equals_P_1], dim=1)

    def answers(self, prompts_B_P: Tensor) -> tuple[Tensor, Tensor]:
        """The right answers [B, digits] (the prompt's digits sorted) and where they are, [B, digits]."""
        answer_B_D = prompts_B_P[:, : self.digits].sort(dim=1).values
        return answer_B_D, torch.ones_like(answer_B_D, dtype=torch.bool)

    def reward(self, tokens_B_L: Tensor) -> Tensor:
        """[B] fraction of answer positions equal to the sorted prompt digits."""
        prompt_B_D = tokens_B_L[:, : self.digits]
        answer_B_D = tokens_B_L[:, self.digits + 1 :]
        target_B_D = prompt_B_D.sort(dim=1).values
        return (answer_B_D == target_B_D).float().mean(1)


@dataclass(frozen=True)
class CopyTask:
    digits: int = 3
    """Most digits a prompt holds (k uniform in 1..digits); the prompt has 2·digits tokens and "="."""
    cap: int = 0
    """The length cap (max new tokens) of an answer, <eos> included; 0: 2·digits + 2."""
    truncation_penalty: float = 0.0
    """The reward of an answer cut at the cap is minus this."""

    name: ClassVar[str] = "copy"
    vocab: ClassVar[int] = COPY_VOCAB
    eos: ClassVar[int | None] = EOS

    @property
    def prompt_len(self) -> int:
        """Tokens before the answer: 2·digits, then "="."""
        return 2 * self.digits + 1

    @property
    def max_new_tokens(self) -> int:
        return self.cap or 2 * self.digits + 2

    @property
    def length(self) -> int:
        """Prompt, "=" and an answer at the cap."""
        return self.prompt_len + self.max_new_tokens

    @property
    def context(self) -> int:
        return max(16, self.length)

    def prior_logits(self) -> Tensor:
        """[vocab] the policy head's initial bias (see the module)."""
        prior = torch.full((COPY_VOCAB,), _PRIOR_OTHER)
        prior[:10] = _PRIOR_DIGIT
        prior[EOS] = _PRIOR_EOS
        return prior

    def prompts(self, count: int, generator: torch.Generator, device: torch.device) -> Tensor:
        """[count, 2·digits + 1]: k digits (1..digits), filler letters, "="."""
        width = 2 * self.digits
        digits_P_W = torch.randint(0, 10, (count, width), generator=generator, device=device)
        fillers_P_W = torch.randint(_FIRST_FILLER, COPY_VOCAB, (count, width), generator=generator, device=device)
        held_P_1 = torch.randint(1, self.digits + 1, (count, 1), generator=generator, device=device)
        places_W = torch.arange(width, device=device)
        tokens_P_W = torch.where(places_W < held_P_1, digits_P_W, fillers_P_W)
        equals_P_1 = torch.full((count, 1), EQUALS, dtype=tokens_P_W.dtype, device=device)
        return torch.cat([tokens_P_W, equals_P_1], dim=1)

    def targets(self, prompts_B_P: Tensor) -> tuple[Tensor, Tensor]:
        """The right answers' digits, [B, digits] (<eos> after the k-th), and k, [B]."""
        body_B_D = prompts_B_P[:, : self.digits]  # the digits come first
        is_digit_B_D = body_B_D < 10
        return torch.where(is_digit_B_D, body_B_D, EOS), is_digit_B_D.sum(1)

    def answers(self, prompts_B_P: Tensor) -> tuple[Tensor, Tensor]:
        """The right answers at the cap's width, [B, T] (the k digits, then <eos>, then <eos>
        as padding), and their places up to and including the first <eos>, [B, T]; an answer
        longer than the cap is cut there."""
        target_B_D, wanted_B = self.targets(prompts_B_P)
        width = self.max_new_tokens
        answer_B_T = torch.full((prompts_B_P.shape[0], width), EOS, dtype=prompts_B_P.dtype, device=prompts_B_P.device)
        kept = min(width, self.digits)
        answer_B_T[:, :kept] = target_B_D[:, :kept]
        places_T = torch.arange(width, device=prompts_B_P.device)
        return answer_B_T, places_T <= wanted_B[:, None]

    def answer_lengths(self, answer_B_T: Tensor) -> tuple[Tensor, Tensor]:
        """[B] tokens up to and including the first <eos> (all T when there is none), and [B]
        whether an <eos> ended the answer."""
        is_eos_B_T = answer_B_T == EOS
        ended_B = is_eos_B_T.any(1)
        first_B = is_eos_B_T.int().argmax(1)
        return torch.where(ended_B, first_B + 1, answer_B_T.shape[1]), ended_B

    def reward(self, tokens_B_L: Tensor) -> Tensor:
        """[B] (digits in place + <eos> in place) / (k + 1); −truncation_penalty for an answer
        with no <eos> within the cap."""
        prompt_len = self.prompt_len
        answer_B_T = tokens_B_L[:, prompt_len:]
        target_B_D, wanted_B = self.targets(tokens_B_L[:, :prompt_len])
        lengths_B, ended_B = self.answer_lengths(answer_B_T)
        said_B = lengths_B - 1  # the answer's tokens before its <eos>
        width = min(self.digits, answer_B_T.shape[1])
        places_D = torch.arange(width, device=tokens_B_L.device)
        # Places before the answer's <eos> holding the right digit (target <eos> places never match).
        hit_B_D = (answer_B_T[:, :width] == target_B_D[:, :width]) & (places_D < said_B[:, None])
        score_B = (hit_B_D.sum(1) + (said_B == wanted_B)).float() / (wanted_B + 1).float()
        return torch.where(ended_B, score_B, 0.0 - self.truncation_penalty)


Task = SortTask | CopyTask
TASKS = ("sort", "copy")
DECODERS = {"sort": token_texts, "copy": copy_texts}
"""Each task's token texts (the `decode` of Monitor.log_batch: the samples Keel shows)."""


def make_task(name: str, digits: int, max_new_tokens: int = 0, truncation_penalty: float = 0.0) -> Task:
    """The task `name` ("sort" or "copy") at this difficulty."""
    if name == "sort":
        return SortTask(digits)
    if name == "copy":
        return CopyTask(digits, max_new_tokens, truncation_penalty)
    raise ValueError(f"unknown task {name!r}; one of {', '.join(TASKS)}")
