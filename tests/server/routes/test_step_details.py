"""Step details over the wire and REST, on both databases (docs/protocol.md, "Step details"
and "Keel's further endpoints"): sent on the ingest socket or POSTed, acked once stored,
read back by /distributions, /samples, /samples/steps, /sequences and /details."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import numpy as np

from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series

EDGES = [-2.0, -0.5, 0.0, 0.5, 2.0]


def _get(server: Any, path: str, **params: Any) -> Any:
    response = httpx.get(f"{server.url}/api/v1{path}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def _sample(rank: int, step: int) -> dict[str, Any]:
    return {
        "seq_id": f"{step}-{rank}", "version": step - 2, "reward": 0.5, "advantage": "nan", "length": 300 + rank,
        "seq_log_ratio": 4.0 - rank, "max_log_ratio": "inf", "start": 12, "worst": 14,
        "tokens": ["a", "b", "c"], "token_ids": [1, 2, 3], "log_ratio": [0.1, "-inf", 0.3],
        "sampler_logprob": [-1.0, -2.0, -3.0], "learner_logprob": [-1.1, -2.2, -3.3],
    }


def _row(step: int, rng: np.random.Generator) -> dict[str, Any]:
    n = 50
    length = rng.integers(20, 2000, size=n)
    log_ratio: list[Any] = (length * 0.004 + rng.normal(scale=0.3, size=n)).tolist()
    if step % 7 == 0:
        log_ratio[0] = "nan"
    return {
        "step": step, "values": {"reward/mean": step / 10},
        "histograms": {"mismatch/log_ratio": {"edges": EDGES, "counts": rng.integers(0, 1000, size=4).tolist(), "nan": step % 3}},
        "samples": [_sample(rank, step) for rank in range(3)] if step % 5 == 0 else [],
        "sequences": {"length": length.tolist(), "log_ratio": log_ratio},
    }


def test_details_sent_on_the_socket_are_acked_then_readable(server) -> None:
    rng = np.random.default_rng(3)
    run = new_run()
    sent = [_row(step, rng) for step in range(40)]
    with open_ingest(server) as ws:
        welcome = hello(ws, run)
        assert welcome["accepts"] == ["histograms", "samples", "sequences"]
        for seq in range(4):
            ws.send(points(seq, sent[seq * 10 : seq * 10 + 10]))
        assert [recv(ws) for _ in range(4)] == [{"type": "ack", "seq": seq} for seq in range(4)]
    run_id = run["id"]
    assert series(server, run_id, "reward/mean")["steps"] == list(range(40))

    # distributions: every step, then buckets whose counts are the exact sums of the stored ones
    stored = np.array([row["histograms"]["mismatch/log_ratio"]["counts"] for row in sent])
    full = _get(server, f"/runs/{run_id}/distributions", key="mismatch/log_ratio")
    assert full == {
        "key": "mismatch/log_ratio", "edges": EDGES, "steps": list(range(40)), "counts": stored.tolist(),
        "nan": [step % 3 for step in range(40)], "bucketed": False, "left_out": 0,
    }
    bucketed = _get(server, f"/runs/{run_id}/distributions", key="mismatch/log_ratio", max_steps=6, start=5, end=34)
    width = math.ceil(30 / 6)
    assert bucketed["bucketed"] is True and bucketed["steps"] == [9, 14, 19, 24, 29, 34]
    assert bucketed["counts"] == [stored[start : start + width].sum(axis=0).tolist() for start in range(5, 35, width)]
    # `from`/`to`: deprecated names of `start`/`end`, still answered
    assert _get(server, f"/runs/{run_id}/distributions", key="mismatch/log_ratio", max_steps=6, **{"from": 5, "to": 34}) == bucketed
    assert _get(server, f"/runs/{run_id}/distributions", key="nope") == {
        "key": "nope", "edges": [], "steps": [], "counts": [], "nan": [], "bucketed": False, "left_out": 0,
    }

    # samples: the latest step <= S that has some (steps 0, 5, ..., 35), as sent
    assert _get(server, f"/runs/{run_id}/samples/steps") == {"steps": list(range(0, 40, 5))}
    assert _get(server, f"/runs/{run_id}/samples") == {"step": 35, "samples": sent[35]["samples"]}
    assert _get(server, f"/runs/{run_id}/samples", step=24) == {"step": 20, "samples": sent[20]["samples"]}
    assert _get(server, f"/runs/{run_id}/samples", step=0)["step"] == 0

    # sequences: every pair, and the fit numpy.polyfit gives over the finite ones
    answer = _get(server, f"/runs/{run_id}/sequences", start=10, end=19)
    length = [x for row in sent[10:20] for x in row["sequences"]["length"]]
    log_ratio = [y for row in sent[10:20] for y in row["sequences"]["log_ratio"]]
    assert answer["steps"] == [step for step in range(10, 20) for _ in range(50)]
    assert answer["length"] == length and answer["log_ratio"] == log_ratio
    finite = [(x, y) for x, y in zip(length, log_ratio, strict=True) if y != "nan"]
    slope, intercept = np.polyfit([x for x, _ in finite], [y for _, y in finite], 1)
    fit = answer["fit"]
    assert fit["n"] == len(finite) == 499
    assert math.isclose(fit["slope_per_1k"], slope * 1000, rel_tol=1e-9) and math.isclose(fit["intercept"], intercept, rel_tol=1e-9)
    sub = _get(server, f"/runs/{run_id}/sequences", max_points=100)
    assert len(sub["length"]) == len(sub["steps"]) == 100 and sub["steps"] == sorted(sub["steps"])
    assert sub["steps"][0] == 0 and sub["steps"][-1] == 39 and sub["fit"]["n"] <= 100


def test_a_malformed_detail_is_rejected_and_the_writer_goes_on(server) -> None:
    run = new_run()
    rng = np.random.default_rng(4)
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [_row(0, rng)]))
        bad = _row(1, rng)
        bad["histograms"]["mismatch/log_ratio"]["counts"] = [1, 2]  # 4 bins
        ws.send(points(1, [_row(2, rng), bad]))
        huge = _row(3, rng)
        huge["samples"] = [_sample(0, 3)] * 65
        ws.send(points(2, [huge]))
        ws.send(points(3, [_row(4, rng)]))
        assert recv(ws) == {"type": "ack", "seq": 0}
        rejected = recv(ws)
        assert rejected["type"] == "reject" and rejected["seq"] == 1 and rejected["code"] == "malformed"
        assert "rows[1].histograms['mismatch/log_ratio'].counts" in rejected["message"]
        too_large = recv(ws)
        assert too_large["type"] == "reject" and too_large["seq"] == 2 and too_large["code"] == "too_large"
        assert recv(ws) == {"type": "ack", "seq": 3}
    # Nothing of a rejected frame is stored (not even its good row), nothing acked is lost.
    assert series(server, run["id"], "reward/mean")["steps"] == [0, 4]
    assert _get(server, f"/runs/{run['id']}/distributions", key="mismatch/log_ratio")["steps"] == [0, 4]
    assert _get(server, f"/runs/{run['id']}/samples/steps") == {"steps": [0]}


def test_post_points_takes_details_and_details_pages_give_them_back(server) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}"
    rng = np.random.default_rng(5)
    rows = [_row(step, rng) for step in range(0, 12)]
    assert httpx.post(f"{url}/points", json={"rows": rows}).status_code == 200
    changed = _row(0, rng)
    changed["samples"] = [_sample(9, 0)]
    assert httpx.post(f"{url}/points", json={"rows": [changed]}).status_code == 200  # the first value stays
    assert _get(server, f"/runs/{run['id']}/samples", step=0) == {"step": 0, "samples": rows[0]["samples"]}
    refused = httpx.post(f"{url}/points", json={"rows": [{"step": 1, "values": {}, "sequences": {"length": [1], "log_ratio": []}}]})
    assert refused.status_code == 422 and "rows[0].sequences" in refused.json()["detail"][0]["msg"]
    oversized = httpx.post(f"{url}/points", json={"rows": [{"step": 1, "values": {}, "samples": [{}] * 65}]})
    assert oversized.status_code == 413

    details: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = _get(server, f"/runs/{run['id']}/details", limit=7, **({"cursor": cursor} if cursor else {}))
        details += page["rows"]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert len(details) == 12 + 3 + 12  # a histogram and sequences per step, samples every 5th
    rebuilt: dict[int, dict[str, Any]] = {}
    for detail in details:
        assert detail["values"] == {}
        rebuilt.setdefault(detail["step"], {"step": detail["step"], "values": {}}).update(
            {k: v for k, v in detail.items() if k not in ("step", "values")}
        )
    for row in rows:
        expected = {k: v for k, v in row.items() if k != "values" and v != []}
        histogram = expected["histograms"]["mismatch/log_ratio"]
        if histogram["nan"] == 0:
            del histogram["nan"]  # a zero is the default, and left out
        assert rebuilt[row["step"]] == {**expected, "values": {}}
    bad = httpx.get(f"{url}/details", params={"cursor": "nonsense"})
    assert bad.status_code == 422


def test_unknown_runs_are_404_and_runs_without_details_answer_empty(server) -> None:
    for path in ("distributions?key=k", "samples", "samples/steps", "sequences", "details"):
        assert httpx.get(f"{server.url}/api/v1/runs/nope/{path}").status_code == 404
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 1, "values": {"x": 1}}]))
        assert recv(ws) == {"type": "ack", "seq": 0}
    assert _get(server, f"/runs/{run['id']}/samples") == {"step": None, "samples": []}
    assert _get(server, f"/runs/{run['id']}/samples/steps") == {"steps": []}
    assert _get(server, f"/runs/{run['id']}/sequences") == {"steps": [], "length": [], "log_ratio": [], "fit": None}
    assert _get(server, f"/runs/{run['id']}/details") == {"rows": [], "cursor": None}
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}/distributions", params={"key": "k", "max_steps": 5001}).status_code == 422


def test_live_pushes_carry_values_not_details(server) -> None:
    from websockets.sync.client import connect

    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        with connect(f"{server.ws_url}/api/v1/live?runs={run['id']}", open_timeout=10) as live:
            ws.send(points(0, [_row(1, np.random.default_rng(0))]))
            assert recv(ws)["type"] == "ack"
            while (message := json.loads(live.recv(timeout=10)))["type"] != "points":
                pass
    assert message["rows"] == [{"step": 1, "values": {"reward/mean": 0.1}}]
