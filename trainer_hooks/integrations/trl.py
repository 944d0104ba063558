"""Keel for TRL's `GRPOTrainer` (docs/integrations/trl.md).

    keel = KeelCallback("http://127.0.0.1:8750", run_name="grpo-qwen")
    KeelGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), callbacks=[keel]).train()

`KeelCallback` on a plain `GRPOTrainer` streams what TRL logs (renamed by `keel_metrics`)
and how the run ended. TRL hands its callbacks no tensors, so Keel's own stability metrics
need the trainer's cooperation: `KeelGRPOMixin` wraps four GRPOTrainer methods (three of
them private, hence `TESTED_TRL_VERSIONS`) and gives each micro-batch's per-token
log-probabilities, rewards and gate mask to the callback. The callback concatenates the
micro-batches of one optimizer step and calls `Monitor.log_batch` once, at `on_step_end`:
the Monitor keeps the first write of a key at a step, so a call per micro-batch would keep
only the first micro-batch.

The step axis is `trainer.state.global_step` after the update (the first update is step 1),
for TRL's logs too: with `logging_steps=N` those arrive every N steps, averaged by TRL over
the N steps, while Keel's metrics are per step.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import trl
from torch import Tensor
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from trl import GRPOTrainer

from trainer_hooks.integrations.names import MAPS
from trainer_hooks.monitor import Monitor
from trainer_hooks.signals import Command

__all__ = [
    "SOURCE_NONE",
    "SOURCE_ROLLOUT",
    "SOURCE_SAMPLER",
    "SOURCE_STALENESS",
    "SOURCE_UNAVAILABLE",
    "TESTED_TRL_VERSIONS",
    "TRL_TO_KEEL",
    "GateParams",
    "KeelCallback",
    "KeelGRPOMixin",
    "KeelGRPOTrainer",
    "MicroBatch",
    "concat_micro_batches",
    "grpo_gate_mask",
    "keel_metrics",
]

logger = logging.getLogger("keel")

TESTED_TRL_VERSIONS = ("1.12.0", "1.16.0")
"""TRL releases whose GRPOTrainer internals KeelGRPOMixin was tested against."""

TRL_TO_KEEL: dict[str, str] = MAPS["trl"].to_keel(native=True)  # cited in integrations/names.py
"""TRL (and transformers.Trainer) log names that have a Keel name. Any other name `x` is
stored as `trl/x`, and `eval_x` as `eval/` + the name of `x`."""

# config["keel/mismatch_source"]: what the "sampler" log-probabilities of the run really are.
SOURCE_SAMPLER = "sampler: vLLM logprobs"
SOURCE_ROLLOUT = "sampler: rollout_func logprobs"
SOURCE_STALENESS = "staleness-only: sampler logprobs are the learner's recomputation"
DEFAULT_ACTIONS = {"checkpoint": "save", "stop": "stop"}
"""A command's action -> what KeelCallback does on it (`actions`)."""

SOURCE_NONE = "none: on-policy without vLLM, sampler logprobs are the learner's own (ratio 1)"
SOURCE_UNAVAILABLE = "unavailable: a plain GRPOTrainer hands no per-token tensors to callbacks"

CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
"""TRL loss types with PPO's two-sided clip; `cispo` caps the ratio, `sapo` and `vespo`
weigh it softly and gate nothing."""

_WRAPPED = (
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_get_per_token_logps_and_entropies",
)


def keel_metrics(logs: Mapping[str, Any], *, reward_headline: bool) -> dict[str, float]:
    """One TRL `on_log` dict under Keel's names (TRL_TO_KEEL, else `trl/` + TRL's name).

    TRL's `reward` is always `trl/reward`; with `reward_headline` (no per-token metrics,
    hence no reward/mean of Keel's own) it fills `reward/mean` as well. Entries that are
    None (TRL's "no valid value in the window") or not numbers are left out; NaN stays.
    """
    out: dict[str, float] = {}
    for name, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if name.startswith("eval_"):
            key = "eval/" + TRL_TO_KEEL.get(name[5:], f"trl/{name[5:]}")
        else:
            key = TRL_TO_KEEL.get(name, f"trl/{name}")
        out[key] = float(value)
    if reward_headline and "trl/reward" in out:
        out["reward/mean"] = out["trl/reward"]
    return out


