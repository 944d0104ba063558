"""Where the mismatch lives: the step details of a `log_batch` step (docs/metrics.md).

Besides its scalars, a step sends (docs/protocol.md, "Step details"):

- `mismatch/log_ratio`: the histogram of ℓ = log π − log μ over the mask's tokens, on the
  fixed signed-log `EDGES` (values beyond ±10 in the end bins, NaN counted apart);
- `mismatch/log_ratio_unbounded`: the same over the tokens no loss bounds, those with a
  negative advantage that the learner likes more than the sampler did (A < 0, r > 1);
  importance sampling and PPO give them a step r times their advantage (with advantages);
- `samples`: the step's `k` worst sequences, ranked by their largest ℓ (NaN first), each
  with the tokens around its worst token (ids, decoded text, ℓ, log μ, log π);
- `sequences`: (length, Σℓ) of the step's sequences, a uniform subsample of at most
  `PAIRS` of them: mismatch against length.

`detail_partials` reduces one batch to fixed-size tensors that merge exactly
(`merge_details`): counts add, the worst candidates keep the k largest scores (top-k of
top-k), the pairs keep the `PAIRS` smallest of their random keys (a uniform subsample of
the union). Under torch.distributed every rank takes part in one all-reduce (the counts)
and one all-gather (candidates and pairs); on a GPU nothing is read back until the
Monitor's one asynchronous copy. `finalize_details` (in the Monitor's worker) turns the
merge into the wire's fields, within a byte budget for the samples.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trainer_hooks.metrics import UNBOUNDED_EPS, data_parallel
from wire import encode_samples

__all__ = [
    "EDGES",
    "HISTOGRAM_KEYS",
    "PAIRS",
    "WINDOW",
    "DetailPartials",
    "Details",
    "detail_partials",
    "finalize_details",
    "merge_details",
]

_DECADES = (-4, 1)
_PER_DECADE = 5


def _signed_log_edges() -> tuple[float, ...]:
    low, high = _DECADES
    magnitudes = [10.0 ** (low + i / _PER_DECADE) for i in range((high - low) * _PER_DECADE + 1)]
    magnitudes = [float(f"{m:.6g}") for m in magnitudes]  # 0.001 rather than 0.0009999999
    return (*(-m for m in reversed(magnitudes)), *magnitudes)


EDGES: tuple[float, ...] = _signed_log_edges()
"""Bin edges of the ℓ histograms: ±10^(−4 … 1) at five bins per decade, and one bin
[−10⁻⁴, 10⁻⁴) around zero: 51 bins. Values below −10 or above 10 count in the end bins."""
BINS = len(EDGES) - 1
HISTOGRAM_KEYS = ("mismatch/log_ratio", "mismatch/log_ratio_unbounded")
WINDOW = 16
"""Tokens shown on each side of a sample's worst token."""
PAIRS = 256
"""(length, Σℓ) pairs kept per step."""

# Columns of a worst-sequence candidate row, then five blocks of 2·WINDOW + 1 token columns.
_SCORE, _INDEX, _RANK, _VERSION, _REWARD, _ADVANTAGE, _LENGTH, _SEQ_LR, _WORST = range(9)
_HEAD = 9
_BLOCKS = ("valid", "token_id", "log_ratio", "sampler_logprob", "learner_logprob")
_SPAN = 2 * WINDOW + 1
_COLUMNS = _HEAD + len(_BLOCKS) * _SPAN
_F64 = torch.float64


