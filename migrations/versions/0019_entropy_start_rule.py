"""a default critical rule when the policy's entropy leaves where it started: "entropy far above its start"

A run fine-tuned from a trained model starts sharp (a token entropy of 0.2-0.9 nats). Public GRPO
runs that fell for good first went to several times that, and two of them did so before their
reward had risen enough for the learned-level rules to have a level at all: one with clipping
and KL went from 0.21 to about 1 nat by its 25th step and to the uniform output (11.9 nats) at its
fall at 57, with no rule firing before or after. "entropy far above its start" pages while the
median of the last 20 entropies is at least 3 times the median of the first 10 (values under
0.2 nats count as 0.2), with a detector of its own, `above_start` (docs/alerts.md, "Every signal
a run logs"). A run trained from scratch starts at its highest entropy and is never paged by it.
Default rules are installed when a project is first seen, so this adds the rule to every project
that has no rule of that name, once; a user who deletes it later keeps it deleted.

Revision ID: 0019
Revises: 0018
"""

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here as the rule was introduced (server/alerts/catalog.py holds the current defaults).
RULE: dict[str, Any] = {
    "name": "entropy far above its start", "metric": "policy/entropy", "detector": "above_start",
    "params": {"start": 10, "window": 20, "factor": 3.0, "floor": 0.2}, "severity": "critical", "for_steps": 1,
    "keep_firing_for": 50, "group_name": None, "run_id": None, "enabled": True, "builtin": True, "action": None,
}

projects = sa.table("projects", sa.column("name", sa.String))
rules = sa.table(
    "rules",
    sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("project", sa.String),
    sa.column("group_name", sa.String), sa.column("run_id", sa.String), sa.column("metric", sa.String),
    sa.column("detector", sa.String), sa.column("params", sa.JSON), sa.column("severity", sa.String),
    sa.column("for_steps", sa.Integer), sa.column("keep_firing_for", sa.Integer), sa.column("enabled", sa.Boolean),
    sa.column("builtin", sa.Boolean), sa.column("created_at", sa.Double), sa.column("action", sa.String),
)


def upgrade() -> None:
    conn = op.get_bind()
    every = list(conn.execute(sa.select(projects.c.name)).scalars())
    have = set(conn.execute(sa.select(rules.c.project).where(rules.c.name == RULE["name"])).scalars())
    missing = [name for name in every if name not in have]
    if missing:
        now = time.time()
        conn.execute(rules.insert(), [{**RULE, "project": name, "created_at": now} for name in missing])


def downgrade() -> None:
    conn = op.get_bind()
    ids = list(conn.execute(sa.select(rules.c.id).where(rules.c.name == RULE["name"], rules.c.builtin.is_(True))).scalars())
    if ids:
        conn.execute(sa.text("DELETE FROM rule_states WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(sa.text("UPDATE alerts SET rule_id = NULL WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(rules.delete().where(rules.c.id.in_(ids)))
