"""The copy task (`keel lm --task copy`): answers that end with <eos> under a length cap, the
std-normalised advantages, the aggregations over variable lengths, and the length metrics."""

from __future__ import annotations

import math
import queue
from dataclasses import asdict, replace

import httpx
import pytest
import torch

from learners.lm.advantages import advantages, zero_std_frac
from learners.lm.learner import LMConfig, Recorder, learner_step, run_config, train
from learners.lm.model import GPT, SIZES, GPTConfig
from learners.lm.runfiles import read_run, write_run
from learners.lm.sampler import DTYPES, Rollout, Sampler, WeightBoard
from learners.lm.task import EOS, EQUALS, CopyTask, SortTask, copy_texts
from tests.support.monitor import keel
from trainer_hooks.losses import policy_loss
from trainer_hooks.metrics import stability_metrics

FAST = LMConfig(task="copy", digits=2, steps=12, prompts=4, group=4)
LETTER = 12  # "a"


def _model(task: CopyTask, eos_bias: float | None = None, seed: int = 0) -> GPT:
    """The copy policy at its prior; `eos_bias` overrides <eos>'s log-weight."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**asdict(SIZES["tiny"]), "vocab": task.vocab, "context": task.context}))
    torch.nn.init.normal_(model.head.weight, std=0.3)  # answers that depend on the prompt
    with torch.no_grad():
        model.head.bias.copy_(task.prior_logits())
        if eos_bias is not None:
            model.head.bias[EOS] = eos_bias
    return model


def _generate(task: CopyTask, model: GPT, dtype: str = "fp32", prompts: int = 8, group: int = 4) -> Rollout:
    board = WeightBoard(DTYPES[dtype])
    board.publish(3, model)
    sampler = Sampler(
        model.config, task, board, queue.Queue(), lag=0, prompts=prompts, group=group,
        device=torch.device("cpu"), seed=0,
    )  # fmt: skip
    published = board.wait_for(0, sampler.stop)
    assert published is not None
    sampler._load(*published)
    return sampler.generate(index=0)[0]


def _mask(rollout: Rollout) -> torch.Tensor:
    assert rollout.mask_B_T is not None
    return rollout.mask_B_T


def test_the_copy_reward_counts_the_digits_and_the_eos_in_place_and_zero_for_a_cut_answer() -> None:
    task = CopyTask(3)  # prompt of 6 tokens and "=", cap 8
    prompt = [3, 9, 1, LETTER + 10, LETTER + 42, LETTER + 23, EQUALS]
    assert copy_texts(prompt) == ["3", "9", "1", "k", "Q", "x", "="]
    answers = [
        [3, 9, 1, EOS] + [EOS] * 4,  # exact: 3 digits + <eos> of 4 places
        [3, 9, EOS] + [EOS] * 5,  # 3 and 9 right, <eos> early: 2/4
        [3, 9, 1, 1, EOS] + [EOS] * 3,  # <eos> late: 3/4
        [9, 3, 1, EOS] + [EOS] * 4,  # the 1 and the <eos> in place: 2/4
        [EOS] * 8,  # nothing said: 0
        [3, 9, 1] + [LETTER] * 5,  # no <eos> within the cap: cut
        [3, 9, 1, 1, 1, 1, 1, EOS],  # <eos> as the cap-th token: it ended, 3/4
    ]
    rewards = task.reward(torch.tensor([prompt + a for a in answers]))
    assert rewards.tolist() == [1.0, 0.5, 0.75, 0.5, 0.0, 0.0, 0.75]
    penalised = CopyTask(3, truncation_penalty=0.5).reward(torch.tensor([prompt + answers[5]]))
    assert penalised.tolist() == [-0.5]
    # A one-digit prompt: the answer is that digit and <eos>.
    short = [7, LETTER, LETTER + 1, LETTER + 2, LETTER + 3, LETTER + 4, EQUALS]
    assert task.reward(torch.tensor([short + [7, EOS] + [EOS] * 6, short + [7, 7, EOS] + [EOS] * 5])).tolist() == [1.0, 0.5]


def test_copy_prompts_hold_one_to_digits_digits_then_fillers() -> None:
    task = CopyTask(3)
    prompts = task.prompts(400, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert prompts.shape == (400, 7) and (prompts[:, -1] == EQUALS).all()
    body = prompts[:, :6]
    counts = (body < 10).sum(1)
    assert set(counts.tolist()) == {1, 2, 3}
    # the digits come first, then letters (ids 12..63) only
    for row, k in zip(body.tolist(), counts.tolist(), strict=True):
        assert all(t < 10 for t in row[:k]) and all(12 <= t < 64 for t in row[k:])
    targets, wanted = task.targets(prompts)
    assert torch.equal(wanted, counts)
    assert torch.equal(targets[:, 0], body[:, 0])
    assert task.vocab == 64 and task.max_new_tokens == 8 and task.prompt_len == 7


def test_the_sampler_stops_each_answer_at_eos_and_the_mask_covers_it_exactly() -> None:
    task = CopyTask(3)
    model = _model(task)
    rollout = _generate(task, model)
    answer, mask, logp = rollout.tokens_B_L[:, task.prompt_len :], _mask(rollout), rollout.sampler_logp_B_T
    assert answer.shape == mask.shape == logp.shape == (32, task.max_new_tokens) and mask.dtype == torch.bool
    lengths, ended = task.answer_lengths(answer)
    assert ended.any() and not ended.all()  # some answers end, some run into the cap
    places = torch.arange(task.max_new_tokens)
    assert torch.equal(mask, places < lengths[:, None])  # up to and including the first <eos>
    assert torch.equal(mask.sum(1), lengths)
    # After its <eos> an answer holds <eos> again with log μ 0; its own tokens have log μ < 0.
    after = ~mask
    assert (answer[after] == EOS).all() and (logp[after] == 0).all() and (logp[mask] < 0).all()
    # The <eos> itself is a loss token: the last masked token of every ended answer.
    last = answer.gather(1, (lengths - 1)[:, None]).squeeze(1)
    assert (last[ended] == EOS).all() and (last[~ended] != EOS).all()
    assert torch.equal(rollout.rewards_B, task.reward(rollout.tokens_B_L))
    # log μ is the sampler's own distribution of each kept token.
    with torch.no_grad():
        full = model(rollout.tokens_B_L[:, :-1])[:, task.prompt_len - 1 :].log_softmax(-1)
    again = full.gather(-1, answer[..., None]).squeeze(-1)
    torch.testing.assert_close(logp[mask], again[mask], atol=1e-5, rtol=0.0)


def test_an_answer_that_never_says_eos_is_cut_at_the_cap_and_one_that_says_it_first_has_one_token() -> None:
    task = CopyTask(2, truncation_penalty=0.25)  # cap 6
    cut = _generate(task, _model(task, eos_bias=-1e4))
    assert _mask(cut).all() and not (cut.tokens_B_L[:, task.prompt_len :] == EOS).any()
    assert cut.rewards_B.tolist() == [-0.25] * 32
    at_once = _generate(task, _model(task, eos_bias=1e4))
    assert (at_once.tokens_B_L[:, task.prompt_len :] == EOS).all()
    assert _mask(at_once).sum(1).tolist() == [1] * 32 and at_once.rewards_B.tolist() == [0.0] * 32
    # What Keel's length metrics make of them (max_length = the cap).
    for rollout, length, cut_share in ((cut, 6.0, 1.0), (at_once, 1.0, 0.0)):
        values = stability_metrics(
            rollout.sampler_logp_B_T, rollout.sampler_logp_B_T, rollout.mask_B_T, max_length=task.max_new_tokens
        )
        assert float(values["response/length_mean"]) == length
        assert float(values["response/length_max"]) == length
        assert float(values["response/truncated_frac"]) == cut_share
        assert float(values["response/length_cap"]) == 6.0


def test_group_std_advantages_divide_by_the_groups_sample_std() -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    centred = advantages(rewards, "group", 4)
    assert centred.tolist() == [-0.5, 0.5, 0.5, -0.5, 0, 0, 0, 0, -0.125, -0.125, -0.125, 0.375]
    scaled = advantages(rewards, "group_std", 4)
    # group 1: sample std sqrt(1/3); group 2: all equal, so 0; group 3: std 0.25
    first = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    third = 0.125 / (0.25 + 1e-6)
    expected = [-first, first, first, -first, 0, 0, 0, 0, -third, -third, -third, 3 * third]
    torch.testing.assert_close(scaled, torch.tensor(expected), rtol=1e-6, atol=0.0)
    assert advantages(rewards, "batch", 4).tolist() == pytest.approx((rewards - rewards.mean()).tolist())
    assert float(zero_std_frac(rewards, "group", 4)) == pytest.approx(1 / 3)
    assert float(zero_std_frac(rewards, "group_std", 4)) == pytest.approx(1 / 3)
    assert float(zero_std_frac(rewards, "batch", 1)) == 0.0
    assert float(zero_std_frac(torch.ones(8), "batch", 1)) == 1.0


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        # Σ_i A_i Σ_{t<T_i} log π_t, lengths 1, 3, 2; A = 2, -1, 0.5; log π_t = -(t + 1) / 10
        ("token_sum", -(2 * -0.1 + -1 * -0.6 + 0.5 * -0.3)),
        ("token_mean", -(2 * -0.1 + -1 * -0.6 + 0.5 * -0.3) / 6),
        ("seq_mean_token_mean", -(2 * -0.1 / 1 + -1 * -0.6 / 3 + 0.5 * -0.3 / 2) / 3),
    ],
)
def test_the_aggregations_over_variable_length_answers_give_the_documented_values(agg: str, expected: float) -> None:
    logp = torch.tensor([[-0.1, -0.2, -0.3], [-0.1, -0.2, -0.3], [-0.1, -0.2, -0.3]], requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    padded = torch.where(mask, logp, torch.tensor(math.nan))  # padding may hold anything
    adv = torch.tensor([2.0, -1.0, 0.5])
    loss, _ = policy_loss("reinforce", padded, padded.detach(), adv, mask, agg=agg)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert logp.grad is not None and (logp.grad[~mask] == 0).all()
    table: dict[str, list[float]] = {
        "token_sum": [1.0, 1.0, 1.0], "token_mean": [1 / 6] * 3, "seq_mean_token_mean": [1 / 3, 1 / 9, 1 / 6],
    }  # fmt: skip
    weights = table[agg]
    torch.testing.assert_close(logp.grad[mask], torch.tensor(
        [-2 * weights[0], 1 * weights[1], 1 * weights[1], 1 * weights[1], -0.5 * weights[2], -0.5 * weights[2]]
    ))  # fmt: skip


@pytest.mark.parametrize("agg", ["token_sum", "token_mean", "seq_mean_token_mean"])
def test_the_learner_step_aggregates_over_the_answers_mask(agg: str) -> None:
    """The learner's loss is the documented aggregation of its own log π over exactly the
    answers' tokens (their <eos> included), with the advantages of --adv."""
    task = CopyTask(2)
    model = _model(task)
    rollout = _generate(task, model, prompts=4, group=4)
    rollout.rewards_B = torch.tensor([0.0, 0.25, 0.5, 1.0] * 4)
    config = replace(FAST, loss="reinforce", agg=agg, adv="group_std", group=4)
    out = learner_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rollout, config)
    assert torch.equal(out.mask_B_T, _mask(rollout))
    adv = advantages(rollout.rewards_B, "group_std", 4)
    torch.testing.assert_close(out.adv_B, adv)
    mask = _mask(rollout).float()
    per_seq = (out.learner_logp_B_T * mask).sum(1)
    if agg == "token_sum":
        expected = -(adv * per_seq).sum()
    elif agg == "token_mean":
        expected = -(adv * per_seq).sum() / mask.sum()
    else:
        expected = -(adv * per_seq / mask.sum(1)).mean()
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)


