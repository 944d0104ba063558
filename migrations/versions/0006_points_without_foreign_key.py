"""points without a foreign key: half the cost of inserting a point on PostgreSQL

PostgreSQL checks a foreign key with one lookup per inserted row; on a 2,000-point frame that
was as much work as inserting the points. Points stay tied to their series without it: every
write locks its run's row before it inserts, and deleting a run takes the same lock before it
deletes the run's last points (server/retention.py).

On SQLite this rebuilds the points table (a copy of every point: about a second per few
million points, once).

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("points", table_kwargs={"sqlite_with_rowid": False}) as batch:
        batch.drop_constraint(op.f("fk_points_series_id_series"), type_="foreignkey")


def downgrade() -> None:
    # Points whose series is gone (there should be none) would fail the constraint.
    op.execute("DELETE FROM points WHERE series_id NOT IN (SELECT id FROM series)")
    with op.batch_alter_table("points", table_kwargs={"sqlite_with_rowid": False}) as batch:
        batch.create_foreign_key(
            op.f("fk_points_series_id_series"), "series", ["series_id"], ["id"], ondelete="CASCADE"
        )
