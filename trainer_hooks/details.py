"""Where the mismatch lives: the step details of a `log_batch` step (docs/metrics.md).

Besides its scalars, a step sends (docs/protocol.md, "Step details"):

- `mismatch/log_ratio`: the histogram of ℓ = log π − log μ over the mask's tokens, on the
  fixed signed-log `EDGES` (values beyond ±10 in the end bins, NaN counted apart);
- `mismatch/log_ratio_unbounded`: the same over the tokens no loss bounds, those with a
  negative advantage that the learner likes more than the sampler did (A < 0, r > 1);
  importance sampling and PPO give them a step r times their advantage (with advantages);
- `samples`: the step's `k` worst sequences, ranked by their largest ℓ (NaN first), each
  with the tokens around its worst token (ids, decoded text, ℓ, log μ, log π) and, given
  the sampler's top-k, both engines' top-k at the worst token and at the shown token whose
  top-k disagree most (`topk`: `TOPK_POSITIONS`);
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

from trainer_hooks.metrics import UNBOUNDED_EPS, data_parallel, topk_disagreement
from wire import encode_samples

__all__ = [
    "EDGES",
    "HISTOGRAM_KEYS",
    "PAIRS",
    "TOPK_POSITIONS",
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
TOPK_POSITIONS = 2
"""Tokens of a sample that carry both engines' top-k: its worst token (largest ℓ), and the
shown token with the largest top-k total variation (when that is another one)."""
# After the _COLUMNS, per top-k position: its offset in the window, tv, kl, then five
# blocks of k: the sampler's ids and log μ, the learner's top-k ids and log π, and the
# learner's log π of the sampler's ids.
_TOPK_HEAD = 3
_TOPK_BLOCKS = (
    "sampler_token_ids",
    "sampler_logprobs",
    "learner_token_ids",
    "learner_logprobs",
    "learner_logprobs_of_sampler_ids",
)


def _topk_width(k: int) -> int:
    return TOPK_POSITIONS * (_TOPK_HEAD + len(_TOPK_BLOCKS) * k) if k else 0


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
    topk: int = 0
    """k of the sampler's top-k in the worst rows' top-k columns (0: none given)."""

    def pack(self) -> tuple[Tensor, tuple[Any, ...]]:
        """One float64 vector and its layout (`unpack`), for the Monitor's one copy."""
        pieces = [self.counts.reshape(-1), self.worst.reshape(-1), self.pairs.reshape(-1)]
        packed = torch.cat([*(p.to(_F64) for p in pieces), self.seqs.to(_F64).reshape(-1)])
        layout = (tuple(self.worst.shape), self.unbounded, self.world, self.given_ids, self.topk)
        return packed, layout

    @classmethod
    def unpack(cls, packed: Tensor, layout: tuple[Any, ...]) -> DetailPartials:
        worst_shape, unbounded, world, given_ids, topk = layout
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
            topk=topk,
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
    logits: Tensor | None = None,
    sampler_topk_ids: Tensor | None = None,
    sampler_topk_logprobs: Tensor | None = None,
    worst: int = 4,
) -> DetailPartials:
    """The details of one [B, T] batch (the arguments of `stability_metrics`, the sampled
    token ids [B, T] and the caller's sequence ids [B], integers). All-reduced and
    all-gathered under data parallel (every rank with the same k)."""
    with torch.no_grad():
        topk = (sampler_topk_ids, sampler_topk_logprobs, logits)
        part = _local(
            sampler_logprobs, learner_logprobs, mask, token_ids, seq_ids, rewards, advantages,
            sampler_version, worst, topk,
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
            topk=part.topk,
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
    topk: tuple[Tensor | None, Tensor | None, Tensor | None] = (None, None, None),
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
    topk_ids, topk_logprobs, logits = topk
    k = 0 if topk_ids is None or topk_logprobs is None else int(topk_ids.shape[-1])
    table = torch.full((worst, _COLUMNS + _topk_width(k)), math.nan, dtype=_F64, device=device)
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
        if k:
            assert topk_ids is not None and topk_logprobs is not None
            head[:, _COLUMNS:] = _topk_columns(rows, window, shown, topk_ids, topk_logprobs, logits)

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
        topk=k,
    )