def test_names_checks_and_the_stored_config() -> None:
    assert LMConfig().name == "cispo-lag0-bf16-s0" and LMConfig().make_task() == SortTask(6)
    config = LMConfig(task="copy", digits=3, loss="ppo", adv="group_std", agg="seq_mean_token_mean", max_new_tokens=12)
    assert config.name == "ppo-lag0-bf16-copy-d3-adv-groupstd-agg-smean-cap12-s0"
    assert replace(config, adv="group", agg="token_sum", max_new_tokens=8).name == "ppo-lag0-bf16-copy-d3-s0"
    assert LMConfig(loss="flash_reinforce", group=1).advantage_mode == "batch"
    LMConfig(loss="flash_reinforce", group=1, task="copy", digits=2).check()  # one answer per prompt
    with pytest.raises(ValueError, match="group >= 2"):
        LMConfig(loss="ppo", group=1).check()
    with pytest.raises(ValueError, match="copy task's"):
        LMConfig(max_new_tokens=9).check()
    with pytest.raises(ValueError, match="unknown task"):
        LMConfig(task="nope").check()
    stored = run_config(config)
    assert (stored["task"], stored["adv/mode"], stored["loss/agg"], stored["max_new_tokens"]) == (
        "copy", "group_std", "seq_mean_token_mean", 12,
    )  # fmt: skip
    default = run_config(LMConfig())
    assert (default["task"], default["max_new_tokens"], default["adv/mode"], default["loss/agg"]) == (
        "sort", 0, "group", "token_sum",
    )  # fmt: skip


