"""A real `keel serve` process for the benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from keel.local import free_port

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("KEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def start_server(database_url: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start `keel serve` on a free port; returns the process and its base URL once ready."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "serve", "--port", str(port), "--database-url", database_url, "--log-level", "warning"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")