def _topk_columns(
    rows: Tensor,
    window: Tensor,
    shown: Tensor,
    topk_ids: Tensor,
    topk_logprobs: Tensor,
    logits: Tensor | None,
) -> Tensor:
    """The top-k columns of the worst rows [take, _topk_width(k)]: only their windows'
    logits are soft-maxed (take × (2·WINDOW + 1) positions, not the batch's B × T)."""
    take, k = rows.shape[0], topk_ids.shape[-1]
    at = rows.unsqueeze(-1), window
    ids_W = topk_ids[at].long()  # [take, span, k]
    logprobs_W = topk_logprobs[at].to(_F64)
    picks = [torch.full((take,), WINDOW, dtype=torch.long, device=rows.device)]
    tv_W = kl_W = logp_W = None
    if logits is not None:
        logp_W = torch.log_softmax(logits[at].to(torch.promote_types(logits.dtype, torch.float32)), -1)
        tv_W, kl_W, listed = topk_disagreement(logp_W, ids_W, logprobs_W)
        score = torch.where(shown & listed, tv_W, -math.inf)
        score[:, WINDOW] = -math.inf  # the worst token is the first pick already
        best, second = score.max(-1)
        picks.append(torch.where(best > -math.inf, second, -1))
    out = torch.full((take, _topk_width(k)), math.nan, dtype=_F64, device=rows.device)
    width = _TOPK_HEAD + len(_TOPK_BLOCKS) * k
    every = torch.arange(take, device=rows.device)
    for number, pick in enumerate(picks):
        chosen = pick >= 0
        offset = pick.clamp_min(0)
        ids = ids_W[every, offset]
        vocab = logp_W.shape[-1] if logp_W is not None else None
        entry = (ids >= 0) if vocab is None else (ids >= 0) & (ids < vocab)
        columns: dict[str, Tensor] = {
            "sampler_token_ids": torch.where(entry, ids.to(_F64), math.nan),
            "sampler_logprobs": torch.where(entry, logprobs_W[every, offset], math.nan),
        }
        head = [offset.to(_F64), torch.full((take,), math.nan, dtype=_F64, device=rows.device)]
        head.append(head[1])
        if logp_W is not None and tv_W is not None and kl_W is not None:
            head[1], head[2] = tv_W[every, offset].to(_F64), kl_W[every, offset].to(_F64)
            logp = logp_W[every, offset]  # [take, V]
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            columns["learner_token_ids"] = top.indices.to(_F64)
            columns["learner_logprobs"] = top.values.to(_F64)
            mine = logp.gather(-1, torch.where(entry, ids, 0)).to(_F64)
            columns["learner_logprobs_of_sampler_ids"] = torch.where(entry, mine, math.nan)
        block = out[:, number * width : (number + 1) * width]
        block[:, 0] = torch.where(chosen, head[0], math.nan)
        block[:, 1], block[:, 2] = head[1], head[2]
        for index, name in enumerate(_TOPK_BLOCKS):
            if name in columns:
                values = columns[name]
                start = _TOPK_HEAD + index * k
                block[:, start : start + values.shape[-1]] = values
    return out


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
    topk = parts[0].topk if all(p.topk == parts[0].topk for p in parts) else 0
    with torch.no_grad():
        offsets = torch.zeros(max(p.seqs.numel() for p in parts), dtype=_F64)  # rows per rank
        worsts = []
        for part in parts:
            # Calls with other top-k (or none) than the others: the step's samples go without.
            shifted = part.worst[:, : _COLUMNS + _topk_width(topk)].clone()
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
            topk=topk,
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
    samples = _samples(part.worst.to("cpu", _F64), decode, ranks, part.topk)
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
    table: Tensor, decode: Callable[[list[int]], list[str]] | None, ranks: bool, topk: int = 0
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
        entries = _topk_entries(row[_COLUMNS:], topk, keep, worst, decode)
        if entries:
            sample["topk"] = entries
        samples.append(sample)
    return samples


