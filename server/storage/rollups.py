"""The rollup scheme, and the SQL that keeps it and reads it, per database.

Bucketed reads do not visit every point: `point_rollups` summarises each series per aligned
block of 16**L steps (L = 1..ROLLUP_LEVELS; min, max, NaN count, point count, last step),
kept in the transaction that stores the points, so it is a function of the stored points
alone. On PostgreSQL one statement inserts the points and merges exactly the rows it inserted
(RETURNING) into every level's blocks (`postgres_merge_sql`); on SQLite, whose writes are
serialised, the blocks a write touched are recomputed from their children, level by level
(`sqlite_refresh_sql`). Either way a resent point (not inserted) changes nothing, and nothing
is ever counted twice. A read covers each bucket exactly by the largest blocks that fit in it,
descending to finer levels, and to points, only where a bucket edge cuts a block (`count_sql`,
`buckets_sql`; docs/operations.md, "Reads").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from sqlalchemy import text

__all__ = [
    "ROLLUP_BITS", "ROLLUP_LEVELS", "Dialect", "Level", "buckets_sql", "count_sql", "cover_sql",
    "postgres_merge_sql", "read_level", "bucket_width", "sqlite_refresh_sql",
]

ROLLUP_BITS = 4
"""A rollup block of level L spans 2**(ROLLUP_BITS * L) steps: 16 children per block. Fewer
children would make a read visit fewer rows at each bucket edge, but a write refresh more
blocks (bench/README.md). Changing it needs a migration that rebuilds point_rollups."""
ROLLUP_LEVELS = 5
"""Blocks of 16 .. 2**20 steps. A 1,000-bucket read visits at most ~16,000 top-level blocks
plus ~32 rows per bucket edge while buckets are under 2**24 steps wide, i.e. for series of up
to ~1.6e10 steps; beyond that its cost grows with length again."""

Dialect = Literal["sqlite", "postgresql"]
"""The database a statement is built for (`engine.dialect.name`)."""


@dataclass(frozen=True)
class Level:
    """What a summary is made from, at one level: the points (0) or the rollup blocks (1..)."""

    level: int

    @property
    def source(self) -> str:
        return "points c" if self.level == 0 else "point_rollups c"

    def key_in(self, lo: str, hi: str) -> str:
        """The condition "a row of this level of series c.series_id, keyed within [lo, hi]"."""
        if self.level == 0:
            return f"c.step BETWEEN {lo} AND {hi}"
        return f"c.level = {self.level} AND c.block BETWEEN {lo} AND {hi}"

    def children_of(self, parent_block: str) -> str:
        """The condition "a row of this level inside the level + 1 block `parent_block`"."""
        first = f"({parent_block} << {ROLLUP_BITS})"
        return self.key_in(first, f"{first} + {(1 << ROLLUP_BITS) - 1}")

    @property
    def first_step(self) -> str:
        return "c.step" if self.level == 0 else f"(c.block << {ROLLUP_BITS * self.level})"

    @property
    def last_covered(self) -> str:
        """The last step the row's block spans (not the last it holds)."""
        if self.level == 0:
            return "c.step"
        return f"((c.block << {ROLLUP_BITS * self.level}) + {(1 << ROLLUP_BITS * self.level) - 1})"

    @property
    def row(self) -> str:
        """min, max, NaN count, point count and last step of one row of this level."""
        if self.level == 0:
            return (
                "c.value AS min_value, c.value AS max_value, CASE WHEN c.value IS NULL THEN 1 ELSE 0 END"
                " AS nan_count, 1 AS point_count, c.step AS last_step"
            )
        return "c.min_value, c.max_value, c.nan_count, c.point_count, c.last_step"

    @property
    def summary(self) -> str:
        """min, max, NaN count, point count and last step of the rows selected, as one row."""
        if self.level == 0:
            return (
                "MIN(c.value) AS min_value, MAX(c.value) AS max_value,"
                " SUM(CASE WHEN c.value IS NULL THEN 1 ELSE 0 END) AS nan_count,"
                " COUNT(*) AS point_count, MAX(c.step) AS last_step"
            )
        return (
            "MIN(c.min_value) AS min_value, MAX(c.max_value) AS max_value, SUM(c.nan_count) AS nan_count,"
            " SUM(c.point_count) AS point_count, MAX(c.last_step) AS last_step"
        )


# -- writes --------------------------------------------------------------------------------


