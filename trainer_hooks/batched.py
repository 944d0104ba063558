"""`stability_metrics` of many learner batches in one call (in the Monitor's worker process).

On CPU `stability_metrics` costs ~100 small tensor operations whatever the batch size, so
computing one step at a time is dominated by per-operation overhead. `compute` stacks the
batches of several steps along a new leading dimension, padding them to a common shape
with mask 0 (padding never counts), and calls `stability_metrics` once per group of
batches that carry the same kinds of inputs: the per-step values are those of
`stability_metrics` on each batch alone, for a fraction of the work.

`concat` makes one batch of the micro-batches of one step (the Monitor merges a step
logged in several `log_batch` calls): concatenated along the batch dim, the shorter ones
padded with mask 0, so its metrics are exactly those of the whole step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from trainer_hooks.details import DetailPartials, detail_partials
from trainer_hooks.metrics import Partials, stability_metrics, stability_partials

__all__ = ["BatchInputs", "compute", "concat"]

logger = logging.getLogger("keel")


@dataclass(frozen=True)
class BatchInputs:
    """The arguments of one `stability_metrics` call (`copy()` snapshots them)."""

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

    def metric_arguments(self) -> dict[str, Any]:
        """The keyword arguments of `stability_metrics`."""
        arguments = self.arguments()
        del arguments["token_ids"], arguments["seq_ids"]
        return arguments

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

    def compute(self) -> dict[str, Tensor]:
        return stability_metrics(**self.metric_arguments())

    def partials(self) -> Partials:
        return stability_partials(**self.metric_arguments())

    def details(self, worst: int) -> DetailPartials:
        """The step details of this batch (`details.py`), `worst` samples at most."""
        return detail_partials(
            self.sampler_logprobs,
            self.learner_logprobs,
            self.mask,
            token_ids=self.token_ids,
            seq_ids=self.seq_ids,
            rewards=self.rewards,
            advantages=self.advantages,
            sampler_version=self.sampler_version,
            logits=self.logits,
            sampler_topk_ids=self.sampler_topk_ids,
            sampler_topk_logprobs=self.sampler_topk_logprobs,
            worst=worst,
        )


_PER_POSITION = ("logits", "sampler_topk_ids", "sampler_topk_logprobs")
"""[B, T, ...] inputs: their trailing dims (vocabulary, k) must agree to stack."""


def _same_k(ids: Tensor | None, logprobs: Tensor | None) -> bool:
    if ids is None or logprobs is None:
        return ids is None and logprobs is None
    return ids.dim() == 3 and tuple(ids.shape) == tuple(logprobs.shape)


def concat(batches: Sequence[BatchInputs]) -> BatchInputs:
    """One batch of `batches` concatenated along the batch dim, the shorter ones padded
    with mask 0: its stability metrics are those of all of them together.

    Raises ValueError when they do not fit together (other kinds of inputs, shapes that
    `stability_metrics` would refuse); the caller then merges their `Partials` instead.
    """
    if len(batches) == 1:
        return batches[0]
    # The same inputs given, with the same dtypes and ranks; a mask may be left out (all 1).
    kinds = {_joinable_kind(b) for b in batches}
    if len(kinds) != 1 or not all(b.stackable() for b in batches):
        raise ValueError("the log_batch calls of a step give different kinds of inputs")
    length = max(b.learner_logprobs.shape[-1] for b in batches)
    joined: dict[str, Any] = {}
    if all(b.mask is None for b in batches) and all(
        b.learner_logprobs.shape[-1] == length for b in batches
    ):
        joined["mask"] = None
    else:
        joined["mask"] = torch.cat([_pad_length(_mask_of(b), length) for b in batches])
    for field in fields(BatchInputs):
        values = [getattr(b, field.name) for b in batches]
        if field.name == "mask":
            continue
        if field.name == "learner_version":
            joined[field.name] = _join_versions(batches)
        elif values[0] is None or field.name == "max_length":
            joined[field.name] = values[0]  # the kinds agree: one cap
        else:
            joined[field.name] = torch.cat([_pad_length(v, length) for v in values])
    return BatchInputs(**joined)


def _joinable_kind(batch: BatchInputs) -> tuple[Any, ...]:
    """What must agree for batches to join: every input's kind but the mask's (a left-out
    mask is all ones) and the learner version's (only whether one is given)."""
    names = [f.name for f in fields(BatchInputs)]
    kinds = dict(zip(names, batch.signature(), strict=True))
    del kinds["mask"]
    kinds["learner_version"] = batch.learner_version is None
    return tuple(kinds.values())


def _mask_of(batch: BatchInputs) -> Tensor:
    if batch.mask is None:
        return torch.ones_like(batch.learner_logprobs, dtype=torch.bool)
    return batch.mask != 0


