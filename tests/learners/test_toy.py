"""The batched toy grid (docs/losses.md): analytic gradient, determinism, streaming API, CLI and the toy study's findings."""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from learners import toy_cli
from learners.toy import (
    DEFAULT_LAGS,
    RunSpec,
    ToyConfig,
    ToyGrid,
    grid_specs,
    simulate,
    weight_gradient,
)
from trainer_hooks.losses import LOSSES, compute_advantages, loss_terms, policy_loss


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run single-threaded, then restore the process's setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Single-threaded, as `keel grid` on a busy machine (see toy_cli.idle_cores):
# several times faster when other tests share the CPU; results are the same.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "name", ["reinforce", "stable_proxy", "importance_sampling", "ppo", "cispo", "mis", "dro"]
)
def test_analytic_gradient_matches_autograd(name: str) -> None:
    """weight_gradient(coefficients) == autograd of policy_loss(token_sum) / prompts w.r.t. W."""
    runs, prompts, positions, vocab, features, group = 2, 3, 4, 5, 6, 2
    n = prompts * positions
    generator = torch.Generator().manual_seed(1)
    features_R_N_D = torch.randn(runs, n, features, generator=generator, dtype=torch.float64)
    weights = torch.randn(
        runs, vocab, features, generator=generator, dtype=torch.float64, requires_grad=True
    )
    tokens_R_G_N = torch.randint(0, vocab, (runs, group, n), generator=generator)
    logpi_R_V_N = torch.log_softmax(torch.bmm(weights, features_R_N_D.transpose(1, 2)), dim=1)
    learner_R_B_T = logpi_R_V_N.gather(1, tokens_R_G_N).view(runs, group * prompts, positions)
    sampler_R_B_T = learner_R_B_T.detach() - 0.5 * torch.randn(
        learner_R_B_T.shape, generator=generator, dtype=torch.float64
    )
    rewards_R_G_P = torch.rand(runs, group, prompts, generator=generator, dtype=torch.float64)
    adv_R_B = (
        compute_advantages(rewards_R_G_P.transpose(1, 2), "group", group)
        .transpose(1, 2)
        .reshape(runs, -1)
    )
    mask = torch.ones(learner_R_B_T.shape)

    loss, _ = policy_loss(name, learner_R_B_T, sampler_R_B_T, adv_R_B, mask, agg="token_sum")
    (autograd_R_V_D,) = torch.autograd.grad(loss / prompts, weights)
    coef = loss_terms(name, learner_R_B_T.detach(), sampler_R_B_T, adv_R_B, mask).coef_B_T
    analytic = weight_gradient(
        features_R_N_D,
        logpi_R_V_N.detach().exp(),
        tokens_R_G_N,
        coef.reshape(runs, group, n),
        prompts,
    )
    torch.testing.assert_close(analytic, autograd_R_V_D, rtol=1e-10, atol=1e-12)


MIXED = [
    RunSpec("importance_sampling", 8, "severe", 1),
    RunSpec("cispo", 0, "mild", 0),
    RunSpec("ppo", 2, "severe", 0),
    RunSpec("mis", 32, "mild", 2),
    RunSpec("stable_proxy", 2, "none", 1),
    RunSpec("dro", 0, "severe", 2),
    RunSpec("gspo", 8, "mild", 0),
    RunSpec("flash_reinforce", 2, "severe", 1),
]


def test_a_run_alone_reproduces_its_numbers_in_the_grid() -> None:
    config = ToyConfig(steps=80)
    grid = simulate(MIXED, config, keep_history=True)
    assert grid.history is not None
    for index in (0, 3, 7):
        alone = simulate([MIXED[index]], config, keep_history=True)
        assert alone.history is not None
        for key, series in grid.history.items():
            torch.testing.assert_close(alone.history[key][0], series[index], rtol=0, atol=0, equal_nan=True, msg=str((MIXED[index], key)))
    # Nor does it depend on the number of CPU threads (keel grid picks it by load).
    torch.set_num_threads(2)
    two_threads = simulate(MIXED[:3], ToyConfig(steps=30), keep_history=True).history
    torch.set_num_threads(1)
    assert two_threads is not None
    for key, series in two_threads.items():
        torch.testing.assert_close(series, grid.history[key][:3, :30], rtol=0, atol=0, equal_nan=True, msg=key)
    # Different runs really differ (the check above is not vacuous).
    assert not torch.equal(grid.history["reward/mean"][0], grid.history["reward/mean"][1])


