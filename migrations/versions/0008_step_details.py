"""step details: a step's histograms, worst samples and sequence sums (docs/protocol.md)

One row per (run, kind, key, step): a histogram of one key, or the step's samples or
sequences (key ""), its body the JSON the wire carried. No foreign key to the run, as for
points (0006): writes lock the run's row, and run deletion takes the same lock before it
deletes the last of them.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "step_details",
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.CheckConstraint("kind IN ('histogram', 'samples', 'sequences')", name=op.f("ck_step_details_kind")),
        sa.PrimaryKeyConstraint("run_id", "kind", "key", "step", name=op.f("pk_step_details")),
    )


def downgrade() -> None:
    op.drop_table("step_details")
