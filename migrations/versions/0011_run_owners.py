"""a run's owner (the name of the token that made it) and who answered a command

With auth on, only tokens of a run's owner name, or an admin, write to the run, listen to
its commands or answer them (docs/security.md, "Who speaks for a run"). Runs that exist at
this upgrade have no owner (nobody recorded which token made them): the first token that
writes to one after it claims it. Commands record the name of the token that answered.

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("owner", sa.String(length=200), nullable=True))
    with op.batch_alter_table("commands") as batch:
        batch.add_column(sa.Column("answered_by", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("commands") as batch:
        batch.drop_column("answered_by")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("owner")
