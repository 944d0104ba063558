"""ORM models. Alembic migrations (migrations/) are the only way this schema reaches a database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
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
    """Highest frame seq stored of any of the run's writers (-1 for none); each writer's own
    sequence is in run_writers."""
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    started_at: Mapped[float] = mapped_column(Double)
    """Unix seconds, as are the other times."""
    last_seen_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """The name of the token that made the run (with auth on): only tokens of that name, or
    an admin, write to it. None: made with auth off, or before owners (the next token that
    writes to it claims it)."""
    unsent: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """Frames its writer's trainer ended without getting acknowledged (its last `finish` said
    its last frame's seq): they are in the trainer's spool for `keel sync`. None: none."""
    actions: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    """The command actions its trainer takes, with what each does: None while no trainer of
    the run listens to commands, {} for one that listens without saying which."""


class RunWriter(Base):
    """One client streaming a run (a Monitor's spool, `keel sync`), with its own frame sequence."""

    __tablename__ = "run_writers"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    writer: Mapped[str] = mapped_column(String(64), primary_key=True)
    """The id the client sends in its hello ("" for clients that send none)."""
    acked_seq: Mapped[int] = mapped_column(BigInteger)
    """Highest frame seq of this writer stored (or rejected as malformed); -1 for none."""
    session: Mapped[str | None] = mapped_column(String(32))
    """The connection that holds this writer now; frames from any other are refused."""


class Series(Base):
    """One metric key of one run; points refer to it by a small integer id."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_series_run_id_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))


class Point(Base):
    """One value of one series at one step. NaN is stored as NULL (SQLite cannot hold NaN).

    `series_id` has no foreign key (migration 0006): the write path and run deletion keep
    it pointing at a series (server/storage/writes.py, server/retention.py)."""

    __tablename__ = "points"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)
    wall_time: Mapped[float] = mapped_column(Double)


class PointRollup(Base):
    """The points of one series in one aligned block of steps, summarised: what a bucketed read
    needs (min, max, NaNs, last step) without visiting the points.

    A block of `level` L holds steps [block * 16**L, (block + 1) * 16**L); its summary is that
    of its 16 children (level L-1 blocks, level 0 being the points themselves), recomputed from
    them whenever one of them gains a point, so it always agrees with the stored points.
    """

    __tablename__ = "point_rollups"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(
        ForeignKey("series.id", ondelete="CASCADE"), primary_key=True
    )
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    block: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    """step >> (4 * level): the block's first step is block << (4 * level)."""
    min_value: Mapped[float | None] = mapped_column(Double)
    """Least value that is not NaN (NULL when every point of the block is NaN)."""
    max_value: Mapped[float | None] = mapped_column(Double)
    nan_count: Mapped[int] = mapped_column(Integer)
    point_count: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(BigInteger)
    """The block's highest stored step."""


DETAIL_KINDS = ("histogram", "samples", "sequences")
"""What a `StepDetail` holds: one histogram (by its key), the step's samples, its sequences."""


class StepDetail(Base):
    """A step's details (docs/protocol.md, "Step details"): one histogram of a key, or the
    step's samples or sequences (key ""), as the JSON the wire carries them in. `size` is
    how many entries the body holds (bins, samples or sequences).

    Like points, no foreign key to the run (migration 0006): a write locks its run's row
    first, and run deletion takes the same lock before it deletes the last of them
    (server/retention.py)."""

    __tablename__ = "step_details"
    __table_args__ = (CheckConstraint("kind IN ('histogram', 'samples', 'sequences')", name="kind"),)

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)


