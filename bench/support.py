"""What the benchmarks share: a `keel serve` process, fresh databases, one percentile.

Only the standard library at import time:
bench/peers_worker.py imports `percentile` from here inside each peer's own venv, which
has no psycopg.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PG_ADMIN",
    "ROOT",
    "KeelServer",
    "fresh_database",
    "keel_server",
    "percentile",
    "postgres_database",
]

ROOT = Path(__file__).resolve().parent.parent
"""The repository root; `keel serve` runs from here, so it is this checkout's server."""
PG_ADMIN = os.environ.get("KEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
"""The PostgreSQL server the benchmarks create their databases on (the tests' variable)."""
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(samples: Sequence[float], q: float) -> float:
    """The `q`-th percentile of `samples`, `q` in 0..100 as numpy's: the sample at rank
    q/100 * (n - 1) of the sorted samples, rounded half to even, as
    `numpy.percentile(samples, q, method="nearest")`. Always one of the samples: a
    latency that was measured, not an interpolation between two."""
    if not samples:
        raise ValueError("no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q is a percentage, 0..100, not {q}")
    ordered = sorted(samples)
    return ordered[round(q / 100 * (len(ordered) - 1))]


@contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """The URL of a new database `<prefix>_<8 hex>` on PG_ADMIN's server, dropped after."""
    import psycopg  # not at the top: the peers' venvs import this module and have no psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_database(kind: str, directory: Path | str, prefix: str) -> Iterator[str]:
    """The URL of a new, empty database of `kind`: "sqlite", a file
    `<directory>/<prefix>_<8 hex>.db`; "postgres", `postgres_database(prefix)`."""
    if kind == "postgres":
        with postgres_database(prefix) as url:
            yield url
    elif kind == "sqlite":
        yield f"sqlite:///{Path(directory) / f'{prefix}_{uuid.uuid4().hex[:8]}.db'}"
    else:
        raise ValueError(f"no database kind {kind!r}: sqlite or postgres")


@dataclass(frozen=True)
class KeelServer:
    url: str
    """http://127.0.0.1:<port>"""
    pid: int
    """The `keel serve` process (bench/load.py samples its CPU and memory in /proc)."""

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)


@contextmanager
def keel_server(
    database_url: str, *, log: Path | None = None, cpus: set[int] | None = None
) -> Iterator[KeelServer]:
    """`keel serve` of this checkout on a free loopback port, on `database_url`; yielded
    once `/readyz` answers 200, terminated after.

    Always its own process, never a server in this one: the benchmark's
    clients (or its learner loop) would share the server's interpreter lock, and part of
    the latency or overhead measured would be the benchmark's own. A process also lets
    bench/load.py read the server's CPU by its pid, and --pin give it other CPUs.

    log: the file the server's stdout and stderr go to; without one its stdout is
         dropped and its stderr (warnings, a failed start) reaches this terminal.
    cpus: the CPUs the server may run on; all of this process's by default.
    """
    port = free_port()
    with ExitStack() as stack:
        output = stack.enter_context(log.open("wb")) if log else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel", "serve", "--port", str(port), "--log-level", "warning",
             "--database-url", database_url],
            cwd=ROOT,
            stdout=output or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if output else None,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _ready(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"keel serve did not start; see {log or 'its stderr above'}")
                time.sleep(0.05)
            yield KeelServer(f"http://127.0.0.1:{port}", proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _ready(port: int) -> bool:
    # http.client, not urllib: urllib would send a loopback request through any *_proxy
    # variable in the environment.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
