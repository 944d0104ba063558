"""The sampler: an inference engine on its own thread, on stale low-precision weights.

The learner publishes its weights after every step (`WeightBoard.publish`): a
copy cast to the sampler dtype, as an inference engine holds them, tagged with
the policy version (the number of optimizer steps behind them). The sampler
makes batch s as soon as a version >= s − lag is published, with the newest
version it has, and does not wait for anything else: when it is faster than
the learner it runs up to `lag` batches ahead, so staleness comes from the
race between the two threads, bounded by `lag`, never injected. At lag 0 it
waits for every update and only the numerics differ.

Each `Rollout` carries what vLLM/SGLang return with a completion: the sampled
tokens, the log-probability of each one under the distribution it was drawn
from (recorded here, at sampling time, and never recomputed), a sequence id
and the policy version that generated it.

With a task that has an end-of-sequence token (`copy`), a sequence stops at its
EOS or at the length cap (`max_new_tokens`), as an engine's `max_tokens`: after the
EOS its places hold EOS again, log μ 0 and mask 0, so the mask covers exactly the
answer, EOS included.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from learners.lm.model import GPT, GPTConfig, KVCache
from learners.lm.task import Task

__all__ = ["DTYPES", "Rollout", "Sampler", "WeightBoard"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# How often a waiting sampler looks at its stop flag.
_POLL_S = 0.1


@dataclass
class Rollout:
    """One batch, as the sampler made it: B = prompts × group sequences of prompt + answer."""

    index: int
    """Batch number s; the learner trains on batch s at step s."""
    version: int
    """Policy version of the weights that sampled every sequence of this batch."""
    seq_id_B: Tensor
    """int64 [B]: unique sequence ids, index·B … index·B + B − 1."""
    version_B: Tensor
    """int64 [B]: the policy version of each sequence (what `staleness/*` is computed from)."""
    tokens_B_L: Tensor
    """int64 [B, L]: prompt, "=", answer; the G samples of a prompt are consecutive."""
    sampler_logp_B_T: Tensor
    """float32 [B, T]: log μ of each answer token, from the sampler's own logits (0 after EOS)."""
    rewards_B: Tensor
    """float32 [B]: in [0, 1] (copy: minus the truncation penalty for a cut answer)."""
    sample_s: float
    """Wall time the sampler spent generating this batch."""
    mask_B_T: Tensor | None = None
    """bool [B, T]: the answer's tokens, up to and including its EOS (all of them without
    an EOS token, or when the answer was cut at the cap). None: every token."""


class WeightBoard:
    """Where the learner publishes weights and the sampler picks them up (a condition variable)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._cond = threading.Condition()
        self._version = -1
        self._weights: dict[str, Tensor] = {}
        self._ready: torch.cuda.Event | None = None

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Snapshot `model` cast to the sampler dtype as `version` (called by the learner)."""
        weights = {
            name: tensor.detach().to(self.dtype, copy=True)
            for name, tensor in model.state_dict().items()
        }
        ready = None
        if next(iter(weights.values())).is_cuda:
            ready = torch.cuda.Event()
            ready.record()  # the sampler's stream waits for this copy, not the host
        with self._cond:
            self._version, self._weights, self._ready = version, weights, ready
            self._cond.notify_all()

    def wait_for(
        self, min_version: int, stop: threading.Event
    ) -> tuple[int, dict[str, Tensor], torch.cuda.Event | None] | None:
        """The newest (version, weights, event) once version >= min_version; None if stopped."""
        with self._cond:
            while self._version < min_version:
                if stop.is_set():
                    return None
                self._cond.wait(_POLL_S)
            return self._version, self._weights, self._ready


