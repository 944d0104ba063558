"""trainer_hooks.details: histograms equal numpy's, the planted worst sequence comes first with
its tokens, micro-batches and gloo ranks merge exactly, the samples keep to their byte budget."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer_hooks.details import (
    EDGES,
    PAIRS,
    WINDOW,
    DetailPartials,
    detail_partials,
    finalize_details,
    merge_details,
)
from trainer_hooks.metrics import UNBOUNDED_EPS
from wire import encode_samples


def planted(seqs: int = 24, length: int = 60, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch whose sequence 5 holds the worst token (ℓ = 20 at position 30), with NaN ℓ
    on padding, values beyond the edges, and per-sequence lengths."""
    generator = torch.Generator().manual_seed(seed)
    learner = -torch.rand(seqs, length, generator=generator) * 3
    spread = torch.randn(seqs, length, generator=generator) * 0.3
    spread[0, :4] = torch.tensor([12.0, -15.0, 1e-6, -1e-6])  # past both ends, around zero
    sampler = learner - spread
    lengths = torch.randint(5, length + 1, (seqs,), generator=generator)
    if seqs > 5 and length > 50:
        sampler[5, 30] = learner[5, 30] - 20.0
        lengths[5] = 50
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {
        "sampler": torch.where(mask, sampler, math.nan),
        "learner": torch.where(mask, learner, math.nan),
        "mask": mask,
        "token_ids": torch.randint(0, 50_000, (seqs, length), generator=generator),
        "rewards": torch.rand(seqs, generator=generator),
        "advantages": torch.randn(seqs, generator=generator),
        "version": torch.randint(0, 9, (seqs,), generator=generator),
    }


def partials_of(batch: dict[str, torch.Tensor], rows: slice = slice(None), worst: int = 4):
    return detail_partials(
        batch["sampler"][rows],
        batch["learner"][rows],
        batch["mask"][rows],
        token_ids=batch["token_ids"][rows],
        rewards=batch["rewards"][rows],
        advantages=batch["advantages"][rows],
        sampler_version=batch["version"][rows],
        worst=worst,
    )


def decode(ids: list[int]) -> list[str]:
    return [f"<{i}>" for i in ids]


def numpy_counts(values: np.ndarray) -> list[int]:
    edges = np.array(EDGES)
    counts, _ = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)
    return [int(c) for c in counts]


def test_histograms_equal_numpys() -> None:
    batch = planted()
    details = finalize_details(partials_of(batch), decode=decode)
    mask = batch["mask"].numpy()
    ell = (batch["learner"] - batch["sampler"]).numpy()[mask]
    assert details.histograms["mismatch/log_ratio"]["counts"] == numpy_counts(ell)
    assert details.histograms["mismatch/log_ratio"]["edges"] == list(EDGES)
    assert sum(details.histograms["mismatch/log_ratio"]["counts"]) == int(mask.sum())
    # Unbounded: A < 0 and r > 1.
    advantages = np.broadcast_to(batch["advantages"].numpy()[:, None], mask.shape)[mask]
    unbounded = ell[(advantages < 0) & (np.expm1(ell) > UNBOUNDED_EPS)]
    assert details.histograms["mismatch/log_ratio_unbounded"]["counts"] == numpy_counts(unbounded)
    assert 0 < len(unbounded) < len(ell)


def test_nan_log_ratios_are_counted_apart() -> None:
    batch = planted()
    batch["learner"][2, 3] = math.nan  # inside the mask
    details = finalize_details(partials_of(batch))
    histogram = details.histograms["mismatch/log_ratio"]
    assert histogram["nan"] == 1
    assert sum(histogram["counts"]) == int(batch["mask"].sum()) - 1
    # A NaN ℓ ranks its sequence first: that is how a collapse starts.
    assert details.samples[0]["seq_id"] == 2
    assert math.isnan(details.samples[0]["max_log_ratio"])