@dataclass(frozen=True)
class DetailPartials:
    """One batch's details before they are finalised; merge with `merge_details`."""

    counts: Tensor
    """[2, BINS + 1]: ℓ counts over the mask's tokens and over the unbounded ones; the last
    column counts NaN ℓ."""
    worst: Tensor
    """[k, _COLUMNS]: the k worst sequences (score −inf: no sequence)."""
    pairs: Tensor
    """[PAIRS, 3]: (key, length, Σℓ) of a subsample of the sequences (key +inf: none)."""
    seqs: Tensor
    """[world]: the batch's rows on each data-parallel rank (one entry without data
    parallel), so that merged micro-batches number each rank's sequences on."""
    unbounded: bool
    """Whether advantages were given (the second histogram means something)."""
    world: int = 1
    """Data-parallel ranks gathered: samples then name their rank in `seq_id`."""
    given_ids: bool = False
    """The caller's sequence ids are in the index column (else the row in the batch)."""

    def pack(self) -> tuple[Tensor, tuple[Any, ...]]:
        """One float64 vector and its layout (`unpack`), for the Monitor's one copy."""
        pieces = [self.counts.reshape(-1), self.worst.reshape(-1), self.pairs.reshape(-1)]
        packed = torch.cat([*(p.to(_F64) for p in pieces), self.seqs.to(_F64).reshape(-1)])
        return packed, (tuple(self.worst.shape), self.unbounded, self.world, self.given_ids)

    @classmethod
    def unpack(cls, packed: Tensor, layout: tuple[Any, ...]) -> DetailPartials:
        worst_shape, unbounded, world, given_ids = layout
        counts_n = 2 * (BINS + 1)
        worst_n = worst_shape[0] * worst_shape[1]
        pairs_n = PAIRS * 3
        return cls(
            counts=packed[:counts_n].reshape(2, BINS + 1),
            worst=packed[counts_n : counts_n + worst_n].reshape(worst_shape),
            pairs=packed[counts_n + worst_n : counts_n + worst_n + pairs_n].reshape(PAIRS, 3),
            seqs=packed[counts_n + worst_n + pairs_n :],
            unbounded=unbounded,
            world=world,
            given_ids=given_ids,
        )


@dataclass
class Details:
    """A step's details as the wire carries them."""

    histograms: dict[str, dict[str, Any]]
    samples: list[dict[str, Any]]
    sequences: dict[str, list[Any]]


_GENERATORS: dict[str, torch.Generator] = {}
_EDGES: dict[tuple[torch.dtype, str], Tensor] = {}


def _inner_edges(dtype: torch.dtype, device: torch.device) -> Tensor:
    """EDGES without the two ends, on `device`, copied there once (a copy from pageable
    host memory would wait for the device)."""
    key = (dtype, str(device))
    edges = _EDGES.get(key)
    if edges is None:
        edges = _EDGES[key] = torch.tensor(EDGES[1:-1], dtype=dtype).to(device)
    return edges


def _keys(count: int, device: torch.device) -> Tensor:
    """Random subsample keys from a generator of Keel's own (the trainer's RNG untouched)."""
    name = str(device)
    generator = _GENERATORS.get(name)
    if generator is None:
        generator = torch.Generator(device=device)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        generator.manual_seed(0x4B45454C + rank)
        _GENERATORS[name] = generator
    return torch.rand(count, generator=generator, device=device, dtype=_F64)


def detail_partials(
    sampler_logprobs: Tensor,
    learner_logprobs: Tensor,
    mask: Tensor | None,
    *,
    token_ids: Tensor | None = None,
    seq_ids: Tensor | None = None,
    rewards: Tensor | None = None,
    advantages: Tensor | None = None,
    sampler_version: Tensor | None = None,
    worst: int = 4,
) -> DetailPartials:
    """The details of one [B, T] batch (the arguments of `stability_metrics`, the sampled
    token ids [B, T] and the caller's sequence ids [B], integers). All-reduced and
    all-gathered under data parallel."""
    with torch.no_grad():
        part = _local(
            sampler_logprobs, learner_logprobs, mask, token_ids, seq_ids, rewards, advantages,
            sampler_version, worst,
        )  # fmt: skip
        if not data_parallel():
            return part
        counts = part.counts.clone()
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        rank = dist.get_rank()
        world = dist.get_world_size()
        mine = part.worst.clone()
        mine[:, _RANK] = rank
        flat = torch.cat([mine.reshape(-1), part.pairs.reshape(-1), part.seqs.reshape(1)])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        worst_n = mine.numel()
        pairs_n = part.pairs.numel()
        worsts = [g[:worst_n].reshape(mine.shape) for g in gathered]
        pairs = [g[worst_n : worst_n + pairs_n].reshape(part.pairs.shape) for g in gathered]
        return DetailPartials(
            counts=counts,
            worst=_top_worst(torch.cat(worsts), mine.shape[0]),
            pairs=_bottom_pairs(torch.cat(pairs)),
            seqs=torch.cat([g[-1:] for g in gathered]),  # each rank's rows: numbered per rank
            unbounded=part.unbounded,
            world=world,
            given_ids=part.given_ids,
        )


