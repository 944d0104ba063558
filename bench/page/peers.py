"""peers: the same runs in TensorBoard's scalar dashboard and Trackio's.

The same runs (`--peer-metrics` metrics: the headline keys and a few; same values,
non-finite points left out) in TensorBoard's scalar dashboard and Trackio's, each from PyPI
in its own venv (bench/peers.py's machinery, under ~/.cache/keel-bench/peers/). Cold load to
the five headline charts drawn, then busy over `--peer-seconds` idle and while every run
appends 2 steps/s (written by a worker in the peer's venv, bench/page_data.py).
TensorBoard: #scalars with a tag filter of the five keys; drawn = for each key a
`tf-scalar-card` (shadow DOM, searched through) whose svg has >= 2 x runs `path.line` with a
drawn `d` (the raw and the smoothed line of each run, smoothing 0.6 by default). Trackio:
/?project=...; drawn = for each key the plot whose section + title is the key has a legend
of >= runs items and coloured pixels on its Vega canvas (it draws to a canvas, so "each
run's line" cannot be checked one by one; its legend lists a few runs and "+N more", both
counted).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench import peers as peer_venvs
from bench.page.browser import browser, busy, cold_load, open_page, probe
from bench.page.results import Results
from bench.page.streams import BenchRun
from bench.page_data import HEADLINE_KEYS, metric_keys
from bench.support import ROOT, free_port

__all__ = ["part_peers"]

PEER_PINS = {"tensorboard": ["tensorboard==2.21.0"]}
"""Added to bench/peers.py's PINS (trackio's pin is there)."""
PEER_ENV = {**peer_venvs.PEER_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}


def peer_python(cache: Path, peer: str) -> Path:
    for name, pins in PEER_PINS.items():
        peer_venvs.PINS.setdefault(name, pins)
    return peer_venvs.peer_python(cache, peer)


def worker(python: Path, config: dict[str, Any], scratch: Path, env: dict[str, str], *, stdin: bool = False) -> subprocess.Popen[bytes]:
    log = open(scratch / f"{config['mode']}.log", "ab")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(
        [str(python), "-m", "bench.page_data", json.dumps(config)],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, **PEER_ENV, **env, "PYTHONPATH": str(ROOT)}, cwd=scratch, start_new_session=True,
    )  # fmt: skip


def run_worker(python: Path, config: dict[str, Any], scratch: Path, env: dict[str, str]) -> None:
    proc = worker(python, config, scratch, env)
    if proc.wait(timeout=1800) != 0:
        tail = (scratch / f"{config['mode']}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{config['mode']} exited {proc.returncode}:\n{tail}")


@contextmanager
def background(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        if proc.stdin:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        peer_venvs.stop_group(proc)


def get_json(url: str) -> Any:
    """A peer's JSON answer (TensorBoard's scalars API)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        connection.request("GET", parts.path + ("?" + parts.query if parts.query else ""))
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {url}: {response.status} {body[:200]!r}")
        return json.loads(body)
    finally:
        connection.close()


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        parts = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=2)
        try:
            connection.request("GET", "/")
            if connection.getresponse().status < 500:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            connection.close()
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.3)


def peer_page(args: argparse.Namespace, label: str, url: str, source: str, live: Callable[[], subprocess.Popen[bytes]],
              results: Results) -> None:  # fmt: skip
    loads = []
    for _ in range(args.repeats):
        loads.append(cold_load(url, source, f"{label} shown", args.window))
        print(f"    {label} cold load {loads[-1]:.2f} s", flush=True)
    with browser(args.window) as driver:
        idle = open_page(driver, url, source, f"{label} shown")
        time.sleep(3)
        idle_busy = busy(driver, args.peer_seconds)
        with background(live()):
            time.sleep(3)
            live_busy = busy(driver, args.peer_seconds)
    results.details[f"peers/{label}"] = {"load_s": loads, "idle_busy": idle_busy, "busy": live_busy, "shown_s": idle}
    results.add("peers", f"{label}: five charts drawn, cold, median", statistics.median(loads), "s")
    results.add("peers", f"{label}: busy, nothing logging ({args.peer_seconds:g} s)", 100 * idle_busy, "%")
    results.add("peers", f"{label}: busy, {args.runs} runs logging {args.rate:g} steps/s each ({args.peer_seconds:g} s)",
                100 * live_busy, "%")  # fmt: skip