def test_same_seed_shares_the_problem_and_noise_across_losses() -> None:
    specs = [RunSpec(loss, 0, "severe", 4) for loss in ("reinforce", "tis", "importance_sampling")]
    specs.append(RunSpec("reinforce", 0, "severe", 5))
    history = simulate(specs, ToyConfig(steps=2), keep_history=True).history
    assert history is not None
    # W₀ = 0 everywhere: step 0 samples identically for a shared seed, differently for another.
    first = history["reward/mean"][:, 0]
    assert first[0] == first[1] == first[2] and first[3] != first[0]
    # The severe noise makes r ≠ 1 at once, so the three losses already differ.
    assert len(set(history["loss/total"][:3, 0].tolist())) == 3


def test_lag_uses_initial_then_stale_weights() -> None:
    specs = [RunSpec("reinforce", lag, "none", 0) for lag in (0, 3)]
    history = simulate(specs, ToyConfig(steps=6), keep_history=True).history
    assert history is not None
    kl = history["mismatch/kl"]
    assert (kl[0] == 0).all() and (
        history["mismatch/ratio_max"][0] == 1
    ).all()  # on-policy, no noise
    assert kl[1, 0] == 0 and (kl[1, 1:] > 0).all()  # W₀ until 3 updates exist, then W_{s−3}
    assert history["staleness/lag_mean"][1].tolist() == [0, 1, 2, 3, 3, 3]
    assert history["staleness/lag_max"][0].tolist() == [0] * 6


def test_on_step_streams_every_metric_for_every_run() -> None:
    specs = [
        RunSpec("cispo", 2, "mild", 0),
        RunSpec("mis", 0, "severe", 1),
        RunSpec("ppo", 8, "none", 2),
    ]
    seen: list[int] = []
    keys: set[str] = set()

    def on_step(step: int, metrics: dict[str, torch.Tensor]) -> None:
        seen.append(step)
        keys.update(metrics)
        for value in metrics.values():
            assert value.shape == (3,) and value.dtype == torch.float32

    result = simulate(specs, ToyConfig(steps=7, final_window=3), on_step=on_step, keep_history=True)
    assert seen == list(range(7))
    assert {
        "reward/mean",
        "reward/std",
        "mismatch/kl",
        "mismatch/kl_k1",
        "mismatch/ratio_max",
        "mismatch/ratio_min",
        "mismatch/ess_frac",
        "mismatch/log_ratio_abs_mean",
        "gate/frac",
        "grad/norm",
        "loss/total",
        "policy/entropy",
    } <= keys
    assert result.history is not None and set(result.history) == keys
    assert all(series.shape == (3, 7) for series in result.history.values())
    reward = result.history["reward/mean"]
    torch.testing.assert_close(result.final_reward, reward[:, -3:].mean(1))
    torch.testing.assert_close(result.max_grad_norm, result.history["grad/norm"].amax(1))
    assert result.history["policy/entropy"][0, 0].item() == pytest.approx(
        torch.log(torch.tensor(8.0)).item()
    )
    assert result.history["batch/tokens"][0, 0].item() == 32 * 8 * 12
    # Gated units are tokens for cispo and sequences for mis; both are fractions.
    assert ((result.history["gate/frac"] >= 0) & (result.history["gate/frac"] <= 1)).all()


def test_grid_iterator_matches_simulate() -> None:
    specs = [RunSpec("tis", 2, "severe", 0)]
    grid = ToyGrid(specs, ToyConfig(steps=5))
    rewards = [metrics["reward/mean"][0].item() for _, metrics in grid.steps()]
    history = simulate(specs, ToyConfig(steps=5), keep_history=True).history
    assert history is not None and rewards == history["reward/mean"][0].tolist()


def test_bad_specs_are_rejected() -> None:
    for spec in (
        RunSpec("nope", 0, "none", 0),
        RunSpec("tis", -1, "none", 0),
        RunSpec("tis", 0, "wild", 0),
    ):
        with pytest.raises(ValueError):
            ToyGrid([spec])


# The toy study's findings (docs/losses.md) on the default grid minus seed 0 and lag 2 (half
# the runs, all 8 losses, 3 mismatch levels, 600 steps); the findings hold on the
# full grid too (`keel grid`, bench/grid.py). The largest IS and PPO gradient
# norms come from seed 2, so that seed has to stay.
FINDINGS_SEEDS = (1, 2)
FINDINGS_LAGS = (0, 8, 32)


