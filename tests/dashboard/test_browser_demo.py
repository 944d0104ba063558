"""`keel demo` walked as a newcomer walks it, in a real headless Chromium: the runs table, the
guarded transformer beside its twin on the compare page, the guarded run's page and its
Rollback button, a toy run that takes no command, then Ctrl-C. The demo's own trainers run
(toy simulations and `keel lm`), paced faster than the default so the walk takes a minute or two;
the guarded run's command goes first, while its trainer is surely still running."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.browser import charts, console_errors, screenshot, text_of, wait_until
from tests.support.monitor import python_process

pytestmark = pytest.mark.browser

GUARDED = "lm-ppo-lag4-bf16-s0-guard"
TWIN = "lm-ppo-lag4-bf16-s0"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _runs(base: str) -> dict[str, dict[str, Any]]:
    """The demo's runs by name (the newest of a name), {} while the server is not up."""
    try:
        listed = httpx.get(f"{base}/api/v1/runs", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for run in listed:
        found.setdefault(run["name"], run)
    return found


def _buttons(browser: Any) -> list[str]:
    return [b.text for b in browser.find_elements("css selector", "#command-actions button")]


@pytest.mark.slow
def test_a_newcomer_walks_the_demo_from_the_runs_table_to_a_rollback_and_stops_it(browser, tmp_path: Path, artifacts: Path) -> None:  # type: ignore[no-untyped-def]
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # Room for the toy runs (6) and the guarded pair (2 transformers, 4) at once, what the walk
    # reads; the transformer A/B waits its turn, as on a small machine, and takes no CPU from it.
    argv = ["demo", "--port", str(port), "--dir", str(tmp_path / "demo"), "--step-delay", "0.2", "--jobs", "10"]
    code = f"import sys, runpy; sys.argv = ['keel', *{argv!r}]; runpy.run_module('keel', run_name='__main__')"
    with python_process(code) as demo:
        # The guarded run and its twin stream (the guarded one has said which command it takes).
        runs = wait_until(
            lambda: (lambda found: found if {GUARDED, TWIN} <= found.keys() and (found[GUARDED]["last_step"] or 0) >= 5 else None)(_runs(base)),
            180, interval=1.0, message="the guarded run and its twin streaming",
        )  # fmt: skip
        guarded, twin = runs[GUARDED], runs[TWIN]

        # The guarded run's page offers the one command its trainer takes, worded by it.
        browser.get(f"{base}/runs/{guarded['id']}")
        assert wait_until(lambda: _buttons(browser), 30, message="the guarded run's buttons") == ["Rollback"]
        assert "rollback: restores the last good weights" in text_of(browser, "command-note")
        rollback = browser.find_element("xpath", "//span[@id='command-actions']/button[text()='Rollback']")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", rollback)  # clear of the sticky header
        rollback.click()
        confirm = WebDriverWait(browser, 10).until(expected_conditions.alert_is_present())
        assert confirm.text.startswith("Send 'rollback' to this run's trainer? Its handler restores the last good weights")
        confirm.accept()
        assert "rollback sent" in wait_until(lambda: text_of(browser, "command-sent"), 10, message="sent")
        answered = wait_until(lambda: "acked" in text_of(browser, "run-commands") and text_of(browser, "run-commands"),
                              60, message="the trainer's answer")  # fmt: skip
        assert "rolling back at the end of the next step" in answered

        # The runs table: every run, its whole name on hover.
        browser.get(f"{base}/")
        names = wait_until(
            lambda: [e.get_attribute("title") for e in browser.find_elements("css selector", "#runs-grid [title]")],
            30, message="the runs table",
        )  # fmt: skip
        wait_until(lambda: GUARDED in [e.get_attribute("title") for e in browser.find_elements("css selector", "#runs-grid [title]")],
                   30, message="the guarded run's whole name in the runs table")  # fmt: skip
        assert names and console_errors(browser) == []

        # The guarded run beside its twin: both drawn on the headline charts and the hazard.
        browser.get(f"{base}/compare?runs={guarded['id']},{twin['id']}")
        def both_on_reward() -> bool:
            reward = [c for c in charts(browser) if c["key"] == "reward/mean"]
            return bool(reward) and {t["run"] for t in reward[0]["traces"]} >= {guarded["id"], twin["id"]}

        wait_until(both_on_reward, 60, message="the guarded run and its twin on the reward chart")
        summary = wait_until(lambda: GUARDED in text_of(browser, "compare-summary") and text_of(browser, "compare-summary"),
                             60, message="the compare summary")  # fmt: skip
        assert TWIN in summary and "Loading" not in summary
        assert console_errors(browser) == []
        screenshot(browser, artifacts / "demo-compare.png")

        # The rollback is on its charts once they are drawn again (a fresh page draws from the server).
        def marked() -> bool:
            browser.get(f"{base}/runs/{guarded['id']}")
            try:
                return bool(wait_until(
                    lambda: any(s["name"] == f"rollback:{guarded['id']}" for c in charts(browser) for s in c["shapes"]),
                    20, interval=0.5,
                ))  # fmt: skip
            except AssertionError:
                return False

        wait_until(marked, 120, interval=1.0, message="the rollback marked on the guarded run's charts")
        assert console_errors(browser) == []
        screenshot(browser, artifacts / "demo-guarded.png")

        # A toy run's trainer takes no command: no buttons, and the page says why.
        toy = next(run for name, run in _runs(base).items() if not name.startswith("lm-"))
        browser.get(f"{base}/runs/{toy['id']}")
        note = wait_until(lambda: text_of(browser, "command-note"), 30, message="the toy run's command note")
        assert "does not listen to commands" in note or "no trainer is there" in note
        assert _buttons(browser) == [] and console_errors(browser) == []
        wait_until(lambda: [c for c in charts(browser) if c["key"]], 30, message="the toy run's page draws its charts")

        # Ctrl-C ends the demo with one line, no traceback.
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    assert demo.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "Traceback" not in out, (out[-2000:], err[-2000:])
    assert out.strip().splitlines()[-1].startswith("keel demo: stopped"), out[-2000:]
