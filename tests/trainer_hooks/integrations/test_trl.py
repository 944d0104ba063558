"""KeelCallback / KeelGRPOTrainer on a real TRL GRPOTrainer, streaming to a real server.

The model is a random-weight two-layer Llama built from a config, the tokenizer a
character-level WordLevel built in code, the dataset in memory: nothing comes from a hub.
Every expected value is TRL's own `trainer.state.log_history` or follows from the inputs.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from tests.support.monitor import FAST
from tests.support.stored_runs import keys_of, run_of, stored
from trainer_hooks.integrations.trl import (
    SOURCE_NONE,
    SOURCE_ROLLOUT,
    SOURCE_STALENESS,
    SOURCE_UNAVAILABLE,
    GateParams,
    KeelCallback,
    KeelGRPOTrainer,
    MicroBatch,
    concat_micro_batches,
    grpo_gate_mask,
    keel_metrics,
)
from trainer_hooks.metrics import stability_metrics

CHARS = "abcdefgh "
PER_DEVICE = 4  # = num_generations: one prompt per micro-batch


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(CHARS) + 2,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )
    return LlamaForCausalLM(config)


def reward_a(completions: list[str], **kwargs: Any) -> list[float | None]:
    """Fraction of 'a' in the completion: varied, so advantages are not all zero."""
    return [c.count("a") / max(1, len(c)) for c in completions]


def train(
    tmp_path: Path,
    url: str,
    *,
    trainer_cls: type[GRPOTrainer] = KeelGRPOTrainer,
    reward: Callable[..., list[float | None]] = reward_a,
    rollout_func: Callable[..., dict[str, Any]] | None = None,
    run_id: str | None = None,
    **overrides: Any,
) -> tuple[GRPOTrainer, str]:
    """Train `max_steps` (default 3) on CPU with a KeelCallback; returns the trainer and run id."""
    settings: dict[str, Any] = {
        "per_device_train_batch_size": PER_DEVICE,
        "num_generations": PER_DEVICE,
        "max_completion_length": 6,
        "max_steps": 3,
        "logging_steps": 1,
        "learning_rate": 1e-2,
        "report_to": "none",
        "use_cpu": True,
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": 0,
        **overrides,
    }
    args = GRPOConfig(output_dir=str(tmp_path / "out"), **settings)
    run_id = run_id or str(uuid.uuid4())
    keel = KeelCallback(
        url,
        run_name="tiny-grpo",
        config={"suite": "test_trl"},
        run_id=run_id,
        spool_dir=tmp_path / "spool",
        sender_config=FAST,
    )
    trainer = trainer_cls(
        model=tiny_model(),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd", "ef", "gh"] * 8}),
        processing_class=tiny_tokenizer(),
        callbacks=[keel],
        rollout_func=rollout_func,
    )
    with keel:  # a plain GRPOTrainer gets its "failed" status from this
        trainer.train()
    return trainer, run_id


def step_logs(trainer: GRPOTrainer) -> dict[int, dict[str, Any]]:
    """TRL's per-step logs (those with a loss; not the end-of-training summary)."""
    return {int(h["step"]): h for h in trainer.state.log_history if "loss" in h}


# -- against a real trainer and server ---------------------------------------------------


@pytest.mark.parametrize("accumulation", [1, 2])
def test_stores_trl_logs_and_keel_metrics_per_optimizer_step(
    server: Any, tmp_path: Path, accumulation: int
) -> None:
    trainer, run_id = train(tmp_path, server.url, gradient_accumulation_steps=accumulation)
    history = step_logs(trainer)
    assert sorted(history) == [1, 2, 3]

    run = run_of(server.url, run_id)
    assert run["status"] == "finished"
    assert run["config"]["suite"] == "test_trl"
    assert run["config"]["keel/mismatch_source"] == SOURCE_NONE
    assert run["config"]["gate/unit"] == "token"
    assert run["config"]["trl/args"]["gradient_accumulation_steps"] == accumulation

    for trl_name, key in [
        ("reward", "trl/reward"),
        ("grad_norm", "grad/norm"),
        ("loss", "loss/total"),
        ("entropy", "policy/entropy"),
        ("learning_rate", "optim/lr"),
        ("reward_std", "trl/reward_std"),
        ("clip_ratio/region_mean", "policy/clip_frac"),
    ]:
        assert stored(server.url, run_id, key) == {s: h[trl_name] for s, h in history.items()}, key
    # Keel's own reward/mean, from each completion's reward, is TRL's reward (float32).
    reward_mean = stored(server.url, run_id, "reward/mean")
    assert reward_mean == pytest.approx({s: h["reward"] for s, h in history.items()}, rel=1e-6)
    # Every micro-batch of the step is counted, and each token once.
    seqs = PER_DEVICE * accumulation
    assert stored(server.url, run_id, "batch/seqs") == {1: seqs, 2: seqs, 3: seqs}
    tokens = stored(server.url, run_id, "batch/tokens")
    assert tokens == pytest.approx(
        {s: h["completions/mean_length"] * seqs for s, h in history.items()}
    )
    # Without vLLM and with these settings TRL's ratio is exactly 1: so is Keel's.
    assert stored(server.url, run_id, "mismatch/ratio_max") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert stored(server.url, run_id, "mismatch/kl") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert stored(server.url, run_id, "gate/frac") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert stored(server.url, run_id, "staleness/lag_max") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert stored(server.url, run_id, "trl/train_loss") == {
        3: trainer.state.log_history[-1]["train_loss"]
    }
    assert "ref/kl" not in keys_of(server.url, run_id)  # beta = 0: TRL logs no kl
    # The step details: the completions' tokens, named by the trainer's tokenizer.
    response = httpx.get(f"{server.url}/api/v1/runs/{run_id}/samples", params={"step": 3})
    samples = response.json()["samples"]
    assert len(samples) == 4
    vocabulary = tiny_tokenizer().convert_ids_to_tokens
    for sample in samples:
        assert sample["tokens"] == vocabulary(sample["token_ids"])
        assert set(sample["tokens"]) <= {*CHARS, "<pad>", "<eos>"}