class Sampler(threading.Thread):
    """Generates batch after batch into `out`; an exception is put there too, for the learner."""

    def __init__(
        self,
        model_config: GPTConfig,
        task: Task,
        board: WeightBoard,
        out: queue.Queue[Rollout | BaseException],
        *,
        lag: int,
        prompts: int,
        group: int,
        device: torch.device,
        seed: int,
        logit_noise: float = 0.0,
    ) -> None:
        super().__init__(name="lm-sampler", daemon=True)
        self.task, self.board, self.out = task, board, out
        self.lag, self.prompts, self.group, self.device = lag, prompts, group, device
        self.model = GPT(model_config).to(device=device, dtype=board.dtype).eval()
        self.version = -1
        self.generator = torch.Generator(device).manual_seed(seed)
        # The planted change draws from its own generator, so the sampling draws (prompts,
        # Gumbel noise) are those of the same seed without it: only μ differs.
        self.logit_noise = logit_noise
        self.noise_generator = torch.Generator(device).manual_seed(seed + 1_000_003)
        self.stop = threading.Event()
        # On a GPU the sampler gets its own stream, as an inference engine beside the trainer.
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def run(self) -> None:
        try:
            with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
                index = 0
                while not self.stop.is_set():
                    published = self.board.wait_for(index - self.lag, self.stop)
                    if published is None:
                        return
                    self._load(*published)
                    # Like an engine that batches every request it may serve: all the batches
                    # this version is allowed to make (up to lag + 1) in one generation.
                    count = self.version + self.lag - index + 1
                    for rollout in self.generate(index, count):
                        self.out.put(rollout)
                    index += count
        except BaseException as exc:  # noqa: BLE001 - handed to the learner, which re-raises
            self.out.put(exc)

    def _load(self, version: int, weights: dict[str, Tensor], ready: torch.cuda.Event | None) -> None:
        if version == self.version:
            return
        if ready is not None and self.stream is not None:
            self.stream.wait_event(ready)
            for tensor in weights.values():
                tensor.record_stream(self.stream)  # freed by the learner, read here
        self.model.load_state_dict(weights)
        self.version = version

    @torch.no_grad()
    def generate(self, index: int, count: int = 1) -> list[Rollout]:
        """Batches index … index + count − 1: `group` answers per prompt, log μ of each token."""
        started = time.perf_counter()
        batch, cap, eos = self.prompts * self.group, self.task.max_new_tokens, self.task.eos
        prompts_N_P = self.task.prompts(count * self.prompts, self.generator, self.device)
        tokens_N_L = prompts_N_P.repeat_interleave(self.group, dim=0)
        cache = KVCache(len(self.model.blocks))
        next_N_1 = tokens_N_L
        logps, masks = [], []
        done_N_1 = torch.zeros((tokens_N_L.shape[0], 1), dtype=torch.bool, device=self.device)
        for position in range(cap):
            # Logits come out of the low-precision model; like vLLM, sample and take
            # log-probabilities from them in float32.
            logits_N_V = self.model(next_N_1, cache)[:, -1].float()
            if self.logit_noise:  # LMConfig.logit_noise: an engine change of known size
                noise_N_V = torch.randn(logits_N_V.shape, generator=self.noise_generator, device=self.device)
                logits_N_V = logits_N_V + self.logit_noise * noise_N_V
            logp_N_V = logits_N_V.log_softmax(-1)
            uniform_N_V = torch.rand(logp_N_V.shape, generator=self.generator, device=self.device)
            # Gumbel-max: an exact draw from softmax(logp) with no host sync.
            gumbel_N_V = -(-uniform_N_V.clamp_min(1e-20).log()).log()
            next_N_1 = (logp_N_V + gumbel_N_V).argmax(-1, keepdim=True)
            logp_N_1 = logp_N_V.gather(1, next_N_1)
            if eos is not None:  # a finished answer is padded: EOS, log μ 0, mask 0
                masks.append(~done_N_1)
                next_N_1 = torch.where(done_N_1, eos, next_N_1)
                logp_N_1 = torch.where(done_N_1, 0.0, logp_N_1)
                done_N_1 = done_N_1 | (next_N_1 == eos)
            logps.append(logp_N_1)
            tokens_N_L = torch.cat([tokens_N_L, next_N_1], dim=1)
            # On a CPU (no sync to pay), stop once every answer has ended, as an engine does.
            if eos is not None and self.stream is None and position + 1 < cap and bool(done_N_1.all()):
                rest = cap - position - 1
                tokens_N_L = torch.cat([tokens_N_L, tokens_N_L.new_full((tokens_N_L.shape[0], rest), eos)], 1)
                logps.append(logp_N_1.new_zeros((logp_N_1.shape[0], rest)))
                masks.append(done_N_1.new_zeros((done_N_1.shape[0], rest)))
                break
        sampler_logp_N_T = torch.cat(logps, dim=1)
        mask_N_T = torch.cat(masks, dim=1) if masks else torch.ones_like(sampler_logp_N_T, dtype=torch.bool)
        rewards_N = self.task.reward(tokens_N_L)
        seq_id_N = torch.arange(index * batch, (index + count) * batch, device=self.device)
        if self.stream is not None:
            self.stream.synchronize()  # a finished generation, as an engine returns it
        sample_s = (time.perf_counter() - started) / count
        return [
            Rollout(
                index=index + i,
                version=self.version,
                seq_id_B=seq_id_N[part],
                version_B=torch.full((batch,), self.version, device=self.device),
                tokens_B_L=tokens_N_L[part],
                sampler_logp_B_T=sampler_logp_N_T[part],
                rewards_B=rewards_N[part],
                sample_s=sample_s,
                mask_B_T=mask_N_T[part],
            )
            for i, part in enumerate(slice(j * batch, (j + 1) * batch) for j in range(count))
        ]
