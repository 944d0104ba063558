"""Server settings: the only place that reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainer_hooks.protocol import Limits


def default_database_url() -> str:
    return f"sqlite:///{Path.home() / '.keel' / 'keel.db'}"


class Settings(BaseSettings):
    """Every knob of `keel serve`; each can be set as KEEL_<NAME> in the environment."""

    model_config = SettingsConfigDict(env_prefix="KEEL_", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    """SQLAlchemy URL. sqlite:///path (embedded default) or postgresql://user@host/db."""
    host: str = "127.0.0.1"
    port: int = 8750
    public_url: str | None = None
    """Base URL used in links sent out (webhooks); defaults to http://host:port."""
    auth: bool | None = None
    """Require API tokens. Default: off on loopback, on for any other interface."""
    bootstrap_token: str | None = None
    """If set, an admin token with this value is ensured at start (for deployments)."""
    migrate_on_start: bool = True
    """Apply Alembic migrations when the server starts (`keel db upgrade` does it explicitly)."""
    stale_after_s: float = 120.0
    """A running run that has sent nothing for this long is reported as "stale"."""
    max_frame_bytes: int = 8 * 1024 * 1024
    max_rows_per_frame: int = 10_000
    max_keys_per_row: int = 1_000
    max_key_length: int = 200
    max_ingest_connections: int = 512
    """Ingest websockets beyond this are refused with close code 1013 (retry later)."""
    allow_private_webhooks: bool = False
    """Allow webhook URLs on loopback/private/link-local addresses (local receivers, tests)."""
    silence_check_s: float = 5.0
    """How often running runs are checked for having gone silent."""
    webhook_timeout_s: float = 5.0
    webhook_retry_base_s: float = 1.0
    """First retry delay; doubles per attempt (with jitter) up to 10 minutes."""
    webhook_max_attempts: int = 10
    live_queue_size: int = 1_000
    """Messages buffered per live subscriber; a subscriber that falls further behind is dropped."""

    @property
    def limits(self) -> Limits:
        return Limits(
            max_frame_bytes=self.max_frame_bytes,
            max_rows=self.max_rows_per_frame,
            max_keys_per_row=self.max_keys_per_row,
            max_key_length=self.max_key_length,
        )

    @property
    def auth_enabled(self) -> bool:
        from server.tokens import is_loopback

        return self.auth if self.auth is not None else not is_loopback(self.host)

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