def test_reused_generations_are_stale_and_gated_as_trl_clips(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    """num_iterations=2: every other step trains on completions of the previous weights."""
    server = server_factory(sqlite_url)
    trainer, run_id = train(
        tmp_path,
        server.url,
        num_iterations=2,
        loss_type="grpo",
        epsilon=0.01,
        learning_rate=0.05,
        max_steps=4,
    )
    history = step_logs(trainer)
    run = run_of(server.url, run_id)
    assert run["config"]["keel/mismatch_source"] == SOURCE_STALENESS

    assert stored(server.url, run_id, "staleness/lag_max") == {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}
    kl = stored(server.url, run_id, "mismatch/kl")
    assert kl[1] < 1e-6 and kl[3] < 1e-6  # old log-probs recomputed by the same weights
    assert kl[2] > 1e-4 and kl[4] > 1e-4  # one update later
    # One micro-batch per step: Keel's gate/frac is TRL's clipped fraction.
    region = {s: h["clip_ratio/region_mean"] for s, h in history.items()}
    assert max(region.values()) > 0
    assert stored(server.url, run_id, "gate/frac") == pytest.approx(region, abs=1e-6)


def test_sampler_logprobs_are_measured_raw(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    """A rollout_func that reports log μ = log π − 3 for one token: ratio e³, uncapped."""
    server = server_factory(sqlite_url)
    tokenizer = tiny_tokenizer()
    offset = 3.0

    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(len(prompts))
        prompt_ids, completion_ids, logprobs = [], [], []
        for index, prompt in enumerate(prompts):
            ids = tokenizer(prompt).input_ids
            completion = torch.randint(2, len(CHARS) + 2, (4,), generator=generator).tolist()
            model: Any = trainer.model
            with torch.no_grad():
                logits = model(torch.tensor([ids + completion])).logits[0]
            logp = torch.log_softmax(logits.float(), -1)
            token_logps = [logp[len(ids) - 1 + t, tok].item() for t, tok in enumerate(completion)]
            if index == 0:
                token_logps[1] -= offset
            prompt_ids.append(ids)
            completion_ids.append(completion)
            logprobs.append(token_logps)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    trainer, run_id = train(tmp_path, server.url, rollout_func=rollout, max_steps=1)
    assert run_of(server.url, run_id)["config"]["keel/mismatch_source"] == SOURCE_ROLLOUT
    # Step 1 trains the weights that sampled: the only mismatch is the planted one.
    assert stored(server.url, run_id, "mismatch/ratio_max")[1] == pytest.approx(
        math.exp(offset), rel=1e-4
    )
    tokens = stored(server.url, run_id, "batch/tokens")[1]
    assert stored(server.url, run_id, "mismatch/kl_k1")[1] == pytest.approx(
        -offset / tokens, rel=1e-4
    )


def flaky_reward(fail_at_call: int) -> Callable[..., list[float | None]]:
    calls: list[int] = []

    def reward(completions: list[str], **kwargs: Any) -> list[float | None]:
        calls.append(1)
        if len(calls) == fail_at_call:
            raise RuntimeError("reward server down")
        return reward_a(completions)

    return reward


@pytest.mark.parametrize("trainer_cls", [KeelGRPOTrainer, GRPOTrainer])
def test_an_exception_marks_the_run_failed(
    sqlite_url: str, server_factory: Any, tmp_path: Path, trainer_cls: type[GRPOTrainer]
) -> None:
    """KeelGRPOTrainer.train() marks it; a plain trainer inside `with keel:` too."""
    server = server_factory(sqlite_url)
    run_id = str(uuid.uuid4())
    with pytest.raises(RuntimeError, match="reward server down"):
        train(tmp_path, server.url, trainer_cls=trainer_cls, reward=flaky_reward(3), run_id=run_id)
    assert run_of(server.url, run_id)["status"] == "failed"
    assert set(stored(server.url, run_id, "grad/norm")) == {1, 2}  # the steps before


def test_a_plain_grpo_trainer_streams_trl_logs_only(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(sqlite_url)
    trainer, run_id = train(tmp_path, server.url, trainer_cls=GRPOTrainer)
    history = step_logs(trainer)
    run = run_of(server.url, run_id)
    assert run["status"] == "finished"
    assert run["config"]["keel/mismatch_source"] == SOURCE_UNAVAILABLE
    assert "gate/unit" not in run["config"]
    # TRL's reward fills the headline panel when Keel computes none of its own.
    assert stored(server.url, run_id, "reward/mean") == {s: h["reward"] for s, h in history.items()}
    assert stored(server.url, run_id, "grad/norm") == {
        s: h["grad_norm"] for s, h in history.items()
    }
    assert not {k for k in keys_of(server.url, run_id) if k.startswith(("mismatch/", "batch/"))}


def test_logging_steps_average_trl_logs_not_keel_metrics(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(sqlite_url)
    trainer, run_id = train(tmp_path, server.url, logging_steps=2, max_steps=4)
    history = step_logs(trainer)
    assert sorted(history) == [2, 4]
    assert stored(server.url, run_id, "trl/reward") == {s: h["reward"] for s, h in history.items()}
    assert stored(server.url, run_id, "grad/norm") == {
        s: h["grad_norm"] for s, h in history.items()
    }
    reward_mean = stored(server.url, run_id, "reward/mean")
    assert sorted(reward_mean) == [1, 2, 3, 4]  # Keel's own: every step
    # TRL averages its reward over the window's two steps; Keel keeps them apart.
    for step in (2, 4):
        window = (reward_mean[step - 1] + reward_mean[step]) / 2
        assert history[step]["reward"] == pytest.approx(window, rel=1e-5)


# -- the pure parts ----------------------------------------------------------------------


def test_keel_metrics_maps_trl_names() -> None:
    logs = {
        "loss": 0.5,
        "grad_norm": math.nan,
        "kl": 0.01,
        "entropy": 2.0,
        "reward": 0.25,
        "rewards/reward_a/mean": 0.25,
        "completions/mean_length": 4.0,
        "frac_reward_zero_std": None,  # TRL: no valid value in the window
        "eval_reward": 0.3,
        "eval_kl": 0.02,
    }
    out = keel_metrics(logs, reward_headline=False)
    assert out.pop("grad/norm") != out.get("grad/norm")  # NaN is kept
    assert out == {
        "loss/total": 0.5,
        "ref/kl": 0.01,
        "policy/entropy": 2.0,
        "trl/reward": 0.25,
        "trl/rewards/reward_a/mean": 0.25,
        "response/length_mean": 4.0,
        "eval/trl/reward": 0.3,
        "eval/ref/kl": 0.02,
    }
    assert keel_metrics({"reward": 0.25}, reward_headline=True) == {
        "trl/reward": 0.25,
        "reward/mean": 0.25,
    }


def test_clip_gate_is_trls_clipped_region_plus_delta() -> None:
    old = torch.zeros(2, 3)
    learner = torch.log(torch.tensor([[1.3, 0.7, 1.0], [1.3, 0.7, 5.0]]))
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    gate = grpo_gate_mask(GateParams("grpo", 0.2, 0.2), learner, old, advantages, mask)
    # A > 0 clips r > 1.2, A < 0 clips r < 0.8; padding never counts.
    assert gate.tolist() == [[True, False, False], [False, True, False]]
    two_sided = grpo_gate_mask(
        GateParams("grpo", 0.2, 0.2, delta=2.0), learner, old, advantages, mask
    )
    assert two_sided.tolist() == [[True, False, False], [False, True, True]]
    cispo = grpo_gate_mask(GateParams("cispo", epsilon_high=1.2), learner, old, advantages, mask)
    assert cispo.tolist() == [[True, False, False], [True, False, True]]
    soft = grpo_gate_mask(GateParams("sapo"), learner, old, advantages, mask)
    assert not soft.any()


def test_sequence_level_and_vllm_mask_gates() -> None:
    old = torch.zeros(2, 2)
    learner = torch.log(torch.tensor([[1.5, 1.5], [1.0, 1.0]]))
    mask = torch.ones(2, 2)
    gspo = GateParams("grpo", 0.2, 0.2, importance_sampling_level="sequence")
    assert gspo.unit == "sequence"
    assert grpo_gate_mask(gspo, learner, old, torch.ones(2), mask).tolist() == [True, False]
    # vLLM's sequence_mask zeroes sequences whose Π_t π_old/μ exceeds clip_max.
    sampler = torch.tensor([[-1.0, -1.0], [0.0, math.nan]])
    vllm = GateParams("sapo", vllm_is_mode="sequence_mask", vllm_is_clip_max=3.0)
    gated = grpo_gate_mask(vllm, old, old, torch.ones(2), mask, sampler_logprobs_B_T=sampler)
    assert gated.tolist() == [[True, True], [False, False]]  # e² > 3; NaN counts as ratio 1
    assert vllm.unit == "token"


def test_micro_batches_concatenate_with_padding_that_never_counts() -> None:
    def micro(length: int, seqs: int, version: int) -> MicroBatch:
        logp = torch.full((seqs, length), -1.0)
        return MicroBatch(
            sampler_logprobs=logp - 0.5,
            learner_logprobs=logp,
            mask=torch.ones(seqs, length),
            gate_mask=torch.zeros(seqs, length, dtype=torch.bool),
            advantages=torch.zeros(seqs),
            rewards=torch.full((seqs,), float(version)),
            sampler_version=torch.full((seqs,), version),
            learner_version=3,
            source=SOURCE_STALENESS,
        )

    inputs = concat_micro_batches([micro(2, 1, 1), micro(5, 2, 3)])
    assert inputs["mask"].tolist() == [[1, 1, 0, 0, 0], [1] * 5, [1] * 5]
    metrics = stability_metrics(
        inputs.pop("sampler_logprobs"), inputs.pop("learner_logprobs"), inputs.pop("mask"), **inputs
    )
    assert metrics["batch/seqs"].item() == 3 and metrics["batch/tokens"].item() == 12
    assert metrics["mismatch/ratio_max"].item() == pytest.approx(math.exp(0.5))
    assert metrics["reward/mean"].item() == pytest.approx(7 / 3)
    assert metrics["staleness/lag_max"].item() == 2


# -- acting on commands (docs/integrations/trl.md, "Acting on alerts") --------------------


MAX_STEPS_TO_STOP = 40


def test_a_checkpoint_command_saves_and_a_stop_command_saves_and_stops(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    """The commands are sent from inside the reward function, while the run trains."""
    server = server_factory(sqlite_url)
    run_id = str(uuid.uuid4())
    calls = {"n": 0}
    sent: dict[str, str] = {}

    def command(action: str) -> None:
        deadline = time.monotonic() + 30
        while True:  # the Monitor's worker says hello in the background: the run may not be there yet
            response = httpx.post(f"{server.url}/api/v1/runs/{run_id}/commands", json={"action": action})
            if response.status_code != 404 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert response.status_code == 202, response.text
        sent[action] = response.json()["id"]

    def reward(completions: list[str], **kwargs: Any) -> list[float | None]:
        calls["n"] += 1
        if calls["n"] == 2:
            command("checkpoint")
        elif calls["n"] == 5:
            command("stop")
        return reward_a(completions)

    # Room for the stop to arrive: it travels server -> the Monitor's worker -> the trainer while
    # steps go on (on a loaded box, several steps); training stops where it arrives, well before.
    trainer, _ = train(tmp_path, server.url, reward=reward, run_id=run_id, max_steps=MAX_STEPS_TO_STOP)
    commands = {c["id"]: c for c in httpx.get(f"{server.url}/api/v1/runs/{run_id}/commands").json()}
    checkpoint, stop = commands[sent["checkpoint"]], commands[sent["stop"]]
    assert checkpoint["state"] == "acked" and stop["state"] == "acked", commands
    saved_at = int(checkpoint["message"].removeprefix("checkpoint saved at step "))
    stopped_at = int(stop["message"].removeprefix("checkpoint saved at step ").removesuffix("; training stops"))
    assert 2 <= saved_at < stopped_at < MAX_STEPS_TO_STOP
    assert trainer.state.global_step == stopped_at  # stopped there, before max_steps
    out = tmp_path / "out"
    assert (out / f"checkpoint-{saved_at}").is_dir() and (out / f"checkpoint-{stopped_at}").is_dir()
    assert run_of(server.url, run_id)["status"] == "finished"


def test_actions_can_be_renamed_or_turned_off(sqlite_url: str, server_factory: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'save' or 'stop'"):
        KeelCallback("http://127.0.0.1:1", actions={"checkpoint": "rollback"})
    callback = KeelCallback("http://127.0.0.1:1", actions={"snapshot": "save"})
    assert callback.actions == {"snapshot": "save"}
    assert KeelCallback("http://127.0.0.1:1", actions={}).actions == {}
