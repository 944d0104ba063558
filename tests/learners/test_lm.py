"""The asynchronous transformer learner (learners.lm, `keel lm`, `keel lm-grid`)."""

from __future__ import annotations

import json
import math
import queue
from dataclasses import replace

import httpx
import pytest
import torch

from learners.lm.grid import climb_step, collapse_step, lead_times, smoothed
from learners.lm.learner import LMConfig, Recorder, learner_step, train
from learners.lm.model import GPT, GPTConfig, KVCache
from learners.lm.sampler import DTYPES, Rollout, Sampler, WeightBoard
from learners.lm.task import EQUALS, VOCAB, SortTask
from tests.support.monitor import keel

# A few steps of a small batch: the tests check plumbing and provenance, not learning.
FAST = LMConfig(steps=12, prompts=4, group=4, digits=4)
HEADLINE = (
    "reward/mean", "mismatch/kl", "mismatch/ratio_max", "gate/frac", "grad/norm",
    "staleness/lag_mean", "staleness/lag_max", "policy/entropy", "loss/total",
)  # fmt: skip
PROVENANCE = ("provenance/seq_id_first", "provenance/seq_id_last", "provenance/sampler_version")


def _trained_model(seed: int = 0) -> GPT:
    """A policy far from uniform, so the sampler's rounding shows in its log-probabilities."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab=VOCAB))
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return model


def _sampler(model: GPT, dtype: str, *, lag: int = 0) -> tuple[Sampler, WeightBoard]:
    board = WeightBoard(DTYPES[dtype])
    board.publish(7, model)
    sampler = Sampler(
        model.config, SortTask(4), board, queue.Queue(), lag=lag, prompts=3, group=4,
        device=torch.device("cpu"), seed=0,
    )  # fmt: skip
    published = board.wait_for(0, sampler.stop)
    assert published is not None
    sampler._load(*published)
    return sampler, board


def test_task_reward_is_partial_credit() -> None:
    task = SortTask(4)
    tokens = torch.tensor([[3, 9, 1, 3, EQUALS, 1, 3, 3, 9], [3, 9, 1, 3, EQUALS, 1, 3, 9, 9]])
    assert task.reward(tokens).tolist() == [1.0, 0.75]
    prompts = task.prompts(5, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert prompts.shape == (5, 5) and (prompts[:, -1] == EQUALS).all() and prompts[:, :4].max() < 10


def test_kv_cache_decoding_matches_the_full_forward() -> None:
    model = _trained_model()
    tokens = torch.randint(0, VOCAB, (3, 9))
    cache = KVCache(model.config.layers)
    parts = [model(tokens[:, :5], cache)] + [model(tokens[:, t : t + 1], cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), model(tokens), atol=1e-5, rtol=1e-5)


def test_sampler_records_log_mu_ids_and_versions_at_sampling_time() -> None:
    model = _trained_model()
    sampler, _ = _sampler(model, "bf16")
    first, second = sampler.generate(index=5, count=2)
    batch = 3 * 4
    assert (first.index, second.index, first.version, second.version) == (5, 6, 7, 7)
    assert first.seq_id_B.tolist() == list(range(5 * batch, 6 * batch))
    assert second.seq_id_B.tolist() == list(range(6 * batch, 7 * batch))
    assert first.version_B.tolist() == [7] * batch
    assert first.rewards_B.tolist() == SortTask(4).reward(first.tokens_B_L).tolist()
    # The G samples of a prompt share it.
    prompts = first.tokens_B_L[:, :5].view(3, 4, 5)
    assert (prompts == prompts[:, :1]).all()

    # log μ is the bf16 model's own (its full forward agrees up to bf16 rounding), and it is
    # not the fp32 learner's: the recorded values carry the sampler's numerics.
    tokens = first.tokens_B_L
    answer = tokens[:, 5:, None]
    with torch.no_grad():
        bf16_logp = sampler.model(tokens[:, :-1])[:, 4:].float().log_softmax(-1).gather(-1, answer)
        fp32_logp = model(tokens[:, :-1])[:, 4:].log_softmax(-1).gather(-1, answer)
    recorded = first.sampler_logp_B_T
    assert recorded.dtype == torch.float32 and recorded.shape == (batch, 4)
    torch.testing.assert_close(recorded, bf16_logp.squeeze(-1), atol=0.1, rtol=0.0)
    assert (recorded - fp32_logp.squeeze(-1)).abs().max() > 1e-4
    fp32_sampler, _ = _sampler(model, "fp32")
    fp32_rollout = fp32_sampler.generate(index=0)[0]
    with torch.no_grad():
        again = model(fp32_rollout.tokens_B_L[:, :-1])[:, 4:].log_softmax(-1)
    again = again.gather(-1, fp32_rollout.tokens_B_L[:, 5:, None]).squeeze(-1)
    torch.testing.assert_close(fp32_rollout.sampler_logp_B_T, again, atol=1e-5, rtol=0.0)


def test_the_learner_trains_on_the_recorded_log_mu_not_a_recomputation() -> None:
    """Shift the recorded log μ by −0.5: importance sampling's loss −Σ r·A scales by e^0.5."""
    model = _trained_model()
    sampler, _ = _sampler(model, "bf16")
    rollout = sampler.generate(index=0)[0]
    # Rewards that differ within each group of 4, so the advantages are not all zero.
    rollout.rewards_B = torch.tensor([0.0, 0.25, 0.5, 1.0] * 3)
    config = replace(FAST, loss="importance_sampling", group=4)
    shifted = Rollout(**{**vars(rollout), "sampler_logp_B_T": rollout.sampler_logp_B_T - 0.5})

    def loss_of(batch: Rollout) -> float:
        copy = GPT(model.config)
        copy.load_state_dict(model.state_dict())
        optimizer = torch.optim.SGD(copy.parameters(), lr=0.0)
        return float(learner_step(copy, optimizer, batch, config).loss)

    plain, moved = loss_of(rollout), loss_of(shifted)
    assert abs(plain) > 1e-3
    # The advantages sum to zero in each group, so the loss is a small difference of terms
    # near 1: float32 rounding of e^(x + 0.5) against e^x · e^0.5 leaves ~1e-5 of it. A learner
    # that recomputed log μ would give `plain` itself, off by a factor of e^0.5.
    assert moved == pytest.approx(plain * math.exp(0.5), rel=1e-4)


