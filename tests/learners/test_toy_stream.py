"""`keel sim` and ToyStreamer (what `keel grid --server` uses) stream toy runs with exact values."""

from __future__ import annotations

import pytest

from learners.stream import ToyStreamer
from learners.toy import RunSpec, ToyConfig, simulate
from tests.support.monitor import keel, servers

make_server = pytest.fixture(name="make_server")(servers)

STEPS = 40


def _history(specs: list[RunSpec]) -> dict[str, list[list[float]]]:
    result = simulate(specs, ToyConfig(steps=STEPS), keep_history=True)
    assert result.history is not None
    return {key: values.tolist() for key, values in result.history.items()}


def _runs_by_name(server) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {run["name"]: run for run in server.get("/runs")}


def test_keel_sim_streams_one_toy_run(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    result = keel(
        "sim", "--loss", "cispo", "--lag", "2", "--mismatch", "mild", "--seed", "1",
        "--steps", str(STEPS), "--server", server.url,
        env={"KEEL_SPOOL_DIR": str(tmp_path / "spool")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = _runs_by_name(server)["cispo-lag2-mild-s1"]
    assert (run["group"], run["status"], run["last_step"]) == ("cispo", "finished", STEPS - 1)
    detail = server.run(run["id"])
    assert detail["config"] == {
        "loss": "cispo",
        "lag": 2,
        "mismatch": "mild",
        "seed": 1,
        "steps": STEPS,
    }
    expected = _history([RunSpec("cispo", 2, "mild", 1)])
    # log_batch adds what the toy leaves out: the p99, the unbounded share, the sampler's
    # entropy estimate, the tail.
    added = {
        "mismatch/log_ratio_p99",
        "mismatch/unbounded_frac",
        "policy/entropy_est",
        "mismatch/tail_frac",
    }
    assert set(server.keys(run["id"])) == set(expected) | added
    assert all(count == STEPS for count in server.keys(run["id"]).values())
    for key in ("reward/mean", "mismatch/kl", "gate/frac", "mismatch/ratio_max", "grad/norm"):
        assert server.series(run["id"], key) == (list(range(STEPS)), expected[key][0]), key
    # The step details, with the toy's tokens by name.
    samples = server.get(f"/runs/{run['id']}/samples")
    assert samples["step"] == STEPS - 1 and len(samples["samples"]) == 4
    assert all(token.startswith("v") for token in samples["samples"][0]["tokens"])
    histograms = server.get(f"/runs/{run['id']}/distributions", key="mismatch/log_ratio")
    assert histograms["steps"] == list(range(STEPS))
    assert all(sum(counts) == 8 * 32 * 12 for counts in histograms["counts"])


def test_keel_sim_name_group_and_bad_loss(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    env = {"KEEL_SPOOL_DIR": str(tmp_path / "spool")}
    result = keel(
        "sim", "--loss", "ppo", "--steps", "5", "--server", server.url,
        "--name", "my-ppo", "--group", "baselines", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = _runs_by_name(server)["my-ppo"]
    assert (run["group"], run["last_step"]) == ("baselines", 4)
    bad = keel("sim", "--loss", "nope", "--server", server.url, env=env)
    assert bad.returncode == 2 and "unknown loss 'nope'" in bad.stderr


def test_toy_streamer_streams_a_grid_with_exact_values(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    specs = [RunSpec("reinforce", 0, "none", 0), RunSpec("importance_sampling", 8, "severe", 0)]
    with ToyStreamer(specs, server.url, steps=STEPS, spool_dir=tmp_path) as streamer:
        simulate(specs, ToyConfig(steps=STEPS), on_step=streamer.on_step)
    expected = _history(specs)
    runs = _runs_by_name(server)
    for index, spec in enumerate(specs):
        run = runs[spec.name]
        assert (run["group"], run["status"]) == (spec.loss, "finished")
        for key in ("reward/mean", "grad/norm", "mismatch/ratio_max"):
            assert server.series(run["id"], key) == (list(range(STEPS)), expected[key][index]), key
