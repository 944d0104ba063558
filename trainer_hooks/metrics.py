"""Stability metrics from a learner step's tensors (docs/metrics.md).

Everything runs under `torch.no_grad()` on the device the inputs live on and
returns 0-dim float32 tensors: no `.item()`, no `.cpu()`, no Python branch on a
tensor value, so a CUDA step is never synchronised per metric. Inputs may carry
leading batch dimensions (`[..., B, T]`); every metric is then a tensor of
shape `[...]` (the toy grid uses this to measure all its runs at once).

With `torch.distributed` initialised (world size > 1), means are reduced as
(sum, count) pairs, extremes with MAX / MIN and the log-ratio p99 from merged
fixed-bin histograms: one collective of each kind per call.

`stability_partials` stops before the final divisions: its `Partials` (sums, counts,
extremes and the |ℓ| values or histogram) of several batches merge exactly
(`merge_partials`), so the metrics of a step logged in several micro-batches are those
of the whole step (`finalize`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import reduce
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from wire.loss_constants import LOG_RATIO_CLAMP, PPO_CLIP_EPS, PROB_CLAMP

__all__ = [
    "LOG_RATIO_CLAMP",
    "PROB_CLAMP",
    "SAMPLER_PROB_BUCKETS",
    "TAILS",
    "UNBOUNDED_EPS",
    "BatchInputs",
    "Partials",
    "bernoulli_kl",
    "finalize",
    "grad_norm",
    "log_ratio",
    "merge_partials",
    "nonfinite_count",
    "stability_metrics",
    "stability_partials",
    "topk_disagreement",
]

UNBOUNDED_EPS = PPO_CLIP_EPS
"""`mismatch/unbounded_frac` counts tokens with A < 0 and r > 1 + UNBOUNDED_EPS: there PPO's
clipped objective (ε = PPO_CLIP_EPS, 0.2, its usual value) takes the unclipped r·A, and importance
sampling never clips, so the token's step grows with r without bound."""
TAILS = (1.0, 2.0)
"""`mismatch/tail_frac` counts the tokens with |ℓ| ≥ 1, `mismatch/tail_frac_2` those with
|ℓ| ≥ 2 (r beyond e^±1 = 2.7 and e^±2 = 7.4), `mismatch/low_tail_frac` those with ℓ ≤ −1."""
SAMPLER_PROB_BUCKETS = (("rare", 1e-3), ("unlikely", 1e-1), ("likely", 1.0))
"""`mismatch/log_ratio_abs_{name}`: mean |ℓ| over the tokens the sampler gave a probability
below the bucket's bound (and at least the previous bucket's): μ < 1e-3, 1e-3 ≤ μ < 0.1,
μ ≥ 0.1. Low-precision samplers disagree most on the unlikely tokens."""
_LOG_PROB_MIN = math.log(PROB_CLAMP)
_LOG_PROB_MAX = math.log1p(-PROB_CLAMP)

# Log-spaced bins for |ℓ| used to merge p99 across ranks: bin 0 holds
# |ℓ| < 1e-7, the others split [1e-7, 30] into steps of ~1 % relative width.
_HIST_MIN = 1e-7
_HIST_BINS = 2048
_HIST_LOG_MIN = math.log10(_HIST_MIN)
_HIST_LOG_WIDTH = (math.log10(LOG_RATIO_CLAMP) - _HIST_LOG_MIN) / _HIST_BINS

_TOKENS = (-2, -1)
_SUM_DTYPE = torch.float64  # exact token counts past 2**24 and stable sums


def log_ratio(learner_logprobs: Tensor, sampler_logprobs: Tensor) -> Tensor:
    """ℓ = log π − log μ in at least float32, clamped to ±LOG_RATIO_CLAMP."""
    dtype = torch.promote_types(learner_logprobs.dtype, torch.float32)
    ell = learner_logprobs.to(dtype) - sampler_logprobs.to(dtype)
    return ell.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def bernoulli_kl(sampler_logprobs: Tensor, learner_logprobs: Tensor) -> Tensor:
    """FlashREINFORCE's per-token d = μ log(μ/π) + (1−μ) log((1−μ)/(1−π)).

    The sampled token is one outcome, the rest of the vocabulary the other.
    """
    dtype = torch.promote_types(learner_logprobs.dtype, torch.float32)
    # Clamping log p clamps p, and saves taking the log of p again.
    log_mu = sampler_logprobs.to(dtype).clamp(_LOG_PROB_MIN, _LOG_PROB_MAX)
    log_pi = learner_logprobs.to(dtype).clamp(_LOG_PROB_MIN, _LOG_PROB_MAX)
    mu, pi = log_mu.exp(), log_pi.exp()
    return mu * (log_mu - log_pi) + (1 - mu) * (torch.log1p(-mu) - torch.log1p(-pi))


