"""the default rules on the signatures every RL run logs, for projects that existed before them

"entropy running away", "loss growing" (critical), "policy ratio jumping", "answers at the
length cap" and "no learning signal" (warnings): default rules are installed when a project
is first seen, so projects created before these rules existed would never get them. This adds
each to every project that has no rule of that name, once; a user who deletes one later keeps
it deleted. The built-in "mismatch climbing" and "mismatch drift" rules that still read their
default metric now read a framework's own mean |Δ log p| where a run logs no `mismatch/kl`.

Revision ID: 0010
Revises: 0009
"""

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here as the rules were introduced (server/alerts/catalog.py holds the current defaults).
_COMMON: dict[str, Any] = {"group_name": None, "run_id": None, "enabled": True, "builtin": True, "action": None}
RULES: list[dict[str, Any]] = [
    {
        **_COMMON, "name": "entropy running away", "metric": "policy/entropy", "detector": "climb",
        "params": {"min_scale": 0.35, "k": 2.0, "h": 10.0, "adapt": 0.02, "floor": 0.1}, "severity": "critical", "for_steps": 1, "keep_firing_for": 50,
    },
    {
        **_COMMON, "name": "loss growing", "metric": "loss/total|loss/pg", "detector": "climb",
        "params": {"of": "magnitude", "floor": 0.01, "min_scale": 0.5, "k": 2.0, "h": 10.0},
        "severity": "critical", "for_steps": 1, "keep_firing_for": 50,
    },
    {
        **_COMMON, "name": "policy ratio jumping", "metric": "policy/ppo_kl|policy/ratio_max|policy/clip_frac",
        "detector": "jump", "params": {"factor": 10.0}, "severity": "warning", "for_steps": 1, "keep_firing_for": 30,
    },
    {
        **_COMMON, "name": "answers at the length cap", "metric": "response/truncated_frac", "detector": "climb",
        "params": {"floor": 0.1, "min_scale": 0.2}, "severity": "warning", "for_steps": 3, "keep_firing_for": 30,
    },
    {
        **_COMMON, "name": "no learning signal", "metric": "reward/zero_std_frac", "detector": "threshold",
        "params": {"op": ">", "threshold": 0.9, "resolve_at": 0.7}, "severity": "warning", "for_steps": 20,
        "keep_firing_for": 10,
    },
]
NAMES = [rule["name"] for rule in RULES]
MISMATCH = "mismatch/kl|mismatch/log_ratio_abs_mean|mismatch/log_ratio_abs_seq_mean"
WIDENED = {  # built-in rules that now read a framework's own mismatch where a run logs no KL
    "mismatch climbing": ("mismatch/kl", MISMATCH),
    "mismatch drift": ("mismatch/kl,mismatch/ratio_max", f"{MISMATCH},mismatch/ratio_max"),
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


def _widen(conn: sa.Connection, name: str, old: str, new: str) -> None:
    """A built-in rule still on its default metric `old` reads `new`; its detector state goes."""
    ids = list(conn.execute(sa.select(rules.c.id).where(rules.c.name == name, rules.c.builtin.is_(True), rules.c.metric == old)).scalars())
    if ids:
        conn.execute(sa.text("DELETE FROM rule_states WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(rules.update().where(rules.c.id.in_(ids)).values(metric=new))


def upgrade() -> None:
    conn = op.get_bind()
    every = list(conn.execute(sa.select(projects.c.name)).scalars())
    now = time.time()
    for rule in RULES:
        have = set(conn.execute(sa.select(rules.c.project).where(rules.c.name == rule["name"])).scalars())
        missing = [name for name in every if name not in have]
        if missing:
            conn.execute(rules.insert(), [{**rule, "project": name, "created_at": now} for name in missing])
    for name, (old, new) in WIDENED.items():
        _widen(conn, name, old, new)


def downgrade() -> None:
    conn = op.get_bind()
    for name, (old, new) in WIDENED.items():
        _widen(conn, name, new, old)
    ids = list(conn.execute(sa.select(rules.c.id).where(rules.c.name.in_(NAMES), rules.c.builtin.is_(True))).scalars())
    if ids:
        conn.execute(sa.text("DELETE FROM rule_states WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(sa.text("UPDATE alerts SET rule_id = NULL WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(rules.delete().where(rules.c.id.in_(ids)))
