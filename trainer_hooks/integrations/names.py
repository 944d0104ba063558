"""Every framework's metric names that mean what a Keel name means, in one place.

The same maps serve the native integrations (`trainer_hooks.integrations.verl`, `.trl`,
`.openrlhf`), and `keel import --framework` and `keel watch --framework` alike (both name a
log's metrics through keel/importers.py's `Renamer`, so a log imported and watched lands each
metric under one name; docs/integrations/watch.md). Standard library only: `keel watch` runs
where neither torch nor the framework is installed.

The rule for an entry: the framework's number is the quantity Keel's name stands for
(docs/metrics.md): the same estimator, over the same tokens, of the same two policies, before
any truncation. Each entry cites the framework's source (file and function, at the version
or commit in `NameMap.source`) and says what the number is. A name that only resembles a Keel
name stays under the framework's prefix (`verl/rollout_corr/rollout_is_max`), and the map's
`not_mapped` says why, so nothing is charted or alerted on as what it is not.

Names are as the framework hands them to its loggers, which is what wandb and TensorBoard
store: TRL's go through transformers' `rewrite_logs` (`train/` + the name, `eval_x` as
`eval/x`), so its map lists them with `train/` (`log_prefix`); the native TRL callback, which
sees them before the rewrite, looks them up without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["FRAMEWORKS", "MAPS", "Mapped", "NameMap", "detect_framework"]


@dataclass(frozen=True)
class Mapped:
    keel: str
    """Keel's name for it (docs/metrics.md)."""
    where: str
    """The framework's file and function that computes it."""
    means: str
    """What the number is: estimator, tokens, policies, aggregation."""
    logs_only: bool = False
    """True where a native integration computes Keel's number itself (TRL's reward): the
    entry then serves `keel import` and `keel watch` only."""


@dataclass(frozen=True)
class NameMap:
    framework: str
    prefix: str
    """Where an unmapped name `x` is stored: `<prefix>/x`."""
    source: str
    """The pinned source every entry was read from."""
    entries: Mapping[str, Mapped]
    signature: tuple[str, ...]
    """Names only this framework logs: `auto` picks it when a run logs any of them."""
    config_keys: tuple[str, ...] = ()
    """Top-level config keys only this framework's config has (`auto`'s second clue)."""
    step_keys: tuple[str, ...] = ()
    """Logged columns that carry the step (first present wins), never stored as metrics."""
    log_prefix: str = ""
    """What the framework's loggers put before its names (TRL: `train/`)."""
    not_mapped: Mapping[str, str] = field(default_factory=dict)
    """Names that look like a Keel metric and are not, with the reason."""

    def to_keel(self, *, native: bool = False) -> dict[str, str]:
        """{framework name: Keel name}; `native`: as the framework's own callback sees the
        names (without `log_prefix`, and without the logs-only entries)."""
        if not native:
            return {name: entry.keel for name, entry in self.entries.items()}
        return {
            name.removeprefix(self.log_prefix): entry.keel
            for name, entry in self.entries.items()
            if not entry.logs_only
        }

    def keel_name(self, name: str) -> str:
        """The Keel name a logged `name` is stored under."""
        entry = self.entries.get(name)
        if entry is not None:
            return entry.keel
        if name.startswith("eval/"):
            return name
        return f"{self.prefix}/{name.removeprefix(self.log_prefix)}" if self.prefix else name


