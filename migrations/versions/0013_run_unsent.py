"""frames a run's trainer ended without getting acknowledged

A trainer that gives up waiting for the server's acks at its end (`finish` with `last_seq`,
docs/protocol.md) still says how the run ended: the run is shown as what it is (finished,
with N frames still in the trainer's spool for `keel sync`), not as a run gone silent.

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("unsent", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("unsent")