@dataclass(frozen=True)
class GateParams:
    """What decides the units a GRPOTrainer loss gates (`GRPOTrainer._compute_loss`)."""

    loss_type: str
    """TRL's `loss_type`."""
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    """The clip range (1 − ε_low, 1 + ε_high); for `cispo`, ε_high is the cap on the ratio."""
    delta: float | None = None
    """Two-sided GRPO's cap on the ratio of negative-advantage units."""
    importance_sampling_level: str = "token"
    """"token" or "sequence" (GSPO): the ratio is per token or the sequence's geometric mean."""
    off_policy_mask_threshold: float | None = None
    """Off-policy sequence masking: negative-advantage sequences whose mean KL exceeds it."""
    top_entropy_quantile: float = 1.0
    """Below 1, only that top fraction of tokens by entropy gets a policy gradient."""
    vllm_is_mode: str | None = None
    """`vllm_importance_sampling_mode` when the vLLM correction is on, else None."""
    vllm_is_clip_min: float | None = None
    vllm_is_clip_max: float | None = None

    @classmethod
    def from_trainer(cls, trainer: Any) -> GateParams:
        correction = trainer.use_vllm and trainer.vllm_importance_sampling_correction
        return cls(
            loss_type=trainer.loss_type,
            epsilon_low=trainer.epsilon_low,
            epsilon_high=trainer.epsilon_high,
            delta=trainer.args.delta,
            importance_sampling_level=trainer.importance_sampling_level,
            off_policy_mask_threshold=trainer.off_policy_mask_threshold,
            top_entropy_quantile=trainer.top_entropy_quantile,
            vllm_is_mode=trainer.vllm_importance_sampling_mode if correction else None,
            vllm_is_clip_min=trainer.vllm_importance_sampling_clip_min,
            vllm_is_clip_max=trainer.vllm_importance_sampling_clip_max,
        )

    @property
    def unit(self) -> str:
        """What `gate/frac` counts: "sequence" when every gate of the loss is per sequence."""
        per_sequence = (
            self.importance_sampling_level == "sequence"
            and (self.loss_type in CLIP_LOSSES or self.loss_type == "cispo")
            and self.top_entropy_quantile >= 1.0
            and (self.vllm_is_mode is None or self.vllm_is_mode.startswith("sequence"))
        )
        return "sequence" if per_sequence else "token"


def _seq_mean(x_B_T: Tensor, mask_B_T: Tensor) -> Tensor:
    return (x_B_T * mask_B_T).sum(-1, keepdim=True) / mask_B_T.sum(-1, keepdim=True).clamp(min=1.0)