VERL = NameMap(
    framework="verl",
    prefix="verl",
    source="verl 0.9.1 (PyPI wheel verl-0.9.1-py3-none-any.whl)",
    entries={
        "rollout_corr/k3_kl": Mapped(
            "mismatch/kl", "verl/trainer/ppo/rollout_corr_helper.py compute_offpolicy_metrics",
            "token mean over the batch of e^ℓ − ℓ − 1, ℓ = log π − log μ: old_log_prob is the "
            "trainer's recomputation under the weights about to be trained (π), rollout_log_prob "
            "the inference engine's (μ); k3 of KL(μ‖π)",
        ),
        "rollout_corr/kl": Mapped(
            "mismatch/kl_k1", "verl/trainer/ppo/rollout_corr_helper.py compute_offpolicy_metrics",
            "token mean of log μ − log π over the batch",
        ),
        "critic/score/mean": Mapped(
            "reward/mean", "verl/trainer/ppo/metric_utils.py compute_data_metrics",
            "mean sequence score, aborted samples left out",
        ),
        "actor/grad_norm": Mapped(
            "grad/norm", "verl/workers/actor/dp_actor.py update_policy (via trainer_base rename)",
            "gradient norm before clipping, mean over the step's mini-batch updates",
        ),
        "actor/entropy": Mapped(
            "policy/entropy", "verl/trainer/ppo/v1/trainer_base.py (actor/entropy)",
            "entropy of the trainer's forward pass, verl's loss_agg_mode",
        ),
        "actor/pg_loss": Mapped(
            "loss/pg", "verl/workers/utils/losses.py ppo_loss", "the policy-gradient loss"
        ),
        "actor/lr": Mapped("optim/lr", "verl/trainer/ppo/v1/trainer_base.py", "the actor's learning rate"),
        "training/off_policy/trajectory_staleness/mean": Mapped(
            "staleness/lag_mean", "verl/trainer/ppo/v1/trainer_base.py (off-policy metrics)",
            "(global_steps − 1) − the newest weight version a trajectory was sampled with, mean over trajectories",
        ),
        "training/off_policy/trajectory_staleness/max": Mapped(
            "staleness/lag_max", "verl/trainer/ppo/v1/trainer_base.py (off-policy metrics)",
            "the same, max over trajectories",
        ),
        "timing_s/step": Mapped("perf/step_s", "verl/trainer/ppo/ray_trainer.py marked_timer('step')", "seconds per step"),
    },
    signature=("rollout_corr/k3_kl", "rollout_corr/kl", "critic/score/mean", "actor/pg_loss", "timing_s/step"),
    config_keys=("actor_rollout_ref", "algorithm"),
    not_mapped={
        "rollout_corr/rollout_is_max": "IS weights after verl's truncation (token mode) or per sequence, not Keel's raw mismatch/ratio_max",
        "rollout_corr/rollout_is_eff_sample_size": "of the truncated or sequence-level weights, not Keel's mismatch/ess_frac",
        "training/rollout_probs_diff_mean": "a difference of probabilities, not of log-probabilities",
    },
)

TRL = NameMap(
    framework="trl",
    prefix="trl",
    source="trl 1.16.0 (PyPI), logged through transformers 5.24.0 integration_utils rewrite_logs",
    entries={
        "train/grad_norm": Mapped(
            "grad/norm", "transformers/trainer.py Trainer._inner_training_loop (clip_grad_norm_ return)",
            "global gradient norm before clipping",
        ),
        "train/loss": Mapped("loss/total", "transformers/trainer.py Trainer._maybe_log_save_evaluate", "the training loss, mean since the last log"),
        "train/learning_rate": Mapped("optim/lr", "transformers/trainer.py Trainer._maybe_log_save_evaluate", "the learning rate"),
        "train/entropy": Mapped(
            "policy/entropy", "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss", "token mean of the policy's entropy"
        ),
        "train/kl": Mapped(
            "ref/kl", "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss",
            "KL to the reference model (beta > 0), not the sampler–learner mismatch",
        ),
        "train/step_time": Mapped("perf/step_s", "trl/trainer/grpo_trainer.py GRPOTrainer.training_step", "seconds per step"),
        "train/reward": Mapped(
            "reward/mean", "trl/trainer/grpo_trainer.py GRPOTrainer._generate_and_score_completions",
            "nanmean of the completions' summed rewards, gathered over processes",
            logs_only=True,
        ),
    },
    signature=("train/sampling/sampling_logp_difference/mean", "train/completions/mean_length", "train/rewards/", "train/reward_std", "train/frac_reward_zero_std"),
    config_keys=("num_generations", "beta", "loss_type"),
    step_keys=("train/global_step",),
    log_prefix="train/",
    not_mapped={
        "train/sampling/sampling_logp_difference/mean": "mean |ℓ| per process, then the mean of the processes' means (Keel's is the token mean)",
        "train/sampling/importance_sampling_ratio/max": "after TRL's vLLM IS truncation or masking, not the raw ratio",
        "train/reward_std": "sample std (nanstd), Keel's reward/std is the population std",
    },
)

