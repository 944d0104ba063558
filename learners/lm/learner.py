"""The learner: fp32 training on the sampler's batches, streaming to Keel.

    board.publish(0, model); sampler.start()
    for step in range(steps):
        rollout = batches.get()                                # sampled by weights `rollout.version`
        learner_logp_B_T = log π(rollout.tokens) in fp32       # the weights of version `step`
        loss, gate = policy_loss(loss, learner_logp_B_T, rollout.sampler_logp_B_T, adv_B, mask_B_T)
        backward, clip, AdamW step; board.publish(step + 1, model)
        monitor.log_inputs(step, BatchInputs(rollout.sampler_logp_B_T, learner_logp_B_T, ...))   # keel

The learner never recomputes log μ: the ratio it trains on and the mismatch Keel
reports both come from the log-probabilities the sampler recorded. The lines
marked `# keel:` are all a learner needs to add (docs/lm.md).
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from learners.lm.advantages import ADVANTAGES, advantages, zero_std_frac
from learners.lm.guard import Guard, GuardConfig
from learners.lm.model import GPT, SIZES, GPTConfig
from learners.lm.sampler import DTYPES, Rollout, Sampler, WeightBoard
from learners.lm.task import DECODERS, TASKS, Task, make_task
from trainer_hooks.losses import (
    AGGREGATIONS,
    LOSSES,
    aggregation_weights,
    loss_terms,
    policy_loss,
)
from trainer_hooks.metrics import BatchInputs

__all__ = [
    "LMConfig",
    "LMResult",
    "MetricSink",
    "Recorder",
    "StepOutput",
    "Tee",
    "learner_step",
    "run_config",
    "train",
    "warm_start",
]


@dataclass(frozen=True)
class LMConfig:
    loss: str = "cispo"
    """A key of trainer_hooks.losses.LOSSES."""
    lag: int = 0
    """How many versions the sampler may run behind the weights being trained."""
    sampler_dtype: str = "bf16"
    """bf16, fp16 or fp32: the dtype the sampler holds its weights in and computes with."""
    device: str = "cpu"
    """Sampler and learner both live here (cpu, cuda, cuda:N)."""
    size: str = "tiny"
    """A key of model.SIZES."""
    steps: int = 600
    """Learner steps (optimizer updates)."""
    seed: int = 0
    """Seeds the initial weights and the sampler's prompts and draws."""
    lr: float = 1e-3
    """AdamW learning rate."""
    digits: int = 6
    """Task difficulty: digits to sort (copy: most digits in a prompt)."""
    prompts: int = 16
    """Prompts per batch."""
    group: int = 8
    """Samples per prompt; the advantage is the reward minus its group's mean (GRPO)."""
    clip: float = 1.0
    """Max gradient norm (0: no clipping). grad/norm is logged before clipping."""
    step_delay: float = 0.0
    """Sleep after each step, to watch a run live on a fast machine."""
    task: str = "sort"
    """"sort" (fixed-length answers) or "copy" (answers end with EOS under a length cap)."""
    max_new_tokens: int = 0
    """copy: the length cap of an answer, EOS included (0: the task's, 2·digits + 2)."""
    truncation_penalty: float = 0.0
    """copy: an answer cut at the cap gets reward −truncation_penalty (0 by default)."""
    adv: str = ""
    """Advantages: group, group_std or batch (learners/lm/advantages.py); "": the loss's
    (batch for flash_reinforce, group otherwise)."""
    agg: str = ""
    """Aggregation of the loss over tokens (trainer_hooks.losses.AGGREGATIONS); "": the loss's."""
    sft_steps: int = 0
    """Supervised steps on the task's right answers before RL (0: none), at `SFT_LR`: RL then
    starts from a trained policy, sharp and partly right, as it starts from a fine-tuned model
    (the uniform output otherwise, or the copy task's format prior)."""
    logit_noise: float = 0.0
    """A planted engine change of known size: the sampler adds Gaussian noise of this standard
    deviation (nats) to every logit it samples from (0: none). Calibrates `keel parity`'s power
    (docs/parity.md): μ moves away from π by about noise²/2 nats of KL per token."""

    @property
    def advantage_mode(self) -> str:
        """The advantages used: `adv`, or the loss's default."""
        return self.adv or ("batch" if self.loss == "flash_reinforce" else "group")

    @property
    def aggregation(self) -> str:
        """The aggregation used: `agg`, or the loss's default."""
        return self.agg or (LOSSES[self.loss].agg if self.loss in LOSSES else "token_sum")

    def make_task(self) -> Task:
        return make_task(self.task, self.digits, self.max_new_tokens, self.truncation_penalty)

    @property
    def name(self) -> str:
        """`{loss}-lag{lag}-{dtype}[-{task}][-lr{lr}][-clip{clip}][-d{digits}][-{size}][-b{prompts}x{group}]
        [-adv-{mode}][-agg-{tsum|tmean|smean}][-cap{cap}][-tp{penalty}]-s{seed}`: a setting is named when
        it differs from the default (the advantages and aggregation when they differ from the loss's),
        so runs of one corpus never share a name."""
        parts = [self.loss, f"lag{self.lag}", self.sampler_dtype]
        default = LMConfig()
        if self.task != default.task:
            parts.append(self.task)
        if self.lr != default.lr:
            parts.append(f"lr{self.lr:g}")
        if self.clip != default.clip:
            parts.append(f"clip{self.clip:g}")
        if self.digits != default.digits:
            parts.append(f"d{self.digits}")
        if self.size != default.size:
            parts.append(self.size)
        if (self.prompts, self.group) != (default.prompts, default.group):
            parts.append(f"b{self.prompts}x{self.group}")
        if self.adv and self.adv != replace(self, adv="").advantage_mode:
            parts.append(f"adv-{self.adv.replace('_', '')}")
        if self.agg and self.agg != replace(self, agg="").aggregation:
            parts.append(f"agg-{_AGG_NAMES.get(self.agg, self.agg)}")
        if self.max_new_tokens and self.task == "copy" and self.max_new_tokens != 2 * self.digits + 2:
            parts.append(f"cap{self.max_new_tokens}")
        if self.truncation_penalty:
            parts.append(f"tp{self.truncation_penalty:g}")
        if self.logit_noise:
            parts.append(f"noise{self.logit_noise:g}")
        if self.sft_steps:
            parts.append(f"sft{self.sft_steps}")
        return "-".join([*parts, f"s{self.seed}"])

    def check(self) -> None:
        """Raise ValueError on a setting the loop cannot run."""
        problems = []
        if self.loss not in LOSSES:
            problems.append(f"unknown loss {self.loss!r}; one of {', '.join(sorted(LOSSES))}")
        if self.sampler_dtype not in DTYPES:
            problems.append(f"sampler dtype must be one of {', '.join(DTYPES)}")
        if self.size not in SIZES:
            problems.append(f"size must be one of {', '.join(SIZES)}")
        if self.adv not in ("", *ADVANTAGES):
            problems.append(f"adv must be one of {', '.join(ADVANTAGES)}")
        if self.agg not in ("", *AGGREGATIONS):
            problems.append(f"agg must be one of {', '.join(AGGREGATIONS)}")
        # One answer per prompt is FlashREINFORCE's setting: only the batch baseline allows it.
        fewest = 1 if self.advantage_mode == "batch" else 2
        if self.lag < 0 or self.steps < 1 or self.prompts < 1 or self.group < fewest:
            problems.append(f"need lag >= 0, steps >= 1, prompts >= 1, group >= {fewest}"
                            + (" (group >= 1 with --adv batch)" if fewest == 2 else ""))  # fmt: skip
        if self.task not in TASKS:
            problems.append(f"unknown task {self.task!r}; one of {', '.join(TASKS)}")
        elif self.task == "sort":
            if not (1 <= self.digits <= 7):
                problems.append("digits must be 1..7 (the model's context is 16 tokens)")
            if self.max_new_tokens or self.truncation_penalty:
                problems.append("max_new_tokens and truncation_penalty are the copy task's")
        else:
            if not (1 <= self.digits <= 10):
                problems.append("copy: digits must be 1..10")
            if self.max_new_tokens and not (2 <= self.max_new_tokens <= 64):
                problems.append("copy: max_new_tokens must be 2..64 (0: 2·digits + 2)")
            if not (math.isfinite(self.truncation_penalty) and self.truncation_penalty >= 0):
                problems.append("truncation_penalty must be finite and >= 0")
        if not (self.lr > 0 and self.clip >= 0):
            problems.append("need lr > 0 and clip >= 0")
        if self.sft_steps < 0:
            problems.append("sft_steps must be >= 0")
        if not (math.isfinite(self.logit_noise) and self.logit_noise >= 0):
            problems.append("logit_noise must be finite and >= 0")
        if problems:
            raise ValueError("; ".join(problems))