def _local(
    sampler_logprobs: Tensor,
    learner_logprobs: Tensor,
    mask: Tensor | None,
    token_ids: Tensor | None,
    seq_ids: Tensor | None,
    rewards: Tensor | None,
    advantages: Tensor | None,
    sampler_version: Tensor | None,
    worst: int,
) -> DetailPartials:
    if learner_logprobs.dim() != 2:
        raise ValueError("step details take one [B, T] batch")
    seqs, length = learner_logprobs.shape
    device = learner_logprobs.device
    dtype = torch.promote_types(learner_logprobs.dtype, torch.float32)
    learner = learner_logprobs.to(dtype)
    sampler = sampler_logprobs.to(dtype)
    ell = learner - sampler
    valid = (
        torch.ones_like(ell, dtype=torch.bool) if mask is None else (mask != 0).expand(ell.shape)
    )

    # Histograms: bins [e(i-1), e(i)), the end bins open-ended, NaN in its own column.
    edges = _inner_edges(dtype, device)
    nan = torch.isnan(ell)
    index = torch.bucketize(torch.where(nan, 0, ell), edges, right=True)
    index = torch.where(nan, BINS, index).reshape(-1)
    counts = torch.zeros((2, BINS + 1), dtype=_F64, device=device)
    counts[0].scatter_add_(0, index, valid.reshape(-1).to(_F64))
    advantages_B_T = None
    if advantages is not None:
        per_token = advantages.dim() == 2
        advantages_B_T = (advantages if per_token else advantages.unsqueeze(-1)).expand(ell.shape)
        unbounded = valid & (advantages_B_T < 0) & (torch.expm1(ell) > UNBOUNDED_EPS)
        counts[1].scatter_add_(0, index, unbounded.reshape(-1).to(_F64))

    # The worst sequences: largest ℓ (NaN ranks first), the window around it.
    score_B_T = torch.where(nan, math.inf, ell)
    score_B_T = torch.where(valid, score_B_T, -math.inf)
    score_B, worst_pos = score_B_T.max(-1)
    lengths = valid.sum(-1).to(_F64)
    seq_log_ratio = torch.where(valid, ell, 0).sum(-1).to(_F64)
    take = min(worst, seqs)
    rows = score_B.topk(take).indices if take else torch.zeros(0, dtype=torch.long, device=device)
    table = torch.full((worst, _COLUMNS), math.nan, dtype=_F64, device=device)
    table[:, _SCORE] = -math.inf
    if take:
        pos = worst_pos[rows]
        head = table[:take]
        head[:, _SCORE] = score_B[rows].to(_F64)
        head[:, _INDEX] = (rows if seq_ids is None else seq_ids.reshape(-1)[rows]).to(_F64)
        head[:, _RANK] = 0
        if sampler_version is not None:
            head[:, _VERSION] = sampler_version.reshape(-1)[rows].to(_F64)
        if rewards is not None:
            head[:, _REWARD] = rewards.reshape(-1)[rows].to(_F64)
        if advantages_B_T is not None:
            head[:, _ADVANTAGE] = advantages_B_T[rows, pos].to(_F64)
        head[:, _LENGTH] = lengths[rows]
        head[:, _SEQ_LR] = seq_log_ratio[rows]
        head[:, _WORST] = pos.to(_F64)
        window = pos.unsqueeze(-1) + torch.arange(-WINDOW, WINDOW + 1, device=device)
        inside = (window >= 0) & (window < length)
        window = window.clamp(0, length - 1)
        shown = inside & valid[rows].gather(1, window)
        blocks = {
            "valid": shown,
            "token_id": token_ids[rows].gather(1, window) if token_ids is not None else None,
            "log_ratio": ell[rows].gather(1, window),
            "sampler_logprob": sampler[rows].gather(1, window),
            "learner_logprob": learner[rows].gather(1, window),
        }
        for number, name in enumerate(_BLOCKS):
            block = blocks[name]
            if block is not None:
                start = _HEAD + number * _SPAN
                head[:, start : start + _SPAN] = block.to(_F64)

    # (length, Σℓ) of a uniform subsample: the PAIRS smallest random keys.
    keys = torch.where(valid.any(-1), _keys(seqs, device), math.inf)
    pairs = torch.stack([keys, lengths, seq_log_ratio], -1)
    return DetailPartials(
        counts=counts,
        worst=table,
        pairs=_bottom_pairs(pairs),
        seqs=torch.full((1,), seqs, dtype=_F64, device=device),
        unbounded=advantages is not None,
        given_ids=seq_ids is not None,
    )


