"""Settings read from the environment, old names of renamed settings included."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from server.config import Settings, deprecated_env


def test_the_silent_run_check_period_is_read_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_SILENT_RUN_CHECK_S", "0.5")
    assert Settings().silent_run_check_s == 0.5
    assert deprecated_env() == []


@pytest.mark.parametrize(
    ("field", "new", "old"),
    [("silent_run_check_s", "KEEL_SILENT_RUN_CHECK_S", "KEEL_SILENCE_CHECK_S"), ("silent_after_s", "KEEL_SILENT_AFTER_S", "KEEL_STALE_AFTER_S")],
)
def test_an_old_name_still_works_and_is_reported_deprecated(monkeypatch: pytest.MonkeyPatch, field: str, new: str, old: str) -> None:
    monkeypatch.delenv(new, raising=False)
    monkeypatch.setenv(old, "0.7")
    assert getattr(Settings(), field) == 0.7
    assert deprecated_env() == [(old, new)]
    monkeypatch.setenv(new, "0.5")  # both set: the new name wins
    assert getattr(Settings(), field) == 0.5


def test_code_sets_it_by_its_field_name_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_SILENCE_CHECK_S", "0.7")
    assert Settings(silent_run_check_s=0.2).silent_run_check_s == 0.2
    assert Settings().silent_run_check_s == 0.7


def test_a_server_started_with_an_old_name_warns_once(
    server_factory, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KEEL_SILENCE_CHECK_S", "0.7")
    with caplog.at_level(logging.WARNING, logger="keel.server"):
        server = server_factory(sqlite_url)
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "KEEL_SILENCE_CHECK_S" in r.getMessage()]
    assert warnings == ["KEEL_SILENCE_CHECK_S is deprecated and will stop working; set KEEL_SILENT_RUN_CHECK_S instead"]


def test_a_bootstrap_token_shorter_than_16_characters_is_refused_without_echoing_it() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="KEEL_BOOTSTRAP_TOKEN must be at least 16 characters, not 15") as refused:
        Settings(bootstrap_token="short-admin-tok")
    assert "short-admin-tok" not in str(refused.value)
    assert Settings(bootstrap_token="x" * 16).bootstrap_token == "x" * 16
    assert Settings(bootstrap_token="").bootstrap_token is None  # empty: no bootstrap token, as before


def test_keel_serve_refuses_a_short_bootstrap_token_at_start(sqlite_url: str) -> None:
    import os
    import subprocess
    import sys

    from tests.support.local_server import free_port

    env = {**os.environ, "KEEL_AUTH": "true", "KEEL_BOOTSTRAP_TOKEN": "admin-pw-12"}
    argv = [sys.executable, "-m", "keel", "serve", "--port", str(free_port()), "--database-url", sqlite_url]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "keel: invalid setting KEEL_BOOTSTRAP_TOKEN: Value error, KEEL_BOOTSTRAP_TOKEN must be at least 16 characters" in result.stderr
    assert "admin-pw-12" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_the_hazard_model_file_is_read_once_at_start_and_a_bad_one_refused(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KEEL_HAZARD_MODEL: one model per process, the same object everywhere it is used."""
    import asyncio
    import json

    from server.alerts.hazard import HazardModel
    from server.components import running
    from tests.support.hazard import RISING, rising_model_file

    monkeypatch.setenv("KEEL_HAZARD_MODEL", str(rising_model_file(tmp_path)))
    settings = Settings(database_url=sqlite_url)
    assert settings.hazard_model == tmp_path / "rising_hazard_model.json"

    async def models() -> tuple[HazardModel, ...]:
        async with running(settings, "internal") as components:
            return components.hazard_model, components.hazards.model, components.alerts.hazard_model

    served = asyncio.run(models())
    assert all(model is served[0] for model in served) and served[0].weights == RISING.weights
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"horizon": 50, "features": ["gain"]}), encoding="utf-8")

    async def start_with_bad() -> None:
        async with running(Settings(database_url=sqlite_url, hazard_model=bad), "internal"):
            pass

    with pytest.raises(ValueError, match="refit"):
        asyncio.run(start_with_bad())
