"""the "mismatch drift" default rule for projects that existed before it

Default rules are installed when a project is first seen, so projects created before this
rule existed would never get it. This adds it to each of them, once, unless the project
already has a rule of that name. A user who deletes it later keeps it deleted.

Revision ID: 0007
Revises: 0006
"""

import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "mismatch drift"
# Frozen here as the rule was introduced (server/alerts/catalog.py holds the current defaults).
RULE = {
    "name": NAME, "group_name": None, "run_id": None, "metric": "mismatch/kl,mismatch/ratio_max",
    "detector": "co_climb", "params": {"h": 20.0}, "severity": "critical", "for_steps": 1,
    "keep_firing_for": 50, "enabled": True, "builtin": True,
}

projects = sa.table("projects", sa.column("name", sa.String))
rules = sa.table(
    "rules",
    sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("project", sa.String),
    sa.column("group_name", sa.String), sa.column("run_id", sa.String), sa.column("metric", sa.String),
    sa.column("detector", sa.String), sa.column("params", sa.JSON), sa.column("severity", sa.String),
    sa.column("for_steps", sa.Integer), sa.column("keep_firing_for", sa.Integer), sa.column("enabled", sa.Boolean),
    sa.column("builtin", sa.Boolean), sa.column("created_at", sa.Double),
)


def upgrade() -> None:
    conn = op.get_bind()
    have = set(conn.execute(sa.select(rules.c.project).where(rules.c.name == NAME)).scalars())
    missing = [name for name in conn.execute(sa.select(projects.c.name)).scalars() if name not in have]
    if missing:
        now = time.time()
        conn.execute(rules.insert(), [{**RULE, "project": name, "created_at": now} for name in missing])


def downgrade() -> None:
    conn = op.get_bind()
    ids = list(conn.execute(sa.select(rules.c.id).where(rules.c.name == NAME, rules.c.builtin.is_(True))).scalars())
    if ids:
        conn.execute(sa.text("DELETE FROM rule_states WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(sa.text("UPDATE alerts SET rule_id = NULL WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(rules.delete().where(rules.c.id.in_(ids)))
