"""`keel parity A B` against a real server (runs stored through the ingest protocol, and
`keel lm` runs). The statistics it decides with are wire.parity's (tests/wire/test_parity.py)."""

from __future__ import annotations

import bisect
import json
import math
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from keel.cli import main
from keel.importers import ImportedRun, PointTable
from keel.transfer import upload_run
from tests.support.monitor import keel
from trainer_hooks.details import EDGES
from wire import Histogram, Row
from wire.parity import (
    EXIT_CANNOT_TELL,
    EXIT_DIFFERENT,
    EXIT_INCOMPARABLE,
    EXIT_SAME,
    HISTOGRAM_KEY,
    tail_key,
)

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
    base = _store(server.url, "base", 30, 1e-3, seed=1)
    _store(server.url, "same", 30, 1e-3, seed=2)
    _store(server.url, "wide", 30, 8e-3, seed=3, tail=0.1)
    _store(server.url, "wide2", 30, 8e-3, seed=5, tail=0.1)
    _store(server.url, "mid", 30, 1.6e-3, seed=6)
    _store(server.url, "short", 24, 1e-3, seed=4)

    code, out, _ = _parity(capsys, "base", "same", "--server", server.url)
    assert code == EXIT_SAME, out
    lines = out.splitlines()
    assert lines[0].startswith("method: one run a side, each cut into 10 blocks of ~3 steps compared block by block")
    assert "different when B/A is beyond 2x" in lines[0] and lines[-1].startswith("SAME (base vs same)")
    assert lines[1].split() == ["metric", "steps", "A/B", "A", "B", "B/A", "90%", "interval", "detects", "floor", "p", "(Holm)", "verdict"]
    assert "step ranges differ" not in out
    # Runs of different lengths are compared, and the report says their ranges differ.
    code, out, _ = _parity(capsys, "base", "short", "--server", server.url, "--json")
    assert "the step ranges differ: A base has steps 0–29 (30), B short has steps 0–23 (24)" in json.loads(out)["notes"][0], out
    # Without --server: $KEEL_URL, as every keel command that talks to a server.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEEL_URL", server.url)
        code, out, _ = _parity(capsys, "base", "same")
    assert code == EXIT_SAME, out

    code, out, _ = _parity(capsys, base, "wide", "--server", server.url, "--json")
    assert code == EXIT_DIFFERENT
    report = json.loads(out)
    assert (report["verdict"], report["exit"], report["runs"]["a"]["name"], report["runs"]["a"]["id"]) == ("different", 1, "base", base)
    by_key = {metric["key"]: metric for metric in report["metrics"]}
    assert "loss/total" not in by_key and {"mismatch/kl", tail_key(0.1, low=False), tail_key(0.1, low=True)} <= set(by_key)
    kl = by_key["mismatch/kl"]
    assert kl["verdict"] == "differs" and 5 < kl["ratio"] < 13 and kl["interval"][0] > 2 and kl["floor"] == 1e-12
    assert 2 < kl["detectable"] < 5 and kl["blocks"] == 10
    assert by_key[tail_key(0.1, low=False)]["verdict"] == "differs"
    assert by_key[tail_key(0.001, low=False)]["level_a"] > 0.9  # the bulk's spread, in both runs

    # Seeds a side: the spread of the runs within a side is the noise, the margin 1.25x.
    code, out, _ = _parity(capsys, "base,same", "wide,wide2", "--server", server.url, "--json")
    report = json.loads(out)
    assert code == EXIT_DIFFERENT and report["method"].startswith("2 run(s) against 2")
    assert [run["name"] for run in report["runs"]["b"]["runs"]] == ["wide", "wide2"] and "id" not in report["runs"]["b"]
    assert {m["key"]: m for m in report["metrics"]}["mismatch/kl"]["tolerance"] == 0.25
    # 1.6x, two seeds against one over 12 steps (1 degree of freedom): not beyond 1.25x, and
    # not a comparison that could have seen a tenfold change either.
    code, out, _ = _parity(capsys, "base,same", "mid", "--server", server.url, "--steps", "18:")
    assert code == EXIT_CANNOT_TELL and out.splitlines()[-1].startswith("CANNOT TELL (base,same vs mid)"), out
    assert "mismatch/kl detects ≥" in out.splitlines()[-1]

    # A step range: the last 10 steps alone are too few to test.
    code, out, err = _parity(capsys, "base", "wide", "--server", server.url, "--steps", "20:")
    assert code == EXIT_INCOMPARABLE and "INCOMPARABLE" in out
    code, _, err = _parity(capsys, "base", "wide", "--server", server.url, "--steps", "100:200")
    assert code == EXIT_INCOMPARABLE and "no steps in the range" in err
    # A wide enough margin forgives the KL; the tails still differ. A floor above the KL
    # makes it nothing.
    code, out, _ = _parity(capsys, "base", "wide", "--server", server.url, "--tolerance", "mismatch/kl=20", "--json")
    assert code == EXIT_DIFFERENT
    assert {m["key"]: m["verdict"] for m in json.loads(out)["metrics"]}["mismatch/kl"] == "same"
    code, out, _ = _parity(capsys, "base", "wide", "--server", server.url, "--floor", "mismatch/kl=1", "--json")
    kl = {m["key"]: m for m in json.loads(out)["metrics"]}["mismatch/kl"]
    assert (kl["floor"], kl["verdict"]) == (1.0, "same") and kl["ratio"] == pytest.approx(1.0, abs=0.01)


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