class Spy(Recorder):
    """A Recorder that also keeps what the loop handed to log_batch."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, torch.Tensor]] = []

    def log_inputs(self, step, inputs, *, metrics=None, decode=None):  # type: ignore[no-untyped-def, override]
        self.calls.append(
            {**inputs.arguments(), "sampler": inputs.sampler_logprobs, "learner": inputs.learner_logprobs, "metrics": metrics, "decode": decode}
        )
        super().log_inputs(step, inputs, metrics=metrics, decode=decode)


@pytest.mark.parametrize("lag", [0, 3])
def test_staleness_comes_from_the_recorded_versions_and_is_bounded_by_lag(lag: int) -> None:
    torch.set_num_threads(1)
    spy = Spy()
    result = train(replace(FAST, lag=lag, steps=20), spy)
    series = spy.series
    batch = FAST.prompts * FAST.group
    assert len(result.rewards) == 20 and len(series["reward/mean"]) == 20
    assert series["provenance/seq_id_first"] == [float(s * batch) for s in range(20)]
    assert series["provenance/seq_id_last"] == [float(s * batch + batch - 1) for s in range(20)]
    versions = series["provenance/sampler_version"]
    for step, (version, lag_mean, lag_max) in enumerate(
        zip(versions, series["staleness/lag_mean"], series["staleness/lag_max"], strict=True)
    ):
        assert 0 <= step - version <= lag
        assert lag_mean == lag_max == step - version  # one version per batch
        call = spy.calls[step]
        assert call["sampler_version"].tolist() == [version] * batch
        assert call["learner_version"] == step
    assert versions == sorted(versions)
    if lag == 0:
        # On-policy up to numerics: bf16 rounding, nothing else.
        assert all(0 <= kl < 1e-2 for kl in series["mismatch/kl"])
    assert all(math.isfinite(series[key][-1]) for key in HEADLINE)
    # The learner's log π differs from the recorded log μ (bf16 sampler): not a recomputation.
    assert any((c["sampler"] - c["learner"]).abs().max() > 0 for c in spy.calls[1:])


def test_collapse_and_climb_definitions() -> None:
    assert collapse_step([0.1, 0.3, 0.5, 0.6, 0.55, 0.45, 0.39] + [0.2] * 100) == 6
    assert collapse_step([0.1, 0.45, 0.2]) is None  # never reached 0.5
    rewards = [0.6] * 30  # reached 0.5 at step 0: the baseline is the first step's value
    flat = [1.0] * 30
    assert climb_step(flat, rewards) is None
    rising = [1.0] * 15 + [5.0] * 15
    # The 10-step rolling median passes 3x the baseline (1.0) once 6 of its 10 steps are 5.
    assert climb_step(rising, rewards) == 20
    assert climb_step(flat[:9] + [math.inf] + flat[10:], rewards) == 9
    runs = [
        {"collapse_step": 25, "series": {"reward/mean": rewards, "mismatch/kl": rising}},
        {"collapse_step": 12, "series": {"reward/mean": rewards, "mismatch/kl": rising}},
        {"collapse_step": None, "series": {"reward/mean": rewards, "mismatch/kl": flat}},
        {"collapse_step": None, "series": {"reward/mean": rewards, "mismatch/kl": rising}},
    ]
    lead = lead_times(runs, "mismatch/kl")
    assert (lead["before"], lead["after"], lead["never"], lead["leads"]) == (1, 1, 0, [5])
    assert (lead["stable_reached"], lead["stable_climbed"]) == (2, 1)


def _get(url: str, path: str, **params: object) -> object:
    response = httpx.get(f"{url}/api/v1{path}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def test_keel_lm_streams_every_headline_metric_and_the_provenance(
    server_factory, sqlite_url, tmp_path
) -> None:
    server = server_factory(sqlite_url)
    result = keel(
        "lm", "--loss", "cispo", "--lag", "2", "--steps", "10", "--prompts", "4",
        "--samples", "4", "--digits", "4", "--server", server.url, "--name", "lm-test",
        env={"KEEL_SPOOL_DIR": str(tmp_path / "spool")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "reward/mean" in result.stdout
    (run,) = [r for r in _get(server.url, "/runs") if r["name"] == "lm-test"]  # type: ignore[union-attr]
    assert (run["group"], run["status"], run["last_step"]) == ("cispo", "finished", 9)
    detail = _get(server.url, f"/runs/{run['id']}")
    config = detail["config"]  # type: ignore[index]
    assert (config["loss"], config["lag"], config["sampler_dtype"], config["gate/unit"]) == (
        "cispo", 2, "bf16", "token",
    )  # fmt: skip
    keys = {e["key"]: e["count"] for e in _get(server.url, f"/runs/{run['id']}/keys")}  # type: ignore[union-attr]
    for key in (*HEADLINE, *PROVENANCE, "perf/tokens_per_s", "perf/sampler_tokens_per_s"):
        assert keys.get(key) == 10, key

    def series(key: str) -> list[float]:
        data = _get(server.url, f"/runs/{run['id']}/series", key=key)
        assert data["steps"] == list(range(10))  # type: ignore[index]
        return data["values"]  # type: ignore[index, no-any-return]

    assert series("provenance/seq_id_first") == [16.0 * s for s in range(10)]
    versions, lags = series("provenance/sampler_version"), series("staleness/lag_mean")
    assert [s - v for s, v in enumerate(versions)] == lags
    assert all(0 <= lag <= 2 for lag in lags)
    assert all(0 <= r <= 1 for r in series("reward/mean"))
    # The step details: the worst answers as text, named by their sequence ids.
    samples = _get(server.url, f"/runs/{run['id']}/samples", step=9)
    assert samples["step"] == 9  # type: ignore[index]
    worst = samples["samples"]  # type: ignore[index]
    assert len(worst) == 4
    assert all(16 * 9 <= s["seq_id"] < 16 * 10 for s in worst)  # the batch's own ids
    # (the policy may answer "=": it is in the vocabulary)
    assert all(set(s["tokens"]) <= set("0123456789=") and len(s["tokens"]) == 4 for s in worst)
    assert [s["max_log_ratio"] for s in worst] == sorted(
        (s["max_log_ratio"] for s in worst), reverse=True
    )


def test_keel_lm_rejects_bad_arguments() -> None:
    result = keel("lm", "--loss", "nope", "--server", "http://127.0.0.1:9")
    assert result.returncode == 2 and "unknown loss 'nope'" in result.stderr
    # One answer per prompt needs the batch baseline (FlashREINFORCE's setting).
    result = keel("lm", "--loss", "ppo", "--task", "copy", "--samples", "1", "--server", "http://127.0.0.1:9")
    assert result.returncode == 2 and "group >= 2" in result.stderr


def test_keel_lm_grid_writes_a_labelled_corpus(tmp_path) -> None:
    path = tmp_path / "corpus.json"
    result = keel(
        "lm-grid", "--losses", "reinforce,ppo", "--lags", "0,2", "--dtypes", "bf16",
        "--seeds", "0", "--steps", "8", "--prompts", "2", "--samples", "4", "--digits", "3",
        "--jobs", "2", "--json", str(path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "collapsed" in result.stdout and "4 runs x 8 steps" in result.stdout
    corpus = json.loads(path.read_text())
    names = [run["name"] for run in corpus["runs"]]
    assert names == ["reinforce-lag0-bf16-d3-b2x4-s0", "reinforce-lag2-bf16-d3-b2x4-s0", "ppo-lag0-bf16-d3-b2x4-s0",
                     "ppo-lag2-bf16-d3-b2x4-s0"]  # fmt: skip
    for run in corpus["runs"]:
        assert run["spec"]["steps"] == 8 and run["spec"]["digits"] == 3
        rewards = run["series"]["reward/mean"]
        assert run["collapse_step"] == collapse_step(smoothed(rewards))
        assert run["collapse_step_raw"] == collapse_step(rewards)
        assert {*HEADLINE, *PROVENANCE} <= set(run["series"])
        assert all(len(values) == 8 for values in run["series"].values())