class Spy(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, object]] = []

    def log_inputs(self, step, inputs, *, metrics=None, decode=None):  # type: ignore[no-untyped-def, override]
        self.calls.append({**inputs.arguments(), "metrics": metrics, "decode": decode})
        super().log_inputs(step, inputs, metrics=metrics, decode=decode)


def test_a_copy_run_logs_the_length_metrics_the_zero_spread_share_and_keeps_them_in_run_files(tmp_path) -> None:
    torch.set_num_threads(1)
    spy = Spy()
    train(replace(FAST, steps=10, max_new_tokens=5), spy)
    series = spy.series
    for key in ("response/length_mean", "response/length_max", "response/truncated_frac",
                "response/length_cap", "reward/zero_std_frac", "loss/total", "policy/entropy"):  # fmt: skip
        assert len(series[key]) == 10 and all(math.isfinite(v) for v in series[key]), key
    assert series["response/length_cap"] == [5.0] * 10
    for step, call in enumerate(spy.calls):
        assert call["max_length"] == 5
        mask = call["mask"]
        lengths = mask.sum(1).float()  # type: ignore[attr-defined]
        assert series["response/length_mean"][step] == pytest.approx(float(lengths.mean()))
        assert series["response/length_max"][step] == float(lengths.max())
        assert series["response/truncated_frac"][step] == pytest.approx(float((lengths >= 5).float().mean()))
        rewards = call["rewards"].view(4, 4)  # type: ignore[attr-defined]
        flat = (rewards.amax(1) == rewards.amin(1)).float().mean()
        assert series["reward/zero_std_frac"][step] == pytest.approx(float(flat))
    # The run file keeps them (the corpora's format).
    run = {"name": "copy-run", "spec": asdict(FAST), "wall_s": 1.0, "series": series}
    back = read_run(write_run(tmp_path, run))["series"]
    for key in ("response/length_mean", "response/truncated_frac", "response/length_cap", "reward/zero_std_frac"):
        assert back[key] == pytest.approx(series[key], rel=1e-6), key
    # The sort task has no cap: no response/* keys, so no "answers at the length cap" alarm.
    sort = Recorder()
    train(LMConfig(steps=3, prompts=2, group=2, digits=3), sort)
    assert not any(key.startswith("response/") for key in sort.series) and "reward/zero_std_frac" in sort.series