def part_peers(args: argparse.Namespace, runs: list[BenchRun], scratch: Path, results: Results) -> None:
    keys = metric_keys(args.peer_metrics)
    names = [f"run-{run.index:02d}" for run in runs]
    base_config = {"runs": len(runs), "steps": args.steps, "keys": keys}
    live_config = {"runs": len(runs), "keys": keys, "rate": args.rate, "start": args.steps}
    args.cache.mkdir(parents=True, exist_ok=True)
    for peer in [p for p in ("tensorboard", "trackio") if p in args.peers.split(",")]:
        began = time.monotonic()
        where = scratch / peer
        where.mkdir()
        try:
            python = peer_python(args.cache, peer)
            if peer == "tensorboard":
                logdir = where / "logs"
                run_worker(python, {**base_config, "mode": "tb-history", "logdir": str(logdir)}, where, {})
                port = free_port()
                log = open(where / "tensorboard.log", "wb")  # noqa: SIM115
                server = subprocess.Popen(
                    [str(python.parent / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
                     "--reload_interval", "1"],
                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **PEER_ENV}, start_new_session=True,
                )  # fmt: skip
                with background(server):
                    wait_http(f"http://127.0.0.1:{port}", server)
                    tags = "^(" + "|".join(HEADLINE_KEYS) + ")$"
                    url = f"http://127.0.0.1:{port}/#scalars&tagFilter={urllib.parse.quote(tags, safe='')}"
                    # Until TensorBoard has read every event file (it loads them in the background).
                    _wait_tb_loaded(f"http://127.0.0.1:{port}", len(runs), args.steps)
                    peer_page(args, "TensorBoard 2.21.0", url, probe("tensorboard", HEADLINE_KEYS, names),
                              partial(worker, python, {**live_config, "mode": "tb-live", "logdir": str(logdir)}, where, {}, stdin=True),
                              results)  # fmt: skip
            else:
                env = {"TRACKIO_DIR": str(where / "trackio")}
                project = "pagebench"
                run_worker(python, {**base_config, "mode": "trackio-history", "project": project}, where, env)
                port = free_port()
                server = worker(python, {"mode": "trackio-show", "project": project, "port": port}, where, env)
                with background(server):
                    wait_http(f"http://127.0.0.1:{port}", server)
                    url = f"http://127.0.0.1:{port}/?project={project}"
                    peer_page(args, f"Trackio {peer_venvs.PINS['trackio'][0].split('==')[1]}", url,
                              probe("trackio", HEADLINE_KEYS, names),
                              partial(worker, python, {**live_config, "mode": "trackio-live", "project": project}, where, env, stdin=True),
                              results)  # fmt: skip
        except Exception as exc:  # one peer failing leaves the other's figures
            print(f"    {peer} failed: {type(exc).__name__}: {str(exc)[-800:]}", flush=True)
            results.add("peers", f"{peer}", "failed", note=f"({type(exc).__name__}: {str(exc)[-200:]})")
        print(f"    {peer}: {time.monotonic() - began:.0f} s", flush=True)


def _wait_tb_loaded(base: str, runs: int, steps: int, timeout: float = 300) -> None:
    """Until TensorBoard's scalars API answers every run's last step of the first key."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tags = get_json(f"{base}/data/plugin/scalars/tags")
            if len(tags) >= runs:
                last = [get_json(f"{base}/data/plugin/scalars/scalars?run={run}&tag={urllib.parse.quote(HEADLINE_KEYS[0])}")
                        for run in list(tags)[:1]]  # fmt: skip
                if last and last[0] and last[0][-1][1] >= steps - 1:
                    return
        except (RuntimeError, OSError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError("TensorBoard did not load the event files")
