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

A name an older release logged for what an entry's name holds now is an alias
(`NameMap.aliases`, citing the release that logged it): `keel import` and `keel watch` store an
old run's number under the entry's Keel name. Where a run logs the alias beside its current
name (verl 0.9.1 still logs `actor/entropy_loss` beside `actor/entropy` when its update
computes the entropy), the current name's number is the one stored under the Keel name and the
old name stays under the framework's prefix (`keel_name(name, beside=...)`), so one run never
puts two of its numbers under one Keel name. The native integrations, which run the pinned
release, use the entries only (`to_keel(native=True)`).

Names are as the framework hands them to its loggers, which is what wandb and TensorBoard
store: TRL's go through transformers' `rewrite_logs` (`train/` + the name, `eval_x` as
`eval/x`), so its map lists them with `train/` (`log_prefix`); the native TRL callback, which
sees them before the rewrite, looks them up without it, and so does a run whose names were
taken before it (a Trainer's `trainer_state.json` `log_history`, the dicts it prints): a
name that is not an entry is looked up again with `log_prefix` before it, and a signature
name matches without it too.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["FRAMEWORKS", "MAPS", "Alias", "Mapped", "NameMap", "detect_framework"]


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
class Alias:
    current: str
    """The entry (the name at `NameMap.source`) the old name holds the number of."""
    where: str
    """The releases that logged the old name, and its file and function there."""


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
    aliases: Mapping[str, Alias] = field(default_factory=dict)
    """{old name: Alias}: what older releases logged under another name, mapped as the entry
    `Alias.current` (module docstring)."""

    def logged(self, name: str) -> str:
        """`name` as the map lists it: with `log_prefix` before it where only that is listed
        (TRL's `entropy`, logged before transformers' rewrite, is its `train/entropy`)."""
        if not self.log_prefix or name.startswith(self.log_prefix) or name in self.entries or name in self.aliases:
            return name
        prefixed = self.log_prefix + name
        return prefixed if prefixed in self.entries or prefixed in self.aliases else name

    def entry(self, name: str) -> Mapped | None:
        """The entry a logged `name` is, directly or through an alias."""
        name = self.logged(name)
        alias = self.aliases.get(name)
        return self.entries.get(alias.current if alias is not None else name)

    def to_keel(self, *, native: bool = False) -> dict[str, str]:
        """{framework name: Keel name}, aliases included; `native`: as the framework's own
        callback sees the names of the pinned release (without `log_prefix`, without the
        logs-only entries, and without aliases: that release logs the current names)."""
        out: dict[str, str] = {}
        for name in (*self.entries, *([] if native else self.aliases)):
            entry = self.entry(name)
            assert entry is not None, name  # _check
            if not native:
                out[name] = entry.keel
            elif not entry.logs_only:
                out[name.removeprefix(self.log_prefix)] = entry.keel
        return out

    def keel_name(self, name: str, beside: Container[str] = ()) -> str:
        """The Keel name a logged `name` is stored under; `beside`: the names logged with it
        (an alias logged beside its current name keeps the framework's prefix)."""
        alias = self.aliases.get(self.logged(name))
        entry = None if alias is not None and (alias.current in beside or alias.current.removeprefix(self.log_prefix) in beside) else self.entry(name)
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
        "rollout_corr/rollout_rs_masked_fraction": Mapped(
            "gate/frac", "verl/trainer/ppo/rollout_corr_helper.py compute_rollout_rejection_mask",
            "token mean over the batch's response tokens of 1 − the rejection sampling's keep mask (a sequence or "
            "geometric rejection masks every token of its sequence): the share of the tokens the loss is not trained on",
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
        "actor/loss": Mapped(
            "loss/total",
            "verl/workers/engine_workers.py TrainingWorker._postprocess_output (`actor/` by trainer/ppo/v1/trainer_base.py _update_actor)",
            "the whole actor loss (pg − entropy_coeff·entropy + kl_loss_coef·KL), summed over a mini-batch's "
            "micro-batches (each normalized by the global batch), averaged over DP ranks, mean over the step's mini-batch updates",
        ),
        "actor/pg_clipfrac": Mapped(
            "policy/clip_frac",
            "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla (Metric MEAN in workers/utils/losses.py ppo_loss)",
            "share of a micro-batch's response tokens where PPO's clip binds (−A·clip(r) > −A·r, r = π/π_old), mean over "
            "micro-batches, ranks and mini-batch updates; policy_loss.loss_mode vanilla (the default): other loss modes log their own share",
        ),
        "actor/ppo_kl": Mapped(
            "policy/ppo_kl",
            "verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla (Metric MEAN in workers/utils/losses.py ppo_loss)",
            "token mean of log π_old − log π (clamped to ±20) over a micro-batch's response tokens, mean over micro-batches, "
            "ranks and mini-batch updates: k1 of KL(π_old‖π)",
        ),
        "response_length/mean": Mapped(
            "response/length_mean", "verl/trainer/ppo/metric_utils.py compute_data_metrics",
            "mean response length in tokens over the step's samples (aborted ones count as 0; multi-turn tool tokens count)",
        ),
        "response_length/max": Mapped(
            "response/length_max", "verl/trainer/ppo/metric_utils.py compute_data_metrics", "the step's longest response, in tokens"
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
        "response_length/clip_ratio": "share of the responses as long as the padded width: in the V1 trainer "
        "(trainer.use_v1, the default) that is the batch's longest response (trainer_base._compute_metrics pads to it), "
        "so it is at least 1/N whether or not a response hit the cap; only the legacy trainer pads to the configured response_length",
        "actor/pg_clipfrac_lower": "dual-clip's share (A < 0 tokens capped at clip_ratio_c), not PPO's clipped share",
    },
    aliases={
        "actor/entropy_loss": Alias(
            "actor/entropy",
            "verl 0.2–0.3 verl/workers/actor/dp_actor.py DataParallelPPOActor.update_policy, 0.4.0 "
            "verl/trainer/ppo/ray_trainer.py RayPPOTrainer.fit (the old-log-prob pass): agg_loss of the token "
            "entropies under loss_agg_mode, the only entropy those releases log; 0.9.1 logs it beside "
            "actor/entropy (the update's own, workers/utils/losses.py ppo_loss), which then wins",
        ),
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
        "train/policy_loss": Mapped(
            "loss/pg", "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss",
            "the policy loss before the entropy bonus, nanmean over processes, mean over the logging window's micro-batches; "
            "logged only with the entropy bonus on (entropy_coef ≠ 0 or adaptive entropy); holds β·KL when beta > 0 (default 0)",
        ),
        "train/clip_ratio/region_mean": Mapped(
            "policy/clip_frac", "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss",
            "share of the loss tokens where PPO's clip binds (r < 1 − ε_low with A < 0, or r > 1 + ε_high with A > 0; "
            "r = π/π_old), summed and counted over processes (global_masked_mean), mean over the logging window's micro-batches; "
            "loss_type grpo, bnpo, dr_grpo, dapo or luspo (importance_sampling_level sequence: a share of sequences)",
        ),
        "train/completions/mean_length": Mapped(
            "response/length_mean", "trl/trainer/grpo_trainer.py GRPOTrainer._generate",
            "mean completion length in tokens over the generation batch, gathered over processes (with a tool or env mask, the "
            "model's tokens only), mean over the logging window's generation batches",
        ),
        "train/completions/max_length": Mapped(
            "response/length_max", "trl/trainer/grpo_trainer.py GRPOTrainer._generate",
            "the generation batch's longest completion, gathered over processes; a log covering several generation batches "
            "holds the mean of their maxima",
        ),
        "train/completions/clipped_ratio": Mapped(
            "response/truncated_frac", "trl/trainer/grpo_trainer.py GRPOTrainer._generate",
            "share of the generation batch's completions whose last token is neither EOS nor pad (cut at "
            "max_completion_length, or stopped by anything but EOS), gathered over processes, mean over the logging window's generation batches",
        ),
        "train/frac_reward_zero_std": Mapped(
            "reward/zero_std_frac", "trl/trainer/grpo_trainer.py GRPOTrainer._generate_and_score_completions",
            "share of the completions (groups are equal-sized: of the prompt groups) whose group's rewards have zero std "
            "(torch.isclose), over all processes' completions, with scale_rewards group or none and multi_objective_aggregation "
            "sum_then_normalize (the defaults); with scale_rewards batch or normalize_then_sum it says whether the whole "
            "batch's std is 0 (0 or 1) and is not Keel's number",
        ),
        "train/sampling/sampling_logp_difference/mean": Mapped(
            "mismatch/log_ratio_abs_mean", "trl/trainer/grpo_trainer.py GRPOTrainer._generate_and_score_completions",
            "token mean of |log π_old − log μ| over one process's completion tokens (μ: vLLM's log-probs, NaN ones left out; "
            "π_old: the trainer's recomputation with the weights that generated), then the mean of the processes' means: Keel's "
            "token mean on one process, each process weighted alike on several; with use_vllm and "
            "vllm_importance_sampling_correction (default on); mean over the logging window's generation batches",
            logs_only=True,
        ),
    },
    signature=("train/sampling/sampling_logp_difference/mean", "train/completions/mean_length", "train/rewards/", "train/reward_std", "train/frac_reward_zero_std"),
    config_keys=("num_generations", "beta", "loss_type"),
    step_keys=("train/global_step",),
    log_prefix="train/",
    not_mapped={
        "train/sampling/sampling_logp_difference/max": "the largest |ℓ|, either way: not the largest ratio",
        "train/sampling/importance_sampling_ratio/max": "after TRL's vLLM IS truncation or masking, not the raw ratio",
        "train/reward_std": "sample std (nanstd), Keel's reward/std is the population std",
        "train/clip_ratio": "TRL 0.16's share of the tokens whose unclipped term was the smaller one (v0.16.0 "
        "GRPOTrainer.compute_loss), not PPO's clipped share; in later releases only the Liger loss's",
    },
    aliases={
        "train/completion_length": Alias(
            "train/completions/mean_length",
            "TRL 0.14.0–0.15.x trl/trainer/grpo_trainer.py GRPOTrainer.compute_loss, 0.16.x "
            "GRPOTrainer._generate_and_score_completions: mean of completion_mask.sum(1) gathered over processes",
        ),
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
        "ppo_clip_ratio": Mapped(
            "policy/clip_frac",
            "openrlhf/models/loss.py PolicyLoss.forward (experience.info in trainer/ray/ppo_actor.py training_step, merged in ppo_train)",
            "share of the action tokens where PPO's clip binds (surr2 < surr1, r = π/π_old): a micro-batch's token mean, "
            "token-weighted over micro-batches and ranks, so the step's token mean; policy_loss_type ppo (the default), "
            "gspo's ratio is one per sequence",
        ),
        "ppo_kl": Mapped(
            "policy/ppo_kl",
            "openrlhf/models/loss.py PolicyLoss.forward (experience.info in trainer/ray/ppo_actor.py training_step, merged in ppo_train)",
            "token mean of log π_old − log π (unclamped) over the step's action tokens, token-weighted over micro-batches and "
            "ranks: k1 of KL(π_old‖π)",
        ),
        "rollout/response_length_mean": Mapped(
            "response/length_mean",
            "openrlhf/trainer/ppo_trainer.py BasePPOTrainer._compute_rollout_stats (response_length in "
            "trainer/ppo_utils/samples_generator.py SamplesGenerator._process_response_into_experience)",
            "mean over the step's samples of the span from the first to the last generated token (multi-turn: the observation "
            "tokens between turns count), before dynamic batching",
        ),
        "rollout/truncated_rate": Mapped(
            "response/truncated_frac",
            "openrlhf/trainer/ppo_trainer.py BasePPOTrainer._compute_rollout_stats (truncated in openrlhf/utils/agent.py)",
            "share of the step's samples whose last generation ended with vLLM finish_reason length, before dynamic batching",
        ),
        "timing/step_total": Mapped("perf/step_s", "openrlhf/trainer/ppo_trainer.py", "seconds per step"),
    },
    signature=("vllm_kl", "actor_grad_norm", "rollout/reward_mean", "timing/step_total", "is_filter_ratio"),
    config_keys=("actor_num_nodes", "vllm_num_engines"),
    not_mapped={
        "rollout/reward_std": "sample std; Keel's reward/std is the population's",
        "entropy_loss": "a micro-batch's entropy sum × gas × DP size ÷ the optimizer step's token count (models/loss.py "
        "aggregate_loss), then token-weighted in ppo_train: the token mean only when every micro-batch holds as many tokens",
    },
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
        "train/agg/effective/num_output_tokens/mean": Mapped(
            "response/length_mean",
            "src/prime_rl/orchestrator/orchestrator.py (EpisodeMetrics.to_wandb in orchestrator/metrics.py; "
            "vf.Trace.num_output_tokens in verifiers a60a606, verifiers/v1/trace.py)",
            "mean over the step's shipped (effective) episodes of the tokens the model generated, all turns, summed over an "
            "episode's traces and branches: a sample's completion length when an episode is one trace with one branch",
        ),
        "train/agg/effective/num_output_tokens/max": Mapped(
            "response/length_max", "src/prime_rl/orchestrator/orchestrator.py (EpisodeMetrics.to_wandb in orchestrator/metrics.py)",
            "the same, the largest over the shipped episodes",
        ),
    },
    signature=("mismatch_kl/all/mean", "entropy/all/mean", "off_policy/in_flight/mean", "time/wait_for_batch"),
    config_keys=("orchestrator", "trainer", "inference"),
    step_keys=("step",),
    not_mapped={
        "mismatch_kl/all/max": "the largest per-token k3 value, no Keel counterpart",
        "is_masked/mean": "share of tokens the DPPO trust region masks, by a probability difference, not Keel's gate/frac of the loss",
        "train/agg/effective/<agent>/reward/mean": "the mean reward, and is_truncated/mean the truncated share, are logged per "
        "agent (TraceMetrics.to_dict under the agent's name, which the run's data decides): no fixed name to map",
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
        "train/train_rollout_logprob_abs_diff": Mapped(
            "mismatch/log_ratio_abs_seq_mean",
            "slime/backends/megatron_utils/loss.py policy_loss_function (get_sum_of_sample_mean in cp_utils.py; "
            "observability/train_metric_utils.py reduce_train_step_metrics)",
            "|log π_old − log μ| (π_old: the trainer's recomputation; with --use-rollout-logprobs, the current log π) averaged "
            "over each sample's loss tokens, summed and divided by the step's rollout count: the mean over sequences of the "
            "per-sequence token mean when each sample is its own rollout (no rollout_id, the default); samples sharing a "
            "rollout_id are pooled into one token mean per rollout; with --calculate-per-token-loss it is the token mean "
            "(Keel's mismatch/log_ratio_abs_mean), not this",
        ),
        "train/pg_clipfrac": Mapped(
            "policy/clip_frac",
            "slime/utils/ppo_utils.py compute_policy_loss (reduced in backends/megatron_utils/loss.py policy_loss_function)",
            "share of a sample's loss tokens where PPO's clip binds (−A·clip(r) > −A·r, r = π/π_old; π_old is μ with "
            "--use-rollout-logprobs), mean over the step's samples (the token share with --calculate-per-token-loss); "
            "cispo logs its own clipped share",
        ),
        "train/ppo_kl": Mapped(
            "policy/ppo_kl", "slime/backends/megatron_utils/loss.py policy_loss_function",
            "log π_old − log π averaged over each sample's loss tokens, then over the step's samples (the token mean with "
            "--calculate-per-token-loss): k1 of KL(π_old‖π); gspo: the sequence-level KL",
        ),
        "train/entropy_loss": Mapped(
            "policy/entropy", "slime/backends/megatron_utils/loss.py policy_loss_function",
            "the trainer's entropy averaged over each sample's loss tokens, then over the step's samples (the token mean with "
            "--calculate-per-token-loss)",
        ),
        "rollout/raw_reward": Mapped(
            "reward/mean",
            "slime/observability/train_metric_utils.py log_rollout_data (raw_reward from slime/ray/rollout.py "
            "RolloutManager._convert_samples_to_train_data)",
            "mean raw reward (sample.get_reward_value, or metadata raw_reward) of the rollout batch, before group "
            "normalization: each DP rank holds the whole batch's list, reduced as Σ sum / Σ count",
        ),
        "rollout/response_len/mean": Mapped(
            "response/length_mean",
            "slime/observability/rollout_metrics.py compute_metrics_from_samples (`rollout/` by log_rollout_data)",
            "mean effective_response_length (the loss-mask sum: generated tokens, tool tokens left out) over the rollout's samples",
        ),
        "rollout/response_len/max": Mapped(
            "response/length_max",
            "slime/observability/rollout_metrics.py compute_metrics_from_samples (`rollout/` by log_rollout_data)",
            "the rollout's largest effective_response_length",
        ),
        "rollout/truncated_ratio": Mapped(
            "response/truncated_frac",
            "slime/observability/rollout_metrics.py compute_metrics_from_samples (`rollout/` by log_rollout_data)",
            "share of the rollout's samples with status TRUNCATED (SGLang finish_reason length, or no new tokens left)",
        ),
    },
    signature=("train/train_rollout_logprob_abs_diff", "train/pg_clipfrac", "train/ppo_kl", "rollout/step", "train/step"),
    config_keys=("rollout_batch_size", "megatron_to_hf_mode", "rollout_num_gpus"),
    step_keys=("train/step", "rollout/step", "eval/step"),
    not_mapped={
        "rollout/response_lengths": "the same rollout's mean response length again, from the trainer's side "
        "(train_metric_utils.log_rollout_data), with tool tokens: rollout/response_len/mean is the one mapped",
        "rollout/truncated": "the same share as rollout/truncated_ratio, from the trainer's side",
        "rollout/zero_std/count_<reward>": "a count of the prompt groups whose rewards all equal <reward>, not a share",
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
        "policy/loss_metrics/clip_ratio": Mapped(
            "policy/clip_frac",
            "skyrl/backends/skyrl_train/utils/ppo_utils.py ppo_policy_loss (`loss_metrics/` by workers/worker.py "
            "_forward_backward_micro, reduce_metrics in workers/worker_utils.py)",
            "share of a micro-batch's loss tokens where PPO's clip binds (−A·clip(r) > −A·r, r = π/π_old), mean over "
            "micro-batches, ranks and mini-batch updates; policy_loss_type regular (the default) or dual_clip: other loss "
            "types log their own share under this name",
        ),
        "policy/loss_metrics/cispo/ratio_max": Mapped(
            "policy/ratio_max",
            "skyrl/backends/skyrl_train/utils/ppo_utils.py compute_policy_loss_cispo (max over micro-batches by reduce_metrics)",
            "largest π/π_old over the loss tokens before CISPO's clamp (ℓ capped at 20 by safe_exp_delta), max over "
            "micro-batches, ranks and updates; only with policy_loss_type cispo and cispo_anchor old (the default): with "
            "anchor rollout it is π/μ",
        ),
        "generate/avg_num_tokens": Mapped(
            "response/length_mean",
            "skyrl/train/generators/utils.py get_rollout_metrics (into the step's metrics by trainer.py RayPPOTrainer.generate)",
            "mean response length in tokens over the step's trajectories (multi-turn: observation tokens count; "
            "generate/avg_assistant_tokens leaves them out)",
        ),
        "generate/max_num_tokens": Mapped(
            "response/length_max", "skyrl/train/generators/utils.py get_rollout_metrics", "the step's longest response, in tokens"
        ),
    },
    signature=("policy/rollout_train_logprobs_abs_diff_mean", "policy/policy_loss", "policy/final_loss", "reward/avg_raw_reward"),
    config_keys=("trainer", "generator", "environment"),
    not_mapped={
        "policy/loss_metrics/is_ratio_min": "the min of is_ratio × loss_mask: padding contributes 0, so it is not the smallest ratio",
        "policy/loss_metrics/is_ratio_mean": "mean of per-sequence means, not a token mean",
        "reward/num_zero_variance_filtered": "a count of the prompt groups zero_variance_filter dropped, not a share",
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
        "ppo_actor/update/clip_ratio/avg": Mapped(
            "policy/clip_frac",
            "areal/trainer/ppo/actor.py grpo_loss_fn (clip_mask of ppo_actor_loss_fn in areal/utils/functional/functional.py)",
            "share of the step's valid loss tokens where PPO's clip binds (−A·r < −A·clip(r), r = π/π_prox), summed and "
            "counted over micro-batches and ranks (stats_tracker); π_prox: the recomputed log-probs, or the inference "
            "engine's without recomputation; 0 with use_sapo_loss",
        ),
        "ppo_actor/update/importance_weight/max": Mapped(
            "policy/ratio_max",
            "areal/trainer/ppo/actor.py grpo_loss_fn (importance_weight of ppo_actor_loss_fn in areal/utils/functional/functional.py)",
            "largest π/π_prox over the step's valid loss tokens, max over micro-batches and ranks; "
            "importance_sampling_level sequence: the largest sequence ratio",
        ),
    },
    signature=("ppo_actor/task_reward/avg", "ppo_actor/update/behave_approx_kl/avg", "ppo_actor/update/actor_loss/avg"),
    config_keys=("actor", "rollout", "gconfig"),
    not_mapped={
        "ppo_actor/update/behave_approx_kl/avg": "k1 of proximal vs behaviour log-probs over the tokens left after rejection sampling only",
        "ppo_actor/update/behave_imp_weight/max": "after AReaL's clamp or mask",
        "ppo_actor/update/version_stats/sample_staleness_theta_avg": "a token mean (Keel's staleness is per sequence)",
        "ppo_actor/update/approx_kl/avg": "token mean of log π − log π_prox: the negative of policy/ppo_kl (log π_old − log π)",
        "ppo_actor/no_eos_ratios/avg": "share of the sequences as long as the batch's padded width, the longest sequence "
        "(concat_padded_tensors pads to it), not of those cut at the length cap",
        "ppo_actor/seq_len/avg": "prompt and response tokens together, not the response length",
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
        "train/mean_gen_tokens_per_sample": Mapped(
            "response/length_mean",
            "nemo_rl/experience/rollouts.py run_multi_turn_rollout (logged by nemo_rl/algorithms/grpo.py grpo_train, prefix train)",
            "mean over the step's samples of the tokens the policy generated, all turns (environment tokens left out)",
        ),
        "train/max_gen_tokens_per_sample": Mapped(
            "response/length_max", "nemo_rl/experience/rollouts.py run_multi_turn_rollout",
            "the step's largest count of generated tokens per sample",
        ),
        "train/truncation_rate": Mapped(
            "response/truncated_frac", "nemo_rl/experience/rollouts.py run_multi_turn_rollout",
            "share of the step's samples truncated: a generation that hit max_tokens without a stop token, or an environment "
            "observation that would overflow max_total_sequence_length",
        ),
        "train/probs_ratio_max": Mapped(
            "policy/ratio_max",
            "nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn.__call__ (max over micro-batches in grpo.py grpo_train)",
            "largest π/π_prev (e^(curr − prev log-prob), before the clamp) over the valid tokens; sequence_level_importance_ratios: "
            "the largest sequence ratio; force_on_policy_ratio: 1; with disable_ppo_ratio it is a log-prob, not a ratio",
        ),
    },
    signature=("train/gen_kl_error", "train/token_mult_prob_error", "train/sampling_importance_ratio"),
    config_keys=("grpo", "policy", "loss_fn", "cluster"),
    not_mapped={
        "train/token_mult_prob_error": "token mean of e^|ℓ|, no Keel counterpart",
        "train/sampling_importance_ratio": "mean of the ratio, not its max",
        "train/grad_norm": "summed over the step's optimizer updates by grpo_train",
        "train/approx_entropy": "token mean of −(π/μ)·log π over the sampled tokens: an importance-sampled estimate, not the exact entropy",
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
        hits = len(_signature_logged(name_map, logged))
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
    return framework, f"it logs {', '.join(_signature_logged(MAPS[framework], logged)[:3])}"


def _signature_logged(name_map: NameMap, logged: set[str]) -> list[str]:
    """The signature names of `name_map` a run that logs `logged` logs, as it logs them (with
    the map's `log_prefix` or without it); a signature name ending in `/` is a prefix."""
    found = []
    for mark in name_map.signature:
        for form in dict.fromkeys((mark, mark.removeprefix(name_map.log_prefix))):
            if any(name.startswith(form) for name in logged) if form.endswith("/") else form in logged:
                found.append(form)
                break
    return found


def _check() -> None:
    """Every entry and alias documented; within a map, each Keel name is one logged name's
    (aliases aside: an old name of an entry, never itself an entry, nor an alias of an alias);
    no name both mapped and listed as not mapped."""
    for name_map in MAPS.values():
        framework = name_map.framework
        targets = [entry.keel for entry in name_map.entries.values()]
        assert len(set(targets)) == len(targets), framework
        assert all(entry.where and entry.means for entry in name_map.entries.values()), framework
        for old, alias in name_map.aliases.items():
            assert old not in name_map.entries and alias.current in name_map.entries, (framework, old)
            assert alias.where, (framework, old)
        mapped = set(name_map.entries) | set(name_map.aliases)
        assert not mapped & set(name_map.not_mapped), (framework, mapped & set(name_map.not_mapped))


_check()