def grad_norm(parameters: Iterable[Tensor]) -> Tensor:
    """Global L2 norm of the gradients before clipping; NaN/Inf are kept, not raised.

    Sharded parameters (FSDP, tensor parallel) need the caller's all-reduce, as
    for `clip_grad_norm_`.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0).to(torch.float32)


def nonfinite_count(*tensors: Tensor) -> Tensor:
    """Number of NaN/Inf entries across `tensors` (e.g. the loss and the grads)."""
    counts = [(~torch.isfinite(t.detach())).sum().to(torch.float32) for t in tensors]
    return sum(
        counts, torch.zeros((), dtype=torch.float32, device=counts[0].device if counts else None)
    )


@dataclass(frozen=True)
class Partials:
    """What `stability_metrics` reduces over tokens and sequences, before dividing.

    The partials of several batches merge exactly (`merge_partials`): sums add, extremes
    take the maximum and the |ℓ| values are concatenated, so `finalize` of the merge is
    `stability_metrics` of the batches concatenated along the batch dim.
    """

    sums: dict[str, Tensor]
    """Added when merging: token and sequence counts and sums (float64)."""
    maxes: dict[str, Tensor]
    """Maximum taken when merging (a minimum travels as −max(−x))."""
    abs_log_ratio: Tensor | None = None
    """|ℓ| of every token, −inf for padding, [..., N]: the exact p99 on one rank."""
    histogram: Tensor | None = None
    """Counts of |ℓ| in the log-spaced bins, [..., 1 + bins]: the p99 across ranks."""

    def pack(self) -> tuple[Tensor, tuple[Any, ...]]:
        """One float64 vector and the layout that `unpack` needs (0-dim partials only):
        the Monitor copies a step's partials to the host in one copy."""
        scalars = [*self.sums.values(), *self.maxes.values()]
        if any(value.dim() != 0 for value in scalars):
            raise ValueError("log_batch takes one [B, T] batch (no leading dims)")
        pieces = [torch.stack(scalars).to(_SUM_DTYPE)]
        quantile = self.abs_log_ratio if self.abs_log_ratio is not None else self.histogram
        if quantile is not None:
            pieces.append(quantile.to(_SUM_DTYPE))
        layout = (tuple(self.sums), tuple(self.maxes), self.abs_log_ratio is not None)
        return torch.cat(pieces), layout

    @classmethod
    def unpack(cls, packed: Tensor, layout: tuple[Any, ...]) -> Partials:
        sum_names, max_names, exact = layout
        scalars = len(sum_names) + len(max_names)
        values = packed[:scalars].unbind()
        quantile = packed[scalars:] if packed.numel() > scalars else None
        return cls(
            sums=dict(zip(sum_names, values[: len(sum_names)], strict=True)),
            maxes=dict(zip(max_names, values[len(sum_names) :], strict=True)),
            abs_log_ratio=quantile if exact else None,
            histogram=None if exact else quantile,
        )


