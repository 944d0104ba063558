"""the built-in mismatch rules also read a framework's k1 estimate of the mismatch

Some runs log the sampler–learner mismatch only as the k1 estimate, the token mean of
log μ − log π (verl's `rollout_corr/kl`, stored as `mismatch/kl_k1`; an export that kept it
and not `rollout_corr/k3_kl`). The built-in "mismatch climbing" and "mismatch drift" rules
that still read their 0010 metric now read it last, after Keel's KL and a framework's mean
|Δ log p|: a run that logs any of them is watched, each against its own learned level.

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here (server/alerts/catalog.py MISMATCH_KEYS holds the current default).
BEFORE = "mismatch/kl|mismatch/log_ratio_abs_mean|mismatch/log_ratio_abs_seq_mean"
AFTER = f"{BEFORE}|mismatch/kl_k1"
WIDENED = {
    "mismatch climbing": (BEFORE, AFTER),
    "mismatch drift": (f"{BEFORE},mismatch/ratio_max", f"{AFTER},mismatch/ratio_max"),
}

rules = sa.table(
    "rules", sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("metric", sa.String), sa.column("builtin", sa.Boolean)
)


def _widen(conn: sa.Connection, name: str, old: str, new: str) -> None:
    """A built-in rule still on its default metric `old` reads `new`; its detector state goes."""
    ids = list(conn.execute(sa.select(rules.c.id).where(rules.c.name == name, rules.c.builtin.is_(True), rules.c.metric == old)).scalars())
    if ids:
        conn.execute(sa.text("DELETE FROM rule_states WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(rules.update().where(rules.c.id.in_(ids)).values(metric=new))


def upgrade() -> None:
    conn = op.get_bind()
    for name, (old, new) in WIDENED.items():
        _widen(conn, name, old, new)


def downgrade() -> None:
    conn = op.get_bind()
    for name, (old, new) in WIDENED.items():
        _widen(conn, name, new, old)
