"""ORM models. Alembic migrations (migrations/) are the only way this schema reaches a database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    """One training run. The id is chosen by the client so that resends and resumes are idempotent."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    project: Mapped[str] = mapped_column(String(200), index=True)
    group: Mapped[str | None] = mapped_column("group_name", String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    tags: Mapped[list[str]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    acked_seq: Mapped[int] = mapped_column(BigInteger)
    """Highest websocket frame seq stored for this run (-1 for none)."""
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    started_at: Mapped[float] = mapped_column(Double)
    """Unix seconds, as are the other times."""
    last_seen_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)


class Series(Base):
    """One metric key of one run; points refer to it by a small integer id."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_series_run_id_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))


class Point(Base):
    """One value of one series at one step. NaN is stored as NULL (SQLite cannot hold NaN)."""

    __tablename__ = "points"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)
    wall_time: Mapped[float] = mapped_column(Double)
