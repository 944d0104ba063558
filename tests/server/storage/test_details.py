"""Step details in storage, on both databases: written with their rows' points (websocket
frames and REST alike), the first value of a (run, kind, key, step) kept, read back in the
shapes the REST routes answer, and deleted with their run."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import pytest

from server import db, retention
from server.errors import UnknownRun
from server.storage import FrameRef, Store
from server.storage.details import _picks, least_squares
from wire import Histogram, Row, RunInfo, Sequences


def _with_store(database_url: str, body: Callable[[Store], Awaitable[None]]) -> None:
    db.upgrade(database_url)

    async def run() -> None:
        store = Store(db.create_engine(database_url))
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(run())


def _detail_row(step: int, marker: float) -> Row:
    return Row(
        step=step, time=None, values={"x": marker},
        histograms={"h": Histogram([0.0, 1.0, 2.0], [int(marker), 1])},
        samples=[{"seq_id": f"s{marker}", "reward": marker, "log_ratio": [marker, math.inf]}],
        sequences=Sequences([10, 20], [marker, math.nan]),
    )


def test_the_first_stored_detail_is_kept_and_resends_add_nothing(database_url: str) -> None:
    async def body(store: Store) -> None:
        now = time.time()
        _, session = await store.open_run(RunInfo(id="r", name="r"), now)
        # Over the socket: frame 0 with details, then a resend of it with other values.
        first = await store.write_points("r", [_detail_row(1, 1.0), _detail_row(2, 2.0)], now, FrameRef("", session, 0))
        assert first.stored and first.acked_seq == 0
        again = await store.write_points("r", [_detail_row(1, 9.0)], now, FrameRef("", session, 0))
        assert not again.stored
        # Over REST (no frame): only (run, kind, key, step) idempotency; the first value stays.
        await store.write_points("r", [_detail_row(2, 7.0), _detail_row(3, 3.0)], now)
        # A frame without details after one with them: the one-statement path on PostgreSQL.
        plain = await store.write_points("r", [Row(step=4, time=None, values={"x": 4.0})], now, FrameRef("", session, 1))
        assert plain.stored and plain.acked_seq == 1

        found = await store.distributions("r", "h")
        assert found.steps == [1, 2, 3] and found.counts == [[1, 1], [2, 1], [3, 1]] and found.edges == [0.0, 1.0, 2.0]
        samples = await store.samples("r", 2)
        assert samples.step == 2 and orjson.loads(samples.samples_json) == [{"seq_id": "s2.0", "reward": 2.0, "log_ratio": [2.0, "inf"]}]
        assert await store.sample_steps("r") == [1, 2, 3]
        pairs = await store.sequences("r")
        assert pairs.steps == [1, 1, 2, 2, 3, 3] and pairs.length == [10, 20] * 3
        assert [v for v in pairs.log_ratio if not math.isnan(v)] == [1.0, 2.0, 3.0]
        assert pairs.fit is None  # one finite pair per length: fewer than 2 distinct lengths
        assert (await store.latest("r", ["x"]))["x"] == (4, 4.0)

    _with_store(database_url, body)


def test_a_frame_whose_details_fail_to_store_is_not_acked(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from server.storage import writes

    async def body(store: Store) -> None:
        now = time.time()
        _, session = await store.open_run(RunInfo(id="r", name="r"), now)

        async def broken(*args: Any) -> None:
            raise RuntimeError("disk full")

        monkeypatch.setattr(writes, "insert_details", broken)
        with pytest.raises(RuntimeError):
            await store.write_points("r", [_detail_row(1, 1.0)], now, FrameRef("", session, 0))
        monkeypatch.undo()
        assert (await store.get_run("r")).acked_seq == -1
        assert await store.latest("r", ["x"]) == {}  # the points went with the details' transaction
        assert (await store.write_points("r", [_detail_row(1, 1.0)], now, FrameRef("", session, 0))).acked_seq == 0
        assert (await store.distributions("r", "h")).steps == [1]

    _with_store(database_url, body)


def test_deleting_a_run_deletes_its_details_and_no_others(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "DETAILS_DELETE_BATCH", 3)  # several batches per (kind, key)

    async def body(store: Store) -> None:
        now = time.time()
        for run_id in ("doomed", "kept"):
            await store.open_run(RunInfo(id=run_id, name=run_id), now)
            await store.write_points(run_id, [_detail_row(step, float(step)) for step in range(10)], now)
            await store.finish_run(run_id, "finished", now)
        await retention.delete_run(store, "doomed")
        with pytest.raises(UnknownRun):
            await store.samples("doomed")
        assert (await store.distributions("kept", "h")).steps == list(range(10))
        # The id used again starts from nothing.
        await store.open_run(RunInfo(id="doomed", name="doomed"), now)
        assert await store.sample_steps("doomed") == []
        assert (await store.distributions("doomed", "h")).edges == []
        assert await store.stored_details("doomed") == []
        assert len(await store.stored_details("kept", limit=1000)) == 30

    _with_store(database_url, body)


def test_distributions_leave_out_other_edges_and_bucket_by_step(database_url: str) -> None:
    rng = np.random.default_rng(1)
    counts = {step: rng.integers(0, 10**12, size=4).tolist() for step in range(3, 200, 2)}
    other_edges = {41, 43}

    async def body(store: Store) -> None:
        now = time.time()
        await store.open_run(RunInfo(id="r", name="r"), now)
        rows = [
            Row(step=step, time=None, values={}, histograms={"h": Histogram([0.0, 1.0, 2.0, 3.0, 5.0] if step not in other_edges else [0.0, 1.0, 2.0, 3.0, 4.0], c, nan=step)})
            for step, c in counts.items()
        ]
        await store.write_points("r", rows, now)
        every = await store.distributions("r", "h", max_steps=5000)
        kept = [step for step in counts if step not in other_edges]
        assert every.steps == kept and every.counts == [counts[step] for step in kept]
        assert every.left_out == 2 and not every.bucketed and every.nans == kept

        ranged = await store.distributions("r", "h", start=40, end=60)
        assert ranged.steps == [45, 47, 49, 51, 53, 55, 57, 59] and ranged.left_out == 2

        bucketed = await store.distributions("r", "h", max_steps=7)
        assert bucketed.bucketed and len(bucketed.steps) <= 7
        width = math.ceil((199 - 3 + 1) / 7)
        groups: dict[int, list[int]] = {}
        for step in kept:
            groups.setdefault((step - 3) // width, []).append(step)
        assert bucketed.steps == [members[-1] for members in groups.values()]
        expected = [np.sum([np.array(counts[s], dtype=object) for s in members], axis=0).tolist() for members in groups.values()]
        assert bucketed.counts == expected  # exact: Python integers, no float rounding
        assert bucketed.nans == [sum(members) for members in groups.values()]
        assert (await store.distributions("r", "nope")).edges == []

    _with_store(database_url, body)


def test_an_even_subsample_and_the_least_squares_line() -> None:
    sizes = [(0, 3), (1, 0), (5, 4), (9, 3)]
    assert _picks(sizes, 10) == {0: None, 5: None, 9: None}
    assert _picks(sizes, 5) == {0: [0, 2], 5: [1, 3], 9: [1]}  # pairs 0, 2, 4, 6, 8 of 10
    assert sum(len(p or []) for p in _picks([(s, 4096) for s in range(100)], 5000).values()) == 5000

    rng = np.random.default_rng(7)
    length = rng.integers(1, 4000, size=500).tolist()
    log_ratio = (np.array(length) * 0.003 + rng.normal(size=500)).tolist()
    log_ratio[3], log_ratio[10] = math.inf, math.nan
    fit = least_squares(length, log_ratio)
    finite = [i for i, v in enumerate(log_ratio) if math.isfinite(v)]
    slope, intercept = np.polyfit(np.array(length)[finite], np.array(log_ratio)[finite], 1)
    assert fit is not None and fit.n == 498
    assert fit.slope_per_1k == pytest.approx(slope * 1000, rel=1e-9) and fit.intercept == pytest.approx(intercept, rel=1e-9)
    assert least_squares([5, 5, 6], [1.0, 2.0, math.nan]) is None
