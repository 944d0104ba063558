"""point rollups: per-series summaries of aligned step blocks, for reads independent of length

A bucketed series read used to visit every point of the range; it now combines these
summaries (docs/operations.md, "Reads"). Existing points are summarised here, level by
level, as the server summarises the blocks a write touches.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of server.storage's ROLLUP_BITS and ROLLUP_LEVELS at this revision: a
# migration must not change meaning when the server's constants do.
BITS = 4
LEVELS = 5


def upgrade() -> None:
    op.create_table(
        "point_rollups",
        sa.Column("series_id", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("min_value", sa.Double(), nullable=True),
        sa.Column("max_value", sa.Double(), nullable=True),
        sa.Column("nan_count", sa.Integer(), nullable=False),
        sa.Column("point_count", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name=op.f("fk_point_rollups_series_id_series"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("series_id", "level", "block", name=op.f("pk_point_rollups")),
        sqlite_with_rowid=False,
    )
    op.execute(
        "INSERT INTO point_rollups "
        "(series_id, level, block, min_value, max_value, nan_count, point_count, last_step) "
        f"SELECT series_id, 1, step >> {BITS}, MIN(value), MAX(value), COUNT(*) - COUNT(value), COUNT(*), MAX(step) "
        f"FROM points GROUP BY series_id, step >> {BITS}"
    )
    for level in range(2, LEVELS + 1):
        op.execute(
            "INSERT INTO point_rollups "
            "(series_id, level, block, min_value, max_value, nan_count, point_count, last_step) "
            f"SELECT series_id, {level}, block >> {BITS}, MIN(min_value), MAX(max_value), SUM(nan_count), "
            f"SUM(point_count), MAX(last_step) FROM point_rollups WHERE level = {level - 1} "
            f"GROUP BY series_id, block >> {BITS}"
        )


def downgrade() -> None:
    op.drop_table("point_rollups")