_AGG_NAMES = {"token_sum": "tsum", "token_mean": "tmean", "seq_mean_token_mean": "smean"}


class MetricSink(Protocol):
    """What the loop logs to: a `trainer_hooks.Monitor`, a `Recorder`, or both (`Tee`)."""

    def log_inputs(
        self, step: int, inputs: BatchInputs, *, metrics: Mapping[str, Any] | None = None, decode: Any = None
    ) -> None: ...

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...


class Recorder:
    """Keeps every logged metric in memory, per step (the grid's corpus); computes on the spot."""

    def __init__(self) -> None:
        self.series: dict[str, list[float]] = {}

    def log_inputs(
        self, step: int, inputs: BatchInputs, *, metrics: Mapping[str, Any] | None = None, decode: Any = None
    ) -> None:  # the step details are the Monitor's: this records the scalars
        self.log(step, {**inputs.compute(), **(metrics or {})})

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        keys = list(metrics)
        # One host copy per step for all the tensors, as the Monitor does.
        floats = torch.stack([torch.as_tensor(metrics[k], dtype=torch.float64).cpu() for k in keys])
        for key, value in zip(keys, floats.tolist(), strict=True):
            column = self.series.setdefault(key, [])
            column.extend([math.nan] * (step - len(column)))
            column.append(value)


