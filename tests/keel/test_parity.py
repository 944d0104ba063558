"""`keel parity A B` against a real server (runs stored through the ingest protocol, and
`keel lm` runs). The statistics it decides with are dashboard.parity's (tests/dashboard/test_parity.py)."""

from __future__ import annotations

import bisect
import json
import math
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from dashboard.parity import EXIT_DIFFERENT, EXIT_INCOMPARABLE, EXIT_SAME, HISTOGRAM_KEY, tail_key
from keel.cli import main
from keel.importers import ImportedRun, PointTable
from keel.transfer import upload_run
from tests.support.monitor import keel
from trainer_hooks.details import EDGES
from wire import Histogram, Row

# -- the command against a real server -----------------------------------------------------------


def _histogram(values: list[float]) -> list[int]:
    """Counts on EDGES as trainer_hooks.details bins them: [e(i), e(i+1)), the rest in the end bins."""
    counts = [0] * (len(EDGES) - 1)
    for value in values:
        counts[min(max(bisect.bisect_right(EDGES, value) - 1, 0), len(counts) - 1)] += 1
    return counts


def _store(url: str, name: str, steps: int, kl: float, *, seed: int, tail: float = 0.01, identity: str | None = None) -> str:
    """A run with the mismatch scalars and a log-ratio histogram per step, stored through
    the ingest protocol: per-step values varying around `kl`, a histogram whose tail
    (|ℓ| ≥ 0.1) holds about `tail` of the tokens."""
    rng = random.Random(seed)
    rows = []
    for step in range(steps):
        tokens = [rng.gauss(0, 0.01) if rng.random() > tail else rng.gauss(0, 1.0) for _ in range(400)]
        values = {
            "mismatch/kl": kl * math.exp(rng.gauss(0, 0.3)),
            "mismatch/tail_frac": sum(abs(t) >= 1 for t in tokens) / len(tokens),
            "loss/total": rng.random(),
        }
        rows.append(Row(step=step, time=None, values=values, histograms={HISTOGRAM_KEY: Histogram(edges=list(EDGES), counts=_histogram(tokens))}))
    table = PointTable()
    run = ImportedRun(identity=identity or f"parity-test/{name}/{seed}", name=name, table=table)
    assert upload_run(run, rows, url, timeout=60) is None
    return run.run_id


