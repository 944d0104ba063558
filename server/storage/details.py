"""Step details (docs/protocol.md, "Step details"): how they are written with a frame's
points, and the reads that answer them.

A row's details become rows of `step_details`, one per (run, kind, key, step): a
histogram of one key, or the step's samples or sequences (key ""), each its wire JSON.
They are inserted in the transaction that writes the row's points, ignoring a (run, kind,
key, step) already stored, so the first value is kept and a resent frame adds nothing.

Reads decode stored JSON off the event loop (`asyncio.to_thread`), a page of rows at a
time, so a long run's distributions never hold other clients or the whole range in memory.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import func, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from server.models import StepDetail
from server.storage.reads import get_run
from wire import Row, decode_value, encode_details

__all__ = [
    "DETAIL_PAGE",
    "Distributions",
    "Fit",
    "SequencePairs",
    "StepSamples",
    "StoredDetail",
    "distributions",
    "has_details",
    "insert_details",
    "sample_steps",
    "samples",
    "sequences",
    "stored_details",
]

DETAIL_PAGE = 256
"""Stored details decoded per read (and per thread hand-off): a histogram of 1,024 bins is
about 5 KB of JSON, samples up to 64 KiB."""

_INSERT = text(
    "INSERT INTO step_details (run_id, kind, key, step, size, body)"
    " VALUES (:run_id, :kind, :key, :step, :size, :body) ON CONFLICT DO NOTHING"
)
"""Both databases' upsert syntax (SQLite 3.24+): a (run, kind, key, step) stored keeps its body."""


