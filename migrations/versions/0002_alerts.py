"""alerts and webhooks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 13:35:44.439502
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "projects",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_projects")),
    )
    op.create_table(
        "rules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=True),
        sa.Column("group_name", sa.String(length=200), nullable=True),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("metric", sa.String(length=200), nullable=False),
        sa.Column("detector", sa.String(length=50), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("for_steps", sa.Integer(), nullable=False),
        sa.Column("keep_firing_for", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("builtin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rules")),
    )
    op.create_index(op.f("ix_rules_project"), "rules", ["project"], unique=False)
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", sa.Double(), nullable=False),
        sa.Column("ends_at", sa.Double(), nullable=False),
        sa.Column("comment", sa.String(length=1000), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("format", sa.String(length=20), nullable=False),
        sa.Column("secret", sa.String(length=200), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("disabled_reason", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("rule_id", sa.Integer(), nullable=True),
        sa.Column("rule_name", sa.String(length=200), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("metric", sa.String(length=200), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_step", sa.BigInteger(), nullable=True),
        sa.Column("fired_step", sa.BigInteger(), nullable=True),
        sa.Column("resolved_step", sa.BigInteger(), nullable=True),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("message", sa.String(length=1000), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("resolved_at", sa.Double(), nullable=True),
        sa.Column("silenced", sa.Boolean(), nullable=False),
        sa.Column("acknowledged_at", sa.Double(), nullable=True),
        sa.Column("acknowledged_by", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["rules.id"], name=op.f("fk_alerts_rule_id_rules"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_alerts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index(op.f("ix_alerts_fingerprint"), "alerts", ["fingerprint"], unique=False)
    op.create_index(op.f("ix_alerts_run_id"), "alerts", ["run_id"], unique=False)
    op.create_index(op.f("ix_alerts_state"), "alerts", ["state"], unique=False)
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(length=100), nullable=False),
        sa.Column("event_type", sa.String(length=50), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=False),
        sa.Column("last_error", sa.String(length=1000), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_deliveries_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("webhook_id", "event_id", name="uq_deliveries_webhook_id_event_id"),
    )
    op.create_index(
        op.f("ix_deliveries_next_attempt_at"), "deliveries", ["next_attempt_at"], unique=False
    )
    op.create_index(op.f("ix_deliveries_status"), "deliveries", ["status"], unique=False)
    op.create_index(op.f("ix_deliveries_webhook_id"), "deliveries", ["webhook_id"], unique=False)
    op.create_table(
        "rule_states",
        sa.Column("rule_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["rules.id"], name=op.f("fk_rule_states_rule_id_rules"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_rule_states_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("rule_id", "run_id", name=op.f("pk_rule_states")),
    )


def downgrade() -> None:

    op.drop_table("rule_states")
    op.drop_index(op.f("ix_deliveries_webhook_id"), table_name="deliveries")
    op.drop_index(op.f("ix_deliveries_status"), table_name="deliveries")
    op.drop_index(op.f("ix_deliveries_next_attempt_at"), table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_index(op.f("ix_alerts_state"), table_name="alerts")
    op.drop_index(op.f("ix_alerts_run_id"), table_name="alerts")
    op.drop_index(op.f("ix_alerts_fingerprint"), table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("webhooks")
    op.drop_table("silences")
    op.drop_index(op.f("ix_rules_project"), table_name="rules")
    op.drop_table("rules")
    op.drop_table("projects")
