"""commands: what people and rules ask a run's trainer to do (docs/protocol.md, "Signals")

A table of commands per run, and a rule's optional action (sent as a command when one of its
alerts fires).

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "commands",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("message", sa.String(length=1000), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_commands_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_commands")),
    )
    op.create_index(op.f("ix_commands_run_id"), "commands", ["run_id"], unique=False)
    with op.batch_alter_table("rules") as batch:
        batch.add_column(sa.Column("action", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rules") as batch:
        batch.drop_column("action")
    op.drop_index(op.f("ix_commands_run_id"), table_name="commands")
    op.drop_table("commands")