OPENRLHF = NameMap(
    framework="openrlhf",
    prefix="openrlhf",
    source="OpenRLHF 0.11.2 source (openrlhf/trainer/ppo_trainer.py, openrlhf/models/loss.py)",
    entries={
        "vllm_kl": Mapped(
            "mismatch/kl_k1", "openrlhf/models/loss.py PolicyLoss (is_correction_level token|seq)",
            "masked_mean(rollout_log_probs − old_log_probs) per micro-batch, token-weighted over micro-batches (ppo_actor.ppo_train): the batch's token mean",
        ),
        "is_filter_ratio": Mapped("gate/frac", "openrlhf/models/loss.py PolicyLoss", "units the IS correction masked or clipped (not PPO's clip)"),
        "actor_grad_norm": Mapped("grad/norm", "openrlhf/trainer/ray/ppo_actor.py ppo_train", "the step's last optimizer step's norm before clipping"),
        "policy_loss": Mapped("loss/pg", "openrlhf/trainer/ray/ppo_actor.py training_step", "the policy loss"),
        "actor_lr": Mapped("optim/lr", "openrlhf/trainer/ray/ppo_actor.py ppo_train", "the actor's learning rate"),
        "kl": Mapped("ref/kl", "openrlhf/trainer/ray/ppo_actor.py training_step", "KL to the reference model, not the sampler–learner mismatch"),
        "rollout/reward_mean": Mapped("reward/mean", "openrlhf/trainer/ppo_trainer.py", "all the step's samples, before dynamic batching"),
        "timing/step_total": Mapped("perf/step_s", "openrlhf/trainer/ppo_trainer.py", "seconds per step"),
    },
    signature=("vllm_kl", "actor_grad_norm", "rollout/reward_mean", "timing/step_total", "is_filter_ratio"),
    config_keys=("actor_num_nodes", "vllm_num_engines"),
    not_mapped={"rollout/reward_std": "sample std; Keel's reward/std is the population's"},
)

PRIME_RL = NameMap(
    framework="prime-rl",
    prefix="prime-rl",
    source="prime-rl 0.8.0, commit 559b44772e471d1538537b8805cc77f3824a5e64 (github.com/PrimeIntellect-ai/prime-rl)",
    entries={
        "mismatch_kl/all/mean": Mapped(
            "mismatch/kl", "src/prime_rl/trainer/rl/train.py train (compute_importance_ratio_and_mismatch_kl in trainer/rl/loss.py; Tensors.compute_stats in trainer/utils.py)",
            "e^ℓ − ℓ − 1 with ℓ = trainer log-prob − inference log-prob, every sampled loss token of the step gathered over ranks, then the mean: k3 of KL(μ‖π), the token mean",
        ),
        "optim/grad_norm": Mapped(
            "grad/norm", "src/prime_rl/trainer/rl/train.py train (clip_grad_norm_ in trainer/utils.py)",
            "total gradient norm returned by torch's clip_grad_norm_: before clipping",
        ),
        "entropy/all/mean": Mapped("policy/entropy", "src/prime_rl/trainer/rl/train.py train", "token mean of the trainer's entropy, gathered over ranks"),
        "optim/lr": Mapped("optim/lr", "src/prime_rl/trainer/rl/train.py train", "the learning rate"),
        "loss/mean": Mapped("loss/total", "src/prime_rl/trainer/rl/train.py train", "the loss, mean over the step's micro-batches and ranks"),
        "off_policy/mean": Mapped(
            "staleness/lag_mean", "src/prime_rl/orchestrator/orchestrator.py (episode_staleness in orchestrator/utils.py)",
            "(training_step − 1) − the policy version that started the episode, mean over the batch's episodes",
        ),
        "off_policy/max": Mapped("staleness/lag_max", "src/prime_rl/orchestrator/orchestrator.py", "the same, max over episodes"),
        "time/step": Mapped("perf/step_s", "src/prime_rl/trainer/rl/train.py train", "seconds per trainer step"),
    },
    signature=("mismatch_kl/all/mean", "entropy/all/mean", "off_policy/in_flight/mean", "time/wait_for_batch"),
    config_keys=("orchestrator", "trainer", "inference"),
    step_keys=("step",),
    not_mapped={
        "mismatch_kl/all/max": "the largest per-token k3 value, no Keel counterpart",
        "is_masked/mean": "share of tokens the DPPO trust region masks, by a probability difference, not Keel's gate/frac of the loss",
    },
)

