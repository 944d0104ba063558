"""Server settings: the only place that reads the environment."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from wire import Limits

MIN_BOOTSTRAP_TOKEN_LENGTH = 16
"""The bootstrap (admin) token's least length: it is the one token whose value an operator
chooses, so one that could be guessed is refused at start."""

DEPRECATED_ENV = {"KEEL_SILENCE_CHECK_S": "KEEL_SILENT_RUN_CHECK_S", "KEEL_STALE_AFTER_S": "KEEL_SILENT_AFTER_S"}
"""Old environment names still read (after the new one), and the names that replaced them."""


def deprecated_env() -> list[tuple[str, str]]:
    """(old name, new name) for each deprecated name set in the environment (warned of at start)."""
    present = {name.upper() for name in os.environ}  # names are matched case-insensitively
    return [(old, new) for old, new in DEPRECATED_ENV.items() if old in present]


def default_database_url() -> str:
    return f"sqlite:///{Path.home() / '.keel' / 'keel.db'}"


class Settings(BaseSettings):
    """Every knob of `keel serve`; each can be set as KEEL_<NAME> in the environment."""

    # populate_by_name: a setting read under old names too (validation_alias) is still
    # passed by its field name in code.
    # hide_input_in_errors: an invalid setting's error never echoes its value (a secret's).
    model_config = SettingsConfigDict(env_prefix="KEEL_", extra="ignore", populate_by_name=True, hide_input_in_errors=True)

    database_url: str = Field(default_factory=default_database_url)
    """SQLAlchemy URL. sqlite:///path (embedded default) or postgresql://user@host/db."""
    host: str = "127.0.0.1"
    port: int = 8750
    public_url: str | None = None
    """Base URL used in links sent out (webhooks); defaults to http://host:port. Its host
    is one of the server's names and its origin may write (below)."""
    allowed_hosts: Annotated[list[str], NoDecode] = []
    """With auth off, names browsers may reach the server by, besides localhost, IP
    addresses, the name it binds and public_url's host (comma-separated; "*": any name).
    A request for any other Host is refused with 400: DNS rebinding (docs/security.md).
    With auth on, any name is served."""
    allowed_origins: Annotated[list[str], NoDecode] = []
    """Origins (https://app.example.com) whose pages may write and open websockets, besides
    the server's own and public_url's (comma-separated). Other pages are refused with 403."""
    forwarded_allow_ips: Annotated[list[str], NoDecode] = []
    """Addresses (or networks, 10.0.0.0/8; "*": any) of the reverse proxies whose
    X-Forwarded-For and X-Forwarded-Proto are believed (comma-separated). Empty: none,
    and a client's address is always its connection's (rate limits, the access log)."""
    auth: bool | None = None
    """Require API tokens. Default: off on loopback, on for any other interface."""
    bootstrap_token: str | None = None
    """If set, an admin token with this value is ensured at start (for deployments); at
    least MIN_BOOTSTRAP_TOKEN_LENGTH characters. Empty: none."""
    migrate_on_start: bool = True
    """Apply Alembic migrations when the server starts (`keel db upgrade` does it explicitly)."""
    silent_after_s: float = Field(default=120.0, validation_alias=AliasChoices("KEEL_SILENT_AFTER_S", "KEEL_STALE_AFTER_S"))
    """A running run that has sent nothing for this long is shown as "silent" (its status in
    the API and on the runs page). The "run went silent" rule pages on its own `after_s`
    (120 s by default, per scope). KEEL_STALE_AFTER_S, its old name, is still read and deprecated."""
    max_frame_bytes: int = 8 * 1024 * 1024
    """Largest websocket message, and largest body of the requests that carry what a frame
    does (POST /runs/{id}/points, PATCH /runs/{id}) and of the dashboard's callbacks."""
    max_body_bytes: int = 1024 * 1024
    """Largest body of every other request (rules, silences, webhooks, tokens, commands,
    backtests); /login takes 4 KiB. Over it: 413, while it is read (server/bodies.py)."""
    max_keys_per_run: int = 10_000
    """Distinct metric keys a run may have: a frame or REST write whose new keys would
    take the run past it is refused whole (keys the run has are always taken)."""
    max_config_bytes: int = 1024 * 1024
    """A run's config as compact JSON, at its hello and after each PATCH's merge."""
    max_rows_per_frame: int = 10_000
    max_keys_per_row: int = 1_000
    max_key_length: int = 200
    max_ingest_connections: int = 512
    """Ingest websockets beyond this are refused with close code 1013 (retry later)."""
    max_ingest_connections_per_token: int = 256
    """Ingest websockets one token (or, with auth off, one address) may hold: past it 1013,
    saying which cap. Half the server's, so one team's token never locks out the others."""
    max_live_connections: int = 1024
    """Live websockets (browsers' pages) the server holds at most: past it 1013."""
    max_live_connections_per_token: int = 128
    """Live websockets one token or login (or, with auth off, one address) may hold."""
    allow_private_webhooks: bool = False
    """Allow webhook URLs on loopback/private/link-local addresses (local receivers, tests)."""
    hazard_model: Path | None = None
    """A collapse-hazard model file (`keel eval-alerts --fit-hazard`) the server computes every
    hazard with: its API, its signals and its `hazard` rules. None: the built-in model."""
    silent_run_check_s: float = Field(default=5.0, validation_alias=AliasChoices("KEEL_SILENT_RUN_CHECK_S", "KEEL_SILENCE_CHECK_S"))
    """How often running runs are checked for having gone silent (and idle runs' detector
    states saved and dropped from memory). Its old name, KEEL_SILENCE_CHECK_S, from before
    "silence" meant muting alerts only, is still read and deprecated."""
    webhook_timeout_s: float = 5.0
    webhook_retry_base_s: float = 1.0
    """First retry delay; doubles per attempt (with jitter) up to 10 minutes."""
    webhook_max_attempts: int = 10
    live_buffer_bytes: int = 8 * 1024 * 1024
    """Encoded bytes queued for one live subscriber; one that falls further behind is closed
    with 1013 ("subscriber fell behind; reload") and its queue freed."""
    live_total_buffer_bytes: int = 256 * 1024 * 1024
    """Encoded bytes queued for all live subscribers together; past it, the subscriber
    furthest behind is dropped (as above) until the new message fits."""

    # Deadlines for every stage of a connection (docs/security.md).
    http_header_timeout_s: float = 10.0
    """From connecting (or from the first byte of the next request on a kept-alive
    connection) to a complete request head, websocket upgrades included; else 408 and close."""
    http_keep_alive_s: int = 5
    """An idle kept-alive HTTP connection is closed after this long (uvicorn's timeout_keep_alive)."""
    http_body_timeout_s: float = 60.0
    """From the request head to the end of its body; else 408 and close (slow uploads)."""
    ingest_hello_timeout_s: float = 10.0
    """An ingest socket that has sent no valid hello this long after it was accepted is
    closed with 4408. Until its hello it holds no ingest slot."""
    ingest_idle_timeout_s: float = 300.0
    """An ingest socket that sends no frame for this long is closed with 4408."""
    token_recheck_s: float = 2.0
    """How often an open websocket's token is checked again: a revoked token's ingest and live
    sockets are closed (4401) within this long."""
    ingest_buffer_bytes: int = 32 * 1024 * 1024
    """Bytes of ingest frames decoded and being written at once, over all sockets (a decoded
    frame takes about ten times its size): beyond it, sockets wait their turn unread, so a
    slow database cannot grow the server's memory."""
    ws_ping_interval_s: float = 20.0
    """Websocket keepalive pings (both sockets)."""
    ws_ping_timeout_s: float = 60.0
    """A websocket peer that answers no ping for this long is dropped (1011)."""

    # Rate limits, per token (per client address with auth off); 0 turns one off.
    write_requests_per_s: float = 100.0
    """REST writes (POST, PUT, PATCH, DELETE under /api/) per second; beyond the burst,
    429 with Retry-After."""
    write_requests_burst: int = 200
    ingest_bytes_per_s: float = 16 * 1024 * 1024
    """Bytes of ingest frames and REST write bodies per second, together."""
    ingest_bytes_burst: int = 128 * 1024 * 1024
    """What may be written at once after a quiet spell (a Monitor flushing its spool)."""
    ingest_max_pacing_s: float = 2.0
    """An ingest frame over the rate is held back (the socket is not read) for up to this
    long; one that would have to wait longer closes the socket with 1013 and `retry_after_s`.
    REST writes are not held back: over the rate they get 429."""
    auth_failures_per_s: float = 0.2
    """Failed authentications per client address (a token that is no token's, in a request
    or at /login), per second, after the burst. Beyond it, the address's credentials are
    answered 429 with Retry-After without being looked up. 0 turns it off."""
    auth_failures_burst: int = 20

    @field_validator("bootstrap_token")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        if not value:
            return None
        if len(value) < MIN_BOOTSTRAP_TOKEN_LENGTH:
            raise ValueError(
                f"KEEL_BOOTSTRAP_TOKEN must be at least {MIN_BOOTSTRAP_TOKEN_LENGTH} characters, not {len(value)}; "
                "use a long random string: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("allowed_hosts", "allowed_origins", "forwarded_allow_ips", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"KEEL_FORWARDED_ALLOW_IPS entries are addresses or networks (10.0.0.5, 10.0.0.0/8) or *, not {entry!r}"
                ) from None
        return value

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
        from server.api_tokens import is_loopback

        return self.auth if self.auth is not None else not is_loopback(self.host)

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