def postgres_merge_sql() -> str:
    """CTEs `level1` .. `levelN` that merge the rows of a CTE `inserted` (series_id, step,
    value) into their blocks at every level: min and max (LEAST/GREATEST skip NULL, i.e.
    NaN), counts added, last step. Only rows the statement inserted may be in `inserted`:
    a point merged twice would be counted twice."""
    merge = (
        " ON CONFLICT (series_id, level, block) DO UPDATE SET"
        " min_value = LEAST(b.min_value, excluded.min_value),"
        " max_value = GREATEST(b.max_value, excluded.max_value),"
        " nan_count = b.nan_count + excluded.nan_count,"
        " point_count = b.point_count + excluded.point_count,"
        " last_step = GREATEST(b.last_step, excluded.last_step)"
    )
    return ", ".join(
        f"level{level} AS (INSERT INTO point_rollups AS b"
        " (series_id, level, block, min_value, max_value, nan_count, point_count, last_step)"
        f" SELECT series_id, {level}, step >> {ROLLUP_BITS * level}, MIN(value), MAX(value),"
        " COUNT(*) - COUNT(value), COUNT(*), MAX(step)"
        f" FROM inserted GROUP BY 1, 3{merge})"
        for level in range(1, ROLLUP_LEVELS + 1)
    )


# SQLite: a summary is recomputed from its children, so points the write did not insert
# (already stored) cannot count twice.
_ROLLUP_INSERT = (
    "INSERT INTO point_rollups"
    " (series_id, level, block, min_value, max_value, nan_count, point_count, last_step) "
)
_ROLLUP_UPSERT = (
    " ON CONFLICT (series_id, level, block) DO UPDATE SET min_value = excluded.min_value,"
    " max_value = excluded.max_value, nan_count = excluded.nan_count,"
    " point_count = excluded.point_count, last_step = excluded.last_step"
)


@cache
def sqlite_refresh_sql(level: int) -> str:
    """Recompute one level-`level` block from its children (level 1 from the points): series
    id ?1, block ?2, one execution per block (a driver-level executemany). A write refreshes
    the blocks it touched level by level, upwards."""
    children = Level(level - 1)
    return (
        f"{_ROLLUP_INSERT}SELECT c.series_id, {level}, ?2, {children.summary} FROM {children.source}"
        f" WHERE c.series_id = ?1 AND {children.children_of('?2')} GROUP BY c.series_id{_ROLLUP_UPSERT}"
    )


# -- reads ---------------------------------------------------------------------------------