def grpo_gate_mask(
    params: GateParams,
    learner_logprobs_B_T: Tensor,
    old_logprobs_B_T: Tensor,
    advantages: Tensor,
    mask_B_T: Tensor,
    *,
    sampler_logprobs_B_T: Tensor | None = None,
    entropy_mask_B_T: Tensor | None = None,
) -> Tensor:
    """The units the GRPOTrainer loss of `params` gives no (or a capped) policy gradient.

    Mirrors `GRPOTrainer._compute_loss`: the clip (clipped units, as TRL's
    `clip_ratio/region_mean`, plus two-sided GRPO's `delta` cap), cispo's cap, off-policy
    sequence masking, the entropy mask (`entropy_mask_B_T`, from `get_high_entropy_mask`)
    and vLLM's importance-sampling correction (units whose ratio it zeroes or truncates;
    needs `sampler_logprobs_B_T`). `old_logprobs_B_T` is TRL's `old_per_token_logps` (the
    learner's own log-probabilities when TRL keeps none). Advantages are [B] or [B, T].

    Returns bool [B] for `params.unit == "sequence"`, else bool [B, T] (padding False).
    """
    with torch.no_grad():
        mask_B_T = mask_B_T.to(learner_logprobs_B_T.dtype)
        valid_B_T = mask_B_T != 0
        adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)
        log_ratio_B_T = learner_logprobs_B_T - old_logprobs_B_T
        if params.importance_sampling_level == "sequence":
            log_ratio_B_T = _seq_mean(log_ratio_B_T, mask_B_T)
        ratio = log_ratio_B_T.exp()  # [B, T], or [B, 1] at sequence level
        parts: list[Tensor] = []
        if params.loss_type in CLIP_LOSSES:
            clipped = ((ratio < 1 - params.epsilon_low) & (adv < 0)) | (
                (ratio > 1 + params.epsilon_high) & (adv > 0)
            )
            if params.delta is not None:  # min(r, δ)·A with A < 0 is constant above δ
                clipped = clipped | ((ratio > params.delta) & (adv < 0))
            parts.append(clipped)
        elif params.loss_type == "cispo":
            parts.append(ratio > params.epsilon_high)
        if params.off_policy_mask_threshold is not None:
            reference = old_logprobs_B_T if sampler_logprobs_B_T is None else sampler_logprobs_B_T
            kl = torch.nan_to_num(reference - learner_logprobs_B_T, nan=0.0)
            parts.append((adv < 0) & (_seq_mean(kl, mask_B_T) > params.off_policy_mask_threshold))
        if entropy_mask_B_T is not None:
            parts.append(~entropy_mask_B_T.bool())
        if params.vllm_is_mode is not None and sampler_logprobs_B_T is not None:
            # TRL's ratio from the same inputs; vLLM's NaN (unscored) tokens count as ratio 1.
            diff = torch.nan_to_num((old_logprobs_B_T - sampler_logprobs_B_T) * mask_B_T, nan=0.0)
            if params.vllm_is_mode.startswith("sequence"):
                diff = diff.sum(-1, keepdim=True)
            is_ratio = diff.exp()
            outside = torch.zeros_like(is_ratio, dtype=torch.bool)
            if params.vllm_is_clip_max is not None:
                outside = outside | (is_ratio > params.vllm_is_clip_max)
            if params.vllm_is_clip_min is not None:
                outside = outside | (is_ratio < params.vllm_is_clip_min)
            parts.append(outside)

        if params.unit == "sequence":
            gated_B = torch.zeros(valid_B_T.shape[0], dtype=torch.bool, device=valid_B_T.device)
            for part in parts:
                gated_B = gated_B | (part.expand_as(valid_B_T) & valid_B_T).any(-1)
            return gated_B
        gated_B_T = torch.zeros_like(valid_B_T)
        for part in parts:
            gated_B_T = gated_B_T | part.expand_as(valid_B_T)
        return gated_B_T & valid_B_T


@dataclass
class MicroBatch:
    """One micro-batch's detached tensors, as `stability_metrics` takes them."""

    sampler_logprobs: Tensor
    """[B, T]: vLLM's, else TRL's `old_per_token_logps`, else the learner's (see `source`)."""
    learner_logprobs: Tensor
    """[B, T]: log π under the weights being trained, as the loss saw them."""
    mask: Tensor
    """[B, T]: completion mask × tool mask."""
    gate_mask: Tensor
    """[B, T] or [B] (`grpo_gate_mask`)."""
    advantages: Tensor
    """[B] or [B, T]."""
    rewards: Tensor | None
    """[B]: the weighted sum of the reward functions, NaN when none could score."""
    sampler_version: Tensor | None
    """[B]: global_step when the completions were generated."""
    learner_version: int
    """global_step before this update."""
    source: str
    """A SOURCE_* constant: where sampler_logprobs came from."""
    token_ids: Tensor | None = None
    """[B, T]: the completion's token ids (the step details' samples show them as text)."""


def concat_micro_batches(batches: list[MicroBatch]) -> dict[str, Any]:
    """The keyword arguments of `Monitor.log_batch` for one optimizer step's micro-batches.

    Concatenated along the batch dim; shorter completions are padded with mask 0.
    """
    length = max(batch.mask.shape[-1] for batch in batches)

    def cat(tensors: list[Tensor], value: float | bool = 0) -> Tensor:
        if tensors[0].dim() == 1:
            return torch.cat(tensors)
        return torch.cat([F.pad(t, (0, length - t.shape[-1]), value=value) for t in tensors])

    out: dict[str, Any] = {
        "sampler_logprobs": cat([b.sampler_logprobs for b in batches]),
        "learner_logprobs": cat([b.learner_logprobs for b in batches]),
        "mask": cat([b.mask for b in batches]),
        "gate_mask": cat([b.gate_mask for b in batches], False),
        "advantages": cat([b.advantages for b in batches]),
        "learner_version": batches[0].learner_version,
    }
    rewards = [b.rewards for b in batches if b.rewards is not None]
    if len(rewards) == len(batches):
        out["rewards"] = torch.cat(rewards)
    versions = [b.sampler_version for b in batches if b.sampler_version is not None]
    if len(versions) == len(batches):
        out["sampler_version"] = torch.cat(versions)
    token_ids = [b.token_ids for b in batches if b.token_ids is not None]
    if len(token_ids) == len(batches):
        out["token_ids"] = cat(token_ids)
    return out