@pytest.fixture(scope="module")
def findings_runs() -> list[dict]:
    toy_cli.keep_freed_memory()  # as `keel grid` does: ~25 % faster, results unchanged
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see one_thread
    try:
        specs = grid_specs(lags=FINDINGS_LAGS, seeds=FINDINGS_SEEDS)
        result = simulate(specs, ToyConfig())
    finally:
        torch.set_num_threads(threads)
    return [
        {"loss": s.loss, "lag": s.lag, "final_reward": r, "max_grad_norm": g}
        for s, r, g in zip(
            specs, result.final_reward.tolist(), result.max_grad_norm.tolist(), strict=True
        )
    ]


def _cell(runs: list[dict], loss: str, lag: int) -> float:
    values = [run["final_reward"] for run in runs if run["loss"] == loss and run["lag"] == lag]
    return sum(values) / len(values)


def _max_grad(runs: list[dict], loss: str) -> float:
    return max(run["max_grad_norm"] for run in runs if run["loss"] == loss)


@pytest.mark.slow
def test_findings_only_unbounded_losses_collapse(findings_runs: list[dict]) -> None:
    below = {run["loss"] for run in findings_runs if run["final_reward"] < 0.9}
    assert below == {"importance_sampling", "ppo"}
    bounded = ("reinforce", "stable_proxy", "cispo", "cispo_floor", "tis", "mis")
    assert max(_max_grad(findings_runs, loss) for loss in bounded) < 3.3
    for loss in ("importance_sampling", "ppo"):
        assert _max_grad(findings_runs, loss) > 33.0, loss


def test_findings_lag_costs(findings_runs: list[dict]) -> None:
    def loss_to_lag(loss: str) -> float:
        return _cell(findings_runs, loss, 0) - _cell(findings_runs, loss, 32)

    assert loss_to_lag("reinforce") >= 0.02
    assert loss_to_lag("cispo") < 0.01 and loss_to_lag("tis") < 0.01
    # The sampler KL term helps at lag 32; the CISPO floor costs there, not at lag 0.
    assert _cell(findings_runs, "stable_proxy", 32) > _cell(findings_runs, "reinforce", 32) + 0.01
    assert _cell(findings_runs, "cispo_floor", 32) < _cell(findings_runs, "cispo", 32) - 0.01
    assert abs(_cell(findings_runs, "cispo_floor", 0) - _cell(findings_runs, "cispo", 0)) < 0.005


def test_keel_grid_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    help_text, add_arguments, run = toy_cli.COMMANDS["grid"]
    add_arguments(parser)
    json_path = tmp_path / "grid.json"
    args = parser.parse_args(
        [
            "--losses",
            "reinforce,tis",
            "--seeds",
            "0",
            "--lags",
            "0,8",
            "--steps",
            "20",
            "--json",
            str(json_path),
        ]
    )
    out = io.StringIO()
    steps: list[int] = []
    assert run(args, on_step=lambda step, metrics: steps.append(step), out=out) == 0
    assert steps == list(range(20))
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["loss", "lag", "0", "lag", "8", "<", "0.9", "max", "|g|"]
    assert [line.split()[0] for line in lines[1:3]] == ["reinforce", "tis"]
    report = json.loads(json_path.read_text())
    assert set(report) == {"wall_s", "device", "runs"} and report["device"] == "cpu"
    assert len(report["runs"]) == 2 * 2 * 3
    assert set(report["runs"][0]) == {
        "loss",
        "lag",
        "mismatch",
        "seed",
        "final_reward",
        "max_grad_norm",
    }
    assert {run["mismatch"] for run in report["runs"]} == {"none", "mild", "severe"}
    cell = [r["final_reward"] for r in report["runs"] if r["loss"] == "tis" and r["lag"] == 8]
    assert f"{sum(cell) / 3:.3f}" in lines[2]
    assert "grid" in help_text.lower()
    assert run(parser.parse_args(["--losses", "nope"]), out=io.StringIO()) == 2
    if not torch.cuda.is_available():
        assert run(parser.parse_args(["--device", "cuda"]), out=io.StringIO()) == 2
    assert 1 <= toy_cli.idle_cores() <= (os.cpu_count() or 1)


def test_toy_cli_imports_only_the_standard_library_at_module_level() -> None:
    tree = ast.parse(Path(toy_cli.__file__).read_text())
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_default_grid_is_the_seeds() -> None:
    specs = grid_specs()
    assert len(specs) == 8 * 4 * 3 * 3 and DEFAULT_LAGS == (0, 2, 8, 32)
    assert {s.loss for s in specs} <= set(LOSSES)