def read_level(width: int) -> int:
    """The coarsest rollup level whose blocks fit in a bucket `width` steps wide (0: points)."""
    return min(ROLLUP_LEVELS, (width.bit_length() - 1) // ROLLUP_BITS)


ROUND_ROWS = 1000
"""A read that would visit at least this many rows of its level (points, or blocks) takes
buckets of the next level's block size instead, where that is less than twice as wide."""


def bucket_width(span: int, max_points: int) -> int:
    """The width of the buckets of a read of `span` steps in at most `max_points`:
    ceil(span / max_points), or the next rollup level's block (16**k steps) where that is less
    than twice as wide and the read would visit ROUND_ROWS rows of its own level or more. It
    then visits 16 times fewer rows (a 5,000-step series read in 500 buckets: 313 blocks of 16
    steps instead of 5,000 points) for at least half the buckets asked."""
    width = -(-span // max_points)
    level = read_level(width)
    if level < ROLLUP_LEVELS and span >> (ROLLUP_BITS * level) >= ROUND_ROWS:
        block = 1 << (ROLLUP_BITS * (level + 1))
        if block < 2 * width:
            return block
    return width


_LO, _HI, _WIDTH = "CAST(:lo AS BIGINT)", "CAST(:hi AS BIGINT)", "CAST(:width AS BIGINT)"


def _bucket_of(at: Level) -> str:
    # (step - lo) / width, not (step - lo) * n / span: steps reach 2**62, and the product overflows.
    return f"({at.first_step} - {_LO}) / {_WIDTH}"


def _inside(at: Level) -> str:
    """The condition "this row's block lies in [lo, hi] and in one bucket"."""
    if at.level == 0:
        return f"c.step BETWEEN {_LO} AND {_HI}"
    return (
        f"{at.first_step} >= {_LO} AND {at.last_covered} <= {_HI}"
        f" AND {_bucket_of(at)} = ({at.last_covered} - {_LO}) / {_WIDTH}"
    )


def _cut_block_pieces(parent: int, dialect: Dialect) -> str:
    """The pieces inside the level-`parent` blocks an edge cuts (CTE `parent<parent>`): their
    children that lie in one bucket."""
    at = Level(parent - 1)
    if at.level == 0:
        # One range, clipped to [lo, hi]: given two ranges on step, SQLite would search the
        # index by the wide one and scan the whole series once per cut block.
        first, last = f"(p.block << {ROLLUP_BITS})", f"((p.block << {ROLLUP_BITS}) + {(1 << ROLLUP_BITS) - 1})"
        where = (
            f"c.series_id = :sid AND c.step BETWEEN CASE WHEN {first} > {_LO} THEN {first} ELSE {_LO} END"
            f" AND CASE WHEN {last} < {_HI} THEN {last} ELSE {_HI} END"
        )
    else:
        where = f"c.series_id = :sid AND {at.children_of('p.block')} AND {_inside(at)}"
    if dialect == "sqlite":  # CROSS JOIN: SQLite keeps this order, one index range scan per cut block
        return f"SELECT {_bucket_of(at)} AS bucket, {at.row} FROM parent{parent} p CROSS JOIN {at.source} WHERE {where}"
    # LATERAL: one index range scan per cut block. As a join, the planner (which guesses
    # 10 rows for a CTE) may hash-join the blocks against every point of the series. The
    # LIMIT (a block has at most that many children) keeps its guess of each scan's rows
    # from the default 0.5 % of the table, which would cost the plan a JIT compile.
    return (
        f"SELECT a.* FROM parent{parent} p CROSS JOIN LATERAL (SELECT {_bucket_of(at)} AS bucket,"
        f" {at.row} FROM {at.source} WHERE {where} LIMIT {1 << ROLLUP_BITS}) AS a"
    )


@cache
def cover_sql(level: int, dialect: Dialect) -> str:
    """CTEs ending in `piece(bucket, min_value, max_value, nan_count, point_count, last_step)`:
    an exact cover of the steps [:lo, :hi] of series :sid, cut in buckets of :width steps
    (:last_bucket + 1 of them), by disjoint pieces each inside one bucket: level-`level`
    blocks, and where a bucket edge (or an end of the range) cuts a block, its children that
    fit, and so on down to points.

    Why it is exact: a block is cut by an edge iff it holds an edge step (a bucket's first
    step, or :hi + 1) other than its own first step; those are the `parent` blocks of each
    level. Every point lies in exactly one piece: the coarsest of its enclosing blocks (up to
    `level`) that no edge cuts.
    """
    top = Level(level)
    top_first = f"({_LO} >> {ROLLUP_BITS * level})" if level else _LO
    top_last = f"({_HI} >> {ROLLUP_BITS * level})" if level else _HI
    parts = [
        f"SELECT {_bucket_of(top)} AS bucket, {top.row} FROM {top.source}"
        f" WHERE c.series_id = :sid AND {top.key_in(top_first, top_last)} AND {_inside(top)}"
    ]
    ctes: list[str] = []
    if level:
        ctes.append(
            "bucket(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM bucket WHERE i < CAST(:last_bucket AS BIGINT))"
        )
        ctes.append(f"edge(x) AS (SELECT {_LO} + i * {_WIDTH} FROM bucket UNION SELECT {_HI} + 1)")
    for parent in range(level, 0, -1):
        bits = ROLLUP_BITS * parent
        ctes.append(
            f"parent{parent}(block) AS (SELECT DISTINCT x >> {bits} FROM edge WHERE (x & {(1 << bits) - 1}) <> 0)"
        )
        parts.append(_cut_block_pieces(parent, dialect))
    ctes.append("piece AS (" + " UNION ALL ".join(parts) + ")")
    return ("WITH RECURSIVE " if level else "WITH ") + ", ".join(ctes)


@cache
def buckets_sql(level: int, dialect: Dialect) -> Any:
    """Per bucket of the cover: last step and its value, min, max and the number of NaNs (stored
    as NULL), so a single spike or a single NaN in a million points survives a 100-point read."""
    return text(
        f"{cover_sql(level, dialect)}, agg AS ("
        " SELECT bucket, MAX(last_step) AS last_step, MIN(min_value) AS vmin, MAX(max_value) AS vmax,"
        " SUM(nan_count) AS nans FROM piece GROUP BY bucket)"
        # One index seek per bucket. Carrying each block's last value instead measured no faster
        # on PostgreSQL (finding the bucket's last piece costs a sort) and costs every write.
        " SELECT agg.last_step, p.value, agg.vmin, agg.vmax, agg.nans"
        " FROM agg JOIN points p ON p.series_id = :sid AND p.step = agg.last_step ORDER BY agg.last_step"
    )


@cache
def count_sql(level: int, dialect: Dialect) -> Any:
    """The number of points in [:lo, :hi], from the same cover (given one bucket as wide as
    the range, it reads the largest blocks that fit)."""
    return text(f"{cover_sql(level, dialect)} SELECT COALESCE(SUM(point_count), 0) FROM piece")
