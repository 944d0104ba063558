"""Both engines' top-k in the step details (trainer_hooks/details.py): the worst samples'
`topk` entries hold the sampler's top-k as given, the learner's top-k of its logits and the
per-token measure; merged micro-batches give the direct batch's; and `Monitor.log_batch`
with the sampler's top-k through a real `keel serve` stores them, with the metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.support.monitor import FAST, servers
from trainer_hooks.details import WINDOW, detail_partials, finalize_details, merge_details
from trainer_hooks.metrics import topk_disagreement
from trainer_hooks.monitor import Monitor
from wire import encode_samples

make_server = pytest.fixture(name="make_server")(servers)
K = 5
VOCAB = 40


def texts(token_ids: list[int]) -> list[str]:
    return [f"t{token}" for token in token_ids]


def batch(seed: int, seqs: int = 4, length: int = 24) -> dict[str, torch.Tensor]:
    """The learner's logits; a sampler whose logits differ a little, more at one planted token."""
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(seqs, length, VOCAB, generator=generator)
    sampler_logits = logits + 0.2 * torch.randn(seqs, length, VOCAB, generator=generator)
    sampled = torch.randint(VOCAB, (seqs, length), generator=generator)
    sampler_V = torch.log_softmax(sampler_logits, -1)
    top = sampler_V.topk(K, -1)
    return {
        "logits": logits,
        "token_ids": sampled,
        "sampler": sampler_V.gather(-1, sampled[..., None]).squeeze(-1),
        "learner": torch.log_softmax(logits, -1).gather(-1, sampled[..., None]).squeeze(-1),
        "mask": torch.ones(seqs, length, dtype=torch.bool),
        "topk_ids": top.indices,
        "topk_logprobs": top.values,
    }


def plant(data: dict[str, torch.Tensor], row: int, at: int, gap: float, disagree: int | None = None) -> None:
    """Make (row, at) the batch's worst token (ℓ = gap); at `disagree`, the sampler's top-k
    on other tokens than the learner's (a large TV)."""
    data["sampler"][row, at] = data["learner"][row, at] - gap
    if disagree is not None:
        learner_order = data["logits"][row, disagree].argsort(descending=True)
        data["topk_ids"][row, disagree] = learner_order[-K:]  # the learner's least likely
        data["topk_logprobs"][row, disagree] = torch.log(torch.full((K,), 0.9 / K))


def details_of(data: dict[str, torch.Tensor], worst: int = 2, decode=texts):  # type: ignore[no-untyped-def]
    part = detail_partials(
        data["sampler"],
        data["learner"],
        data["mask"],
        token_ids=data["token_ids"],
        logits=data["logits"],
        sampler_topk_ids=data["topk_ids"],
        sampler_topk_logprobs=data["topk_logprobs"],
        worst=worst,
    )
    return part


def test_the_worst_samples_carry_both_engines_top_k() -> None:
    data = batch(0)
    plant(data, row=2, at=10, gap=6.0, disagree=13)
    sample = finalize_details(details_of(data), decode=texts, max_sample_bytes=1 << 20).samples[0]
    assert sample["seq_id"] == 2 and sample["worst"] == 10
    worst, other = sample["topk"]
    assert worst["position"] == 10 and other["position"] == 13  # the window's largest TV
    logp = torch.log_softmax(data["logits"][2], -1)
    tv, kl, _ = topk_disagreement(logp, data["topk_ids"][2], data["topk_logprobs"][2])
    for entry in (worst, other):
        at = entry["position"]
        order = data["topk_logprobs"][2, at].argsort(descending=True)
        assert entry["sampler_token_ids"] == data["topk_ids"][2, at][order].tolist()
        assert entry["sampler_logprobs"] == pytest.approx(data["topk_logprobs"][2, at][order].tolist(), rel=1e-5)
        top = logp[at].topk(K)
        assert entry["learner_token_ids"] == top.indices.tolist()
        assert entry["learner_logprobs"] == pytest.approx(top.values.tolist(), rel=1e-5)
        assert entry["learner_logprobs_of_sampler_ids"] == pytest.approx(
            logp[at][entry["sampler_token_ids"]].tolist(), rel=1e-5
        )
        assert entry["tv"] == pytest.approx(float(tv[at]), rel=1e-5)
        assert entry["kl"] == pytest.approx(float(kl[at]), rel=1e-5)
        assert entry["sampler_tokens"] == texts(entry["sampler_token_ids"])
        assert entry["learner_tokens"] == texts(entry["learner_token_ids"])
    assert other["tv"] > 0.8 > worst["tv"]
    # The window is every token around the worst one; a tight budget drops the second
    # entry before it narrows a window.
    assert sample["start"] == 0 and len(sample["log_ratio"]) == 24 < 2 * WINDOW + 1
    full = finalize_details(details_of(data), decode=texts, max_sample_bytes=1 << 20).samples
    size = len(json.dumps(encode_samples(full)))
    tight = finalize_details(details_of(data), decode=texts, max_sample_bytes=size - 100).samples
    assert [len(s["topk"]) for s in tight] == [1, 1]
    assert [len(s["log_ratio"]) for s in tight] == [len(s["log_ratio"]) for s in full]


