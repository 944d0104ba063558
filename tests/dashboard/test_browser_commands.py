"""The run page's command buttons in a real headless Chromium: one for each action the run's
trainer said it takes, shown to an admin, hidden from a read-only login; a click reaches a
listening trainer and its answer shows; a run whose trainer does not listen, or that ended,
says so and offers none."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from websockets.sync.client import connect

from server.api_tokens import create_token
from server.db import create_engine
from server.storage import Store
from tests.support.browser import console_errors, text_of, wait_until
from tests.support.raw_client import new_run, open_ingest, points

pytestmark = pytest.mark.browser

ADMIN = "keel_admin_token_for_the_commands_test_0123456789"


SHOWN_JS = """var e = document.getElementById('command-buttons');
return e ? getComputedStyle(e).display !== 'none' : null;"""


def _shown(browser) -> bool | None:  # type: ignore[no-untyped-def]
    """Whether the buttons show (None while the panel is not on the page yet)."""
    return browser.execute_script(SHOWN_JS)  # type: ignore[no-any-return]


def _buttons(browser) -> list[str]:  # type: ignore[no-untyped-def]
    return [b.text for b in browser.find_elements("css selector", "#command-actions button")]


def _button(browser, label: str):  # type: ignore[no-untyped-def]
    return browser.find_element("xpath", f"//span[@id='command-actions']/button[text()='{label}']")


def _listening(server, name: str, actions: dict[str, str] | None = None, listen: bool = True):  # type: ignore[no-untyped-def]
    run = new_run(name)
    ws = open_ingest(server)
    hello = {"type": "hello", "protocol": 1, "run": run, **({"listen": ["commands"]} if listen else {})}
    ws.send(json.dumps({**hello, **({"actions": actions} if actions is not None else {})}))
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
        # It listens without naming its actions: the usual two, said to be its handler's.
        assert wait_until(lambda: _buttons(browser), message="the buttons") == ["Checkpoint", "Stop"]
        assert "without saying which it takes" in text_of(browser, "command-note")
        _button(browser, "Checkpoint").click()
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
def test_a_trainer_that_named_its_actions_gets_those_buttons_worded_by_its_handler(server, browser) -> None:
    said = "restores the last good weights and skips the batches sampled since"
    run, ws = _listening(server, "guarded", {"rollback": said})
    with ws:
        browser.get(f"{server.url}/runs/{run['id']}")
        assert wait_until(lambda: _buttons(browser), message="the buttons") == ["Rollback"]
        assert f"rollback: {said}" in text_of(browser, "command-note")
        assert _button(browser, "Rollback").get_attribute("title") == said
        _button(browser, "Rollback").click()
        confirm = WebDriverWait(browser, 10).until(expected_conditions.alert_is_present())
        assert confirm.text == f"Send 'rollback' to this run's trainer? Its handler {said}."
        confirm.accept()
        assert "rollback sent" in wait_until(lambda: text_of(browser, "command-sent"), message="sent")
        message = json.loads(ws.recv(timeout=10))
        assert message["type"] == "command" and message["command"]["action"] == "rollback"
        assert console_errors(browser) == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_whose_trainer_does_not_listen_or_that_ended_offers_no_command_and_says_why(server, browser) -> None:
    """No buttons where no trainer can take a command, and a line saying why; a command its
    trainer never received becomes `failed` when the run ends, not `pending` for ever."""
    run, ws = _listening(server, "deaf", listen=False)
    with ws:
        sent = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "checkpoint"})
        assert sent.status_code == 202 and sent.json()["state"] == "pending"
        browser.get(f"{server.url}/runs/{run['id']}")
        text = wait_until(lambda: "checkpoint" in text_of(browser, "run-commands") and text_of(browser, "run-commands"), message="listed")
        assert "not received: a trainer gets commands only while it listens to them" in text
        assert "does not listen to commands" in wait_until(lambda: text_of(browser, "command-note"), message="the note")
        assert _buttons(browser) == []
        ws.send(json.dumps({"type": "finish", "status": "finished"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "bye"
    browser.get(f"{server.url}/runs/{run['id']}")
    assert "The run is finished: no trainer is there" in wait_until(lambda: text_of(browser, "command-note"), message="the note")
    # The list is another callback's: it may come after the note.
    ended = "the run ended (finished) before its trainer answered"
    wait_until(lambda: ended in text_of(browser, "run-commands"), message="the failed command")
    assert _buttons(browser) == []
    assert console_errors(browser) == []
