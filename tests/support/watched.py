"""`keel watch` in a child process, and reading back what it streamed (tests/keel/test_watch*.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.server import REPO_ROOT


class Watch:
    """`python -m keel watch` in a child process, its output in a file (SIGKILL-able)."""

    def __init__(self, tmp: Path, server_url: str, paths: list[Path], *extra: str) -> None:
        self.log = tmp / "watch.log"
        self.state = tmp / "state"
        self.argv = [sys.executable, "-m", "keel", "watch", *map(str, paths), "--server", server_url,
                     "--state", str(self.state), "--interval", "0.1", "--scan-interval", "0.3", *extra]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Watch:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
            self.process = None

    def output(self) -> str:
        return self.log.read_text()

    def states(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in sorted(self.state.glob("sources/*/watch.json"))]


def api_get(url: str, path: str, **params: Any) -> Any:
    """GET /api/v1{path}: its JSON, or None for a 404."""
    response = httpx.get(f"{url}/api/v1{path}", params=params, timeout=30)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.json()


def stored_series(url: str, run_id: str, key: str) -> dict[int, float]:
    body = api_get(url, f"/runs/{run_id}/series", key=key, max_points=100_000)
    return {} if body is None else dict(zip(body["steps"], body["values"], strict=True))
