"""The run page's Checkpoint and Stop buttons in a real headless Chromium: shown to an admin,
hidden from a read-only login; a click reaches a listening trainer and its answer shows."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from server.db import create_engine
from server.storage import Store
from server.tokens import create_token
from tests.support.browser import console_errors, text_of, wait_until
from tests.support.raw_client import new_run, open_ingest, points

pytestmark = pytest.mark.browser

ADMIN = "keel_admin_token_for_the_commands_test_0123456789"


SHOWN_JS = """var e = document.getElementById('command-buttons');
return e ? getComputedStyle(e).display !== 'none' : null;"""


def _shown(browser) -> bool | None:  # type: ignore[no-untyped-def]
    """Whether the buttons show (None while the panel is not on the page yet)."""
    return browser.execute_script(SHOWN_JS)  # type: ignore[no-any-return]


def _listening(server, name: str):  # type: ignore[no-untyped-def]
    run = new_run(name)
    ws = open_ingest(server)
    ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run, "listen": ["commands"]}))
    assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
    ws.send(points(0, [{"step": s, "values": {"reward/mean": 0.1 * s}} for s in range(5)]))
    assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": 0}
    return run, ws


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_checkpoint_clicked_on_the_run_page_reaches_the_trainer_and_its_answer_shows(server, browser) -> None:
    run, ws = _listening(server, "commanded")
    with ws:
        browser.get(f"{server.url}/runs/{run['id']}")
        wait_until(lambda: _shown(browser), message="the buttons")
        assert "No commands sent" in wait_until(lambda: text_of(browser, "run-commands"), message="the commands panel")
        browser.find_element("id", "command-checkpoint").click()
        assert "checkpoint sent" in wait_until(lambda: text_of(browser, "command-sent"), message="sent")
        message = json.loads(ws.recv(timeout=10))
        assert message["type"] == "command" and message["command"]["action"] == "checkpoint"
        assert message["command"]["requested_by"] == "local"
        table = wait_until(lambda: "checkpoint" in text_of(browser, "run-commands") and text_of(browser, "run-commands"), message="listed")
        assert "pending" in table or "delivered" in table
        ws.send(json.dumps({"type": "command_result", "id": message["command"]["id"], "ok": True, "message": "saved step 4"}))
        ws.send(points(1, [{"step": 5, "values": {"reward/mean": 0.5}}]))  # a live tick redraws the panel
        assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": 1}
        wait_until(lambda: "saved step 4" in text_of(browser, "run-commands"), message="the answer on the page")
        assert "acked" in text_of(browser, "run-commands")
        assert console_errors(browser) == []


def test_the_buttons_are_hidden_from_a_read_only_login(server_factory, sqlite_url, browser) -> None:
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN)
    admin = {"Authorization": f"Bearer {ADMIN}"}

    async def make_reader() -> str:
        store = Store(create_engine(sqlite_url))
        try:
            return await create_token(store, "reader", ["read"])
        finally:
            await store.close()

    reader = asyncio.run(make_reader())

    run = new_run("guarded-page")
    with connect(f"{server.ws_url}/api/v1/ingest", additional_headers=admin) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run}))
        json.loads(ws.recv(timeout=10))
    for token, shown in ((reader, False), (ADMIN, True)):
        browser.delete_all_cookies()
        browser.get(f"{server.url}/login")
        browser.find_element("name", "token").send_keys(token)
        browser.find_element("name", "token").submit()
        browser.get(f"{server.url}/runs/{run['id']}")
        wait_until(lambda: "No commands sent" in text_of(browser, "run-commands"), message="the commands panel")
        if shown:
            wait_until(lambda: _shown(browser), message="the admin's buttons")
        else:
            time.sleep(1.0)  # the page has asked who it is
            assert _shown(browser) is False
            # And the API refuses the read token's command, whatever the page shows.
            refused = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "stop"}, headers={"Authorization": f"Bearer {token}"})
            assert refused.status_code == 401


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_finished_run_offers_no_command_and_a_pending_one_says_why(server, browser) -> None:
    """A run whose trainer finished has no one to take a command: no buttons. A command no
    trainer has received says so, instead of a bare `pending`."""
    run, ws = _listening(server, "ended")
    with ws:
        ws.send(json.dumps({"type": "finish", "status": "finished"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "bye"
    sent = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "checkpoint"})
    assert sent.status_code == 202
    browser.get(f"{server.url}/runs/{run['id']}")
    text = wait_until(lambda: "checkpoint" in text_of(browser, "run-commands") and text_of(browser, "run-commands"), message="listed")
    assert "not received: a trainer gets commands only while it listens to them" in text
    time.sleep(1.0)  # the page has asked who it is and what the run is
    assert _shown(browser) is False
    assert console_errors(browser) == []