def _topk_entries(
    columns: list[float],
    k: int,
    keep: range,
    worst: int,
    decode: Callable[[list[int]], list[str]] | None,
) -> list[dict[str, Any]]:
    """A sample's `topk` (docs/protocol.md): per chosen token, both engines' top-k, the
    sampler's sorted by its log μ; numbers to 6 significant digits (what the view shows)."""
    entries = []
    width = _TOPK_HEAD + len(_TOPK_BLOCKS) * k
    for number in range(TOPK_POSITIONS if k else 0):
        block = columns[number * width : (number + 1) * width]
        if math.isnan(block[0]) or int(block[0]) not in keep:
            continue
        lists = {
            name: block[_TOPK_HEAD + i * k : _TOPK_HEAD + (i + 1) * k]
            for i, name in enumerate(_TOPK_BLOCKS)
        }
        sampler = [i for i in range(k) if not math.isnan(lists["sampler_token_ids"][i])]
        sampler.sort(key=lambda i: -_or_low(lists["sampler_logprobs"][i]))
        learner = [i for i in range(k) if not math.isnan(lists["learner_token_ids"][i])]
        if not sampler and not learner:
            continue
        entry: dict[str, Any] = {
            "position": worst - WINDOW + int(block[0]),
            "tv": _optional(_short(block[1])),
            "kl": _optional(_short(block[2])),
            "sampler_token_ids": [int(lists["sampler_token_ids"][i]) for i in sampler],
            "sampler_logprobs": [_short(lists["sampler_logprobs"][i]) for i in sampler],
        }
        if learner:
            entry["learner_token_ids"] = [int(lists["learner_token_ids"][i]) for i in learner]
            entry["learner_logprobs"] = [_short(lists["learner_logprobs"][i]) for i in learner]
            of_sampler = lists["learner_logprobs_of_sampler_ids"]
            entry["learner_logprobs_of_sampler_ids"] = [_short(of_sampler[i]) for i in sampler]
        if decode is not None:
            ids = entry["sampler_token_ids"] + entry.get("learner_token_ids", [])
            texts = _decoded(decode, ids)
            entry["sampler_tokens"] = texts[: len(sampler)]
            if learner:
                entry["learner_tokens"] = texts[len(sampler) :]
        entries.append(entry)
    return entries


def _short(value: float) -> float:
    """6 significant digits: what the token view shows, at half the JSON of a float64."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def _or_low(value: float) -> float:
    return -math.inf if math.isnan(value) else value


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
    """Samples within `budget` bytes of JSON: the top-k of other tokens than the worst
    left out first, then windows narrowed around the worst token, then the top-k left
    out, then the least bad samples."""
    if budget <= 0:
        return []

    def over() -> bool:
        return sum(map(_size, samples)) > budget

    if over():
        for sample in samples:
            if "topk" in sample:
                sample["topk"] = sample["topk"][:1]
    while samples and over():
        widest = max(samples, key=lambda s: len(s["log_ratio"]))
        shown = len(widest["log_ratio"])
        if shown > 1:
            for sample in samples:
                _narrow(sample, max(1, shown // 2))
        elif any("topk" in sample for sample in samples):
            for sample in samples:
                sample.pop("topk", None)
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
    if "topk" in sample:
        inside = range(sample["start"], sample["start"] + width)
        sample["topk"] = [entry for entry in sample["topk"] if entry["position"] in inside]
        if not sample["topk"]:
            del sample["topk"]