def _top_worst(rows: Tensor, k: int) -> Tensor:
    if rows.shape[0] <= k:
        return rows
    return rows[rows[:, _SCORE].topk(k).indices]


def _bottom_pairs(pairs: Tensor) -> Tensor:
    """The PAIRS rows with the smallest keys, padded with key +inf to exactly PAIRS rows."""
    if pairs.shape[0] > PAIRS:
        return pairs[pairs[:, 0].topk(PAIRS, largest=False).indices]
    pad = pairs.new_full((PAIRS - pairs.shape[0], 3), math.nan)
    pad[:, 0] = math.inf
    return torch.cat([pairs, pad])


def merge_details(parts: Sequence[DetailPartials]) -> DetailPartials:
    """The details of the batches together, as if concatenated along the batch dim (in
    order: a later batch's sequences are numbered after the earlier ones'; under data
    parallel each rank's after that rank's own, whatever the other ranks' batch sizes)."""
    if len(parts) == 1:
        return parts[0]
    with torch.no_grad():
        offsets = torch.zeros(max(p.seqs.numel() for p in parts), dtype=_F64)  # rows per rank
        worsts = []
        for part in parts:
            shifted = part.worst.clone()
            if not part.given_ids:
                ranks = shifted[:, _RANK].nan_to_num(0).long()  # NaN: a row without a sequence
                shifted[:, _INDEX] += offsets.to(shifted.device)[ranks]
            worsts.append(shifted)
            seqs = part.seqs.to("cpu", _F64).reshape(-1)
            offsets[: seqs.numel()] += seqs
        return DetailPartials(
            counts=sum(p.counts for p in parts),  # type: ignore[arg-type]
            worst=_top_worst(torch.cat(worsts), max(p.worst.shape[0] for p in parts)),
            pairs=_bottom_pairs(torch.cat([p.pairs for p in parts])),
            seqs=offsets,
            unbounded=all(p.unbounded for p in parts),
            world=max(p.world for p in parts),
            given_ids=all(p.given_ids for p in parts),
        )


def finalize_details(
    part: DetailPartials,
    *,
    decode: Callable[[list[int]], list[str]] | None = None,
    max_sample_bytes: int = 16 * 1024,
) -> Details:
    """The wire's fields of merged details (in the worker, on CPU)."""
    counts = part.counts.to("cpu", _F64)
    histograms: dict[str, dict[str, Any]] = {}
    for number, key in enumerate(HISTOGRAM_KEYS):
        if number == 1 and not part.unbounded:
            continue
        row = [int(c) for c in counts[number].tolist()]
        histogram: dict[str, Any] = {"edges": list(EDGES), "counts": row[:BINS]}
        if row[BINS]:
            histogram["nan"] = row[BINS]
        histograms[key] = histogram
    ranks = part.world > 1 and not part.given_ids
    samples = _samples(part.worst.to("cpu", _F64), decode, ranks)
    samples = _within(samples, max_sample_bytes)
    pairs = part.pairs.to("cpu", _F64)
    pairs = pairs[torch.isfinite(pairs[:, 0])]
    pairs = pairs[pairs[:, 1].argsort(stable=True)]
    sequences = {
        "length": [int(n) for n in pairs[:, 1].tolist()],
        "log_ratio": pairs[:, 2].tolist(),
    }
    return Details(histograms, samples, sequences)


