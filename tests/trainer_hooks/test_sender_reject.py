"""A frame the server refuses as malformed is kept aside, warned about once, and the run
goes on with the frames after it (it used to be resent forever, blocking the run)."""

from __future__ import annotations

import json
import logging

import pytest

from tests.support.monitor import servers
from trainer_hooks.sender import ConnState, upload
from trainer_hooks.spool import Spool
from wire import RunInfo

make_server = pytest.fixture(name="make_server")(servers)


def test_a_rejected_frame_is_kept_aside_and_the_frames_after_it_are_stored(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url)
    run = RunInfo(id="6e1d4b63-7f1b-4a68-8b66-2e5d1f8f0001", name="one-bad-frame")
    spool = Spool.open(tmp_path / "spool" / run.id, run=run)
    good = lambda steps: json.dumps([{"step": s, "values": {"m": float(s)}} for s in steps])  # noqa: E731
    spool.append(good(range(0, 3)))
    spool.append(json.dumps([{"step": 3, "values": {"bad\x00key": 1.0}}]))  # NUL: never storable
    spool.append(good(range(4, 7)))
    with caplog.at_level(logging.ERROR, logger="keel"):
        sender = upload(spool, server.url, status="finished", timeout=60)
    assert sender.state is ConnState.DONE and sender.rejected_frames == 1
    assert spool.unacked == 0
    kept = spool.rejected_path.read_text().splitlines()
    assert len(kept) == 1 and '"step":3' in kept[0].replace(" ", "")
    spool.close(remove=True)
    assert spool.rejected_path.is_file()  # outlives the spool
    assert server.series(run.id, "m") == ([0, 1, 2, 4, 5, 6], [0.0, 1.0, 2.0, 4.0, 5.0, 6.0])
    assert server.run(run.id)["status"] == "finished"
    refusals = [r for r in caplog.records if "refused a frame" in r.getMessage()]
    assert len(refusals) == 1 and str(spool.rejected_path) in refusals[0].getMessage()


def test_a_run_whose_hello_the_server_refuses_is_not_dialled_again(server_factory, sqlite_url, tmp_path, caplog) -> None:
    """A config over the server's limit (4413 at the hello) can never be welcomed: the sender
    says so once and stops, keeping the spool (it used to redial every 2 s, forever)."""
    server = server_factory(sqlite_url, max_config_bytes=1000)
    run = RunInfo(id="6e1d4b63-7f1b-4a68-8b66-2e5d1f8f0002", name="big-config", config={"notes": "x" * 5000})
    spool = Spool.open(tmp_path / "spool" / run.id, run=run)
    spool.append(json.dumps([{"step": 0, "values": {"m": 1.0}}]))
    with caplog.at_level(logging.ERROR, logger="keel"):
        sender = upload(spool, server.url, status="finished", timeout=20)
    assert sender.state is ConnState.REJECTED and spool.unacked == 1
    refusals = [r for r in caplog.records if "refused run" in r.getMessage()]
    assert len(refusals) == 1 and ("4413" in refusals[0].getMessage() or "too_large" in refusals[0].getMessage())
    spool.close()


def test_a_run_of_another_tokens_name_is_not_dialled_again(server_factory, sqlite_url, tmp_path, caplog) -> None:
    """A hello for another token's run (4403) can never be welcomed with this token: the
    sender says so once and stops, keeping the spool for `keel sync` with the run's token."""
    import httpx

    admin = "keel_test_admin_token_sender_forbidden_0123"
    server = server_factory(sqlite_url, host="127.0.0.1", auth=True, bootstrap_token=admin)
    tokens = {
        name: httpx.post(f"{server.url}/api/v1/tokens", json={"name": name, "scopes": ["ingest"]},
                         headers={"Authorization": f"Bearer {admin}"}).json()["token"]  # fmt: skip
        for name in ("team-a", "team-b")
    }
    run = RunInfo(id="6e1d4b63-7f1b-4a68-8b66-2e5d1f8f0003", name="team-a-run")
    mine = Spool.open(tmp_path / "a" / run.id, run=run)
    mine.append(json.dumps([{"step": 0, "values": {"m": 1.0}}]))
    assert upload(mine, server.url, status="finished", timeout=20, token=tokens["team-a"]).state is ConnState.DONE
    theirs = Spool.open(tmp_path / "b" / run.id, run=run)
    theirs.append(json.dumps([{"step": 1, "values": {"m": 9.0}}]))
    with caplog.at_level(logging.ERROR, logger="keel"):
        sender = upload(theirs, server.url, status="finished", timeout=20, token=tokens["team-b"])
    assert sender.state is ConnState.REJECTED and theirs.unacked == 1
    refusals = [r for r in caplog.records if "refused run" in r.getMessage()]
    assert len(refusals) == 1 and "forbidden" in refusals[0].getMessage(), [r.getMessage() for r in caplog.records]
    theirs.close()
    mine.close(remove=True)
