"""the command actions a run's trainer takes

A trainer that listens to commands may say which actions its handler takes, with a line on
what each does (docs/protocol.md, "Signals"): the run page offers exactly those, and a
command for another action, or for a run that has ended, is refused instead of waiting
`pending` for a trainer that will never take it. NULL: no trainer of the run listens to
commands (or it said so before this upgrade); {}: one listens without saying which.

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("actions", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("actions")