class Tee:
    """Log to several sinks."""

    def __init__(self, *sinks: MetricSink) -> None:
        self.sinks = sinks

    def log_inputs(
        self, step: int, inputs: BatchInputs, *, metrics: Mapping[str, Any] | None = None, decode: Any = None
    ) -> None:
        for sink in self.sinks:
            sink.log_inputs(step, inputs, metrics=metrics, decode=decode)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)


@dataclass
class LMResult:
    rewards: list[float]
    """reward/mean per step."""
    wall_s: float
    learner_tokens_per_s: float
    """Answer positions trained on per second of learner step (median step; copy: up to the cap)."""
    sampler_tokens_per_s: float
    """Answer positions generated per second of sampler batch (median batch)."""


def run_config(config: LMConfig) -> dict[str, Any]:
    """The run's config as Keel stores it."""
    return {
        **asdict(config), "gate/unit": LOSSES[config.loss].unit, "task": config.task,
        "adv/mode": config.advantage_mode, "loss/agg": config.aggregation,
        **({"max_new_tokens": config.make_task().max_new_tokens} if config.task != "sort" else {}),
    }  # fmt: skip


def train(
    config: LMConfig,
    monitor: MetricSink | None = None,
    progress: Callable[[int, float], None] | None = None,
    *,
    guard: GuardConfig | None = None,
    hazard: Callable[[], float | None] = lambda: None,
    alarm: Callable[[], int | None] = lambda: None,
    on_guard: Callable[[Guard], None] = lambda guard: None,
) -> LMResult:
    """Run `config` to the end, the sampler on its own thread; log every step to `monitor`.

    `progress(step, reward)` is called every 100 steps (a host sync, only then). With `guard`,
    a `Guard` watches `alarm()` (the step a critical alert firing on the run started at) and
    `hazard()` (the run's collapse hazard), read after each step, and rolls back
    (learners/lm/guard.py); `on_guard` is handed it once made (to route commands to it).

    Per-step keys (besides stability_metrics'): `grad/norm`, `loss/total`,
    `loss/pg`, `loss/kl`, `reward/zero_std_frac`, `perf/step_s`, `perf/tokens_per_s`,
    `perf/sampler_tokens_per_s`, `perf/wait_s`, `provenance/seq_id_first`,
    `provenance/seq_id_last`, `provenance/sampler_version`; with a length cap (copy)
    stability_metrics' `response/length_mean`, `_max`, `response/truncated_frac` and
    `response/length_cap` too.
    """
    config.check()
    device = torch.device(config.device)
    task = config.make_task()
    model_config = GPTConfig(**{**asdict(SIZES[config.size]), "vocab": task.vocab, "context": task.context})
    torch.manual_seed(config.seed)
    model = GPT(model_config)
    prior = task.prior_logits()
    if prior is not None:  # the task's starting policy (a pretrained model's format)
        with torch.no_grad():
            model.head.bias.copy_(prior)
    model = model.to(device)
    warm_start(model, task, config, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)

    board = WeightBoard(DTYPES[config.sampler_dtype])
    batches: queue.Queue[Rollout | BaseException] = queue.Queue()
    sampler = Sampler(
        model_config, task, board, batches,
        lag=config.lag, prompts=config.prompts, group=config.group, device=device,
        seed=config.seed + 1, logit_noise=config.logit_noise,
    )  # fmt: skip
    guarding = Guard(guard, model, optimizer) if guard is not None else None
    if guarding is not None:
        on_guard(guarding)
    board.publish(0, model)
    sampler.start()
    decode = DECODERS[task.name]
    max_length = task.max_new_tokens if task.eos is not None else None  # a cap only with an EOS
    rewards, step_s, sample_s = [], [], []
    started = time.perf_counter()
    try:
        for step in range(config.steps):
            waited = time.perf_counter()
            rollout = _take(batches, device)
            step_started = time.perf_counter()
            discarded = guarding is not None and guarding.discards(rollout.version)
            out = learner_step(model, optimizer, rollout, config, update=not discarded)
            guarded = {}
            if guarding is not None:  # the guard judges by the reward too: one host read of it a step
                reward = float(rollout.rewards_B.float().mean())
                guarded = {**guarding.after_step(step, hazard(), reward, alarm()), "guard/discarded": float(discarded)}
            board.publish(step + 1, model)
            elapsed = time.perf_counter() - step_started
            tokens = out.mask_B_T.sum()  # answer tokens (a tensor: no host sync)
            if monitor is not None:
                loss_pg, loss_kl = _loss_parts(config.loss, config.aggregation, rollout, out)
                inputs = BatchInputs(  # keel: what the stability metrics read of this batch
                    rollout.sampler_logp_B_T,  # keel: recorded by the sampler, never recomputed
                    out.learner_logp_B_T,  # keel: log π of the same tokens, fp32
                    out.mask_B_T,
                    rewards=rollout.rewards_B,
                    advantages=out.adv_B,
                    gate_mask=out.gate_mask,  # keel: gate/frac
                    logits=out.logits_B_T_V,  # keel: exact policy/entropy
                    sampler_version=rollout.version_B,  # keel: staleness/* from provenance
                    learner_version=step,
                    # keel: the worst sequences' tokens, and their ids
                    token_ids=rollout.tokens_B_L[:, -out.learner_logp_B_T.shape[1] :],
                    seq_ids=rollout.seq_id_B,
                    max_length=max_length,  # keel: response/length_*, truncated_frac
                )
                monitor.log_inputs(  # keel: the stability metrics of this batch, and the loop's own
                    step,
                    inputs,
                    decode=decode,
                    metrics={
                        "grad/norm": out.grad_norm,
                        "loss/total": out.loss,
                        "reward/zero_std_frac": zero_std_frac(
                            rollout.rewards_B, config.advantage_mode, config.group
                        ),
                        "loss/pg": loss_pg,
                        "loss/kl": loss_kl,
                        "perf/step_s": elapsed,
                        "perf/tokens_per_s": tokens / elapsed,
                        "perf/sampler_tokens_per_s": tokens / rollout.sample_s,
                        "perf/wait_s": step_started - waited,
                        "provenance/seq_id_first": rollout.seq_id_B[0],
                        "provenance/seq_id_last": rollout.seq_id_B[-1],
                        "provenance/sampler_version": rollout.version,
                        **guarded,
                    },
                )
            rewards.append(rollout.rewards_B.mean())
            step_s.append(elapsed)
            sample_s.append(rollout.sample_s)
            if progress is not None and (step + 1) % 100 == 0:
                progress(step, float(rewards[-1]))
            if config.step_delay > 0:
                time.sleep(config.step_delay)
    finally:
        sampler.stop.set()
        sampler.join(timeout=30)
    batch_tokens = config.prompts * config.group * task.max_new_tokens
    return LMResult(
        rewards=torch.stack(rewards).tolist(),  # one host sync, at the end
        wall_s=time.perf_counter() - started,
        learner_tokens_per_s=batch_tokens / _median(step_s),
        sampler_tokens_per_s=batch_tokens / _median(sample_s),
    )