SLIME = NameMap(
    framework="slime",
    prefix="slime",
    source="slime 0.3.1, commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (github.com/THUDM/slime)",
    entries={
        "train/grad_norm": Mapped(
            "grad/norm", "slime/backends/megatron_utils/model.py train (train_one_step)",
            "Megatron optimizer.step's grad norm: the global norm before clipping",
        ),
        "train/pg_loss": Mapped("loss/pg", "slime/backends/megatron_utils/loss.py policy_loss_function", "the policy-gradient loss"),
        "train/loss": Mapped("loss/total", "slime/backends/megatron_utils/loss.py policy_loss_function", "the whole loss"),
    },
    signature=("train/train_rollout_logprob_abs_diff", "train/pg_clipfrac", "train/ppo_kl", "rollout/step", "train/step"),
    config_keys=("rollout_batch_size", "megatron_to_hf_mode", "rollout_num_gpus"),
    step_keys=("train/step", "rollout/step", "eval/step"),
    not_mapped={
        "train/train_rollout_logprob_abs_diff": "|log π_old − log μ| averaged per sample, then over samples (sum_of_sample_mean), not Keel's token mean",
        "train/ois": "e^(−ppo_kl) per sample mean: the old-vs-current policy ratio, not the sampler's",
        "train/tis": "the sampler IS ratio averaged per sample, not a max or a KL",
        "train/tis_clipfrac": "per-sample mean of the clipped share, not gate/frac of the loss",
    },
)

SKYRL = NameMap(
    framework="skyrl",
    prefix="skyrl",
    source="skyrl 0.3.0, commit a9564572eb8e91076be43c1bd5e4615e3de17265 (github.com/NovaSky-AI/SkyRL)",
    entries={
        "policy/rollout_train_logprobs_abs_diff_mean": Mapped(
            "mismatch/log_ratio_abs_mean", "skyrl/train/trainer.py RayPPOTrainer.fwd_logprobs_values_reward",
            "token mean of |rollout log-prob − the trainer's forward-pass log-prob| over the batch's loss-mask tokens",
        ),
        "policy/loss_metrics/is_ratio_max": Mapped(
            "mismatch/ratio_max", "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py compute_off_policy_correction",
            "largest e^(log π_old − log μ) over loss tokens, before TIS truncation (ℓ capped at 20 by safe_exp_delta), max over micro-batches and ranks (reduce_metrics)",
        ),
        "policy/grad_norm": Mapped(
            "grad/norm", "skyrl/train/trainer.py _execute_training_step (strategy optimizer_step)",
            "norm before clipping, mean over the step's mini-batch updates",
        ),
        "policy/policy_loss": Mapped("loss/pg", "skyrl/backends/skyrl_train/workers/worker.py forward_backward", "the policy-gradient loss"),
        "policy/final_loss": Mapped("loss/total", "skyrl/backends/skyrl_train/workers/worker.py forward_backward", "the whole unscaled loss"),
        "policy/policy_entropy": Mapped("policy/entropy", "skyrl/backends/skyrl_train/workers/worker.py forward_backward", "token mean of the policy's entropy"),
        "policy/policy_lr": Mapped("optim/lr", "skyrl/backends/skyrl_train/workers/worker.py forward_backward", "the learning rate"),
        "reward/avg_raw_reward": Mapped("reward/mean", "skyrl/train/trainer.py (overall_metrics avg_score)", "mean raw reward of the step's trajectories"),
    },
    signature=("policy/rollout_train_logprobs_abs_diff_mean", "policy/policy_loss", "policy/final_loss", "reward/avg_raw_reward"),
    config_keys=("trainer", "generator", "environment"),
    not_mapped={
        "policy/loss_metrics/is_ratio_min": "the min of is_ratio × loss_mask: padding contributes 0, so it is not the smallest ratio",
        "policy/loss_metrics/is_ratio_mean": "mean of per-sequence means, not a token mean",
    },
)

