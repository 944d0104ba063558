"""the built-in "answers cut at the cap" pages only while the reward has fallen too

Public TRL runs of a GRPO sweep (GSM8K, Qwen2.5-7B and Qwen3.5-9B, answers capped at 512 tokens)
had every answer cut at the cap for a hundred steps and more while their reward held at
0.8-1.0: the reward read the answer before the rambling that ran on to the cap, or a thinking
model under a short cap kept its answers cut from the start, dipped, and came back. The rule
paged 4 of 37 such healthy runs; on the runs that fell, answers ran to the cap as their reward
fell, and the page came after the fall in every one. A built-in rule still on its 0018
parameters gets `reward_fall` 0.3: it fires only while the mean of the reward's last 10 values
is at least 30 % below the highest such mean the run had (docs/alerts.md). A rule its user
edited is left as it is. Each run's state of it was computed without the reward and is thrown
away when next read (its definition changes): the rule's window starts again for runs that
are streaming.

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "answers cut at the cap"
# Frozen here (server/alerts/catalog.py SIGNATURE_RULES holds the current default).
BEFORE: dict[str, Any] = {"op": ">", "threshold": 0.9, "resolve_at": 0.7, "window": 10, "rise": 0.2}
AFTER: dict[str, Any] = {**BEFORE, "reward_fall": 0.3}

rules = sa.table("rules", sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("params", sa.JSON), sa.column("builtin", sa.Boolean))


def _move(old: dict[str, Any], new: dict[str, Any]) -> None:
    conn = op.get_bind()
    found = conn.execute(sa.select(rules.c.id, rules.c.params).where(rules.c.name == NAME, rules.c.builtin.is_(True))).all()
    for rule_id, params in found:
        if params == old:
            conn.execute(rules.update().where(rules.c.id == rule_id).values(params=new))


def upgrade() -> None:
    _move(BEFORE, AFTER)


def downgrade() -> None:
    _move(AFTER, BEFORE)