def _samples(
    table: Tensor, decode: Callable[[list[int]], list[str]] | None, ranks: bool
) -> list[dict[str, Any]]:
    samples = []
    for row in table.tolist():
        if row[_SCORE] == -math.inf:
            continue
        blocks = {
            name: row[_HEAD + n * _SPAN : _HEAD + (n + 1) * _SPAN] for n, name in enumerate(_BLOCKS)
        }
        # The contiguous run of mask tokens around the worst one (at WINDOW).
        first = last = WINDOW
        while first > 0 and blocks["valid"][first - 1] == 1.0:
            first -= 1
        while last < _SPAN - 1 and blocks["valid"][last + 1] == 1.0:
            last += 1
        keep = range(first, last + 1)
        worst = int(row[_WORST])
        index = int(row[_INDEX])
        sample: dict[str, Any] = {
            "seq_id": f"{int(row[_RANK])}:{index}" if ranks else index,
            "version": _optional(row[_VERSION]),
            "reward": _optional(row[_REWARD]),
            "advantage": _optional(row[_ADVANTAGE]),
            "length": int(row[_LENGTH]),
            "seq_log_ratio": row[_SEQ_LR],
            "max_log_ratio": blocks["log_ratio"][WINDOW],
            "start": worst - WINDOW + first,
            "worst": worst,
            "log_ratio": [blocks["log_ratio"][i] for i in keep],
            "sampler_logprob": [blocks["sampler_logprob"][i] for i in keep],
            "learner_logprob": [blocks["learner_logprob"][i] for i in keep],
        }
        ids = [blocks["token_id"][i] for i in keep]
        if ids and not any(math.isnan(i) for i in ids):
            token_ids = [int(i) for i in ids]
            sample["token_ids"] = token_ids
            if decode is not None:
                sample["tokens"] = _decoded(decode, token_ids)
        samples.append(sample)
    return samples


def _decoded(decode: Callable[[list[int]], list[str]], token_ids: list[int]) -> list[str]:
    texts = list(decode(token_ids))
    if len(texts) != len(token_ids):
        raise ValueError(f"decode gave {len(texts)} strings for {len(token_ids)} token ids")
    return [str(t)[:200] for t in texts]


def _optional(value: float) -> float | None:
    return None if math.isnan(value) else value


_PER_TOKEN = ("tokens", "token_ids", "log_ratio", "sampler_logprob", "learner_logprob")


def _size(sample: dict[str, Any]) -> int:
    """At least the sample's bytes in the wire's compact JSON (non-finite numbers as "nan",
    "inf", "-inf"), with room for its comma in the list: the spaced, ASCII-escaped dump."""
    return len(json.dumps(encode_samples([sample])[0], default=str))


def _within(samples: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """Samples within `budget` bytes of JSON: windows narrowed around the worst token
    first, then the least bad samples left out."""
    if budget <= 0:
        return []
    while samples and sum(map(_size, samples)) > budget:
        widest = max(samples, key=lambda s: len(s["log_ratio"]))
        shown = len(widest["log_ratio"])
        if shown > 1:
            for sample in samples:
                _narrow(sample, max(1, shown // 2))
        else:
            samples = samples[:-1]
    return samples


def _narrow(sample: dict[str, Any], width: int) -> None:
    """Keep at most `width` tokens around the worst one."""
    shown = len(sample["log_ratio"])
    if shown <= width:
        return
    at = sample["worst"] - sample["start"]
    first = min(max(0, at - width // 2), shown - width)
    for name in _PER_TOKEN:
        if name in sample:
            sample[name] = sample[name][first : first + width]
    sample["start"] += first