AREAL = NameMap(
    framework="areal",
    prefix="areal",
    source="AReaL 1.0.4, commit 4aef98d8d818af55b43621aaadba047ae10f4e77 (github.com/inclusionAI/AReaL)",
    entries={
        "ppo_actor/task_reward/avg": Mapped("reward/mean", "areal/trainer/ppo/actor.py PPOActor.compute_advantages", "mean task reward over the batch's sequences"),
        "ppo_actor/update/grad_norm": Mapped(
            "grad/norm", "areal/engine/fsdp_engine.py optimizer_step (fsdp2_clip_grad_norm)",
            "norm before clipping, mean over the step's mini-batch updates",
        ),
        "ppo_actor/update/actor_loss/avg": Mapped("loss/pg", "areal/trainer/ppo/actor.py grpo_loss_fn", "the PPO loss, token mean"),
        "ppo_actor/update/entropy/avg": Mapped("policy/entropy", "areal/trainer/ppo/actor.py grpo_loss_fn", "token mean of the policy's entropy"),
        "ppo_actor/update/lr": Mapped("optim/lr", "areal/engine/fsdp_engine.py optimizer_step", "the learning rate"),
    },
    signature=("ppo_actor/task_reward/avg", "ppo_actor/update/behave_approx_kl/avg", "ppo_actor/update/actor_loss/avg"),
    config_keys=("actor", "rollout", "gconfig"),
    not_mapped={
        "ppo_actor/update/behave_approx_kl/avg": "k1 of proximal vs behaviour log-probs over the tokens left after rejection sampling only",
        "ppo_actor/update/behave_imp_weight/max": "after AReaL's clamp or mask",
        "ppo_actor/update/version_stats/sample_staleness_theta_avg": "a token mean (Keel's staleness is per sequence)",
    },
)

NEMO_RL = NameMap(
    framework="nemo-rl",
    prefix="nemo-rl",
    source="NeMo-RL 0.6.0, commit 7ea279abfbeb698b092856d0dab61e7cf39bc909 (github.com/NVIDIA-NeMo/RL)",
    entries={
        "train/gen_kl_error": Mapped(
            "mismatch/kl", "nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn.__call__ (calculate_kl in algorithms/utils.py)",
            "calculate_kl(generation log-probs, prev log-probs) with reference_policy_kl_type k3 (the default): e^ℓ − ℓ − 1, "
            "ℓ = log π_prev − log μ, token mean over the step's valid tokens (global_valid_toks); with k1 or k2 configured it is not Keel's number",
        ),
        "train/reward": Mapped("reward/mean", "nemo_rl/algorithms/grpo.py grpo_train", "mean reward of the step's samples"),
        "train/loss": Mapped("loss/total", "nemo_rl/algorithms/grpo.py grpo_train", "the loss, summed over the step's global batches (one by default)"),
    },
    signature=("train/gen_kl_error", "train/token_mult_prob_error", "train/sampling_importance_ratio"),
    config_keys=("grpo", "policy", "loss_fn", "cluster"),
    not_mapped={
        "train/token_mult_prob_error": "token mean of e^|ℓ|, no Keel counterpart",
        "train/sampling_importance_ratio": "mean of the ratio, not its max",
        "train/grad_norm": "summed over the step's optimizer updates by grpo_train",
    },
)

MAPS: dict[str, NameMap] = {m.framework: m for m in (VERL, TRL, OPENRLHF, PRIME_RL, AREAL, SLIME, SKYRL, NEMO_RL)}
FRAMEWORKS = tuple(MAPS)
"""The frameworks `--framework` takes (besides `auto` and `none`)."""


def detect_framework(names: Iterable[str], config: Mapping[str, object] | None = None) -> tuple[str | None, str]:
    """(framework or None, why): the framework whose signature names a run logs most of, the
    config's top-level keys breaking ties. A signature entry ending in `/` matches a prefix."""
    logged = set(names)
    scores: dict[str, int] = {}
    for framework, name_map in MAPS.items():
        hits = sum(
            any(name.startswith(mark) for name in logged) if mark.endswith("/") else mark in logged
            for mark in name_map.signature
        )
        if hits:
            scores[framework] = hits * 10
    keys = set(config or {})
    for framework, name_map in MAPS.items():
        if framework in scores and name_map.config_keys:
            scores[framework] += sum(key in keys for key in name_map.config_keys)
    if not scores:
        return None, "no framework's names among the logged ones"
    best = max(scores.values())
    winners = sorted(f for f, score in scores.items() if score == best)
    if len(winners) > 1:
        return None, f"names of several frameworks ({', '.join(winners)})"
    framework = winners[0]
    marks = [m for m in MAPS[framework].signature if m in logged or (m.endswith("/") and any(n.startswith(m) for n in logged))]
    return framework, f"it logs {', '.join(marks[:3])}"


def _check() -> None:  # every entry documented; Keel names unique within a map
    for name_map in MAPS.values():
        targets = [entry.keel for entry in name_map.entries.values()]
        assert len(set(targets)) == len(targets), name_map.framework
        assert all(entry.where and entry.means for entry in name_map.entries.values())


_check()