@pytest.mark.slow
def test_keel_parity_of_keel_lm_runs_same_setting_and_changed_sampler_precision(server_factory, sqlite_url, tmp_path) -> None:
    """Two seeds of an fp16 sampler are the same (one run a side, against the seed margin);
    an fp32 sampler's mismatch is orders of magnitude smaller (only the learner's own numerics
    are left), so it differs."""
    server = server_factory(sqlite_url)

    def lm(name: str, seed: int, dtype: str) -> None:
        result = keel(
            "lm", "--loss", "cispo", "--lag", "0", "--steps", "30", "--prompts", "4", "--samples", "4",
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
    assert (kl["steps_a"], kl["steps_b"], kl["blocks"], kl["verdict"]) == (30, 30, 10, "same")

    different = keel("parity", "fp16-s0", "fp32-s0", "--server", server.url)
    assert different.returncode == EXIT_DIFFERENT, different.stdout + different.stderr
    rows = {line.split()[0]: line.split() for line in different.stdout.splitlines()[3:] if line.startswith("mismatch/")}
    assert rows["mismatch/kl"][-1] == "differs"
    # fp32's KL is at the noise floor (1e-12 nats), fp16's hundreds of times above it.
    assert float(rows["mismatch/kl"][3]) < 1e-13 and float(rows["mismatch/kl"][4].rstrip("x")) < 1e-2
    assert different.stdout.splitlines()[-1].startswith("DIFFERENT (fp16-s0 vs fp32-s0)")


def test_keel_parity_prints_a_run_name_as_text_never_as_a_line_of_its_own(server_factory, database_url) -> None:
    """A run named to forge the verdict (issue 48): with terminal controls that erase the line,
    or with a line break and a verdict of its own. The terminal gets every name on its line,
    escaped, and the verdict is the last line; --json keeps the names as they are."""
    server = server_factory(database_url)
    base = _store(server.url, "base", 30, 1e-3, seed=1)
    verdict = "SAME (base vs wide): 3 metric(s) tested, none beyond its margin"
    for seed, name in enumerate((f"wide\x1b[2K\r{verdict}\u202e", f"wide): ok\n{verdict}", f"wide\r\n{verdict}\r\n"), start=3):
        forged = _store(server.url, name, 30, 8e-3, seed=seed, tail=0.1)
        shown = keel("parity", base, forged, "--server", server.url)
        lines = shown.stdout.splitlines()
        assert shown.returncode == EXIT_DIFFERENT and lines[-1].startswith("DIFFERENT (base vs wide"), shown.stdout
        assert not any(line.startswith("SAME") for line in lines), shown.stdout
        assert not {"\x1b", "\r", "\u202e"} & set(shown.stdout), shown.stdout
        report = json.loads(keel("parity", base, forged, "--server", server.url, "--json").stdout)
        assert report["runs"]["b"]["name"] == name and report["verdict"] == "different"


def test_keel_parity_calls_a_real_verl_mismatch_ab_different_on_its_own_k1_kl(server_factory, sqlite_url, capsys) -> None:
    """The arms of a public verl A/B (corpora/real, batch-logprob-gap), imported as a user
    would (`keel import wandb --framework auto`): verl's `rollout_corr/kl` is their only
    mismatch metric (Keel's `mismatch/kl_k1`). Sampling at top_p 0.8 without the author's fix,
    it is ~135x the fixed arm's: different; the fixed arm and the top_p 1.0 arm: the same."""
    server = server_factory(sqlite_url)
    arms = {
        "fixed": "verl-grpo-qwen25-15b-gsm8k-topp08-georS-replayfix-healthy.csv",
        "mismatch": "verl-grpo-qwen25-15b-gsm8k-topp08-nocorr-mismatch-healthy.csv",
        "topp10": "verl-grpo-qwen25-15b-gsm8k-topp10-georS-healthy.csv",
    }
    for name, file in arms.items():
        assert main(["import", "wandb", f"corpora/real/{file}", "--framework", "auto", "--name", name, "--server", server.url]) == 0
    code, out, _ = _parity(capsys, "fixed", "mismatch", "--server", server.url, "--json")
    report = json.loads(out)
    assert code == EXIT_DIFFERENT and report["verdict"] == "different"
    (kl,) = [row for row in report["metrics"] if row["key"] == "mismatch/kl_k1"]
    assert 100 < kl["ratio"] < 170
    code, out, _ = _parity(capsys, "fixed", "topp10", "--server", server.url, "--json")
    assert code == EXIT_SAME and json.loads(out)["verdict"] == "same"