def test_the_planted_worst_sequence_comes_first_with_its_tokens() -> None:
    batch = planted()
    details = finalize_details(partials_of(batch), decode=decode)
    first = details.samples[0]
    assert first["seq_id"] == 5
    assert first["worst"] == 30
    assert abs(first["max_log_ratio"] - 20.0) < 1e-5
    assert first["length"] == 50
    assert first["start"] == 30 - WINDOW
    ids = batch["token_ids"][5, 30 - WINDOW : 30 + WINDOW + 1].tolist()
    assert first["token_ids"] == ids
    assert first["tokens"] == [f"<{i}>" for i in ids]
    ell = (batch["learner"][5] - batch["sampler"][5])[30 - WINDOW : 30 + WINDOW + 1]
    np.testing.assert_allclose(first["log_ratio"], ell.numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        first["sampler_logprob"], batch["sampler"][5, 30 - WINDOW : 30 + WINDOW + 1].numpy()
    )
    assert first["reward"] == batch["rewards"][5].item()
    assert first["advantage"] == batch["advantages"][5].item()
    assert first["version"] == batch["version"][5].item()
    seq_ell = (batch["learner"][5] - batch["sampler"][5])[:50].double().sum().item()
    assert abs(first["seq_log_ratio"] - seq_ell) < 1e-4
    # Worst first, by their largest ℓ.
    scores = [s["max_log_ratio"] for s in details.samples]
    assert scores == sorted(scores, reverse=True) and len(scores) == 4


def test_windows_stop_at_the_mask() -> None:
    batch = planted(seqs=8, length=20)
    batch["sampler"][5] = batch["learner"][5] - 0.01
    batch["sampler"][5, 2] = batch["learner"][5, 2] - 30.0  # near the start
    details = finalize_details(partials_of(batch, worst=1), decode=decode)
    (sample,) = details.samples
    assert sample["start"] == 0 and sample["worst"] == 2
    shown = int(batch["mask"][5].sum())
    assert len(sample["tokens"]) == min(shown, 2 + WINDOW + 1)


def test_micro_batches_merge_exactly() -> None:
    batch = planted()
    whole = finalize_details(partials_of(batch), decode=decode)
    merged = finalize_details(
        merge_details([partials_of(batch, slice(0, 7)), partials_of(batch, slice(7, None))]),
        decode=decode,
    )
    assert merged.histograms == whole.histograms
    assert merged.samples == whole.samples  # numbered on across the micro-batches
    assert sorted(merged.sequences["length"]) == sorted(whole.sequences["length"])


def test_sequences_are_a_bounded_subsample() -> None:
    batch = planted(seqs=PAIRS * 2, length=60)
    details = finalize_details(partials_of(batch))
    lengths = details.sequences["length"]
    assert len(lengths) == PAIRS == len(details.sequences["log_ratio"])
    all_lengths = batch["mask"].sum(-1).tolist()
    assert set(lengths) <= set(all_lengths)
    # Every pair is one real sequence's (length, Σℓ).
    ell = torch.where(batch["mask"], batch["learner"] - batch["sampler"], 0).sum(-1).double()
    real = {(n, round(s, 6)) for n, s in zip(all_lengths, ell.tolist(), strict=True)}
    pairs = zip(lengths, details.sequences["log_ratio"], strict=True)
    assert {(n, round(s, 6)) for n, s in pairs} <= real


PER_TOKEN = ("tokens", "token_ids", "log_ratio", "sampler_logprob", "learner_logprob")


def wire_bytes(samples: list[dict[str, Any]]) -> int:
    """The samples as the wire sends them and the server measures them: compact UTF-8 JSON."""
    encoded = json.dumps(encode_samples(samples), separators=(",", ":"), ensure_ascii=False)
    return len(encoded.encode())