def _sampler_source(trainer: Any) -> str:
    return SOURCE_ROLLOUT if trainer.rollout_func is not None else SOURCE_SAMPLER


def _expected_source(trainer: Any) -> str:
    if trainer.use_vllm or trainer.rollout_func is not None:
        return _sampler_source(trainer)
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    # GRPOTrainer keeps old_per_token_logps exactly when this holds (_generate_and_score_completions).
    if trainer.args.gradient_accumulation_steps % generate_every != 0:
        return SOURCE_STALENESS
    return SOURCE_NONE


class KeelCallback(TrainerCallback):
    """Streams a transformers/TRL training run to a Keel server.

    Args:
        server_url: the Keel server.
        run_name: defaults to `args.run_name`, else "trl".
        config: stored with the run, next to `trl/args` (the GRPOConfig), `trl/version`,
            `keel/mismatch_source` and `gate/unit`.
        actions: what the trainer does on a command to the run (docs/integrations/trl.md,
            "Acting on alerts"): action name -> "save" (a checkpoint at the end of the
            current step: `control.should_save`) or "stop" (a checkpoint, then
            `control.should_training_stop`). By default `checkpoint` saves and `stop` stops;
            `{}` acts on none (commands then stay pending). A command is acknowledged once
            its checkpoint is saved, and fails if none is within `action_timeout_s`.
        monitor_kwargs: the other arguments of `Monitor` (project, group, tags, token, ...).

    The Monitor starts at `on_train_begin` and finishes at `on_train_end` ("finished").
    On an exception `KeelGRPOTrainer.train` marks the run "failed"; with a plain trainer
    use the callback as a context manager around `train()` to get the same. Every rank
    calls the Monitor (its metrics all-reduce); only the main process sends.
    """

    def __init__(
        self,
        server_url: str,
        *,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        actions: Mapping[str, str] | None = None,
        action_timeout_s: float = 3600.0,
        **monitor_kwargs: Any,
    ) -> None:
        self.server_url = server_url
        self.run_name = run_name
        self.config = dict(config or {})
        self.actions = dict(DEFAULT_ACTIONS if actions is None else actions)
        if not set(self.actions.values()) <= {"save", "stop"}:
            raise ValueError(f"actions map a command's action to 'save' or 'stop', got {self.actions}")
        self.action_timeout_s = action_timeout_s
        self._acting = threading.Condition()
        self._wanted: set[str] = set()  # "save", "stop": asked by commands, done at the next step end
        self._saves = 0  # checkpoints saved so far (on_save)
        self._saved_step = -1
        self._ended = False
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Monitor | None = None
        self._source: str | None = None  # set by KeelGRPOMixin: per-token metrics will come
        self._decode: Any = None  # likewise: the tokenizer's convert_ids_to_tokens
        self._gate_unit: str | None = None
        self._pending: list[MicroBatch] = []
        self._sent: tuple[int, set[str]] = (-1, set())  # keys already logged at that step
        self._warned: set[str] = set()

    def attach(self, *, source: str, gate_unit: str, decode: Any = None) -> None:
        """Called by KeelGRPOMixin: micro-batches will come, their sampler log-probs from
        `source`; `decode` (the tokenizer's `convert_ids_to_tokens`) names their tokens."""
        self._source = source
        self._gate_unit = gate_unit
        self._decode = decode

    def add_micro_batch(self, batch: MicroBatch) -> None:
        """Queue one micro-batch for the current optimizer step (sent at `on_step_end`)."""
        if self._source is not None and batch.source != self._source:
            self._warn_once(
                "source",
                f"keel: run config says {self._source!r}, a micro-batch's sampler logprobs are {batch.source!r}",
            )
        self._pending.append(batch)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(message)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.monitor is not None:
            return
        if self._source is None:
            self._warn_once(
                "mixin",
                "keel: a plain trainer gives callbacks no per-token tensors; use KeelGRPOTrainer "
                "(or KeelGRPOMixin) for the mismatch, gate and staleness metrics",
            )
        config = {
            **self.config,
            "trl/args": args.to_dict(),
            "trl/version": trl.__version__,
            "keel/mismatch_source": self._source or SOURCE_UNAVAILABLE,
        }
        if self._gate_unit is not None:
            config["gate/unit"] = self._gate_unit
        self.monitor = Monitor(
            self.server_url,
            run_name=self.run_name or getattr(args, "run_name", None) or "trl",
            config=config,
            **self.monitor_kwargs,
        )
        with self._acting:
            self._ended = False
        if self.actions:
            said = {"save": "saves a checkpoint at the end of the current step", "stop": "saves a checkpoint and stops training"}
            self.monitor.on_command(self._on_command, {action: said[what] for action, what in self.actions.items()})

    def _on_command(self, command: Command) -> str:
        """On the Monitor's command thread: ask the training loop, wait for the checkpoint."""
        what = self.actions[command.action]  # the Monitor passes only the actions declared
        with self._acting:
            before = self._saves
            self._wanted.add(what)
            done = self._acting.wait_for(lambda: self._saves > before or self._ended, timeout=self.action_timeout_s)
            if self._saves == before:
                raise RuntimeError("training ended before a checkpoint was saved" if done else f"no step ended within {self.action_timeout_s:g} s")
            return f"checkpoint saved at step {self._saved_step}" + ("; training stops" if what == "stop" else "")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        with self._acting:
            wanted, self._wanted = self._wanted, set()
        if wanted:
            control.should_save = True
            if "stop" in wanted:
                control.should_training_stop = True
        batches, self._pending = self._pending, []
        if self.monitor is None or not batches:
            return
        try:
            inputs = concat_micro_batches(batches)
        except Exception as exc:  # Keel must never stop training
            self._warn_once("concat", f"keel: step {state.global_step} not measured: {exc!r}")
        else:
            self.monitor.log_batch(
                state.global_step,
                inputs.pop("sampler_logprobs"),
                inputs.pop("learner_logprobs"),
                inputs.pop("mask"),
                decode=self._decode,
                **inputs,
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.monitor is None or not logs:
            return
        step = state.global_step
        if self._sent[0] != step:
            self._sent = (step, set())
        sent = self._sent[1]
        # Train, eval and the end-of-training summary are separate logs at one step; a key
        # they share (epoch) is kept from the first, as the server would.
        metrics = {
            key: value
            for key, value in keel_metrics(logs, reward_headline=self._source is None).items()
            if key not in sent
        }
        sent.update(metrics)
        if metrics:
            self.monitor.log(step, metrics)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        with self._acting:
            self._saves += 1
            self._saved_step = state.global_step
            self._acting.notify_all()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        with self._acting:
            self._ended = True
            self._acting.notify_all()
        self.finish("finished")

    def finish(self, status: str = "finished") -> None:
        """Mark the run `status` and flush it (no-op when no run is open)."""
        monitor, self.monitor = self.monitor, None
        self._pending = []
        if monitor is not None:
            monitor.finish(status)

    def __enter__(self) -> KeelCallback:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        monitor, self.monitor = self.monitor, None
        self._pending = []
        if monitor is not None:  # the Monitor's own exit: failed, killed (SIGTERM) or finished
            monitor.__exit__(exc_type, exc, traceback)


if TYPE_CHECKING:
    _TrainerBase = GRPOTrainer
else:
    _TrainerBase = object


class KeelGRPOMixin(_TrainerBase):
    """Hands each training micro-batch of a GRPOTrainer to its KeelCallback.

        class KeelGRPOTrainer(KeelGRPOMixin, GRPOTrainer): ...   # or before your own subclass

    Needs exactly one `KeelCallback` in `callbacks=[...]`. Wraps, returning what they return:

    - `_calculate_rewards` (private): keeps the generation batch's rewards per function;
    - `_generate_and_score_completions` (private): adds `keel_rewards` and
      `keel_sampler_version` (one per completion) to the batch, so that they follow TRL's
      shuffle and split into micro-batches;
    - `compute_loss` (transformers' override point): in training, captures the forward pass
      and gives the micro-batch (`MicroBatch`) to the callback;
    - `_get_per_token_logps_and_entropies` (private): its first call inside `compute_loss`
      is the learner's forward pass; the log-probs and entropies are kept, detached;
    - `train`: an exception marks the run failed (killed on Ctrl-C or SIGTERM).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        missing = [name for name in _WRAPPED if not hasattr(GRPOTrainer, name)]
        if missing:
            raise TypeError(
                f"KeelGRPOMixin wraps GRPOTrainer.{', '.join(missing)}, which TRL {trl.__version__} "
                f"lacks; it is tested with TRL {', '.join(TESTED_TRL_VERSIONS)}"
            )
        super().__init__(*args, **kwargs)
        callbacks = [cb for cb in self.callback_handler.callbacks if isinstance(cb, KeelCallback)]
        if len(callbacks) != 1:
            raise ValueError(
                f"{type(self).__name__} needs one KeelCallback in callbacks=[...], got {len(callbacks)}"
            )
        self.keel_callback = callbacks[0]
        self._keel_gate = GateParams.from_trainer(self)
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        self.keel_callback.attach(
            source=_expected_source(self),
            gate_unit=self._keel_gate.unit,
            decode=getattr(tokenizer, "convert_ids_to_tokens", None),
        )
        self._keel_rewards_per_func: Tensor | None = None
        self._keel_capture: list[tuple[Tensor, Tensor | None]] | None = None

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        except BaseException as exc:
            self.keel_callback.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)
        self._keel_rewards_per_func = rewards_per_func  # [all processes' completions, functions]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._keel_rewards_per_func = self._keel_rewards_per_func, None
        completions, device = output["completion_ids"].shape[0], output["completion_ids"].device
        if rewards_per_func is not None:
            # TRL's own `reward`: the weighted sum, NaN where no function could score.
            weights = self.reward_weights.to(rewards_per_func.device)
            rewards = (rewards_per_func * weights).nansum(dim=1)
            rewards[torch.isnan(rewards_per_func).all(dim=1)] = math.nan
            start = self.accelerator.process_index * completions
            output["keel_rewards"] = rewards[start : start + completions].to(device)
        output["keel_sampler_version"] = torch.full(
            (completions,), self.state.global_step, dtype=torch.long, device=device
        )
        return output

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._keel_capture is not None and not self._keel_capture:
            logps, entropies = result[0], result[1]
            self._keel_capture.append(
                (logps.detach(), None if entropies is None else entropies.detach())
            )
        return result

    def compute_loss(
        self,
        model: Any,
        inputs: Any,
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if not model.training:  # evaluation: not a training micro-batch
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._keel_capture = []
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            captured = self._keel_capture
        finally:
            self._keel_capture = None
        try:
            if not captured:
                raise RuntimeError("the loss made no _get_per_token_logps_and_entropies call")
            self.keel_callback.add_micro_batch(self._keel_micro_batch(inputs, *captured[0]))
        except Exception as exc:  # Keel must never stop training
            self.keel_callback._warn_once(
                f"capture:{type(exc).__name__}", f"keel: micro-batch not captured: {exc!r}"
            )
        return loss

    def _keel_micro_batch(
        self, inputs: Mapping[str, Any], learner_logprobs: Tensor, entropies: Tensor | None
    ) -> MicroBatch:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")
        sampler = inputs.get("sampling_per_token_logps")
        if sampler is not None:
            source, sampler_logprobs = _sampler_source(self), sampler
        elif old is not None:
            source, sampler_logprobs = SOURCE_STALENESS, old
        else:
            source, sampler_logprobs = SOURCE_NONE, learner_logprobs
        entropy_mask = None
        if self.top_entropy_quantile < 1.0 and entropies is not None:
            entropy_mask = self.get_high_entropy_mask(
                entropies, mask, 1 - self.top_entropy_quantile
            )
        gate_mask = grpo_gate_mask(
            self._keel_gate,
            learner_logprobs,
            learner_logprobs if old is None else old,
            inputs["advantages"],
            mask,
            sampler_logprobs_B_T=sampler,
            entropy_mask_B_T=entropy_mask,
        )
        return MicroBatch(
            sampler_logprobs=sampler_logprobs,
            learner_logprobs=learner_logprobs,
            mask=mask,
            gate_mask=gate_mask,
            advantages=inputs["advantages"],
            rewards=inputs.get("keel_rewards"),
            sampler_version=inputs.get("keel_sampler_version"),
            learner_version=self.state.global_step,
            source=source,
            token_ids=inputs.get("completion_ids"),
        )


class KeelGRPOTrainer(KeelGRPOMixin, GRPOTrainer):
    """`GRPOTrainer` with `KeelGRPOMixin`; pass a `KeelCallback` in `callbacks=[...]`."""