SFT_LR = 1e-3
"""The learning rate of the supervised warm start (`LMConfig.sft_steps`)."""


def warm_start(model: GPT, task: Task, config: LMConfig, device: torch.device) -> None:
    """`config.sft_steps` supervised steps (AdamW at SFT_LR, its own optimizer) on the right
    answers to fresh prompts, `prompts · group` a step: the mean cross-entropy of the answer's
    tokens (the copy task's up to and including its <eos>) under teacher forcing."""
    if not config.sft_steps:
        return
    generator = torch.Generator(device).manual_seed(config.seed + 2)  # the sampler's is seed + 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    for _ in range(config.sft_steps):
        prompts_B_P = task.prompts(config.prompts * config.group, generator, device)
        answer_B_T, mask_B_T = task.answers(prompts_B_P)
        tokens_B_L = torch.cat([prompts_B_P, answer_B_T], dim=1)
        logits_B_T_V = model(tokens_B_L[:, :-1])[:, task.prompt_len - 1 :]
        nll_B_T = torch.nn.functional.cross_entropy(logits_B_T_V.transpose(1, 2), answer_B_T, reduction="none")
        loss = (nll_B_T * mask_B_T).sum() / mask_B_T.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _take(batches: queue.Queue[Rollout | BaseException], device: torch.device) -> Rollout:
    item = batches.get()
    if isinstance(item, BaseException):
        raise RuntimeError("the sampler thread failed") from item
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        for tensor in (item.seq_id_B, item.version_B, item.tokens_B_L, item.sampler_logp_B_T, item.rewards_B,
                       *(() if item.mask_B_T is None else (item.mask_B_T,))):  # fmt: skip
            tensor.record_stream(stream)  # made on the sampler's stream, freed after use here
    return item


