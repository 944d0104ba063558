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
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from trainer_hooks.details import DetailPartials, detail_partials
from trainer_hooks.metrics import BatchInputs

__all__ = ["compute", "concat", "details_of"]

logger = logging.getLogger("keel")


def details_of(batch: BatchInputs, worst: int) -> DetailPartials:
    """The step details of `batch` (`details.py`), `worst` samples at most."""
    return detail_partials(
        batch.sampler_logprobs,
        batch.learner_logprobs,
        batch.mask,
        token_ids=batch.token_ids,
        seq_ids=batch.seq_ids,
        rewards=batch.rewards,
        advantages=batch.advantages,
        sampler_version=batch.sampler_version,
        logits=batch.logits,
        sampler_topk_ids=batch.sampler_topk_ids,
        sampler_topk_logprobs=batch.sampler_topk_logprobs,
        worst=worst,
    )


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
