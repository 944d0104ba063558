"""Metric names as each framework logs them, copied verbatim from its source with the line
they come from (file:line at the version or commit of trainer_hooks/integrations/names.py),
and how the logged name is put together where the line holds only part of it.

verl and TRL are installed here: their lines are checked against the installed packages."""

from __future__ import annotations

# framework -> [(logged name, "file:line", the source line verbatim, how the name is composed)]
LOGGED: dict[str, list[tuple[str, str, str, str]]] = {
    "verl": [
        ("rollout_corr/k3_kl", "verl/trainer/ppo/rollout_corr_helper.py:966", 'metrics["k3_kl"] = verl_F.masked_mean(k3_kl_matrix, response_mask).detach().item()', 'prefixed "rollout_corr/" at :892'),
        ("rollout_corr/kl", "verl/trainer/ppo/rollout_corr_helper.py:959", 'metrics["kl"] = verl_F.masked_mean(rollout_log_prob - old_log_prob, response_mask).detach().item()', 'prefixed "rollout_corr/"'),
        ("critic/score/mean", "verl/trainer/ppo/metric_utils.py:556", '"critic/score/mean": score_mean,', ""),
        ("actor/pg_loss", "verl/workers/utils/losses.py:119", 'metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)', ""),
        ("actor/entropy", "verl/trainer/ppo/v1/trainer_base.py:1684", '"actor/entropy": entropy_agg.detach().item(),', ""),
        ("training/off_policy/trajectory_staleness/mean", "verl/trainer/ppo/v1/trainer_base.py:1986", '"training/off_policy/trajectory_staleness/mean": trajectory_staleness.mean(),', ""),
        ("training/off_policy/trajectory_staleness/max", "verl/trainer/ppo/v1/trainer_base.py:1987", '"training/off_policy/trajectory_staleness/max": trajectory_staleness.max(),', ""),
    ],
    "trl": [
        ("train/reward", "trl/trainer/grpo_trainer.py:2828", 'self._metrics[mode]["reward"].append(torch.nanmean(rewards).item())', '"train/" by transformers rewrite_logs'),
        ("train/reward_std", "trl/trainer/grpo_trainer.py:2829", 'self._metrics[mode]["reward_std"].append(nanstd(rewards).item())', '"train/" by rewrite_logs'),
        ("train/sampling/sampling_logp_difference/mean", "trl/trainer/grpo_trainer.py:2868", 'self._metrics[mode]["sampling/sampling_logp_difference/mean"].append(', '"train/" by rewrite_logs'),
        ("train/sampling/importance_sampling_ratio/max", "trl/trainer/grpo_trainer.py:2894", 'self._metrics[mode]["sampling/importance_sampling_ratio/max"].append(', '"train/" by rewrite_logs'),
        ("train/kl", "trl/trainer/grpo_trainer.py:3268", 'self._metrics[mode]["kl"].append(global_masked_mean(per_token_kl))', '"train/" by rewrite_logs'),
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
    ],
    "slime": [
        ("train/grad_norm", "slime/backends/megatron_utils/model.py:886", 'log_dict[f"train/{role_tag}grad_norm"] = grad_norm', 'role_tag "" for the actor'),
        ("train/pg_loss", "slime/backends/megatron_utils/loss.py:1144", '"pg_loss": pg_loss.clone().detach(),', '"train/" by model.py:883'),
        ("train/loss", "slime/backends/megatron_utils/loss.py:1143", '"loss": loss.clone().detach(),', '"train/" by model.py:883'),
        ("train/train_rollout_logprob_abs_diff", "slime/backends/megatron_utils/model.py:900", 'if args.ci_test and "train/train_rollout_logprob_abs_diff" in log_dict:', ""),
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
    ],
    "areal": [
        ("ppo_actor/task_reward/avg", "areal/trainer/ppo/actor.py:302", "task_reward=reward_score.float(),", 'scope "ppo_actor" (:252), "/avg" by stats_tracker._aggregate'),
        ("ppo_actor/update/actor_loss/avg", "areal/trainer/ppo/actor.py:534", 'actor_loss=stat["loss"],', 'scopes "ppo_actor/update" (:341), "/avg"'),
        ("ppo_actor/update/entropy/avg", "areal/trainer/ppo/actor.py:533", "entropy=entropy.float(),", 'scopes "ppo_actor/update", "/avg"'),
        ("ppo_actor/update/grad_norm", "areal/engine/fsdp_engine.py:711", 'grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),', 'stats_tracker.scalar(**train_stat) in scope "ppo_actor/update" (actor.py:365)'),
        ("ppo_actor/update/lr", "areal/engine/fsdp_engine.py:712", "lr=current_lr,", "the same"),
        ("ppo_actor/update/behave_approx_kl/avg", "areal/trainer/ppo/actor.py:543", 'behave_approx_kl=stat["behave_approx_kl"],', 'scopes "ppo_actor/update", "/avg"'),
    ],
    "nemo-rl": [
        ("train/gen_kl_error", "nemo_rl/algorithms/loss/loss_functions.py:344", '"gen_kl_error": MetricNormalizer.TOKENS,', 'prefix "train" by logger.log_metrics (grpo.py)'),
        ("train/reward", "nemo_rl/algorithms/grpo.py:3435", '"reward": rewards.numpy(),', 'prefix "train"'),
        ("train/loss", "nemo_rl/algorithms/grpo.py:3433", '"loss": train_results["loss"].numpy(),', 'prefix "train"'),
        ("train/token_mult_prob_error", "nemo_rl/algorithms/loss/loss_functions.py:343", '"token_mult_prob_error": MetricNormalizer.TOKENS,', 'prefix "train"'),
    ],
}