@dataclass
class StepOutput:
    """What one learner step computed; all detached."""

    learner_logp_B_T: Tensor
    """log π of the sampled answer tokens under the weights before the update, fp32."""
    logits_B_T_V: Tensor
    mask_B_T: Tensor
    adv_B: Tensor
    loss: Tensor
    gate_mask: Tensor
    grad_norm: Tensor
    """Global L2 norm before clipping (non-finite kept)."""


def learner_step(
    model: GPT, optimizer: torch.optim.Optimizer, rollout: Rollout, config: LMConfig, *, update: bool = True
) -> StepOutput:
    """One update on `rollout`: its recorded log μ go straight into the loss (no update, and a
    zero gradient norm, when not `update`). The loss covers the answer's tokens up to and
    including its EOS (`rollout.mask_B_T`), aggregated by `config.aggregation`."""
    prompt_len = config.make_task().prompt_len  # the prompt and "="
    tokens_B_L = rollout.tokens_B_L
    # Position t predicts answer token t.
    logits_B_T_V = model(tokens_B_L[:, :-1])[:, prompt_len - 1 :]
    learner_logp_B_T = (
        logits_B_T_V.log_softmax(-1).gather(-1, tokens_B_L[:, prompt_len:, None]).squeeze(-1)
    )
    mask_B_T = rollout.mask_B_T
    if mask_B_T is None:  # fixed-length answers
        mask_B_T = torch.ones_like(learner_logp_B_T, dtype=torch.bool)
    # FlashREINFORCE is defined with the batch baseline; the others use GRPO's group baseline.
    adv_B = advantages(rollout.rewards_B, config.advantage_mode, config.group)
    loss, gate_mask = policy_loss(
        config.loss, learner_logp_B_T, rollout.sampler_logp_B_T, adv_B, mask_B_T,
        agg=config.aggregation,
    )  # fmt: skip
    optimizer.zero_grad(set_to_none=True)
    if update:
        loss.backward()
        max_norm = config.clip if config.clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # before clipping
        optimizer.step()
    else:
        grad_norm = torch.zeros((), device=loss.device)
    return StepOutput(
        learner_logp_B_T.detach(), logits_B_T_V.detach(), mask_B_T, adv_B, loss.detach(),
        gate_mask, grad_norm,
    )  # fmt: skip


def _loss_parts(loss: str, agg: str, rollout: Rollout, out: StepOutput) -> tuple[Tensor, Tensor]:
    """loss/pg and loss/kl: the policy-gradient term and the penalty (zero for most losses)."""
    terms = loss_terms(loss, out.learner_logp_B_T, rollout.sampler_logp_B_T, out.adv_B, out.mask_B_T)
    weight_B_T = aggregation_weights(out.mask_B_T, agg)
    return -(weight_B_T * terms.pg_B_T).sum(), (weight_B_T * terms.penalty_B_T).sum()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else math.nan
