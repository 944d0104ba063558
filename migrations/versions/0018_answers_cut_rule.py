"""a default critical rule when answers stop finishing: "answers cut at the cap"

A run whose answers run to the length cap is failing, whatever else it logs: once nearly
every answer is cut, the reward sees unfinished answers and groups whose answers are all cut
score alike. The mismatch arm of a public slime A/B went from about half its answers cut to 97 %
while its reward slid to 0, and no default rule paged it (the warning "answers at the length
cap" waits for a learned level this run never had). "answers cut at the cap" pages when the mean
of `response/truncated_frac` over the last 10 steps is above 0.9, up at least 0.2 from the lowest
it had (a run cut at the cap from its first steps is not paged; docs/alerts.md, "Every signal a
run logs"); the threshold detector gains its `window` and `rise` for it. Default rules are installed when a
project is first seen, so this adds the rule to every project that has no rule of that name,
once; a user who deletes it later keeps it deleted.

Revision ID: 0018
Revises: 0017
"""

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here as the rule was introduced (server/alerts/catalog.py holds the current defaults).
RULE: dict[str, Any] = {
    "name": "answers cut at the cap", "metric": "response/truncated_frac", "detector": "threshold",
    "params": {"op": ">", "threshold": 0.9, "resolve_at": 0.7, "window": 10, "rise": 0.2}, "severity": "critical", "for_steps": 1,
    "keep_firing_for": 10, "group_name": None, "run_id": None, "enabled": True, "builtin": True, "action": None,
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
