"""The native framework loggers' tests stream to a real Keel server (tests/conftest.py's
`server_factory`, on SQLite) and read back what it stored (tests/support/stored_runs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sqlite_url: str, server_factory: Any) -> str:
    """A Keel server at $KEEL_URL (where the integrations find it), the Monitor's spool in
    tmp_path; its URL."""
    server = server_factory(sqlite_url)
    monkeypatch.setenv("KEEL_URL", server.url)
    monkeypatch.setenv("KEEL_SPOOL_DIR", str(tmp_path / "spool"))
    return str(server.url)
