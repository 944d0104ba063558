"""`keel serve` in a subprocess, for tests that need the server in a process of its own: to
SIGKILL it and start it again on the same port (the Monitor's tests), to read its whole log
(log redaction), to measure its memory by pid, or to run another install's `keel` (the image).

bench/support.py's `keel_server` is the benchmarks' launcher; these tests need what it
leaves out on purpose (a restart on the same port, a command and environment of their own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tests.support.local_server import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0
"""Generous: the tests share two cores, and a server on PostgreSQL migrates before it is ready."""


class ServerProcess:
    """`argv`, a server on 127.0.0.1:`port` (any interface that includes it), its stdout and
    stderr appended to `log_path`. start() returns once /readyz answers 200; kill() (SIGKILL)
    and start() again on the same port; `with` starts it and stops it."""

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
        token: str | None = None,
    ) -> None:
        """env: the child's whole environment (this process's by default); token: the admin
        token the REST reads below send (the server must know it: `keel_serve(token=...)`)."""
        self.argv = list(argv)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"
        self.log_path = log_path
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.token = token
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        assert self.process is None, "already running"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env
            )
        try:
            self._wait_ready(self.process, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"keel serve exited with {process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"keel serve not ready in {timeout_s} s:\n{self.log()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, connections die with the process."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
            self.process = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def log(self) -> str:
        """The end of the log, for failure messages."""
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    # -- REST reads used by the assertions -------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(
            f"{self.url}/api/v1{path}", params=params, headers=self._headers(), timeout=30.0
        )
        response.raise_for_status()
        return response.json()

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.get(f"/runs/{run_id}"))

    def last_step(self, run_id: str) -> int:
        """The run's last stored step; -1 while the run does not exist or holds nothing."""
        response = httpx.get(
            f"{self.url}/api/v1/runs/{run_id}", headers=self._headers(), timeout=30.0
        )
        if response.status_code == 404:
            return -1
        response.raise_for_status()
        last = response.json()["last_step"]
        return -1 if last is None else int(last)

    def keys(self, run_id: str) -> dict[str, int]:
        return {entry["key"]: entry["count"] for entry in self.get(f"/runs/{run_id}/keys")}

    def series(self, run_id: str, key: str) -> tuple[list[int], list[Any]]:
        data = self.get(f"/runs/{run_id}/series", key=key, max_points=100_000)
        assert data["downsampled"] is False
        return data["steps"], data["values"]


def keel_serve(
    database_url: str,
    log_path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    port: int | None = None,
) -> ServerProcess:
    """This checkout's `python -m keel serve` on 127.0.0.1 (a free port by default), not
    started. Auth is off, or on with `token` as an admin token (KEEL_BOOTSTRAP_TOKEN); env:
    variables added to this process's environment; args: more options of `keel serve`."""
    port = port or free_port()
    auth = (
        {"KEEL_AUTH": "false"}
        if token is None
        else {"KEEL_AUTH": "true", "KEEL_BOOTSTRAP_TOKEN": token}
    )
    argv = [sys.executable, "-m", "keel", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--database-url", database_url, *args]  # fmt: skip
    return ServerProcess(
        argv, port, log_path, env={**os.environ, **auth, **(env or {})}, token=token
    )
