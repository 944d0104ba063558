"""The toy off-policy study's simulation (docs/losses.md) as one batched program.

All runs of a grid (losses × lags × mismatch levels × seeds) advance together:
every tensor carries a leading run dimension R, and the gradient on W is
computed analytically (the policy is a linear softmax, ∂log π(x)/∂logits =
onehot(x) − π), so a step is a handful of batched matmuls and elementwise ops
on whatever device the grid lives on.

Reproducibility: a run's trajectory depends only on its own RunSpec. The
problem (F, W*) is drawn on the CPU from `seed`, so it is the same on every
device and for every loss; the sampler noise and the sampling uniforms come
from one generator per seed on the grid's device, drawn in a fixed order each
step. Runs sharing a seed therefore share the problem and the random numbers
(common random numbers: differences between losses are not sampling luck),
and a run executed alone reproduces its numbers from the grid.

Choices the study leaves open (documented in docs/losses.md):
- the noise and the −6 spikes perturb the sampler's logits of all 32×12×8
  (prompt, position, token) entries, redrawn at every step; spikes are the
  entries whose uniform draw is below the level's fraction;
- at step s the sampler uses W_{max(s − lag, 0)} (the initial weights until
  `lag` updates exist);
- loss/total = −(1/32) Σ over prompts, samples and positions of the per-token
  objective (the training loss itself); the ratio is computed in float32.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trainer_hooks.losses import LOSSES
from trainer_hooks.metrics import stability_metrics

__all__ = [
    "DEFAULT_LAGS",
    "DEFAULT_LOSSES",
    "DEFAULT_SEEDS",
    "MISMATCH_LEVELS",
    "MismatchLevel",
    "RunSpec",
    "BatchCallback",
    "StepCallback",
    "ToyBatch",
    "ToyConfig",
    "ToyGrid",
    "ToyResult",
    "grid_specs",
    "simulate",
    "token_texts",
    "weight_gradient",
]

DEFAULT_LOSSES = (
    "reinforce",
    "stable_proxy",
    "importance_sampling",
    "ppo",
    "cispo",
    "cispo_floor",
    "tis",
    "mis",
)
DEFAULT_LAGS = (0, 2, 8, 32)
DEFAULT_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class MismatchLevel:
    sigma: float
    """Std of the Gaussian noise added to every sampler logit."""
    spike_frac: float
    """Fraction of sampler logits lowered by `spike_depth` (the p ≫ q tail)."""
    spike_depth: float = 6.0


MISMATCH_LEVELS = {
    "none": MismatchLevel(0.0, 0.0),
    "mild": MismatchLevel(0.1, 0.005),
    "severe": MismatchLevel(0.2, 0.02),
}


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid."""

    loss: str
    """A key of trainer_hooks.losses.LOSSES."""
    lag: int
    """The sampler uses the weights from `lag` steps ago."""
    mismatch: str
    """A key of MISMATCH_LEVELS."""
    seed: int
    """Draws the problem (F, W*) and the noise; shared by every loss."""

    @property
    def name(self) -> str:
        return f"{self.loss}-lag{self.lag}-{self.mismatch}-s{self.seed}"


@dataclass(frozen=True)
class ToyConfig:
    prompts: int = 32
    positions: int = 12
    vocab: int = 8
    features: int = 24
    samples_per_prompt: int = 8
    """G: samples per prompt; the advantage is the reward minus its group's mean."""
    lr: float = 2.0
    """Plain SGD."""
    steps: int = 600
    final_window: int = 50
    """Final reward = mean reward over the last `final_window` steps."""


StepCallback = Callable[[int, dict[str, Tensor]], None]
"""on_step(step, metrics): metric name -> tensor [R] on the grid's device."""


