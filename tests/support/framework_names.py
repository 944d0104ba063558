"""Metric names as each framework logs them, copied verbatim from its source with the line
they come from (file:line at the version or commit of trainer_hooks/integrations/names.py),
and how the logged name is put together where the line holds only part of it.

verl and TRL are installed here: their lines are checked against the installed packages.
`OLD` holds the names older releases logged that the maps take as aliases (`NameMap.aliases`)."""

from __future__ import annotations

# framework -> [(logged name, "file:line", the source line verbatim, how the name is composed)]
LOGGED: dict[str, list[tuple[str, str, str, str]]] = {
    "verl": [
        ("rollout_corr/k3_kl", "verl/trainer/ppo/rollout_corr_helper.py:966", 'metrics["k3_kl"] = verl_F.masked_mean(k3_kl_matrix, response_mask).detach().item()', 'prefixed "rollout_corr/" at :892'),
        ("rollout_corr/kl", "verl/trainer/ppo/rollout_corr_helper.py:959", 'metrics["kl"] = verl_F.masked_mean(rollout_log_prob - old_log_prob, response_mask).detach().item()', 'prefixed "rollout_corr/"'),
        ("rollout_corr/rollout_rs_masked_fraction", "verl/trainer/ppo/rollout_corr_helper.py:407", 'metrics["rollout_rs_masked_fraction"] = verl_F.masked_mean(1 - final_mask, response_mask).item()', 'prefixed "rollout_corr/" at :892'),
        ("critic/score/mean", "verl/trainer/ppo/metric_utils.py:556", '"critic/score/mean": score_mean,', ""),
        ("actor/pg_loss", "verl/workers/utils/losses.py:119", 'metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)', ""),
        ("actor/entropy", "verl/trainer/ppo/v1/trainer_base.py:1684", '"actor/entropy": entropy_agg.detach().item(),', ""),
        ("training/off_policy/trajectory_staleness/mean", "verl/trainer/ppo/v1/trainer_base.py:1986", '"training/off_policy/trajectory_staleness/mean": trajectory_staleness.mean(),', ""),
        ("training/off_policy/trajectory_staleness/max", "verl/trainer/ppo/v1/trainer_base.py:1987", '"training/off_policy/trajectory_staleness/max": trajectory_staleness.max(),', ""),
        ("actor/loss", "verl/workers/engine_workers.py:212", 'final_metrics["loss"] = loss', 'prefixed "actor/" by trainer/ppo/v1/trainer_base.py:1861 (rename_dict)'),
        ("actor/pg_clipfrac", "verl/trainer/ppo/core_algos.py:1372", '"actor/pg_clipfrac": pg_clipfrac.detach().item(),', "compute_policy_loss_vanilla"),
        ("actor/ppo_kl", "verl/trainer/ppo/core_algos.py:1373", '"actor/ppo_kl": ppo_kl.detach().item(),', "compute_policy_loss_vanilla"),
        ("response_length/mean", "verl/trainer/ppo/metric_utils.py:573", '"response_length/mean": torch.mean(response_length).detach().item(),', ""),
        ("response_length/max", "verl/trainer/ppo/metric_utils.py:574", '"response_length/max": torch.max(response_length).detach().item(),', ""),
        ("response_length/clip_ratio", "verl/trainer/ppo/metric_utils.py:576", '"response_length/clip_ratio": torch.mean(torch.eq(response_length, max_response_length).float())', "not mapped"),
        ("actor/entropy_loss", "verl/workers/utils/losses.py:129", 'metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=metric_aggregation)', "not mapped"),
    ],
    "trl": [
        ("train/reward", "trl/trainer/grpo_trainer.py:2828", 'self._metrics[mode]["reward"].append(torch.nanmean(rewards).item())', '"train/" by transformers rewrite_logs'),
        ("train/reward_std", "trl/trainer/grpo_trainer.py:2829", 'self._metrics[mode]["reward_std"].append(nanstd(rewards).item())', '"train/" by rewrite_logs'),
        ("train/sampling/sampling_logp_difference/mean", "trl/trainer/grpo_trainer.py:2868", 'self._metrics[mode]["sampling/sampling_logp_difference/mean"].append(', '"train/" by rewrite_logs'),
        ("train/sampling/importance_sampling_ratio/max", "trl/trainer/grpo_trainer.py:2894", 'self._metrics[mode]["sampling/importance_sampling_ratio/max"].append(', '"train/" by rewrite_logs'),
        ("train/kl", "trl/trainer/grpo_trainer.py:3268", 'self._metrics[mode]["kl"].append(global_masked_mean(per_token_kl))', '"train/" by rewrite_logs'),
        ("train/completions/mean_length", "trl/trainer/grpo_trainer.py:2296", 'self._metrics[mode]["completions/mean_length"].append(agg_completion_lengths.float().mean().item())', '"train/" by rewrite_logs'),
        ("train/completions/max_length", "trl/trainer/grpo_trainer.py:2298", 'self._metrics[mode]["completions/max_length"].append(agg_completion_lengths.float().max().item())', '"train/" by rewrite_logs'),
        ("train/completions/clipped_ratio", "trl/trainer/grpo_trainer.py:2304", 'self._metrics[mode]["completions/clipped_ratio"].append(agg_is_truncated.float().mean().item())', '"train/" by rewrite_logs'),
        ("train/frac_reward_zero_std", "trl/trainer/grpo_trainer.py:2830", 'self._metrics[mode]["frac_reward_zero_std"].append(is_std_zero.float().mean().item())', '"train/" by rewrite_logs'),
        ("train/policy_loss", "trl/trainer/grpo_trainer.py:3213", 'self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())', '"train/" by rewrite_logs'),
        ("train/clip_ratio/region_mean", "trl/trainer/grpo_trainer.py:3279", 'self._metrics[mode]["clip_ratio/region_mean"].append(global_masked_mean(is_region_clipped.float()))', '"train/" by rewrite_logs'),
        ("train/sampling/sampling_logp_difference/max", "trl/trainer/grpo_trainer.py:2871", 'self._metrics[mode]["sampling/sampling_logp_difference/max"].append(', '"train/" by rewrite_logs'),
        ("train/global_step", "transformers/integrations/integration_utils.py:900", 'self._wandb.log({**non_scalar_logs, "train/global_step": state.global_step})', "the step column"),
    ],
    "prime-rl": [
        ("mismatch_kl/all/mean", "src/prime_rl/trainer/rl/train.py:512", 'tensors["mismatch_kl/all"].append(mismatch_kl)', '"/mean" by Tensors.compute_stats (trainer/utils.py:269)'),
        ("entropy/all/mean", "src/prime_rl/trainer/rl/train.py:484", 'tensors["entropy/all"].append(entropy)', '"/mean" by Tensors.compute_stats'),
        ("optim/grad_norm", "src/prime_rl/trainer/rl/train.py:666", 'optim_metrics["optim/grad_norm"] = grad_norm.item()', ""),
        ("optim/lr", "src/prime_rl/trainer/rl/train.py:662", '"optim/lr": current_lr,', ""),
        ("time/step", "src/prime_rl/trainer/rl/train.py:680", '"time/step": step_time,', ""),
        ("off_policy/mean", "src/prime_rl/orchestrator/orchestrator.py:735", '"off_policy/mean": sum(totals) / len(totals),', ""),
        ("off_policy/max", "src/prime_rl/orchestrator/orchestrator.py:736", '"off_policy/max": float(max(totals)),', ""),
        ("off_policy/in_flight/mean", "src/prime_rl/orchestrator/orchestrator.py:737", '"off_policy/in_flight/mean": sum(in_flight) / len(in_flight),', ""),
        ("train/agg/effective/num_output_tokens/mean", "src/prime_rl/orchestrator/metrics.py:329", 'for name in ("num_total_tokens", "num_input_tokens", "num_output_tokens", "num_turns", "num_branches"):', 'EpisodeMetrics.to_wandb: prefix "train/agg" (orchestrator.py:700) + "/effective" (metrics.py:327), "/mean" by Stat.to_dict (:83)'),
        ("train/agg/effective/num_output_tokens/max", "src/prime_rl/orchestrator/metrics.py:329", 'for name in ("num_total_tokens", "num_input_tokens", "num_output_tokens", "num_turns", "num_branches"):', 'the same, "/max" by Stat.to_dict (:84)'),
    ],
    "slime": [
        ("train/grad_norm", "slime/backends/megatron_utils/model.py:886", 'log_dict[f"train/{role_tag}grad_norm"] = grad_norm', 'role_tag "" for the actor'),
        ("train/pg_loss", "slime/backends/megatron_utils/loss.py:1144", '"pg_loss": pg_loss.clone().detach(),', '"train/" by model.py:883'),
        ("train/loss", "slime/backends/megatron_utils/loss.py:1143", '"loss": loss.clone().detach(),', '"train/" by model.py:883'),
        ("train/train_rollout_logprob_abs_diff", "slime/backends/megatron_utils/model.py:900", 'if args.ci_test and "train/train_rollout_logprob_abs_diff" in log_dict:', ""),
        ("train/pg_clipfrac", "slime/backends/megatron_utils/loss.py:1146", '"pg_clipfrac": pg_clipfrac.clone().detach(),', '"train/" by model.py:883'),
        ("train/ppo_kl", "slime/backends/megatron_utils/loss.py:1147", '"ppo_kl": ppo_kl.clone().detach(),', '"train/" by model.py:883'),
        ("train/entropy_loss", "slime/backends/megatron_utils/loss.py:1145", '"entropy_loss": entropy_loss.clone().detach(),', '"train/" by model.py:883'),
        ("rollout/raw_reward", "slime/ray/rollout.py:663", '"raw_reward": raw_rewards,', 'whole on every DP rank; Σ sum / Σ count (observability/train_metric_utils.py:214), "rollout/" by gather_log_data (:221, :134)'),
        ("rollout/response_len/mean", "slime/observability/rollout_metrics.py:48", 'log_dict |= dict_add_prefix(compute_statistics(response_lengths), "response_len/")', '"mean" by compute_statistics (observability/metric_utils.py:62), "rollout/" by log_rollout_data (:266)'),
        ("rollout/response_len/max", "slime/observability/rollout_metrics.py:48", 'log_dict |= dict_add_prefix(compute_statistics(response_lengths), "response_len/")', '"max" by compute_statistics (metric_utils.py:64), "rollout/" by :266'),
        ("rollout/truncated_ratio", "slime/observability/rollout_metrics.py:55", 'log_dict["truncated_ratio"] = np.mean([int(s.status == Sample.Status.TRUNCATED) for s in samples]).item()', '"rollout/" by log_rollout_data (:266)'),
        ("train/step", "slime/backends/megatron_utils/model.py:897", 'log_dict["train/step"] = accumulated_step_id', "the step column"),
    ],
    "skyrl": [
        ("policy/rollout_train_logprobs_abs_diff_mean", "skyrl/train/trainer.py:1403", '"policy/rollout_train_logprobs_abs_diff_mean": logprobs_diff_mean,', ""),
        ("policy/loss_metrics/is_ratio_max", "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:311", 'metrics["is_ratio_max"] = (is_ratio * loss_mask).max().detach().item()', '"loss_metrics/" by worker.py:1122, "policy/" by trainer.py:1578'),
        ("policy/final_loss", "skyrl/backends/skyrl_train/workers/worker.py:1114", '"final_loss": unscaled_loss.item(),', '"policy/" by trainer.py:1578'),
        ("policy/policy_loss", "skyrl/backends/skyrl_train/workers/worker.py:1115", '"policy_loss": policy_loss.item(),', '"policy/" by trainer.py:1578'),
        ("policy/policy_entropy", "skyrl/backends/skyrl_train/workers/worker.py:1116", '"policy_entropy": entropy.item(),', '"policy/" by trainer.py:1578'),
        ("policy/policy_lr", "skyrl/backends/skyrl_train/workers/worker.py:1118", '"policy_lr": self.scheduler.get_last_lr()[0],', '"policy/" by trainer.py:1578'),
        ("policy/grad_norm", "skyrl/train/trainer.py:1549", 'all_metrics["grad_norm"].append(grad_norm)', '"policy/" by trainer.py:1578'),
        ("reward/avg_raw_reward", "skyrl/train/trainer.py:1112", '"reward/avg_raw_reward": overall_metrics["avg_score"],', ""),
        ("policy/loss_metrics/clip_ratio", "skyrl/backends/skyrl_train/utils/ppo_utils.py:578", 'loss_metrics = {"clip_ratio": clip_ratio}', 'ppo_policy_loss; "loss_metrics/" by worker.py:1122, "policy/" by trainer.py:1578'),
        ("policy/loss_metrics/cispo/ratio_max", "skyrl/backends/skyrl_train/utils/ppo_utils.py:812", '"cispo/ratio_max": cispo_ratio_max,', 'compute_policy_loss_cispo; "loss_metrics/" by worker.py:1122, "policy/" by trainer.py:1578'),
        ("generate/avg_num_tokens", "skyrl/train/generators/utils.py:458", '"generate/avg_num_tokens": np.mean(num_tokens_arr).item(),', "into all_metrics by trainer.py:1001"),
        ("generate/max_num_tokens", "skyrl/train/generators/utils.py:457", '"generate/max_num_tokens": np.max(num_tokens_arr).item(),', "into all_metrics by trainer.py:1001"),
    ],
    "areal": [
        ("ppo_actor/task_reward/avg", "areal/trainer/ppo/actor.py:302", "task_reward=reward_score.float(),", 'scope "ppo_actor" (:252), "/avg" by stats_tracker._aggregate'),
        ("ppo_actor/update/actor_loss/avg", "areal/trainer/ppo/actor.py:534", 'actor_loss=stat["loss"],', 'scopes "ppo_actor/update" (:341), "/avg"'),
        ("ppo_actor/update/entropy/avg", "areal/trainer/ppo/actor.py:533", "entropy=entropy.float(),", 'scopes "ppo_actor/update", "/avg"'),
        ("ppo_actor/update/grad_norm", "areal/engine/fsdp_engine.py:711", 'grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),', 'stats_tracker.scalar(**train_stat) in scope "ppo_actor/update" (actor.py:365)'),
        ("ppo_actor/update/lr", "areal/engine/fsdp_engine.py:712", "lr=current_lr,", "the same"),
        ("ppo_actor/update/behave_approx_kl/avg", "areal/trainer/ppo/actor.py:543", 'behave_approx_kl=stat["behave_approx_kl"],', 'scopes "ppo_actor/update", "/avg"'),
        ("ppo_actor/update/clip_ratio/avg", "areal/trainer/ppo/actor.py:535", 'clip_ratio=stat["clip_mask"].float(),', 'scopes "ppo_actor/update", "/avg"'),
        ("ppo_actor/update/importance_weight/max", "areal/trainer/ppo/actor.py:529", 'importance_weight=stat["importance_weight"],', 'scopes "ppo_actor/update", "/max" by stats_tracker._aggregate'),
    ],
    "nemo-rl": [
        ("train/gen_kl_error", "nemo_rl/algorithms/loss/loss_functions.py:344", '"gen_kl_error": MetricNormalizer.TOKENS,', 'prefix "train" by logger.log_metrics (grpo.py)'),
        ("train/reward", "nemo_rl/algorithms/grpo.py:3435", '"reward": rewards.numpy(),', 'prefix "train"'),
        ("train/loss", "nemo_rl/algorithms/grpo.py:3433", '"loss": train_results["loss"].numpy(),', 'prefix "train"'),
        ("train/token_mult_prob_error", "nemo_rl/algorithms/loss/loss_functions.py:343", '"token_mult_prob_error": MetricNormalizer.TOKENS,', 'prefix "train"'),
        ("train/mean_gen_tokens_per_sample", "nemo_rl/experience/rollouts.py:1077", '"mean_gen_tokens_per_sample": float(', 'prefix "train" (grpo.py:3022)'),
        ("train/max_gen_tokens_per_sample", "nemo_rl/experience/rollouts.py:1080", '"max_gen_tokens_per_sample": float(', 'prefix "train" (grpo.py:3022)'),
        ("train/truncation_rate", "nemo_rl/experience/rollouts.py:1071", '"truncation_rate": float(sample_truncated.float().mean().item()),', 'prefix "train" (grpo.py:3022)'),
        ("train/probs_ratio_max", "nemo_rl/algorithms/loss/loss_functions.py:774", '"probs_ratio_max": probs_ratio_max,', 'max over micro-batches (grpo.py:3475), prefix "train"'),
    ],
}

# framework -> [(old name, "release file:line", the source line verbatim there, how the name is composed)]:
# the names `NameMap.aliases` maps, from the releases that logged them (not installed, so not
# checked against a package: copied from the release's tag)
OLD: dict[str, list[tuple[str, str, str, str]]] = {
    "verl": [
        ("actor/entropy_loss", "v0.2.0.post2 verl/workers/actor/dp_actor.py:278", "'actor/entropy_loss': entropy_loss.detach().item(),", ""),
        ("actor/entropy_loss", "v0.4.0 verl/trainer/ppo/ray_trainer.py:1068", 'old_log_prob_metrics = {"actor/entropy_loss": entropy_loss.detach().item()}', ""),
    ],
    "trl": [
        ("train/completion_length", "v0.14.0 trl/trainer/grpo_trainer.py:516", 'self._metrics["completion_length"].append(completion_length)', '"train/" by rewrite_logs'),
        ("train/completion_length", "v0.16.0 trl/trainer/grpo_trainer.py:849", 'self._metrics[mode]["completion_length"].append(completion_length)', '"train/" by rewrite_logs'),
    ],
}