def test_merged_micro_batches_give_the_direct_batch_top_k() -> None:
    first, second = batch(1, seqs=3), batch(2, seqs=5)
    plant(second, row=4, at=8, gap=7.0)
    plant(first, row=0, at=20, gap=5.0)
    whole = {name: torch.cat([first[name], second[name]]) for name in first}
    direct = finalize_details(details_of(whole), decode=texts).samples
    merged = finalize_details(merge_details([details_of(first), details_of(second)]), decode=texts).samples
    assert [s["seq_id"] for s in merged] == [s["seq_id"] for s in direct] == [3 + 4, 0]
    assert [s["topk"] for s in merged] == [s["topk"] for s in direct]
    # A call without top-k in the step: its samples, and the merge's, go without.
    plain = detail_partials(first["sampler"], first["learner"], first["mask"], worst=2)
    mixed = finalize_details(merge_details([plain, details_of(second)])).samples
    assert mixed and not any("topk" in s for s in mixed)


def test_log_batch_with_the_sampler_top_k_through_a_real_server(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    data = batch(3)
    plant(data, row=1, at=12, gap=8.0, disagree=15)
    monitor = Monitor(server.url, run_name="topk", spool_dir=tmp_path, sender_config=FAST, samples=2, sample_bytes=64 * 1024)
    monitor.log_batch(
        0,
        data["sampler"],
        data["learner"],
        data["mask"],
        logits=data["logits"],
        token_ids=data["token_ids"],
        decode=texts,
        sampler_topk_ids=data["topk_ids"],
        sampler_topk_logprobs=data["topk_logprobs"],
    )
    monitor.log_batch(1, data["sampler"], data["learner"], data["mask"], logits=data["logits"])  # no top-k
    assert monitor.finish(timeout=60)
    assert monitor.dropped == {}
    run = monitor.run_id

    logp = torch.log_softmax(data["logits"], -1)
    tv, kl, _ = topk_disagreement(logp, data["topk_ids"], data["topk_logprobs"])
    assert server.series(run, "mismatch/topk_tv")[1] == pytest.approx([float(tv.mean())], rel=1e-5)
    assert server.series(run, "mismatch/topk_tv_max")[1] == pytest.approx([float(tv.max())], rel=1e-5)
    assert server.series(run, "mismatch/topk_kl")[1] == pytest.approx([float(kl.mean())], rel=1e-5)

    stored = server.get(f"/runs/{run}/samples", step=0)["samples"][0]
    assert stored["seq_id"] == 1 and stored["worst"] == 12
    worst, other = stored["topk"]
    assert (worst["position"], other["position"]) == (12, 15)
    assert worst["learner_token_ids"] == logp[1, 12].topk(K).indices.tolist()
    assert other["tv"] == pytest.approx(float(tv[1, 15]), rel=1e-5)
    assert other["sampler_tokens"] == texts(other["sampler_token_ids"])
    assert sorted(other["sampler_token_ids"]) == sorted(data["topk_ids"][1, 15].tolist())
    assert math.isfinite(worst["kl"])
    assert "topk" not in server.get(f"/runs/{run}/samples", step=1)["samples"][0]
