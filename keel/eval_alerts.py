"""`keel eval-alerts`: score critical alerts on a labelled corpus of toy runs.

The corpus is the toy grid (learners.toy). A run *collapses* when its
reward reached >= 0.5 and later fell >= 0.2 below its running peak; the
collapse step is the first such step. Every run is replayed through the real
ingest websocket of an in-process server (so the real alert engine with the
default rules evaluates it), and the first critical alert of each run is
compared with the label:

- recall: collapsing runs with a critical alert fired before the collapse step;
- lead: collapse step minus that alert's step (median over the recalled runs);
- false alarms: runs that never collapse but got a critical alert.

rlwatch's default detectors are fed the same series in the same invocation.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

REPLAYED_KEYS = (
    "reward/mean", "reward/std", "mismatch/kl", "mismatch/ratio_max", "mismatch/ess_frac",
    "gate/frac", "grad/norm", "loss/total", "policy/entropy",
)


@dataclass
class CorpusRun:
    name: str
    config: dict[str, Any]
    series: dict[str, list[float]]
    collapse_step: int | None


@dataclass
class Score:
    detector: str
    recall: float
    recalled: int
    collapsing: int
    median_lead: float | None
    false_alarm_rate: float
    false_alarms: int
    stable: int


def collapse_step(rewards: Sequence[float], reach: float = 0.5, drop: float = 0.2) -> int | None:
    peak = -math.inf
    for step, reward in enumerate(rewards):
        peak = max(peak, reward)
        if peak >= reach and reward <= peak - drop:
            return step
    return None


def build_corpus(losses: Sequence[str], lags: Sequence[int], mismatches: Sequence[str], seeds: Sequence[int], steps: int, device: str) -> list[CorpusRun]:
    from trainer_hooks.toy import ToyConfig, grid_specs, simulate

    specs = grid_specs(losses=losses, lags=lags, mismatches=mismatches, seeds=seeds)
    result = simulate(specs, ToyConfig(steps=steps), device=device, keep_history=True)
    assert result.history is not None
    history = {key: result.history[key].cpu().tolist() for key in REPLAYED_KEYS if key in result.history}
    corpus = []
    for index, spec in enumerate(specs):
        series = {key: values[index] for key, values in history.items()}
        corpus.append(
            CorpusRun(
                name=spec.name,
                config={"loss": spec.loss, "lag": spec.lag, "mismatch": spec.mismatch, "seed": spec.seed},
                series=series,
                collapse_step=collapse_step(series["reward/mean"]),
            )
        )
    return corpus


def score(detector: str, corpus: Sequence[CorpusRun], first_alerts: Sequence[int | None]) -> Score:
    leads, recalled, false_alarms = [], 0, 0
    collapsing = sum(run.collapse_step is not None for run in corpus)
    for run, fired in zip(corpus, first_alerts, strict=True):
        if run.collapse_step is None:
            false_alarms += fired is not None
        elif fired is not None and fired < run.collapse_step:
            recalled += 1
            leads.append(run.collapse_step - fired)
    stable = len(corpus) - collapsing
    return Score(
        detector=detector,
        recall=recalled / collapsing if collapsing else math.nan,
        recalled=recalled,
        collapsing=collapsing,
        median_lead=statistics.median(leads) if leads else None,
        false_alarm_rate=false_alarms / stable if stable else math.nan,
        false_alarms=false_alarms,
        stable=stable,
    )


# -- Keel: replay through the real ingest path ---------------------------------------


async def _stream(ws_url: str, run: CorpusRun, run_id: str, rows_per_frame: int) -> None:
    from websockets.asyncio.client import connect

    from trainer_hooks.protocol import Row, RunInfo, finish_message, hello_message, points_message

    steps = len(run.series["reward/mean"])
    info = RunInfo(id=run_id, name=run.name, project="eval-alerts", group=run.config["loss"], config=run.config, tags=["eval"])
    async with connect(f"{ws_url}/api/v1/ingest", max_size=None) as ws:
        await ws.send(json.dumps(hello_message(info)))
        json.loads(await ws.recv())
        frames = 0
        for seq, start in enumerate(range(0, steps, rows_per_frame)):
            rows = [
                Row(step=step, time=None, values={key: values[step] for key, values in run.series.items()})
                for step in range(start, min(steps, start + rows_per_frame))
            ]
            await ws.send(json.dumps(points_message(seq, rows)))
            frames += 1
        for _ in range(frames):
            assert json.loads(await ws.recv())["type"] == "ack"
        await ws.send(json.dumps(finish_message("finished")))
        assert json.loads(await ws.recv())["type"] == "bye"  # every frame evaluated by now


async def _replay_all(ws_url: str, corpus: Sequence[CorpusRun], run_ids: Sequence[str], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(run: CorpusRun, run_id: str) -> None:
        async with gate:
            await _stream(ws_url, run, run_id, rows_per_frame=50)

    await asyncio.gather(*(one(run, run_id) for run, run_id in zip(corpus, run_ids, strict=True)))


def keel_first_alerts(corpus: Sequence[CorpusRun], database_url: str | None = None, concurrency: int = 8) -> list[int | None]:
    import httpx

    from keel.local import LocalServer

    with tempfile.TemporaryDirectory(prefix="keel-eval-") as tmp:
        with LocalServer(database_url or f"sqlite:///{tmp}/eval.db", silence_check_s=3600) as server:
            run_ids = [str(uuid.uuid4()) for _ in corpus]
            asyncio.run(_replay_all(server.ws_url, corpus, run_ids, concurrency))
            alerts = httpx.get(f"{server.url}/api/v1/alerts", params={"severity": "critical", "limit": 10_000}, timeout=60).json()
    first: dict[str, int] = {}
    for alert in alerts:
        if alert["fired_step"] is not None:
            first[alert["run_id"]] = min(first.get(alert["run_id"], alert["fired_step"]), alert["fired_step"])
    return [first.get(run_id) for run_id in run_ids]


# -- rlwatch: the peer's default detectors on the same series ---------------------------


def rlwatch_first_alerts(corpus: Sequence[CorpusRun]) -> list[int | None] | None:
    try:
        from rlwatch.config import RLWatchConfig
        from rlwatch.detectors import DetectorSuite
    except ImportError:
        return None
    out: list[int | None] = []
    for run in corpus:
        suite = DetectorSuite(RLWatchConfig())
        fired = None
        s = run.series
        for step in range(len(s["reward/mean"])):
            alerts = suite.check_step(
                step,
                entropy=s["policy/entropy"][step] if "policy/entropy" in s else None,
                kl_divergence=s["mismatch/kl"][step],
                reward_mean=s["reward/mean"][step],
                reward_std=s["reward/std"][step],
                loss=s["loss/total"][step],
                grad_norm=s["grad/norm"][step],
            )
            if any(alert.severity == "critical" for alert in alerts):
                fired = step
                break
        out.append(fired)
    return out


def format_scores(scores: Sequence[Score]) -> str:
    lines = [f"{'detector':28s} {'recall':>14s} {'median lead':>12s} {'false alarms':>18s}"]
    for s in scores:
        lead = "-" if s.median_lead is None else f"{s.median_lead:g} steps"
        lines.append(
            f"{s.detector:28s} {s.recall:>7.0%} ({s.recalled:>2d}/{s.collapsing:<2d}) {lead:>12s} "
            f"{s.false_alarm_rate:>8.1%} ({s.false_alarms:>3d}/{s.stable:<3d})"
        )
    return "\n".join(lines)


def evaluate(losses: Sequence[str], lags: Sequence[int], mismatches: Sequence[str], seeds: Sequence[int], steps: int, device: str, database_url: str | None) -> dict[str, Any]:
    started = time.perf_counter()
    corpus = build_corpus(losses, lags, mismatches, seeds, steps, device)
    built = time.perf_counter()
    scores = [score("keel (critical alerts)", corpus, keel_first_alerts(corpus, database_url))]
    replayed = time.perf_counter()
    peer = rlwatch_first_alerts(corpus)
    if peer is not None:
        scores.append(score("rlwatch 0.5 defaults (crit.)", corpus, peer))
    return {
        "runs": len(corpus),
        "collapsing": sum(run.collapse_step is not None for run in corpus),
        "scores": [asdict(s) for s in scores],
        "text": format_scores(scores),
        "rlwatch_available": peer is not None,
        "timings_s": {"corpus": built - started, "keel_replay": replayed - built, "rlwatch": time.perf_counter() - replayed},
    }
