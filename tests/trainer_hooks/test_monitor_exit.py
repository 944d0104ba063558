"""How a trainer process ends decides the run's status: finished, failed (exception), killed (SIGTERM)."""

from __future__ import annotations

import signal
from textwrap import dedent

import pytest

from tests.support.monitor import python_process, servers, wait_until

make_server = pytest.fixture(name="make_server")(servers)

PRELUDE = """
    import sys, time
    from trainer_hooks.monitor import Monitor
    from trainer_hooks.sender import SenderConfig
    config = SenderConfig(flush_interval=0.02)
"""

BODIES = {
    "with-exception": """
        with Monitor({url!r}, run_name="boom", spool_dir={root!r}, sender_config=config) as monitor:
            print(monitor.run_id, flush=True)
            for step in range(30):
                monitor.log(step, {{"x": float(step)}})
            raise RuntimeError("diverged")
    """,
    "bare-exception": """
        monitor = Monitor({url!r}, run_name="boom", spool_dir={root!r}, sender_config=config)
        print(monitor.run_id, flush=True)
        for step in range(30):
            monitor.log(step, {{"x": float(step)}})
        raise RuntimeError("diverged")
    """,
    "bare-normal-exit": """
        monitor = Monitor({url!r}, run_name="forgot-finish", spool_dir={root!r}, sender_config=config)
        print(monitor.run_id, flush=True)
        for step in range(30):
            monitor.log(step, {{"x": float(step)}})
    """,
    "with-sys-exit-0": """
        with Monitor({url!r}, run_name="exit0", spool_dir={root!r}, sender_config=config) as monitor:
            print(monitor.run_id, flush=True)
            for step in range(30):
                monitor.log(step, {{"x": float(step)}})
            sys.exit(0)
    """,
}


@pytest.mark.parametrize(
    ("body", "returncode", "status"),
    [
        ("with-exception", 1, "failed"),
        ("bare-exception", 1, "failed"),
        ("bare-normal-exit", 0, "finished"),
        ("with-sys-exit-0", 0, "finished"),
    ],
)
def test_exit_status_of_a_trainer_process(
    make_server, sqlite_url, tmp_path, body, returncode, status
) -> None:
    server = make_server(sqlite_url)
    code = dedent(PRELUDE) + dedent(BODIES[body]).format(url=server.url, root=str(tmp_path))
    with python_process(code) as trainer:
        out, err = trainer.communicate(timeout=60)
    assert trainer.returncode == returncode, err
    if returncode:
        assert "RuntimeError: diverged" in err
    run_id = out.strip()
    assert server.run(run_id)["status"] == status
    assert server.series(run_id, "x") == (list(range(30)), [float(s) for s in range(30)])


LOOP = """
    {setup}
        print(monitor.run_id, flush=True)
        step = 0
        while True:
            monitor.log(step, {{"x": float(step)}})
            step += 1
            time.sleep(0.005)
"""


@pytest.mark.parametrize("style", ["with", "bare"])
def test_sigterm_marks_the_run_killed(make_server, sqlite_url, tmp_path, style) -> None:
    server = make_server(sqlite_url)
    monitor_call = f"Monitor({server.url!r}, run_name='sigterm', spool_dir={str(tmp_path)!r}, sender_config=config)"
    setup = (
        f"with {monitor_call} as monitor:"
        if style == "with"
        else f"monitor = {monitor_call}\nif True:"
    )
    with python_process(dedent(PRELUDE) + dedent(LOOP).format(setup=setup)) as trainer:
        assert trainer.stdout is not None
        run_id = trainer.stdout.readline().strip()
        wait_until(lambda: server.last_step(run_id) >= 50, what="steps on the server")
        trainer.send_signal(signal.SIGTERM)
        _, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 128 + signal.SIGTERM, err
    run = server.run(run_id)
    assert run["status"] == "killed"
    # Everything logged before the signal arrived, each step once.
    last = run["last_step"]
    assert server.keys(run_id) == {"x": last + 1}
    assert server.series(run_id, "x") == (
        list(range(last + 1)),
        [float(s) for s in range(last + 1)],
    )