def _pad_length(tensor: Tensor, length: int) -> Tensor:
    """[B] as it is; [B, T(, V)] zero-padded to T = length."""
    if tensor.dim() < 2 or tensor.shape[1] == length:
        return tensor
    out = tensor.new_zeros((tensor.shape[0], length, *tensor.shape[2:]))
    out[:, : tensor.shape[1]] = tensor
    return out


def _join_versions(batches: Sequence[BatchInputs]) -> Tensor | int | None:
    """The learner version of the joined batch: the common one, else one per sequence."""
    versions = [b.learner_version for b in batches]
    if versions[0] is None:
        return None
    as_tensors = [torch.as_tensor(v) for v in versions]  # type: ignore[arg-type]
    if all(torch.equal(v, as_tensors[0]) for v in as_tensors):
        return versions[0]
    return torch.cat(
        [v.expand(b.learner_logprobs.shape[0]) for v, b in zip(as_tensors, batches, strict=True)]
    )


def compute(
    batches: Sequence[BatchInputs], warn: Callable[[str, str], None] | None = None
) -> list[dict[str, float]]:
    """The metrics of each batch, as floats, in order. A batch that fails gets {}.

    `warn(what, message)` reports a failure (default: the "keel" logger).
    """
    report = warn or (lambda what, message: logger.warning("keel: %s", message))
    results: list[dict[str, float]] = [{} for _ in batches]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, batch in enumerate(batches):
        groups.setdefault(batch.signature(), []).append(index)
    for indices in groups.values():
        group = [batches[i] for i in indices]
        try:
            if len(group) == 1:
                values = _as_floats(group[0].compute(), 1)
            elif all(b.stackable() for b in group):
                values = _as_floats(_stack(group).compute(), len(group))
            else:
                raise ValueError("a batch's shapes do not fit; each alone")
        except Exception:  # one bad batch must not cost the others their metrics
            values = [_alone(batch, report) for batch in group]
        for i, row in zip(indices, values, strict=True):
            results[i] = row
    return results


def _alone(batch: BatchInputs, report: Callable[[str, str], None]) -> dict[str, float]:
    try:
        return _as_floats(batch.compute(), 1)[0]
    except Exception as exc:
        report(f"batched:{type(exc).__name__}", f"stability metrics lost: {exc!r}")
        return {}


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def _as_floats(metrics: dict[str, Tensor], steps: int) -> list[dict[str, float]]:
    """Per step, name -> float: values are [steps] tensors, or 0-dim for one step."""
    names = list(metrics)
    table = torch.stack([metrics[name] for name in names], -1).reshape(steps, len(names))
    return [dict(zip(names, row, strict=True)) for row in table.tolist()]


def _stack(batches: list[BatchInputs]) -> BatchInputs:
    """One batch [K, ...] of K batches, padded to the largest B and T with mask 0."""
    seqs = max(b.learner_logprobs.shape[-2] for b in batches)
    length = max(b.learner_logprobs.shape[-1] for b in batches)
    masks = [
        b.mask if b.mask is not None else torch.ones_like(b.learner_logprobs, dtype=torch.bool)
        for b in batches
    ]
    stacked: dict[str, Any] = {"mask": _pad([m != 0 for m in masks], seqs, length)}
    for field in fields(BatchInputs):
        if field.name == "mask":
            continue
        values = [getattr(b, field.name) for b in batches]
        if values[0] is None or field.name == "max_length":
            stacked[field.name] = values[0]  # one signature: one cap
        elif field.name == "learner_version" and isinstance(values[0], Tensor) and values[0].dim():
            stacked[field.name] = _pad(values, seqs, length)  # one version per sequence
        elif field.name == "learner_version":
            stacked[field.name] = torch.as_tensor(
                [int(v) if not isinstance(v, Tensor) else v.item() for v in values]
            ).unsqueeze(-1)
        else:
            stacked[field.name] = _pad(values, seqs, length)
    return BatchInputs(**stacked)


def _pad(tensors: list[Tensor], seqs: int, length: int) -> Tensor:
    """Stack [B] / [B, T] / [B, T, V] tensors into [K, seqs(, length(, V))], zero-padded."""
    shape = (seqs, length, *tensors[0].shape[2:])[: tensors[0].dim()]
    if all(t.shape == shape for t in tensors):
        return torch.stack(tensors)
    out = tensors[0].new_zeros((len(tensors), *shape))
    for index, tensor in enumerate(tensors):
        region: tuple[int | slice, ...] = (index, *(slice(0, n) for n in tensor.shape))
        out[region] = tensor
    return out