def _parity(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["parity", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_keel_parity_over_a_real_server(server_factory, sqlite_url, capsys) -> None:
    server = server_factory(sqlite_url)
    base = _store(server.url, "base", 16, 1e-3, seed=1)
    _store(server.url, "same", 16, 1e-3, seed=2)
    _store(server.url, "double", 16, 2e-3, seed=3, tail=0.03)

    _store(server.url, "short", 12, 1e-3, seed=4)

    code, out, _ = _parity(capsys, "base", "same", "--server", server.url)
    assert code == EXIT_SAME, out
    assert out.splitlines()[-1].startswith("SAME (base vs same)")
    assert "step ranges differ" not in out
    # Runs of different lengths are compared, and the report says their ranges differ.
    code, out, _ = _parity(capsys, "base", "short", "--server", server.url, "--json")
    assert "the step ranges differ: A has steps 0–15 (16), B has steps 0–11 (12)" in json.loads(out)["notes"][0], out
    # Without --server: $KEEL_URL, as every keel command that talks to a server.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEEL_URL", server.url)
        code, out, _ = _parity(capsys, "base", "same")
    assert code == EXIT_SAME, out

    code, out, _ = _parity(capsys, base, "double", "--server", server.url, "--json")
    assert code == EXIT_DIFFERENT
    report = json.loads(out)
    assert (report["verdict"], report["exit"], report["runs"]["a"]["name"]) == ("different", 1, "base")
    by_key = {metric["key"]: metric for metric in report["metrics"]}
    assert "loss/total" not in by_key and {"mismatch/kl", tail_key(0.1, low=False), tail_key(0.1, low=True)} <= set(by_key)
    assert by_key["mismatch/kl"]["verdict"] == "differs" and 1.5 < by_key["mismatch/kl"]["ratio"] < 2.7
    assert by_key[tail_key(0.1, low=False)]["verdict"] == "differs"
    assert by_key[tail_key(0.001, low=False)]["median_a"] > 0.9  # the bulk's spread, in both runs

    # A step range: the last 4 steps alone are too few to decide.
    code, out, err = _parity(capsys, "base", "double", "--server", server.url, "--steps", "12:")
    assert code == EXIT_INCOMPARABLE and "INCOMPARABLE" in out
    code, _, err = _parity(capsys, "base", "double", "--server", server.url, "--steps", "100:200")
    assert code == EXIT_INCOMPARABLE and "no steps in the range" in err
    # A wide enough tolerance forgives the doubled KL; the tails still differ.
    code, out, _ = _parity(capsys, "base", "double", "--server", server.url, "--tolerance", "mismatch/kl=1.5", "--json")
    assert code == EXIT_DIFFERENT
    assert {m["key"]: m["verdict"] for m in json.loads(out)["metrics"]}["mismatch/kl"] == "same"


def test_keel_parity_cannot_compare_unknown_ambiguous_or_metricless_runs(server_factory, sqlite_url, capsys) -> None:
    server = server_factory(sqlite_url)
    _store(server.url, "base", 10, 1e-3, seed=1)
    _store(server.url, "twin", 10, 1e-3, seed=2, identity="one")
    _store(server.url, "twin", 10, 1e-3, seed=3, identity="two")
    table = PointTable()
    for step in range(10):
        table.add(step, "loss/total", float(step))
    assert upload_run(ImportedRun(identity="no-mismatch", name="plain", table=table), table.rows(), server.url, timeout=60) is None

    code, _, err = _parity(capsys, "base", "nope", "--server", server.url)
    assert code == EXIT_INCOMPARABLE and "no run with id or name 'nope'" in err
    code, _, err = _parity(capsys, "base", "twin", "--server", server.url)
    assert code == EXIT_INCOMPARABLE and "2 runs are named 'twin'" in err
    code, out, err = _parity(capsys, "base", "plain", "--server", server.url, "--json")
    assert code == EXIT_INCOMPARABLE and "share no mismatch metric" in err
    assert json.loads(out)["verdict"] == "incomparable"
    code, _, err = _parity(capsys, "base", "base", "--server", "http://127.0.0.1:9")
    assert code == EXIT_INCOMPARABLE and "cannot reach" in err


# -- end to end: `keel lm` runs -----------------------------------------------------------------


def test_keel_parity_of_keel_lm_runs_same_setting_and_changed_sampler_precision(server_factory, sqlite_url, tmp_path) -> None:
    """Two seeds of an fp16 sampler are the same; an fp32 sampler's mismatch is orders of
    magnitude smaller (only the learner's own numerics are left), so it differs."""
    server = server_factory(sqlite_url)

    def lm(name: str, seed: int, dtype: str) -> None:
        result = keel(
            "lm", "--loss", "cispo", "--lag", "0", "--steps", "12", "--prompts", "4", "--samples", "4",
            "--digits", "4", "--sampler-dtype", dtype, "--seed", str(seed), "--server", server.url, "--name", name,
            env={"KEEL_SPOOL_DIR": str(tmp_path / "spool")},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lm, ("fp16-s0", "fp16-s1", "fp32-s0"), (0, 1, 0), ("fp16", "fp16", "fp32")))

    same = keel("parity", "fp16-s0", "fp16-s1", "--server", server.url, "--json")
    assert same.returncode == EXIT_SAME, same.stdout + same.stderr
    report = json.loads(same.stdout)
    kl = {metric["key"]: metric for metric in report["metrics"]}["mismatch/kl"]
    assert (kl["steps_a"], kl["steps_b"], kl["verdict"]) == (12, 12, "same")

    different = keel("parity", "fp16-s0", "fp32-s0", "--server", server.url)
    assert different.returncode == EXIT_DIFFERENT, different.stdout + different.stderr
    rows = {line.split()[0]: line.split() for line in different.stdout.splitlines()[2:] if line.startswith("mismatch/")}
    assert rows["mismatch/kl"][-1] == "differs"
    assert float(rows["mismatch/kl"][4].rstrip("x")) < 1e-3  # fp32's KL is > 1000x smaller
    assert different.stdout.splitlines()[-1].startswith("DIFFERENT (fp16-s0 vs fp32-s0)")