def has_details(rows: Sequence[Row]) -> bool:
    return any(row.histograms or row.samples or row.sequences for row in rows)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def detail_params(run_id: str, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The `step_details` rows of these rows' details."""
    params: list[dict[str, Any]] = []
    for row in rows:
        if not (row.histograms or row.samples or row.sequences):
            continue
        details = encode_details(row)
        base = {"run_id": run_id, "step": row.step}
        for key, histogram in details.get("histograms", {}).items():
            params.append({**base, "kind": "histogram", "key": key, "size": len(histogram["counts"]), "body": _dumps(histogram)})
        if "samples" in details:
            samples = details["samples"]
            params.append({**base, "kind": "samples", "key": "", "size": len(samples), "body": _dumps(samples)})
        if "sequences" in details:
            pairs = details["sequences"]
            params.append({**base, "kind": "sequences", "key": "", "size": len(pairs["length"]), "body": _dumps(pairs)})
    return params


async def insert_details(session: AsyncSession, run_id: str, rows: Sequence[Row]) -> None:
    """Insert the details of `rows` not stored yet, in the caller's transaction."""
    params = detail_params(run_id, rows)
    if params:
        await session.execute(_INSERT, params)


def _where(run_id: str, kind: str, key: str, start: int | None, end: int | None) -> list[Any]:
    where = [StepDetail.run_id == run_id, StepDetail.kind == kind, StepDetail.key == key]
    if start is not None:
        where.append(StepDetail.step >= start)
    if end is not None:
        where.append(StepDetail.step <= end)
    return where


async def _pages(session: AsyncSession, where: list[Any]) -> Any:
    """(step, body) of the matching rows in step order, `DETAIL_PAGE` at a time."""
    after: int | None = None
    while True:
        query = select(StepDetail.step, StepDetail.body).where(*where)
        if after is not None:
            query = query.where(StepDetail.step > after)
        page = [(int(step), body) for step, body in await session.execute(query.order_by(StepDetail.step).limit(DETAIL_PAGE))]
        if not page:
            return
        yield page
        if len(page) < DETAIL_PAGE:
            return
        after = page[-1][0]


# -- distributions ------------------------------------------------------------------------


@dataclass
class Distributions:
    """A histogram key's counts per step (or per bucket of steps, summed)."""

    key: str
    edges: list[float]
    steps: list[int] = field(default_factory=list)
    counts: list[list[int]] = field(default_factory=list)
    nans: list[int] = field(default_factory=list)
    bucketed: bool = False
    left_out: int = 0
    """Steps whose edges differ from the newest step's."""


class _Summing:
    """Folds pages of stored histograms into a `Distributions`: bucket b holds the steps
    lo + b * width .. lo + (b + 1) * width - 1, its step the last one it holds."""

    def __init__(self, out: Distributions, lo: int, width: int):
        self.out, self.lo, self.width = out, lo, width
        self._bucket = -1

    def add(self, page: list[tuple[int, str]]) -> None:
        out = self.out
        for step, body in page:
            histogram = orjson.loads(body)
            if histogram["edges"] != out.edges:
                out.left_out += 1
                continue
            counts: list[int] = histogram["counts"]
            nan = int(histogram.get("nan", 0))
            bucket = (step - self.lo) // self.width
            if out.bucketed and bucket == self._bucket:
                out.steps[-1] = step
                out.counts[-1] = [a + b for a, b in zip(out.counts[-1], counts, strict=True)]
                out.nans[-1] += nan
            else:
                self._bucket = bucket
                out.steps.append(step)
                out.counts.append(counts)
                out.nans.append(nan)


async def distributions(
    session: AsyncSession, run_id: str, key: str, *, start: int | None, end: int | None, max_steps: int
) -> Distributions:
    """The histograms of `key` at steps start..end: one per step, or, when more than
    `max_steps` steps have one, at most `max_steps` buckets of consecutive steps of one width,
    their counts summed. Steps whose edges differ from the newest step's are left out."""
    await get_run(session, run_id)
    where = _where(run_id, "histogram", key, start, end)
    newest = (
        await session.execute(select(StepDetail.step, StepDetail.body).where(*where).order_by(StepDetail.step.desc()).limit(1))
    ).first()
    if newest is None:
        return Distributions(key=key, edges=[])
    hi = int(newest[0])
    count, lo = (await session.execute(select(func.count(), func.min(StepDetail.step)).where(*where))).one()
    out = Distributions(key=key, edges=orjson.loads(newest[1])["edges"], bucketed=count > max_steps)
    summing = _Summing(out, int(lo), -(-(hi - int(lo) + 1) // max_steps) if out.bucketed else 1)
    async for page in _pages(session, where):
        await asyncio.to_thread(summing.add, page)
    return out


# -- samples ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSamples:
    step: int | None
    """None when the run has no samples at or before the step asked for."""
    samples_json: str
    """The samples as stored: a JSON array, worst first."""


async def samples(session: AsyncSession, run_id: str, step: int | None) -> StepSamples:
    """The samples of the latest step <= `step` that has some (of the run's latest, without one)."""
    await get_run(session, run_id)
    found = (
        await session.execute(
            select(StepDetail.step, StepDetail.body)
            .where(*_where(run_id, "samples", "", None, step))
            .order_by(StepDetail.step.desc())
            .limit(1)
        )
    ).first()
    if found is None:
        return StepSamples(step=None, samples_json="[]")
    return StepSamples(step=int(found[0]), samples_json=found[1])


async def sample_steps(session: AsyncSession, run_id: str) -> list[int]:
    await get_run(session, run_id)
    query = select(StepDetail.step).where(*_where(run_id, "samples", "", None, None)).order_by(StepDetail.step)
    return [int(step) for step in await session.scalars(query)]


# -- sequences ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """The least-squares line of Σℓ on length: Σℓ ≈ intercept + slope_per_1k * length / 1000."""

    slope_per_1k: float
    intercept: float
    n: int
    """The finite pairs it was fitted to."""


@dataclass
class SequencePairs:
    steps: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    log_ratio: list[float] = field(default_factory=list)
    fit: Fit | None = None


def least_squares(length: Sequence[int], log_ratio: Sequence[float]) -> Fit | None:
    """The line of `log_ratio` on `length` over the finite pairs; None with fewer than two
    distinct lengths among them."""
    pairs = [(float(x), y) for x, y in zip(length, log_ratio, strict=True) if math.isfinite(y)]
    if len({x for x, _ in pairs}) < 2:
        return None
    n = len(pairs)
    mean_x = math.fsum(x for x, _ in pairs) / n
    mean_y = math.fsum(y for _, y in pairs) / n
    sxx = math.fsum((x - mean_x) ** 2 for x, _ in pairs)
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in pairs)
    slope = sxy / sxx
    return Fit(slope_per_1k=slope * 1000.0, intercept=mean_y - slope * mean_x, n=n)


def _picks(sizes: list[tuple[int, int]], max_points: int) -> dict[int, list[int] | None]:
    """Which pairs of which steps an even subsample of `max_points` keeps: step -> positions
    in its body (None: all of them). Pair i of the whole range (in step order) is kept when
    it is floor(j * total / max_points) for some j."""
    total = sum(size for _, size in sizes)
    if total <= max_points:
        return {step: None for step, size in sizes if size}
    picks: dict[int, list[int] | None] = {}
    offset = 0
    for step, size in sizes:
        first = -(-offset * max_points // total)  # the least j with floor(j * total / max_points) >= offset
        positions = []
        j = first
        while j < max_points and (index := j * total // max_points) < offset + size:
            positions.append(index - offset)
            j += 1
        if positions:
            picks[step] = positions
        offset += size
    return picks


class _Pairs:
    def __init__(self, picks: dict[int, list[int] | None]):
        self.picks = picks
        self.out = SequencePairs()

    def add(self, page: list[tuple[int, str]]) -> None:
        out = self.out
        for step, body in page:
            if step not in self.picks:
                continue
            pairs = orjson.loads(body)
            positions = self.picks[step]
            length, log_ratio = pairs["length"], pairs["log_ratio"]
            if positions is not None:
                length = [length[p] for p in positions]
                log_ratio = [log_ratio[p] for p in positions]
            out.steps.extend([step] * len(length))
            out.length.extend(length)
            out.log_ratio.extend(decode_value(v) for v in log_ratio)

    def finish(self) -> SequencePairs:
        self.out.fit = least_squares(self.out.length, self.out.log_ratio)
        return self.out


async def sequences(
    session: AsyncSession, run_id: str, *, start: int | None, end: int | None, max_points: int
) -> SequencePairs:
    """The (length, Σℓ) pairs of steps start..end, an even subsample of `max_points` when
    there are more, and the least-squares line through the finite ones answered."""
    await get_run(session, run_id)
    where = _where(run_id, "sequences", "", start, end)
    sizes = [(int(step), int(size)) for step, size in await session.execute(
        select(StepDetail.step, StepDetail.size).where(*where).order_by(StepDetail.step)
    )]
    pairs = _Pairs(_picks(sizes, max_points))
    steps = sorted(pairs.picks)
    for at in range(0, len(steps), DETAIL_PAGE):
        wanted = steps[at : at + DETAIL_PAGE]
        query = select(StepDetail.step, StepDetail.body).where(*where, StepDetail.step.in_(wanted)).order_by(StepDetail.step)
        page = [(int(step), body) for step, body in await session.execute(query)]
        await asyncio.to_thread(pairs.add, page)
    return await asyncio.to_thread(pairs.finish)


# -- every detail, for export ---------------------------------------------------------------


@dataclass(frozen=True)
class StoredDetail:
    kind: str
    key: str
    step: int
    body: str
    """The JSON the wire carried."""

    @property
    def cursor(self) -> str:
        """Where a read of the details after this one starts (`stored_details`)."""
        return _dumps([self.kind, self.key, self.step])


def parse_cursor(cursor: str) -> tuple[str, str, int]:
    """A `StoredDetail.cursor` back to (kind, key, step); ValueError for anything else."""
    try:
        kind, key, step = orjson.loads(cursor)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        raise ValueError("cursor must be the one a previous page returned") from None
    if not isinstance(kind, str) or not isinstance(key, str) or type(step) is not int:
        raise ValueError("cursor must be the one a previous page returned")
    return kind, key, step


async def stored_details(session: AsyncSession, run_id: str, *, after: tuple[str, str, int] | None, limit: int) -> list[StoredDetail]:
    """Up to `limit` of the run's stored details, in (kind, key, step) order, after `after`."""
    await get_run(session, run_id)
    query = select(StepDetail.kind, StepDetail.key, StepDetail.step, StepDetail.body).where(StepDetail.run_id == run_id)
    if after is not None:
        query = query.where(tuple_(StepDetail.kind, StepDetail.key, StepDetail.step) > tuple_(*after))
    query = query.order_by(StepDetail.kind, StepDetail.key, StepDetail.step).limit(limit)
    return [StoredDetail(kind, key, int(step), body) for kind, key, step, body in await session.execute(query)]