def test_keel_lm_task_copy_streams_the_length_metrics(server_factory, sqlite_url, tmp_path) -> None:
    server = server_factory(sqlite_url)
    result = keel(
        "lm", "--task", "copy", "--loss", "cispo", "--adv", "group_std", "--digits", "2", "--steps", "6",
        "--prompts", "4", "--samples", "4", "--server", server.url, "--name", "copy-test",
        env={"KEEL_SPOOL_DIR": str(tmp_path / "spool")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = httpx.get(f"{server.url}/api/v1/runs", timeout=30).json()
    (run,) = [r for r in runs if r["name"] == "copy-test"]
    detail = httpx.get(f"{server.url}/api/v1/runs/{run['id']}", timeout=30).json()
    assert (detail["config"]["task"], detail["config"]["max_new_tokens"], detail["config"]["adv/mode"]) == (
        "copy", 6, "group_std",
    )  # fmt: skip
    keys = {e["key"]: e["count"] for e in httpx.get(f"{server.url}/api/v1/runs/{run['id']}/keys", timeout=30).json()}
    for key in ("response/length_mean", "response/length_max", "response/truncated_frac", "response/length_cap",
                "reward/zero_std_frac", "loss/total"):  # fmt: skip
        assert keys.get(key) == 6, key
    cap = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/series", params={"key": "response/length_cap"}, timeout=30)
    assert cap.json()["values"] == [6.0] * 6
    samples = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/samples", params={"step": 5}, timeout=30).json()
    texts = {t for s in samples["samples"] for t in s["tokens"]}
    assert texts <= set(copy_texts(list(range(64)))) and texts  # decoded with the copy vocabulary


def test_the_right_answers_score_one_and_their_mask_ends_at_the_first_eos() -> None:
    """What the warm start trains on: each task's right answers, whose reward is 1, and (copy)
    the places up to and including the answer's first <eos>; an answer longer than the cap is
    cut there, and scored as cut."""
    generator = torch.Generator().manual_seed(0)
    for task in (SortTask(4), CopyTask(3), CopyTask(3, cap=5)):
        prompts = task.prompts(64, generator, torch.device("cpu"))
        answers, mask = task.answers(prompts)
        assert answers.shape == mask.shape == (64, task.max_new_tokens)
        reward = task.reward(torch.cat([prompts, answers], dim=1))
        if isinstance(task, SortTask):
            assert reward.tolist() == [1.0] * 64 and mask.all()
            continue
        _, wanted = task.targets(prompts)
        assert mask.sum(1).tolist() == [min(k + 1, task.max_new_tokens) for k in wanted.tolist()]
        assert (answers[mask.logical_not()] == EOS).all()
        fits = wanted + 1 <= task.max_new_tokens
        assert reward[fits].tolist() == [1.0] * int(fits.sum())
    cut = CopyTask(3, cap=2)
    prompts = torch.tensor([[1, 2, 3, 20, 20, 20, EQUALS]])
    answers, mask = cut.answers(prompts)
    assert answers.tolist() == [[1, 2]] and mask.tolist() == [[True, True]]
    assert cut.reward(torch.cat([prompts, answers], dim=1)).tolist() == [0.0]  # no <eos> within the cap


def test_a_warm_start_begins_rl_from_a_trained_sharper_policy() -> None:
    """`sft_steps`: RL starts where supervised steps on the right answers left the policy, its
    reward above and its entropy below those of a run that starts from the format prior; the
    step count is in the run's name, and a negative one is refused."""
    torch.set_num_threads(1)
    base = LMConfig(task="copy", digits=2, steps=5, prompts=8, group=4, seed=3)
    cold, warm = Recorder(), Recorder()
    train(base, cold)
    train(replace(base, sft_steps=150), warm)

    def mean(series: list[float]) -> float:
        return sum(series) / len(series)

    assert mean(warm.series["reward/mean"]) > mean(cold.series["reward/mean"]) + 0.3
    assert mean(warm.series["policy/entropy"]) < 0.5 * mean(cold.series["policy/entropy"])
    assert replace(base, sft_steps=150).name == "importance_sampling-lag0-bf16-copy-d2-b8x4-sft150-s3".replace("importance_sampling", base.loss)
    with pytest.raises(ValueError, match="sft_steps"):
        replace(base, sft_steps=-1).check()