@dataclass(frozen=True)
class ToyBatch:
    """One step's sampled batch of every run, as `Monitor.log_batch` takes it (per run r:
    `sampler_logp_R_B_T[r]`, ...): what `keel sim` streams with the step details."""

    sampler_logp_R_B_T: Tensor
    learner_logp_R_B_T: Tensor
    tokens_R_B_T: Tensor
    rewards_R_B: Tensor
    advantages_R_B: Tensor
    sampler_version_R: Tensor
    learner_version: int


BatchCallback = Callable[[int, dict[str, Tensor], ToyBatch], None]
"""on_batch(step, metrics, batch): `on_step` with the step's batch."""


def token_texts(token_ids: list[int]) -> list[str]:
    """The toy's tokens have no text: "v0" … "v7" (the `decode` of `keel sim`)."""
    return [f"v{token}" for token in token_ids]


@dataclass
class ToyResult:
    specs: list[RunSpec]
    final_reward: Tensor
    """[R], mean `reward/mean` over the last `final_window` steps."""
    max_grad_norm: Tensor
    """[R], largest `grad/norm` seen (NaN if one was NaN)."""
    wall_s: float
    history: dict[str, Tensor] | None = field(default=None)
    """Metric name -> [R, steps], when asked for."""


def grid_specs(
    losses: Sequence[str] = DEFAULT_LOSSES,
    lags: Sequence[int] = DEFAULT_LAGS,
    mismatches: Sequence[str] = tuple(MISMATCH_LEVELS),
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> list[RunSpec]:
    """Every combination, loss-major."""
    return [RunSpec(*combo) for combo in itertools.product(losses, lags, mismatches, seeds)]


def _run_selector(indices: list[int], device: torch.device) -> slice | Tensor:
    """A slice when the runs are contiguous (loss-major grids): views, not copies."""
    if indices == list(range(indices[0], indices[-1] + 1)):
        return slice(indices[0], indices[-1] + 1)
    return torch.tensor(indices, device=device)


def weight_gradient(
    features_R_N_D: Tensor, pi_R_V_N: Tensor, tokens_R_G_N: Tensor, coef_R_G_N: Tensor, prompts: int
) -> Tensor:
    """∂loss/∂Wᵀ [R, V, D] for loss = −(1/prompts) Σ c · log π(token).

    ∂log π(x)/∂logits = onehot(x) − π, and logits = F·W, so the gradient is
    −(1/prompts) · Mᵀ F with M[v, n] = Σ_g c_g (1[x_g = v] − π_v).
    """
    onehot_sum_R_V_N = torch.zeros_like(pi_R_V_N)
    # One sample at a time: within a call no two sources hit the same entry, so
    # the sum is deterministic even where scatter_add uses atomics (CUDA).
    for g in range(tokens_R_G_N.shape[1]):
        onehot_sum_R_V_N.scatter_add_(1, tokens_R_G_N[:, g : g + 1], coef_R_G_N[:, g : g + 1])
    m_R_V_N = onehot_sum_R_V_N - coef_R_G_N.sum(1, keepdim=True) * pi_R_V_N
    return torch.bmm(m_R_V_N, features_R_N_D) / -prompts


class ToyGrid:
    """State of R toy runs advanced together; `steps()` yields per-step metrics.

    Shapes: R runs, N = prompts × positions, V vocab, D features, G samples.
    """

    def __init__(
        self,
        specs: Sequence[RunSpec],
        config: ToyConfig = ToyConfig(),
        device: str | torch.device = "cpu",
    ) -> None:
        for spec in specs:
            if spec.loss not in LOSSES or spec.mismatch not in MISMATCH_LEVELS or spec.lag < 0:
                raise ValueError(f"bad run spec {spec}")
        self.specs = list(specs)
        self.config = config
        self.device = torch.device(device)
        c, dev, runs = config, self.device, len(self.specs)
        seeds = sorted({spec.seed for spec in self.specs})
        seed_index = torch.tensor([seeds.index(spec.seed) for spec in self.specs], device=dev)

        features_S_N_D, targets_S_N = zip(*(self._problem(seed) for seed in seeds), strict=True)
        self.features_R_N_D = torch.stack(features_S_N_D).to(dev)[seed_index]
        self.features_R_D_N = self.features_R_N_D.transpose(1, 2).contiguous()
        self.targets_R_1_N = torch.stack(targets_S_N).to(dev)[seed_index].unsqueeze(1)
        self.seed_index = seed_index
        # Noise generators live on the device: their streams must not depend on R.
        self.generators = [torch.Generator(dev).manual_seed(2 * seed + 1) for seed in seeds]

        # The noise of a run depends on its (seed, level) only: build it once per pair.
        level_names = sorted({spec.mismatch for spec in self.specs})
        levels = [MISMATCH_LEVELS[name] for name in level_names]
        self.sigma_L_1_1 = torch.tensor([lv.sigma for lv in levels], device=dev).view(-1, 1, 1)
        self.spike_frac_L_1_1 = torch.tensor([lv.spike_frac for lv in levels], device=dev).view(
            -1, 1, 1
        )
        self.spike_depth_L_1_1 = torch.tensor([lv.spike_depth for lv in levels], device=dev).view(
            -1, 1, 1
        )
        self.seed_level_index = seed_index * len(levels) + torch.tensor(
            [level_names.index(spec.mismatch) for spec in self.specs], device=dev
        )
        self.lag_R = torch.tensor([spec.lag for spec in self.specs], device=dev)
        self.run_index_R = torch.arange(runs, device=dev)
        self.loss_groups = {
            name: _run_selector([i for i, s in enumerate(self.specs) if s.loss == name], dev)
            for name in dict.fromkeys(spec.loss for spec in self.specs)
        }
        self.weights_R_V_D = torch.zeros(runs, c.vocab, c.features, device=dev)
        # Ring buffer of past weights: slot s % H holds W_s.
        self.history_H_R_V_D = torch.zeros(
            max(self.lag_R.tolist(), default=0) + 1, *self.weights_R_V_D.shape, device=dev
        )
        self.step_index = 0

    def _problem(self, seed: int) -> tuple[Tensor, Tensor]:
        """F [N, D] and target [N] of a seed, drawn on the CPU so every device agrees."""
        c = self.config
        generator = torch.Generator().manual_seed(2 * seed)
        features = torch.randn(c.prompts, c.positions, c.features, generator=generator)
        w_star = torch.randn(c.features, c.vocab, generator=generator)
        targets = (features @ w_star).argmax(-1)
        return features.reshape(-1, c.features), targets.reshape(-1)

    def _draw_noise(self) -> tuple[Tensor, Tensor]:
        """This step's sampler-logit noise [R, V, N] and sampling uniforms [R, G, N].

        Each seed's generator draws a normal, a spike uniform and a sampling
        uniform per entry, in that order, whatever else is in the grid.
        """
        c, n, dev = self.config, self.config.prompts * self.config.positions, self.device
        draws = [
            (
                torch.randn(c.vocab, n, generator=g, device=dev),
                torch.rand(c.vocab, n, generator=g, device=dev),
                torch.rand(c.samples_per_prompt, n, generator=g, device=dev),
            )
            for g in self.generators
        ]
        normal_S_V_N, spike_S_V_N, uniform_S_G_N = (
            torch.stack(parts) for parts in zip(*draws, strict=True)
        )
        spiked_S_L_V_N = spike_S_V_N.unsqueeze(1) < self.spike_frac_L_1_1
        noise_S_L_V_N = (
            self.sigma_L_1_1 * normal_S_V_N.unsqueeze(1) - self.spike_depth_L_1_1 * spiked_S_L_V_N
        )
        return noise_S_L_V_N.flatten(0, 1)[self.seed_level_index], uniform_S_G_N[self.seed_index]

    def step(self) -> dict[str, Tensor]:
        """Sample with the lagged noisy sampler, take one SGD step; metrics of this step, each [R]."""
        c, s = self.config, self.step_index
        runs, horizon = len(self.specs), self.history_H_R_V_D.shape[0]
        self.history_H_R_V_D[s % horizon] = self.weights_R_V_D
        sampler_slot_R = (s - self.lag_R).clamp_min(0) % horizon
        sampler_weights_R_V_D = self.history_H_R_V_D[sampler_slot_R, self.run_index_R]

        noise_R_V_N, uniform_R_G_N = self._draw_noise()
        learner_logits_R_V_N = torch.bmm(self.weights_R_V_D, self.features_R_D_N)
        sampler_logits_R_V_N = torch.bmm(sampler_weights_R_V_D, self.features_R_D_N) + noise_R_V_N
        logpi_R_V_N = torch.log_softmax(learner_logits_R_V_N, dim=1)
        pi_R_V_N = logpi_R_V_N.exp()
        logmu_R_V_N = torch.log_softmax(sampler_logits_R_V_N, dim=1)

        # Inverse-CDF sampling: token = number of CDF entries ≤ u (uint8 adds are
        # the cheapest on CPU; gather wants int64).
        cdf_R_V_N = logmu_R_V_N.exp().cumsum(1)
        tokens_R_G_N = torch.zeros_like(uniform_R_G_N, dtype=torch.uint8)
        for v in range(c.vocab - 1):
            tokens_R_G_N += (uniform_R_G_N >= cdf_R_V_N[:, v : v + 1]).view(torch.uint8)
        tokens_R_G_N = tokens_R_G_N.long()
        sampler_logp_R_G_N = logmu_R_V_N.gather(1, tokens_R_G_N)
        learner_logp_R_G_N = logpi_R_V_N.gather(1, tokens_R_G_N)

        # Sequences are (sample, prompt) pairs of `positions` tokens: B = G·P.
        seq_shape = (runs, c.samples_per_prompt * c.prompts, c.positions)
        correct_R_B_T = (tokens_R_G_N == self.targets_R_1_N).view(seq_shape)
        reward_R_G_P = correct_R_B_T.float().mean(-1).view(runs, c.samples_per_prompt, c.prompts)
        adv_R_B_1 = (reward_R_G_P - reward_R_G_P.mean(1, keepdim=True)).view(runs, -1, 1)

        coef_R_B_T, objective_R, pg_R, gate_frac_R = self._coefficients(
            learner_logp_R_G_N.view(seq_shape), sampler_logp_R_G_N.view(seq_shape), adv_R_B_1
        )
        grad_R_V_D = weight_gradient(
            self.features_R_N_D, pi_R_V_N, tokens_R_G_N, coef_R_B_T.view_as(tokens_R_G_N), c.prompts
        )
        self.weights_R_V_D = self.weights_R_V_D - c.lr * grad_R_V_D
        self.step_index += 1

        metrics = stability_metrics(
            sampler_logp_R_G_N.view(seq_shape),
            learner_logp_R_G_N.view(seq_shape),
            None,
            rewards=reward_R_G_P.view(runs, -1),
            sampler_version=(s - self.lag_R).clamp_min(0).unsqueeze(-1),
            learner_version=s,
            quantile=False,  # a sort of every run's tokens would cost more than the step
        )
        self.batch = ToyBatch(
            sampler_logp_R_B_T=sampler_logp_R_G_N.view(seq_shape),
            learner_logp_R_B_T=learner_logp_R_G_N.view(seq_shape),
            tokens_R_B_T=tokens_R_G_N.view(seq_shape),
            rewards_R_B=reward_R_G_P.view(runs, -1),
            advantages_R_B=adv_R_B_1.squeeze(-1),
            sampler_version_R=(s - self.lag_R).clamp_min(0),
            learner_version=s,
        )
        del metrics["policy/entropy_est"]  # the exact entropy is cheap here
        metrics["policy/entropy"] = -(pi_R_V_N * logpi_R_V_N).sum(1).mean(-1)
        metrics["gate/frac"] = gate_frac_R
        metrics["grad/norm"] = torch.linalg.vector_norm(grad_R_V_D, dim=(1, 2))
        metrics["loss/total"] = -objective_R / c.prompts
        metrics["loss/pg"] = -pg_R / c.prompts
        metrics["loss/kl"] = (pg_R - objective_R) / c.prompts
        return metrics

    def _coefficients(
        self, logp_R_B_T: Tensor, sampler_logp_R_B_T: Tensor, adv_R_B_1: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """c_t, objective Σ(pg − penalty), Σ pg and gate/frac per run, each loss on its own runs."""
        runs, dev = logp_R_B_T.shape[0], logp_R_B_T.device
        coef_R_B_T = torch.empty_like(logp_R_B_T)
        objective_R = torch.empty(runs, device=dev)
        pg_R = torch.empty(runs, device=dev)
        gate_frac_R = torch.empty(runs, device=dev)
        for name, index in self.loss_groups.items():
            terms = LOSSES[name](
                logp_R_B_T[index], sampler_logp_R_B_T[index], adv_R_B_1[index], None
            )
            coef_R_B_T[index] = terms.coef_B_T
            pg_sum = terms.pg_B_T.sum((1, 2))
            pg_R[index] = pg_sum
            objective_R[index] = pg_sum - terms.penalty_B_T.sum((1, 2))
            gate_frac_R[index] = terms.gate.flatten(1).float().mean(1)
        return coef_R_B_T, objective_R, pg_R, gate_frac_R

    def steps(self, count: int | None = None) -> Iterator[tuple[int, dict[str, Tensor]]]:
        """Advance `count` steps (default: the config's), yielding (step, metrics)."""
        for _ in range(self.config.steps if count is None else count):
            step = self.step_index
            yield step, self.step()


def simulate(
    specs: Sequence[RunSpec],
    config: ToyConfig = ToyConfig(),
    *,
    device: str | torch.device = "cpu",
    on_step: StepCallback | None = None,
    on_batch: BatchCallback | None = None,
    keep_history: bool = False,
) -> ToyResult:
    """Run the grid to the end; stream each step to `on_step` (and with its batch to
    `on_batch`); keep [R, steps] histories if asked.

    Metric keys per step: `reward/mean`, `reward/std`, `mismatch/kl`,
    `mismatch/kl_k1`, `mismatch/kl_k2`, `mismatch/ratio_max`,
    `mismatch/ratio_min`, `mismatch/log_ratio_abs_mean`,
    `mismatch/seq_log_ratio_max`, `mismatch/ess_frac`, `mismatch/bkl_seq_max`,
    `mismatch/bkl_seq_mean`, `gate/frac`, `grad/norm`, `loss/total`,
    `loss/pg`, `loss/kl`, `policy/entropy`, `staleness/lag_mean`,
    `staleness/lag_max`, `batch/seqs`, `batch/tokens`, `batch/len_mean`,
    `nonfinite/count`.
    """
    started = time.perf_counter()
    grid = ToyGrid(specs, config, device)
    runs = len(grid.specs)
    reward_R_S = torch.empty(runs, config.steps, device=grid.device)
    max_grad_R = torch.full((runs,), -torch.inf, device=grid.device)
    history: dict[str, Tensor] | None = None
    for step, metrics in grid.steps():
        reward_R_S[:, step] = metrics["reward/mean"]
        max_grad_R = torch.maximum(max_grad_R, metrics["grad/norm"])
        if keep_history:
            if history is None:
                history = {k: torch.empty(runs, config.steps, device=grid.device) for k in metrics}
            for key, value in metrics.items():
                history[key][:, step] = value
        if on_step is not None:
            on_step(step, metrics)
        if on_batch is not None:
            on_batch(step, metrics, grid.batch)
    final_reward = reward_R_S[:, -config.final_window :].mean(1)
    if grid.device.type == "cuda":
        torch.cuda.synchronize(grid.device)  # note: wall time must include the queued kernels
    return ToyResult(grid.specs, final_reward, max_grad_R, time.perf_counter() - started, history)