class Project(Base):
    """A project seen by the server; its default alert rules are installed on first sight."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[float] = mapped_column(Double)


class Rule(Base):
    """An alert rule: a detector with parameters on a metric, scoped to a project, group or run."""

    __tablename__ = "rules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    project: Mapped[str | None] = mapped_column(String(200), index=True)
    group: Mapped[str | None] = mapped_column("group_name", String(200))
    run_id: Mapped[str | None] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(200))
    detector: Mapped[str] = mapped_column(String(50))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    severity: Mapped[str] = mapped_column(String(16))
    for_steps: Mapped[int] = mapped_column(Integer)
    """Consecutive steps the condition must hold before pending becomes firing."""
    keep_firing_for: Mapped[int] = mapped_column(Integer)
    """Consecutive clear steps before a firing alert resolves (hysteresis)."""
    enabled: Mapped[bool] = mapped_column(Boolean)
    builtin: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[float] = mapped_column(Double)
    action: Mapped[str | None] = mapped_column(String(64))
    """A command sent to the run when an alert of this rule fires (`checkpoint`, `stop`, ...)."""


class RuleState(Base):
    """Detector and lifecycle state of one rule on one run, so evaluation survives restarts."""

    __tablename__ = "rule_states"

    rule_id: Mapped[int] = mapped_column(ForeignKey("rules.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    last_step: Mapped[int | None] = mapped_column(BigInteger)


class Alert(Base):
    """One episode of a rule on a run: pending -> firing -> resolved."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    """Stable identity of (rule, run): repeated episodes share it."""
    rule_id: Mapped[int | None] = mapped_column(ForeignKey("rules.id", ondelete="SET NULL"))
    rule_name: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    metric: Mapped[str] = mapped_column(String(200))
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    started_step: Mapped[int | None] = mapped_column(BigInteger)
    fired_step: Mapped[int | None] = mapped_column(BigInteger)
    resolved_step: Mapped[int | None] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double)
    message: Mapped[str] = mapped_column(String(1000))
    started_at: Mapped[float] = mapped_column(Double)
    resolved_at: Mapped[float | None] = mapped_column(Double)
    silenced: Mapped[bool] = mapped_column(Boolean)
    acknowledged_at: Mapped[float | None] = mapped_column(Double)
    acknowledged_by: Mapped[str | None] = mapped_column(String(200))


class Silence(Base):
    """Mutes notifications of alerts whose labels match every matcher, for a bounded time."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    matchers: Mapped[dict[str, str]] = mapped_column(JSON)
    starts_at: Mapped[float] = mapped_column(Double)
    ends_at: Mapped[float] = mapped_column(Double)
    comment: Mapped[str] = mapped_column(String(1000))
    created_by: Mapped[str] = mapped_column(String(200))


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(2000))
    format: Mapped[str] = mapped_column(String(20))
    secret: Mapped[str] = mapped_column(String(200))
    """Signing secret (whsec_...). Returned once, at creation."""
    enabled: Mapped[bool] = mapped_column(Boolean)
    disabled_reason: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[float] = mapped_column(Double)


class Delivery(Base):
    """The webhook outbox: one row per (webhook, event), written with the alert change."""

    __tablename__ = "deliveries"
    __table_args__ = (UniqueConstraint("webhook_id", "event_id", name="uq_deliveries_webhook_id_event_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    event_id: Mapped[str] = mapped_column(String(100))
    """Sent as webhook-id; stable across retries so receivers can deduplicate."""
    event_type: Mapped[str] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    """pending, delivered, failed (gave up) or dropped (hook disabled)."""
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[float] = mapped_column(Double, index=True)
    last_error: Mapped[str | None] = mapped_column(String(1000))
    created_at: Mapped[float] = mapped_column(Double)
    delivered_at: Mapped[float | None] = mapped_column(Double)


class Command(Base):
    """A command addressed to a run's trainer (docs/protocol.md, "Signals"): pending until a
    listening writer of the run receives it (delivered), then acked or failed as it answers."""

    __tablename__ = "commands"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    action: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    """pending, delivered, acked or failed."""
    requested_by: Mapped[str] = mapped_column(String(200))
    """The token's name, or "rule <name>"."""
    created_at: Mapped[float] = mapped_column(Double)
    delivered_at: Mapped[float | None] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    message: Mapped[str] = mapped_column(String(1000))
    """What the trainer answered (an error's text when failed)."""
    answered_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """The name of the token whose socket answered ("local" with auth off)."""


class ApiToken(Base):
    """A bearer token, stored as its SHA-256; the token itself is shown once, at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    """Any of "ingest", "read", "admin" (admin implies the others)."""
    created_at: Mapped[float] = mapped_column(Double)
    revoked: Mapped[bool] = mapped_column(Boolean)
