"""Settings read from the environment, old names of renamed settings included."""

from __future__ import annotations

import logging

import httpx
import pytest

from server.config import Settings, deprecated_env


def test_the_silent_run_check_period_is_read_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_SILENT_RUN_CHECK_S", "0.5")
    assert Settings().silent_run_check_s == 0.5
    assert deprecated_env() == []


def test_its_old_name_still_works_and_is_reported_deprecated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEEL_SILENT_RUN_CHECK_S", raising=False)
    monkeypatch.setenv("KEEL_SILENCE_CHECK_S", "0.7")
    assert Settings().silent_run_check_s == 0.7
    assert deprecated_env() == [("KEEL_SILENCE_CHECK_S", "KEEL_SILENT_RUN_CHECK_S")]
    monkeypatch.setenv("KEEL_SILENT_RUN_CHECK_S", "0.5")  # both set: the new name wins
    assert Settings().silent_run_check_s == 0.5


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
