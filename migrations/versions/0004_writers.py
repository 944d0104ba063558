"""run writers: frame sequences per writer of a run

Each client that streams a run (a Monitor's spool, `keel sync`) numbers its frames in a
sequence of its own, so two writers of one run never mistake each other's frames for
resends; `session` fences off a superseded connection of the same writer.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_writers",
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("writer", sa.String(length=64), nullable=False),
        sa.Column("acked_seq", sa.BigInteger(), nullable=False),
        sa.Column("session", sa.String(length=32), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_writers_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "writer", name=op.f("pk_run_writers")),
    )
    # Frames numbered before writers existed belong to the unnamed writer "".
    op.execute(
        "INSERT INTO run_writers (run_id, writer, acked_seq, session) "
        "SELECT id, '', acked_seq, NULL FROM runs WHERE acked_seq >= 0"
    )
    # runs.acked_seq stays: the highest seq stored of any of the run's writers (REST reads).


def downgrade() -> None:
    op.drop_table("run_writers")
