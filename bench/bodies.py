"""Server memory under a stream of huge request bodies from a client without a token.

A `keel serve` process with auth on (a fresh SQLite file) is sent `--requests` (20)
chunked POSTs of `--mib` (300) MiB each to each of `/login` and `/api/v1/rules`, no
token, `--parallel` (2) at a time, each sent 1 MiB at a time until the server answers
or closes. Its resident memory (VmRSS, /proc/<pid>/status) is read before (after one
small request to each route, the baseline), every 20 ms during the stream (the peak),
and `--settle` (3) seconds after it. Printed: the three, and the peak and after as
ratios to the baseline; per route, what was answered and how much of each body had been
sent by then.

    python -m bench.bodies [--requests 20] [--mib 300] [--parallel 2]

Before bodies were refused while read (server/bodies.py), each body was read whole
before the 401 or 422: on a 2-core VM the server grew from 132 to 1,930 MiB, and 1,013 MiB
of it stayed; now every body is answered 413 within 10 ms, and the server peaks at 144
MiB (docs/security.md, "Sizes").
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.support import keel_server

CHUNK = 1024 * 1024
ROUTES = ("/login", "/api/v1/rules")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass(frozen=True)
class Sent:
    route: str
    answer: str
    """The status the server answered, or how the connection ended without one."""
    sent_mib: float
    """Body bytes sent before the answer (or the end of the connection)."""
    seconds: float


def post(port: int, route: str, total_mib: int) -> Sent:
    """One chunked POST of `total_mib` MiB, sent until the server answers or closes."""
    chunk = b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n"
    head = (
        f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    started = time.monotonic()
    sent = 0
    answer = ""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(head)
            for _ in range(total_mib):
                sock.sendall(chunk)
                sent += CHUNK
                sock.setblocking(False)
                try:
                    answer = sock.recv(4096).decode("latin-1")
                except BlockingIOError:
                    pass  # nothing answered yet
                finally:
                    sock.setblocking(True)
                if answer:
                    break
            else:
                sock.sendall(b"0\r\n\r\n")
        except OSError as exc:  # the server closed while we sent
            answer = answer or f"closed while sending ({exc.__class__.__name__})"
        if not answer or answer.startswith("closed"):
            try:
                answer = sock.recv(4096).decode("latin-1") or answer or "closed"
            except OSError as exc:
                answer = answer or f"closed ({exc.__class__.__name__})"
    status = answer.split(" ", 2)[1] if answer.startswith("HTTP/") else answer
    return Sent(route, status, sent / CHUNK, time.monotonic() - started)


class Sampler(threading.Thread):
    def __init__(self, pid: int, period_s: float = 0.02):
        super().__init__(daemon=True)
        self.pid, self.period_s = pid, period_s
        self.peak = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(self.period_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="POSTs to each route")
    parser.add_argument("--mib", type=int, default=300, help="MiB each body would be")
    parser.add_argument("--parallel", type=int, default=2, help="POSTs at once")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the stream before the last reading")
    args = parser.parse_args()

    os.environ["KEEL_AUTH"] = "true"  # an outsider: no token, on a server that wants one
    with tempfile.TemporaryDirectory() as directory, keel_server(f"sqlite:///{directory}/bodies.db") as server:
        port = int(server.url.rsplit(":", 1)[1])
        for route in ROUTES:  # whatever the first request of each route allocates, before the baseline
            post(port, route, 1)
        time.sleep(1.0)
        baseline = rss_mib(server.pid)
        sampler = Sampler(server.pid)
        sampler.start()
        started = time.monotonic()
        with ThreadPoolExecutor(args.parallel) as pool:
            jobs = [pool.submit(post, port, route, args.mib) for _ in range(args.requests) for route in ROUTES]
            results = [job.result() for job in jobs]
        took = time.monotonic() - started
        sampler.done.set()
        sampler.join()
        time.sleep(args.settle)
        after = rss_mib(server.pid)
        peak = max(sampler.peak, after)

    print(f"{len(results)} chunked POSTs of {args.mib} MiB without a token, {args.parallel} at a time, in {took:.1f} s")
    for route in ROUTES:
        sent = [r for r in results if r.route == route]
        answers = sorted({r.answer for r in sent})
        print(
            f"  {route:15} answered {', '.join(answers)}; sent before the answer: median"
            f" {statistics.median(r.sent_mib for r in sent):.1f} MiB, at most {max(r.sent_mib for r in sent):.1f} MiB;"
            f" median {statistics.median(r.seconds for r in sent):.2f} s"
        )
    print(f"server RSS: baseline {baseline:.0f} MiB, peak {peak:.0f} MiB ({peak / baseline:.2f}x), after {after:.0f} MiB ({after / baseline:.2f}x)")


if __name__ == "__main__":
    main()