def head(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample's fields but its window (NaN as "nan", so that equal means equal)."""
    return encode_samples([{k: v for k, v in sample.items() if k not in (*PER_TOKEN, "start")}])[0]


def within_budgets(
    batch: dict[str, torch.Tensor], part: DetailPartials, budgets: Sequence[int]
) -> dict[int, list[dict[str, Any]]]:
    """The samples kept within each budget (bytes), checked against the unlimited ones: they
    fit on the wire, they are the worst ones (a prefix of the ranking), and each keeps a part
    of its window around its worst token, whose id and ℓ are the batch's."""
    everything = finalize_details(part, decode=decode, max_sample_bytes=1 << 30).samples
    kept_within: dict[int, list[dict[str, Any]]] = {}
    for budget in budgets:
        kept = kept_within[budget] = finalize_details(part, decode=decode, max_sample_bytes=budget).samples
        assert not kept or wire_bytes(kept) <= budget, budget
        assert [s["seq_id"] for s in kept] == [s["seq_id"] for s in everything[: len(kept)]]
        for sample, whole in zip(kept, everything, strict=False):
            shown = len(sample["log_ratio"])
            at = sample["worst"] - sample["start"]
            assert 0 <= at < shown <= len(whole["log_ratio"])
            first = sample["start"] - whole["start"]
            for name in PER_TOKEN:  # a narrowed window: a slice of the whole one
                np.testing.assert_array_equal(sample[name], whole[name][first : first + shown])
            assert head(sample) == head(whole)
            row, worst = sample["seq_id"], sample["worst"]
            assert sample["token_ids"][at] == batch["token_ids"][row, worst].item()
            assert sample["tokens"][at] == f"<{batch['token_ids'][row, worst].item()}>"
            ell = (batch["learner"][row, worst] - batch["sampler"][row, worst]).item()
            np.testing.assert_allclose(sample["log_ratio"][at], ell, rtol=1e-6)
            np.testing.assert_array_equal(sample["log_ratio"][at], sample["max_log_ratio"])
    return kept_within


def test_samples_keep_to_their_byte_budget() -> None:
    batch = planted()
    part = partials_of(batch, worst=8)
    budgets = (16 * 1024, 8000, 3000, 1500, 1000, 600, 400, 300, 0)
    kept = within_budgets(batch, part, budgets)
    assert len(kept[16 * 1024]) == 8
    assert len(kept[16 * 1024][0]["log_ratio"]) < 2 * WINDOW + 1  # narrowed to fit
    assert [len(kept[b]) for b in kept] == sorted((len(k) for k in kept.values()), reverse=True)
    for budget in (16 * 1024, 8000, 3000, 1500, 1000, 600, 400):
        assert kept[budget][0]["seq_id"] == 5 and kept[budget][0]["worst"] == 30  # the planted one
    assert 2 <= len(kept[1500]) < 8 and kept[300] == kept[0] == []
    assert finalize_details(partials_of(batch), max_sample_bytes=0).samples == []


def test_samples_with_nan_windows_keep_to_their_byte_budget() -> None:
    """NaN is 5 bytes on the wire ("nan"): windows of NaN ℓ still fit, at every budget near
    their whole size."""
    batch = planted()
    batch["mask"][:] = True
    batch["learner"][:] = batch["sampler"][:] = math.nan  # every token's ℓ: a collapsed batch
    batch["token_ids"] %= 10  # short tokens: the NaN take most of the bytes
    part = partials_of(batch, worst=4)
    whole = wire_bytes(finalize_details(part, decode=decode, max_sample_bytes=1 << 30).samples)
    for kept in within_budgets(batch, part, range(whole - 30, whole + 30)).values():
        assert kept and all(math.isnan(s["max_log_ratio"]) for s in kept)


def test_seq_ids_name_the_samples() -> None:
    batch = planted()
    ids = torch.arange(1000, 1000 + batch["mask"].shape[0])
    part = detail_partials(batch["sampler"], batch["learner"], batch["mask"], seq_ids=ids, worst=2)
    details = finalize_details(part)
    assert details.samples[0]["seq_id"] == 1005
    assert "token_ids" not in details.samples[0]  # no ids given: none shown
    assert "mismatch/log_ratio_unbounded" not in details.histograms  # no advantages


def test_pack_round_trips() -> None:
    from trainer_hooks.details import DetailPartials

    part = partials_of(planted())
    packed, layout = part.pack()
    back = DetailPartials.unpack(packed, layout)
    assert finalize_details(back, decode=decode) == finalize_details(part, decode=decode)


# Data parallel: two gloo ranks hold different sequences.


def _rank_main(rank: int, init_file: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        batch = planted()
        rows = (slice(0, 10), slice(10, None))[rank]
        part = partials_of(batch, rows)
        if rank == 0:
            torch.save(finalize_details(part, decode=decode), out_path)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_the_whole_batch() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_path = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(_rank_main, args=(init_file, out_path), nprocs=2, join=True)
        gathered = torch.load(out_path, weights_only=False)
    whole = finalize_details(partials_of(planted()), decode=decode)
    assert gathered.histograms == whole.histograms
    # The worst sequence lives on rank 0 (row 5); rank 1's rows are named by their rank.
    assert [s["max_log_ratio"] for s in gathered.samples] == [
        s["max_log_ratio"] for s in whole.samples
    ]
    assert gathered.samples[0]["seq_id"] == "0:5"
    assert any(str(s["seq_id"]).startswith("1:") for s in gathered.samples)
    assert sorted(gathered.sequences["length"]) == sorted(whole.sequences["length"])


# Two micro-batches per rank, of other sizes on each: rank 0 holds rows 0–9 of the batch
# (3 + 7 rows), rank 1 rows 10–23 (6 + 8 rows).
MICRO_BATCHES = ((slice(0, 3), slice(3, 10)), (slice(10, 16), slice(16, 24)))
FIRST_ROW = (0, 10)


def unequal_batch() -> dict[str, torch.Tensor]:
    """The planted batch with two more bad sequences on rank 1: row 20 (the 11th of rank 1,
    in its second micro-batch) and row 12 (its 3rd, in its first)."""
    batch = planted()
    batch["sampler"][20, 3] = batch["learner"][20, 3] - 15.0
    batch["sampler"][12, 2] = batch["learner"][12, 2] - 14.0
    return batch


def _unequal_main(rank: int, init_file: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        batch = unequal_batch()
        parts = [partials_of(batch, rows) for rows in MICRO_BATCHES[rank]]  # one call each
        if rank == 0:  # as the Monitor sends them to its worker, which merges the step's calls
            received = [DetailPartials.unpack(*part.pack()) for part in parts]
            torch.save(finalize_details(merge_details(received), decode=decode), out_path)
    finally:
        dist.destroy_process_group()


def test_ranks_number_their_rows_across_micro_batches_of_other_sizes() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_path = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(_unequal_main, args=(init_file, out_path), nprocs=2, join=True)
        gathered = torch.load(out_path, weights_only=False)
    batch = unequal_batch()
    whole = finalize_details(partials_of(batch), decode=decode)
    assert gathered.histograms == whole.histograms
    # "rank:row", the row counted on over that rank's micro-batches: 1:10 is row 20.
    assert [s["seq_id"] for s in gathered.samples] == ["0:5", "1:10", "1:2", "0:0"]
    assert [s["seq_id"] for s in whole.samples] == [5, 20, 12, 0]
    for sample, same in zip(gathered.samples, whole.samples, strict=True):
        rank, row = (int(n) for n in sample["seq_id"].split(":"))
        assert FIRST_ROW[rank] + row == same["seq_id"]
        assert head({**sample, "seq_id": 0}) == head({**same, "seq_id": 0})
        for name in PER_TOKEN:
            np.testing.assert_array_equal(sample[name], same[name])
    assert sorted(gathered.sequences["length"]) == sorted(whole.sequences["length"])


def test_on_the_device_as_on_the_cpu() -> None:
    """bench/gpu.sh runs this on a GPU: the details computed there, packed and copied back
    as the Monitor does, equal the CPU's."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch = planted()
    on_device = {name: tensor.to(device) for name, tensor in batch.items()}
    packed, layout = partials_of(on_device).pack()
    from trainer_hooks.details import DetailPartials

    back = DetailPartials.unpack(packed.cpu(), layout)
    got = finalize_details(back, decode=decode)
    want = finalize_details(partials_of(batch), decode=decode)
    assert got.histograms == want.histograms
    assert [s["seq_id"] for s in got.samples] == [s["seq_id"] for s in want.samples]
    assert got.samples[0]["token_ids"] == want.samples[0]["token_ids"]
