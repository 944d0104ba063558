"""`keel eval-alerts`' scoring (keel/eval_alerts.py) on a hand-made corpus, and the real rules on it."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from keel.eval_alerts import CorpusRun, collapse_step, evaluate, load_real_runs, score
from server.alerts.hazard import FEATURES, HORIZON, MODEL, HazardModel

BUILT_IN = HazardModel(MODEL)


def _run(name: str, loss: str, collapse: int | None, steps: int = 500, lag: int = 8) -> CorpusRun:
    return CorpusRun(name, {"loss": loss, "lag": lag}, {"reward/mean": [0.5] * steps}, collapse)


CORPUS = [
    _run("hit", "ppo", 300),  # fired at 280: lead 20
    _run("hit-and-early", "ppo", 300),  # fired at 100 (< 300 - 150) and 290: a hit and an early FA
    _run("late", "cispo", 300),  # fired only after its collapse: a miss
    _run("young", "ppo", 40),  # collapse before MIN_HISTORY: scored apart, fired before it
    _run("quiet-bounded", "cispo", None),
    _run("paged-bounded", "tis", None),  # fired twice
    _run("quiet-unbounded", "importance_sampling", None),
    _run("paged-unbounded", "gspo", None),
]
FIRINGS = [[280], [100, 290], [310], [30], [], [50, 200], [], [60]]


def test_score_counts_hits_leads_early_false_alarms_and_history_as_documented() -> None:
    s = score("x", CORPUS, FIRINGS)
    assert (s.collapsing, s.hits, s.leads, s.median_lead) == (3, 2, [10, 20], 15)
    assert (s.leads_at_bound, s.hits_with_lag) == (2, 2)  # leads of 10 and 20 at lag 8: >= lag - 1
    assert s.recall == pytest.approx(2 / 3)
    assert s.early_false_alarms == 1
    assert (s.no_history, s.no_history_fired) == (1, 1)
    assert (s.stable_bounded, s.false_alarms_bounded, s.stable_unbounded, s.false_alarms_unbounded) == (2, 1, 2, 1)
    # (1 stable unbounded run paged + 1 unbounded collapsing run paged early) / (2 + 2 unbounded collapsing)
    assert s.unbounded_rate_with_early == pytest.approx(2 / 4)
    assert s.firings_per_1k_stable_steps == pytest.approx(1000 * 3 / (4 * 350))  # scored steps: 500 - AFTERMATH
    assert s.firings_before_history == 1  # the firing at step 30


def test_a_stable_runs_tail_is_not_scored_and_a_collapse_in_it_is_a_collapse() -> None:
    corpus = [
        _run("late-collapse", "ppo", 420),  # collapses after 350 (500 - AFTERMATH): scored to its collapse
        _run("late-page", "cispo", None),  # fired only in the tail: not judged
        _run("early-then-tail", "ppo", 440),  # fired at 100, before 440 - 150: an early false alarm
    ]
    s = score("x", corpus, [[360], [360, 400], [100]])
    assert (s.collapsing, s.hits, s.leads) == (2, 1, [60])
    assert (s.stable_bounded, s.false_alarms_bounded, s.stable_unbounded) == (1, 0, 0)
    assert s.early_false_alarms == 1


def test_ppo_is_scored_apart() -> None:
    result = evaluate([_corpus_run("ppo-quiet", "ppo", None, {}), _corpus_run("tis-quiet", "tis", None, {})], hazard_model=BUILT_IN, rlwatch=False)
    by_name = {s["detector"]: s for s in result["scores"]}
    assert by_name["  keel critical: PPO"]["stable_unbounded"] == 1 and by_name["  keel critical: PPO"]["stable_bounded"] == 0
    assert by_name["  keel critical: other losses"]["stable_bounded"] == 1


def test_nothing_to_score_is_nan_not_zero() -> None:
    s = score("x", [_run("quiet", "ppo", None)], [[]])
    assert math.isnan(s.recall) and s.median_lead is None and math.isnan(s.fa_bounded_rate)


def _corpus_run(name: str, loss: str, collapse: int | None, kl_at: dict[int, float]) -> CorpusRun:
    """A learning run (reward 0.1 -> 0.9, spread 0.1) with a calm gradient and KL, spiking where asked."""
    steps = 450
    series: dict[str, list[float]] = {
        "reward/mean": [min(0.9, 0.1 + i / 50) for i in range(steps)],
        "reward/std": [0.1] * steps,
        "grad/norm": [1.0] * steps,
        "mismatch/kl": [0.02] * steps,
        "mismatch/ratio_max": [5.0] * steps,
    }
    for step, kl in kl_at.items():
        series["grad/norm"][step] = 20.0
        series["mismatch/kl"][step + 1] = kl
    return CorpusRun(name, {"loss": loss}, series, collapse)


def test_evaluate_replays_the_real_rules_and_breaks_the_union_down_by_rule() -> None:
    corpus = [
        _corpus_run("damaged", "ppo", 250, {240: 3.0}),  # a 20x step, then 3 nats: collapse risk at 241
        _corpus_run("healthy", "ppo", None, {200: 0.05}),  # the same step, the KL stays put
    ]
    result = evaluate(corpus, hazard_model=BUILT_IN, rlwatch=False, details=True)
    by_name = {s["detector"]: s for s in result["scores"]}
    assert by_name["keel critical"]["hits"] == 1 and by_name["keel critical"]["leads"] == [9]
    assert by_name["  collapse risk"]["hits"] == 1 and by_name["  mismatch drift"]["hits"] == 0
    assert by_name["keel critical"]["false_alarms_unbounded"] == 0
    assert "  collapse risk" in result["text"] and result["details"] == []


def test_collapse_label_is_a_fall_that_lasts() -> None:
    fall = [0.1, 0.3, 0.6, 0.55, 0.41, 0.39] + [0.1] * 100
    assert collapse_step(fall) == 5
    assert collapse_step([0.1, 0.45] + [0.2] * 200) is None  # never reached 0.5
    assert collapse_step([0.5, 0.6, 0.7, 0.65, 0.7] + [0.69] * 200) is None


def test_firings_near_a_dip_are_neither_hits_nor_false_alarms() -> None:
    """A dip (a fall that regained) at 200: firings in [50, 300) are not judged either way."""
    rewards = [0.8] * 200 + [0.55] * 20 + [0.8] * 330  # regains at 220
    dipped = CorpusRun.labelled("dipped", {"loss": "ppo", "lag": 4}, {"reward/mean": rewards})
    assert (dipped.collapse_step, dipped.dips) == (None, [200])
    s = score("x", [dipped], [[150]])
    assert (s.false_alarms_unbounded, s.dips, s.dips_fired) == (0, 1, 1)
    s = score("x", [dipped], [[320]])  # after the dip's window: a false alarm
    assert (s.false_alarms_unbounded, s.dips_fired) == (1, 0)
    # A dip, then a collapse that lasts: a firing in the dip's window is no hit, nor early.
    rewards = [0.8] * 100 + [0.55] * 10 + [0.8] * 190 + [0.3] * 150
    run = CorpusRun.labelled("both", {"loss": "ppo", "lag": 4}, {"reward/mean": rewards})
    assert (run.collapse_step, run.dips) == (300, [100])
    s = score("x", [run], [[20, 190]])
    assert (s.hits, s.early_false_alarms, s.dips_fired) == (0, 0, 1)
    s = score("x", [run], [[250]])
    assert (s.hits, s.leads) == (1, [50])


def test_a_lead_under_lag_minus_one_is_not_at_the_physical_bound() -> None:
    s = score("x", [_run("short", "ppo", 300, lag=8), _run("long", "ppo", 300, lag=2)], [[297], [299]])
    assert s.leads == [1, 3] and (s.leads_at_bound, s.hits_with_lag) == (1, 2)  # 3 < 7 at lag 8; 1 >= max(1, 1) at lag 2


def test_the_hazard_is_scored_under_the_model_given() -> None:
    """`hazard > p` and the hazard rules are replayed with the model passed down (as `keel
    eval-alerts --hazard-model` passes its file's): one that always says 1 pages every run,
    one that always says 0 none."""
    corpus = [_corpus_run("damaged", "ppo", 250, {240: 3.0}), _corpus_run("healthy", "cispo", None, {})]
    flat = {"horizon": HORIZON, "features": list(FEATURES), "weights": [0.0] * len(FEATURES),
            "means": [0.0] * len(FEATURES), "scales": [1.0] * len(FEATURES)}  # fmt: skip
    scores = {}
    for name, intercept in (("always", 30.0), ("never", -30.0)):
        result = evaluate(corpus, hazard_model=HazardModel({**flat, "intercept": intercept}), hazard_p=0.5, rlwatch=False)
        scores[name] = {s["detector"]: s for s in result["scores"]}["hazard > 0.5"]
    assert scores["always"]["early_false_alarms"] == 1 and scores["always"]["false_alarms_bounded"] == 1
    assert scores["never"]["hits"] == 0 and scores["never"]["early_false_alarms"] == 0 and scores["never"]["false_alarms_bounded"] == 0


def test_every_real_run_is_sourced_split_and_read_with_its_label() -> None:
    """corpora/real: each run names its repository, commit and path, a split, an outcome; its
    file has a `_step` column and its reward column, read as Keel's reward/mean; a collapsed
    run's label is the manifest's step (a row of the run), a healthy run has none."""
    folder = Path(__file__).resolve().parents[2] / "corpora" / "real"
    manifest = json.loads((folder / "runs.json").read_text(encoding="utf-8"))
    runs = {run.name: run for run in load_real_runs(str(folder))}
    assert len(runs) == len(manifest) >= 19
    for entry in manifest:
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and entry["repo"].count("/") == 1 and entry["path"], entry["file"]
        assert entry["split"] in ("tune", "score"), entry["file"]
        header = (folder / entry["file"]).read_text(encoding="utf-8").splitlines()[0].split(",")
        assert "_step" in header and entry["reward_metric"] in header, entry["file"]
        run = runs[entry["file"]]
        rewards = run.series["reward/mean"]
        assert sum(1 for value in rewards if value is not None) >= 10, entry["file"]
        if entry["collapse_step"] is None:
            assert run.collapse_step is None, entry["file"]
        else:
            assert run.collapse_step is not None and 0 <= run.collapse_step < run.steps, entry["file"]
    # Both splits hold collapses and healthy runs: there is something to tune on and to score.
    for split in ("tune", "score"):
        outcomes = {entry["outcome"] for entry in manifest if entry["split"] == split}
        assert "healthy" in outcomes and any(o.startswith("collapsed") or o == "degraded" for o in outcomes), split


def test_without_scores_every_run_as_if_it_did_not_log_the_metric(tmp_path: Path) -> None:
    """`--without mismatch/ratio_max`: runs whose KL surges while their ratio tail stays flat
    are no mismatch drift with the ratio logged (both must climb) and are caught without it
    (a framework that logs no ratio tail gets the KL's climb alone); the file itself is read
    unchanged."""
    from keel.cli import main
    from keel.eval_alerts import save_corpus

    def surging(collapse: int | None) -> CorpusRun:
        run = _corpus_run("surge" if collapse else "calm", "ppo", collapse, {})
        if collapse:
            run.series["mismatch/kl"] = [0.02 * (math.exp((i - 300) / 6) if i >= 300 else 1.0) * (1.1 if i % 2 else 0.9) for i in range(450)]
            run.series["reward/mean"] = [0.1 if i >= collapse else value for i, value in enumerate(run.series["reward/mean"])]
        else:
            run.series["mismatch/kl"] = [0.02 * (1.1 if i % 2 else 0.9) for i in range(450)]
        return run

    path = tmp_path / "corpus.json"
    save_corpus([surging(330), surging(330), surging(None)], str(path))
    drift = {}
    for without in ([], ["--without", "mismatch/ratio_max"]):
        out = tmp_path / f"scores{len(without)}.json"
        assert main(["eval-alerts", "--corpus", str(path), "--no-rlwatch", "--json", str(out), *without]) == 0
        (result,) = json.loads(out.read_text())
        drift[len(without)] = {s["detector"]: s for s in result["scores"]}["  mismatch drift"]
    assert drift[0]["hits"] == 0 and drift[2]["hits"] == 2 and drift[2]["false_alarms_unbounded"] == 0
    assert "mismatch/ratio_max" in json.loads(path.read_text())["runs"][0]["series"]


def test_the_default_critical_rules_page_no_stable_real_run_at_any_step_and_most_falls_before_them() -> None:
    """docs/alerts.md, "Real runs": with the default rules, no run of corpora/real its manifest
    calls stable is paged at any step, its last 150 included; of the falls with history (at
    row 50 or later), at least 6 have a critical page in the 150 rows before the fall."""
    from keel.eval_alerts import rule_firings
    from server.alerts.catalog import DEFAULT_RULES

    folder = Path(__file__).resolve().parents[2] / "corpora" / "real"
    corpus = load_real_runs(str(folder))
    critical = [rule for rule in DEFAULT_RULES if rule.severity == "critical"]
    firings = rule_firings(corpus, critical)
    paged = {
        run.name: {name: steps[index][0] for name, steps in firings.items() if steps[index]}
        for index, run in enumerate(corpus)
        if run.collapse_step is None and any(steps[index] for steps in firings.values())
    }
    assert paged == {}
    falls = [(index, run.collapse_step) for index, run in enumerate(corpus) if run.collapse_step is not None and run.collapse_step >= 50]
    ahead = [index for index, fall in falls if any(fall - 150 <= step < fall for steps in firings.values() for step in steps[index])]
    assert len(falls) == 7 and len(ahead) >= 6, (len(falls), [corpus[index].name for index, _ in falls if index not in ahead])
