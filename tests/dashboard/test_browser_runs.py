"""The runs page when a read fails: a real server on a real SQLite file whose tables are
taken away under it (renamed, then given back), in real Chromium. The page says what
failed, never "Loading…" forever, and shows the rows again once the reads work."""

from __future__ import annotations

import sqlite3

import pytest

from tests.support.browser import text_of, wait_until
from tests.support.toy_runs import open_runs

pytestmark = pytest.mark.browser

ROWS = "#runs-grid .ag-center-cols-container .ag-row"


def _rename(database_url: str, old: str, new: str) -> None:
    with sqlite3.connect(database_url.removeprefix("sqlite:///")) as db:
        db.execute(f"ALTER TABLE {old} RENAME TO {new}")


def _error(browser) -> str:  # type: ignore[no-untyped-def]
    shown = browser.execute_script("var e = document.getElementById('runs-error'); return e && !e.hidden")
    return text_of(browser, "runs-error") if shown else ""


def _rows(browser) -> int:  # type: ignore[no-untyped-def]
    return len(browser.find_elements("css selector", ROWS))


def _loading(browser) -> bool:  # type: ignore[no-untyped-def]
    return bool(
        browser.execute_script(
            "var g = document.getElementById('runs-grid');"
            "return !!g && g.offsetParent !== null && g.innerText.indexOf('Loading') >= 0"
        )
    )


def test_a_failed_runs_read_is_said_on_the_page_and_the_rows_come_back(
    server_factory, sqlite_url: str, browser
) -> None:
    server = server_factory(sqlite_url)
    open_runs(server, [("a", "cispo"), ("b", "is")], steps=3)
    _rename(sqlite_url, "runs", "runs_away")  # GET /api/v1/runs fails in the database
    try:
        browser.get(f"{server.url}/")
        message = wait_until(lambda: _error(browser), message="the runs page's error")
        assert "Could not read the runs" in message, message
        assert _rows(browser) == 0 and not _loading(browser)
        assert "No runs yet" not in text_of(browser, "page")  # not a claim there are none
    finally:
        _rename(sqlite_url, "runs_away", "runs")
    browser.refresh()
    wait_until(lambda: _rows(browser) == 2, message="both rows, once the read works")
    assert _error(browser) == ""


def test_a_failed_alerts_read_shows_the_rows_and_says_health_is_unknown(
    server_factory, sqlite_url: str, browser
) -> None:
    server = server_factory(sqlite_url)
    open_runs(server, [("a", "cispo"), ("b", "is")], steps=3)
    _rename(sqlite_url, "alerts", "alerts_away")
    try:
        browser.get(f"{server.url}/")
        wait_until(lambda: _rows(browser) == 2, message="both rows without alerts")
        message = wait_until(lambda: _error(browser), message="the alerts' error")
        assert "Could not read the alerts" in message, message
        assert "n/a" in text_of(browser, "runs-grid")
    finally:
        _rename(sqlite_url, "alerts_away", "alerts")


def test_the_newest_runs_show_first_then_all_of_them(server_factory, sqlite_url: str, browser, monkeypatch) -> None:
    """The page reads the newest FIRST_ROWS runs first (10,000 runs take seconds to read), then
    every run: the reads it made, in order, and what each returned."""
    from dashboard.data import KeelApi
    from dashboard.views import runs as runs_view

    reads: list[tuple[int | None, int]] = []
    real = KeelApi.runs

    async def recorded(self, **kwargs):  # type: ignore[no-untyped-def]
        answer = await real(self, **kwargs)
        reads.append((kwargs.get("limit"), len(answer)))
        return answer

    monkeypatch.setattr(runs_view, "FIRST_ROWS", 2)
    monkeypatch.setattr(KeelApi, "runs", recorded)
    server = server_factory(sqlite_url)
    made = open_runs(server, [("a", "cispo"), ("b", "is"), ("c", "gspo")], steps=3)
    browser.get(f"{server.url}/")
    wait_until(lambda: _rows(browser) == 3 and text_of(browser, "runs-count") == "3", message="all three rows")
    assert reads[:2] == [(2, 2), (None, 3)], reads
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(function (r) { return r.getAttribute('row-id'); })", ROWS
    )
    assert sorted(shown) == sorted(run.id for run in made)