@dataclass(frozen=True)
class BatchInputs:
    """One batch of a step, as a trainer logs it: the inputs of the metrics (`compute`,
    `partials`), of the step details (`batched.details_of`) and of the Monitor's worker
    (`copy()` snapshots them). `stability_metrics`' arguments are its fields (docs there)."""

    sampler_logprobs: Tensor
    learner_logprobs: Tensor
    mask: Tensor | None = None
    rewards: Tensor | None = None
    advantages: Tensor | None = None
    gate_mask: Tensor | None = None
    logits: Tensor | None = None
    sampler_version: Tensor | None = None
    learner_version: Tensor | int | None = None
    token_ids: Tensor | None = None
    """The sampled token ids [B, T], for the step details' samples (`details.py`)."""
    seq_ids: Tensor | None = None
    """The caller's sequence ids [B] (integers), for the samples."""
    sampler_topk_ids: Tensor | None = None
    """The sampler's top-k token ids at each position [B, T, k] (< 0: no entry)."""
    sampler_topk_logprobs: Tensor | None = None
    """Their log-probabilities under the sampler [B, T, k]."""
    max_length: int | None = None
    """The answers' length cap (`response/*` metrics)."""

    def arguments(self) -> dict[str, Any]:
        """Every input, by name (what is shipped to the worker and copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def copy(self) -> BatchInputs:
        """Snapshot the tensors (one copy each), so the caller may reuse its buffers at once."""
        with torch.no_grad():  # copies without autograd history, no detach() needed
            return BatchInputs(**{name: _copy(value) for name, value in self.arguments().items()})

    def signature(self) -> tuple[Any, ...]:
        """Batches with equal signatures can be stacked into one call: the same inputs
        given, with the same dtypes and ranks (and vocabulary size for logits)."""
        kinds: list[Any] = []
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Tensor):
                vocab = tuple(value.shape[2:]) if field.name in _PER_POSITION else ()
                kinds.append((value.dtype, value.dim(), vocab))
            elif field.name == "max_length":
                kinds.append(value)  # only batches of one cap join or stack
            else:
                kinds.append(type(value))  # None, or an int learner_version
        return tuple(kinds)

    def stackable(self) -> bool:
        """A plain [B, T] batch whose other inputs have the shapes stability_metrics expects
        (padding would otherwise hide a shape error that the batch alone raises)."""
        if self.learner_logprobs.dim() != 2:
            return False
        seqs, length = self.learner_logprobs.shape
        tokens, per_seq = (seqs, length), (seqs,)
        shapes = {
            "sampler_logprobs": (tokens,),
            "mask": (tokens,),
            "rewards": (per_seq,),
            "advantages": (per_seq, tokens),
            "gate_mask": (per_seq, tokens),
            "sampler_version": (per_seq,),
            "token_ids": (tokens,),
            "seq_ids": (per_seq,),
        }
        for name, allowed in shapes.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) not in allowed:
                return False
        version = self.learner_version
        if isinstance(version, Tensor) and tuple(version.shape) not in ((), per_seq):
            return False  # per sequence when concat() joined micro-batches of other versions
        return all(
            getattr(self, name) is None or tuple(getattr(self, name).shape[:2]) == tokens
            for name in _PER_POSITION
        ) and _same_k(self.sampler_topk_ids, self.sampler_topk_logprobs)

    def compute(self, quantile: bool = True) -> dict[str, Tensor]:
        """`stability_metrics` of this batch."""
        return finalize(self.partials(quantile))

    def partials(self, quantile: bool = True) -> Partials:
        """`stability_partials` of this batch (all-reduced under data parallel)."""
        return _partials(self, quantile)

_PER_POSITION = ("logits", "sampler_topk_ids", "sampler_topk_logprobs")
"""[B, T, ...] inputs: their trailing dims (vocabulary, k) must agree to stack."""


def _same_k(ids: Tensor | None, logprobs: Tensor | None) -> bool:
    if ids is None or logprobs is None:
        return ids is None and logprobs is None
    return ids.dim() == 3 and tuple(ids.shape) == tuple(logprobs.shape)


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def stability_metrics(
    sampler_logprobs: Tensor,
    learner_logprobs: Tensor,
    mask: Tensor | None,
    *,
    rewards: Tensor | None = None,
    advantages: Tensor | None = None,
    gate_mask: Tensor | None = None,
    logits: Tensor | None = None,
    sampler_version: Tensor | None = None,
    learner_version: Tensor | int | None = None,
    sampler_topk_ids: Tensor | None = None,
    sampler_topk_logprobs: Tensor | None = None,
    max_length: int | None = None,
    quantile: bool = True,
) -> dict[str, Tensor]:
    """The docs/metrics.md metrics of one batch, as 0-dim float32 tensors on the input device.

    Args:
        sampler_logprobs: log μ of each sampled token, recorded at sampling, [..., B, T].
        learner_logprobs: log π of the same tokens under the trained weights, [..., B, T].
        mask: 1 for loss tokens, 0 for padding, [..., B, T]; None means all tokens.
        rewards: R_i, [..., B].
        advantages: A_i, [..., B] or [..., B, T]: `mismatch/unbounded_frac`, and
            counted in `nonfinite/count`.
        gate_mask: the loss's gated units (losses.py): [..., B, T] for token units,
            [..., B] for sequence units.
        logits: learner logits [..., B, T, V] for the exact entropy.
        sampler_version: weights version each sequence was sampled with, [..., B].
        learner_version: version of the weights being trained (int or tensor).
        sampler_topk_ids, sampler_topk_logprobs: the sampler's top-k at each position,
            [..., B, T, k] (ids, and their log μ as the sampler returned them; an id < 0
            or ≥ V is no entry): with `logits`, how far the two engines' distributions are
            apart over the sampler's top-k (`topk_disagreement`). Ignored without logits.
        max_length: the length cap of the answers (the sampler's max new tokens): the mask's
            tokens of a row are its answer, and a row with `max_length` of them or more was
            cut at the cap.
        quantile: compute `mismatch/log_ratio_p99` (one top-k of the tokens).

    Returns keys (always): `mismatch/kl`, `mismatch/kl_k1`, `mismatch/kl_k2`,
    `mismatch/ratio_max`, `mismatch/ratio_min`, `mismatch/log_ratio_abs_mean`,
    `mismatch/tail_frac`, `mismatch/tail_frac_2`, `mismatch/low_tail_frac`,
    `mismatch/log_ratio_abs_rare`, `_unlikely`, `_likely` (NaN where no token is in the bucket),
    `mismatch/seq_log_ratio_max`, `mismatch/ess_frac`, `mismatch/bkl_seq_max`,
    `mismatch/bkl_seq_mean`, `batch/seqs`, `batch/tokens`, `batch/len_mean`,
    `nonfinite/count`, and `policy/entropy` with logits or `policy/entropy_est`
    (token-mean −log μ) without. With quantile: `mismatch/log_ratio_p99`.
    With rewards: `reward/mean`, `reward/std` (population std). With advantages:
    `mismatch/unbounded_frac`. With gate_mask:
    `gate/frac`. With both versions: `staleness/lag_mean`, `staleness/lag_max`. With
    logits and the sampler's top-k: `mismatch/topk_tv`, `mismatch/topk_tv_max`,
    `mismatch/topk_kl` (over the tokens with at least one top-k entry; NaN without one).
    With max_length: `response/length_mean`, `response/length_max` (tokens of the answers),
    `response/truncated_frac` (the share cut at the cap) and `response/length_cap`.

    Padding never counts: a sequence is a row with at least one mask-1 token;
    rewards, advantages and versions of empty rows are ignored.
    """
    batch = BatchInputs(
        sampler_logprobs, learner_logprobs, mask, rewards=rewards, advantages=advantages,
        gate_mask=gate_mask, logits=logits, sampler_version=sampler_version,
        learner_version=learner_version, sampler_topk_ids=sampler_topk_ids,
        sampler_topk_logprobs=sampler_topk_logprobs, max_length=max_length,
    )  # fmt: skip
    return batch.compute(quantile)


def stability_partials(
    sampler_logprobs: Tensor,
    learner_logprobs: Tensor,
    mask: Tensor | None,
    *,
    rewards: Tensor | None = None,
    advantages: Tensor | None = None,
    gate_mask: Tensor | None = None,
    logits: Tensor | None = None,
    sampler_version: Tensor | None = None,
    learner_version: Tensor | int | None = None,
    sampler_topk_ids: Tensor | None = None,
    sampler_topk_logprobs: Tensor | None = None,
    max_length: int | None = None,
    quantile: bool = True,
) -> Partials:
    """`stability_metrics` up to the final divisions (all-reduced under data parallel).

    `finalize(stability_partials(...))` is `stability_metrics(...)`; merge the partials
    of several batches first (`merge_partials`) to get the metrics of them all.
    """
    batch = BatchInputs(
        sampler_logprobs, learner_logprobs, mask, rewards=rewards, advantages=advantages,
        gate_mask=gate_mask, logits=logits, sampler_version=sampler_version,
        learner_version=learner_version, sampler_topk_ids=sampler_topk_ids,
        sampler_topk_logprobs=sampler_topk_logprobs, max_length=max_length,
    )  # fmt: skip
    return batch.partials(quantile)


def _partials(batch: BatchInputs, quantile: bool) -> Partials:
    with torch.no_grad():
        partials = _local_partials(batch, quantile)
        if not data_parallel():
            return partials
        if partials.histogram is not None:
            dist.all_reduce(partials.histogram, op=dist.ReduceOp.SUM)
        return Partials(
            sums=_all_reduce(partials.sums, dist.ReduceOp.SUM),
            maxes=_all_reduce(partials.maxes, dist.ReduceOp.MAX),
            histogram=partials.histogram,
        )


def merge_partials(parts: Sequence[Partials]) -> Partials:
    """The partials of the batches together, as if concatenated along the batch dim.

    A quantity that only some of them carry (rewards given to some calls only) is left
    out: its metric would not be that of the whole.
    """
    if len(parts) == 1:
        return parts[0]
    sum_names = [name for name in parts[0].sums if all(name in p.sums for p in parts)]
    max_names = [name for name in parts[0].maxes if all(name in p.maxes for p in parts)]
    with torch.no_grad():
        abs_log_ratios = [p.abs_log_ratio for p in parts if p.abs_log_ratio is not None]
        histograms = [p.histogram for p in parts if p.histogram is not None]
        abs_log_ratio = torch.cat(abs_log_ratios, -1) if len(abs_log_ratios) == len(parts) else None
        histogram = reduce(torch.add, histograms) if len(histograms) == len(parts) else None
        return Partials(
            sums={name: reduce(torch.add, [p.sums[name] for p in parts]) for name in sum_names},
            maxes={
                name: reduce(torch.maximum, [p.maxes[name] for p in parts]) for name in max_names
            },
            abs_log_ratio=abs_log_ratio,
            histogram=histogram,
        )


def finalize(partials: Partials) -> dict[str, Tensor]:
    """The metrics of `partials` (see `stability_metrics`), as float32 tensors."""
    with torch.no_grad():
        p99 = None
        if partials.abs_log_ratio is not None:
            p99 = _exact_quantile(partials.abs_log_ratio, partials.sums["tokens"], 0.99)
        elif partials.histogram is not None:
            p99 = _histogram_quantile(partials.histogram, partials.sums["tokens"], 0.99)
        return _finalize(partials.sums, partials.maxes, p99)


def data_parallel() -> bool:
    """Is torch.distributed initialised with more than one rank (metrics then all-reduce)?"""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _masked_sum(
    values: Tensor, valid: Tensor | None, dims: tuple[int, ...] | int = _TOKENS
) -> Tensor:
    if valid is not None:
        values = torch.where(valid, values, 0)  # where, not multiply: padding may hold NaN
    # Sum in the input dtype (bool sums are exact int64), then widen for the reduction.
    return values.sum(dim=dims).to(_SUM_DTYPE)


def _masked_norm(values: Tensor, valid: Tensor | None, order: int) -> Tensor:
    if valid is not None:
        values = torch.where(valid, values, 0)
    return torch.linalg.vector_norm(values, ord=order, dim=_TOKENS).to(_SUM_DTYPE)


def _masked_max(
    values: Tensor, valid: Tensor | None, dims: tuple[int, ...] | int = _TOKENS
) -> Tensor:
    if valid is not None:
        values = torch.where(valid, values, -math.inf)
    return values.amax(dim=dims)


def _masked_min(
    values: Tensor, valid: Tensor | None, dims: tuple[int, ...] | int = _TOKENS
) -> Tensor:
    if valid is not None:
        values = torch.where(valid, values, math.inf)
    return values.amin(dim=dims)


def _count_nonfinite(
    values: Tensor, valid: Tensor | None, dims: tuple[int, ...] | int = _TOKENS
) -> Tensor:
    # x − x is 0 for finite x and NaN for ±inf and NaN; summing it as 0/1 floats
    # is ~4x cheaper on CPU than summing a bool mask (which casts to int64).
    # At least float32, so that bf16 inputs still count exactly.
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    return _masked_sum(torch.nan_to_num(values - values, nan=1.0), valid, dims)


def _local_partials(batch: BatchInputs, quantile: bool) -> Partials:
    """Per-rank sums (reduced with SUM) and extremes (reduced with MAX).

    Without a mask nothing is masked: the toy grid's hot path skips every where().
    """
    sampler_logprobs, learner_logprobs, mask = batch.sampler_logprobs, batch.learner_logprobs, batch.mask
    rewards, advantages, gate_mask, logits = batch.rewards, batch.advantages, batch.gate_mask, batch.logits
    sampler_version, learner_version, max_length = batch.sampler_version, batch.learner_version, batch.max_length
    sampler_topk_ids, sampler_topk_logprobs = batch.sampler_topk_ids, batch.sampler_topk_logprobs
    if (sampler_topk_ids is None) != (sampler_topk_logprobs is None):
        raise ValueError("sampler_topk_ids and sampler_topk_logprobs go together")
    *lead, seqs, seq_len = learner_logprobs.shape
    ell = log_ratio(learner_logprobs, sampler_logprobs)
    ratio_minus_one = torch.expm1(ell)  # keeps k3 accurate when ℓ ~ 1e-3 (bf16 mismatch)
    ratio = ratio_minus_one + 1
    valid = seq_valid = None
    if mask is None:
        tokens = torch.full(lead, seqs * seq_len, dtype=_SUM_DTYPE, device=ell.device)
        seq_count = torch.full(lead, seqs, dtype=_SUM_DTYPE, device=ell.device)
        seq_tokens: Tensor | int = seq_len
    else:
        valid = (mask != 0).expand(learner_logprobs.shape)
        seq_valid = valid.any(-1)
        tokens = valid.sum(_TOKENS).to(_SUM_DTYPE)
        seq_count = seq_valid.sum(-1).to(_SUM_DTYPE)
        seq_tokens = valid.sum(-1).clamp_min(1)

    sums: dict[str, Tensor] = {
        "tokens": tokens,
        "seqs": seq_count,
        "k3": _masked_sum(ratio_minus_one - ell, valid),
        "k1": -_masked_sum(ell, valid),
        # Norms reduce in one pass where square-then-sum takes three.
        "k2": 0.5 * _masked_norm(ell, valid, 2) ** 2,
        "abs": _masked_norm(ell, valid, 1),
        "ratio": _masked_sum(ratio, valid),
        "ratio_sq": _masked_norm(ratio, valid, 2) ** 2,
    }
    abs_ell = ell.abs()
    sums["tail"] = _masked_sum(abs_ell >= TAILS[0], valid)
    sums["tail_2"] = _masked_sum(abs_ell >= TAILS[1], valid)
    sums["low_tail"] = _masked_sum(ell <= -TAILS[0], valid)
    log_mu = sampler_logprobs.to(ell.dtype)
    low = -math.inf
    for name, bound in SAMPLER_PROB_BUCKETS:  # NaN log μ falls in none
        inside = (log_mu >= low) & (log_mu < math.log(bound)) if bound < 1 else log_mu >= low
        sums[f"abs_{name}"] = _masked_sum(torch.where(inside, abs_ell, 0), valid)
        sums[f"tokens_{name}"] = _masked_sum(inside, valid)
        low = math.log(bound)
    seq_log_ratio = ell if valid is None else torch.where(valid, ell, 0)
    seq_log_ratio = seq_log_ratio.sum(-1)
    bkl_seq = _masked_sum(bernoulli_kl(sampler_logprobs, learner_logprobs), valid, -1) / seq_tokens
    sums["bkl_seq"] = _masked_sum(bkl_seq, seq_valid, -1)
    maxes: dict[str, Tensor] = {
        "ratio_max": _masked_max(ratio, valid),
        # MIN travels as −max(−x) so that one MAX collective serves every extreme.
        "neg_ratio_min": -_masked_min(ratio, valid),
        "seq_log_ratio_max": _masked_max(seq_log_ratio, seq_valid, -1),
        "bkl_seq_max": _masked_max(bkl_seq, seq_valid, -1),
    }

    nonfinite = _count_nonfinite(sampler_logprobs, valid) + _count_nonfinite(
        learner_logprobs, valid
    )
    if logits is not None:
        logp_V = torch.log_softmax(logits.to(ell.dtype), dim=-1)
        entropy = torch.special.entr(logp_V.exp()).sum(-1)
        sums["entropy"] = _masked_sum(entropy, valid)
        if sampler_topk_ids is not None and sampler_topk_logprobs is not None:
            tv, kl, listed = topk_disagreement(logp_V, sampler_topk_ids, sampler_topk_logprobs)
            counted = listed if valid is None else valid & listed
            sums["topk_tokens"] = _masked_sum(counted, None)
            sums["topk_tv"] = _masked_sum(tv, counted)
            sums["topk_kl"] = _masked_sum(kl, counted)
            maxes["topk_tv_max"] = _masked_max(tv, counted)
    else:
        sums["entropy_est"] = -_masked_sum(sampler_logprobs.to(ell.dtype), valid)
    if rewards is not None:
        rewards64 = rewards.to(_SUM_DTYPE)
        sums["reward"] = _masked_sum(rewards64, seq_valid, -1)
        sums["reward_sq"] = _masked_sum(rewards64 * rewards64, seq_valid, -1)
        nonfinite = nonfinite + _count_nonfinite(rewards, seq_valid, -1)
    if advantages is not None:
        per_token = advantages.dim() == learner_logprobs.dim()
        nonfinite = nonfinite + _count_nonfinite(
            advantages, valid if per_token else seq_valid, _TOKENS if per_token else -1
        )
        advantages_B_T = advantages if per_token else advantages.unsqueeze(-1)
        unbounded = (advantages_B_T < 0) & (ratio > 1 + UNBOUNDED_EPS)  # a NaN A is neither
        sums["unbounded"] = _masked_sum(unbounded.expand(ell.shape), valid)
    sums["nonfinite"] = nonfinite
    if gate_mask is not None:
        per_token = gate_mask.dim() == learner_logprobs.dim()
        sums["gated"] = _masked_sum(
            gate_mask != 0, valid if per_token else seq_valid, _TOKENS if per_token else -1
        )
        sums["gate_units"] = tokens if per_token else seq_count
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        lengths = (valid.sum(-1) if valid is not None else torch.full((*lead, seqs), seq_len, device=ell.device)).to(_SUM_DTYPE)
        answered = seq_valid if seq_valid is not None else lengths > 0
        sums["truncated"] = _masked_sum(lengths >= max_length, answered, -1)
        maxes["len_max"] = _masked_max(lengths, answered, -1)
        maxes["length_cap"] = torch.full(lead, float(max_length), dtype=_SUM_DTYPE, device=ell.device)
    if sampler_version is not None and learner_version is not None:
        lag = (learner_version - sampler_version).to(_SUM_DTYPE)
        lag = lag.expand(*lead, seqs)
        sums["lag"] = _masked_sum(lag, seq_valid, -1)
        maxes["lag_max"] = _masked_max(lag, seq_valid, -1)

    if not quantile:
        return Partials(sums, maxes)
    valid_tokens = valid if valid is not None else torch.ones_like(ell, dtype=torch.bool)
    if data_parallel():
        return Partials(sums, maxes, histogram=_log_ratio_histogram(ell.abs(), valid_tokens))
    # Boolean indexing would sync to learn the count: padding becomes −inf instead.
    abs_log_ratio = torch.where(valid_tokens, ell.abs(), -math.inf).flatten(-2)
    return Partials(sums, maxes, abs_log_ratio=abs_log_ratio)


def topk_disagreement(
    learner_logp_V: Tensor, sampler_topk_ids: Tensor, sampler_topk_logprobs: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """How far the sampler's and the learner's next-token distributions are apart, seen
    through the sampler's top-k S (docs/metrics.md, "Both engines' view of a token").

    Both distributions are coarsened to k + 1 outcomes: each token of S, and "any other
    token" with the mass 1 − Σ_S left over. μ_j is the sampler's probability of j as it
    returned it, π_j = softmax(logits)_j the learner's. Per position:

        tv = ½ (Σ_S |μ_j − π_j| + |μ_rest − π_rest|)
        kl = Σ_S μ_j log(μ_j / π_j) + μ_rest log(μ_rest / π_rest)    (KL(μ‖π), π ≥ PROB_CLAMP)

    Coarsening never increases a divergence, so both are lower bounds of the total
    variation and the KL of the full distributions (exact when S holds every token either
    engine gives mass to). Args: the learner's log-softmax [..., V]; the top-k ids and
    their log μ [..., k] (an id < 0 or ≥ V is no entry: a position with fewer than k).
    Returns (tv, kl, listed) [...]: `listed` is whether the position has an entry; tv and
    kl are 0 where it has none.
    """
    vocab = learner_logp_V.shape[-1]
    entry = (sampler_topk_ids >= 0) & (sampler_topk_ids < vocab)
    ids = torch.where(entry, sampler_topk_ids, 0).long()
    log_pi = learner_logp_V.gather(-1, ids)
    log_mu = sampler_topk_logprobs.to(log_pi.dtype)
    mu = torch.where(entry, log_mu.exp(), 0)
    pi = torch.where(entry, log_pi.exp(), 0)
    mu_rest = (1 - mu.sum(-1)).clamp_min(0)
    pi_rest = (1 - pi.sum(-1)).clamp_min(0)
    tv = 0.5 * ((mu - pi).abs().sum(-1) + (mu_rest - pi_rest).abs())
    # xlogy: a μ of 0 adds 0 whatever π is; π is floored so that one token the learner
    # rules out does not make the step's mean infinite.
    floor = math.log(PROB_CLAMP)
    kl_S = torch.special.xlogy(mu, mu) - mu * log_pi.clamp_min(floor)
    kl = torch.where(entry, kl_S, 0).sum(-1)
    kl = kl + torch.special.xlogy(mu_rest, mu_rest) - mu_rest * pi_rest.clamp_min(PROB_CLAMP).log()
    return tv, kl, entry.any(-1)


def _exact_quantile(values: Tensor, count: Tensor, q: float) -> Tensor:
    """torch.quantile (linear interpolation) over the `count` valid entries of `values`
    [..., N] (the others −inf), without a host sync.

    The largest ⌊(1 − q)(N − 1)⌋ + 2 entries (N known from the shape) are taken in
    descending order, which hold both order statistics around q·(count − 1) for any
    count ≤ N, and those are gathered at tensor-valued positions.
    """
    size = values.shape[-1]
    top = values.topk(min(size, math.floor((1 - q) * (size - 1)) + 2), dim=-1).values
    pos = (q * (count - 1)).clamp_min(0)
    below = pos.floor()
    # Ascending position p among `count` values is descending position count − 1 − p.
    ranks = (count - 1).unsqueeze(-1) - torch.stack([below, pos.ceil()], -1)
    bounds = top.gather(-1, ranks.clamp(0, top.shape[-1] - 1).long())
    value = torch.lerp(bounds[..., 0], bounds[..., 1], (pos - below).to(values.dtype))
    return torch.where(count > 0, value, math.nan)


def _log_ratio_histogram(abs_ell: Tensor, valid: Tensor) -> Tensor:
    """Counts of |ℓ| in the fixed log-spaced bins, [..., 1 + _HIST_BINS]."""
    scaled = (abs_ell.clamp_min(_HIST_MIN).log10() - _HIST_LOG_MIN) / _HIST_LOG_WIDTH
    index = 1 + scaled.floor().clamp(0, _HIST_BINS - 1)
    index = torch.where(abs_ell < _HIST_MIN, 0, index)
    index = torch.where(torch.isnan(abs_ell), _HIST_BINS, index).long().flatten(-2)
    counts = valid.flatten(-2).to(_SUM_DTYPE)
    hist = torch.zeros((*index.shape[:-1], _HIST_BINS + 1), dtype=_SUM_DTYPE, device=index.device)
    return hist.scatter_add_(-1, index, counts)


def _histogram_quantile(hist: Tensor, count: Tensor, q: float) -> Tensor:
    """Geometric centre of the bin holding the order statistic at q·(n − 1)."""
    rank = (q * (count - 1)).clamp_min(0).floor()
    bin_index = (hist.cumsum(-1) <= rank.unsqueeze(-1)).sum(-1).clamp_max(_HIST_BINS)
    centre = 10 ** (_HIST_LOG_MIN + (bin_index.to(_SUM_DTYPE) - 0.5) * _HIST_LOG_WIDTH)
    value = torch.where(bin_index == 0, 0.0, centre)
    return torch.where(count > 0, value, math.nan)


def _all_reduce(parts: dict[str, Tensor], op: dist.ReduceOp.RedOpType) -> dict[str, Tensor]:
    """One collective for a whole dict of same-shaped partials."""
    names = list(parts)
    packed = torch.stack([parts[name].to(_SUM_DTYPE) for name in names])
    dist.all_reduce(packed, op=op)
    return dict(zip(names, packed.unbind(0), strict=True))


def _finalize(
    sums: dict[str, Tensor], maxes: dict[str, Tensor], p99: Tensor | None
) -> dict[str, Tensor]:
    tokens, seqs = sums["tokens"], sums["seqs"]
    has_tokens = tokens > 0
    out = {
        "mismatch/kl": sums["k3"] / tokens,
        "mismatch/kl_k1": sums["k1"] / tokens,
        "mismatch/kl_k2": sums["k2"] / tokens,
        "mismatch/ratio_max": torch.where(has_tokens, maxes["ratio_max"], math.nan),
        "mismatch/ratio_min": torch.where(has_tokens, -maxes["neg_ratio_min"], math.nan),
        "mismatch/log_ratio_abs_mean": sums["abs"] / tokens,
        "mismatch/tail_frac": sums["tail"] / tokens,
        "mismatch/tail_frac_2": sums["tail_2"] / tokens,
        "mismatch/low_tail_frac": sums["low_tail"] / tokens,
        **{
            f"mismatch/log_ratio_abs_{name}": sums[f"abs_{name}"] / sums[f"tokens_{name}"]
            for name, _ in SAMPLER_PROB_BUCKETS
        },
        "mismatch/seq_log_ratio_max": torch.where(has_tokens, maxes["seq_log_ratio_max"], math.nan),
        "mismatch/ess_frac": sums["ratio"] * sums["ratio"] / (tokens * sums["ratio_sq"]),
        "mismatch/bkl_seq_max": torch.where(has_tokens, maxes["bkl_seq_max"], math.nan),
        "mismatch/bkl_seq_mean": sums["bkl_seq"] / seqs,
        "batch/seqs": seqs,
        "batch/tokens": tokens,
        "batch/len_mean": tokens / seqs,
        "nonfinite/count": sums["nonfinite"],
    }
    if p99 is not None:
        out["mismatch/log_ratio_p99"] = p99
    if "entropy" in sums:
        out["policy/entropy"] = sums["entropy"] / tokens
    else:
        out["policy/entropy_est"] = sums["entropy_est"] / tokens
    if "reward" in sums:
        mean = sums["reward"] / seqs
        out["reward/mean"] = mean
        out["reward/std"] = (sums["reward_sq"] / seqs - mean * mean).clamp_min(0).sqrt()
    if "gated" in sums:
        out["gate/frac"] = sums["gated"] / sums["gate_units"]
    if "unbounded" in sums:
        out["mismatch/unbounded_frac"] = sums["unbounded"] / tokens
    if "topk_tv" in sums:
        listed = sums["topk_tokens"]
        out["mismatch/topk_tv"] = sums["topk_tv"] / listed
        out["mismatch/topk_kl"] = sums["topk_kl"] / listed
        out["mismatch/topk_tv_max"] = torch.where(listed > 0, maxes["topk_tv_max"], math.nan)
    if "truncated" in sums:
        out["response/length_mean"] = tokens / seqs
        out["response/length_max"] = torch.where(seqs > 0, maxes["len_max"], math.nan)
        out["response/truncated_frac"] = sums["truncated"] / seqs
        out["response/length_cap"] = maxes["length_cap"]
    if "lag" in sums:
        out["staleness/lag_mean"] = sums["lag"] / seqs
        out["staleness/lag_max"] = torch.where(seqs > 0, maxes["lag_max"], math.nan)
    return {name: value.to(torch.float32) for name, value in out.items()}
