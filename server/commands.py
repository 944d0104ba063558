"""Server-side `keel` subcommands: serve, db, demo. Stdlib imports only at module level."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import Any


def _add_database_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help="sqlite:///path or postgresql://user@host/db (env KEEL_DATABASE_URL; default ~/.keel/keel.db)",
    )


def _settings(args: argparse.Namespace, **overrides: object):  # type: ignore[no-untyped-def]
    from server.config import Settings

    values = {k: v for k, v in overrides.items() if v is not None}
    if getattr(args, "database_url", None):
        values["database_url"] = args.database_url
    return Settings(**values)  # type: ignore[arg-type]


def _add_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8750)")
    _add_database_url(parser)
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--allow-private-webhooks",
        action="store_true",
        default=None,
        help="allow webhook URLs on loopback/private addresses (local receivers)",
    )


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app

    settings = _settings(args, host=args.host, port=args.port, allow_private_webhooks=args.allow_private_webhooks)
    from server.auth import is_loopback

    if not settings.auth_enabled and not is_loopback(settings.host):
        print(f"keel: refusing to serve on {settings.host} with auth off; unset KEEL_AUTH=false or bind 127.0.0.1", flush=True)
        return 2
    if settings.auth_enabled:
        print("keel: auth is on: clients need a token (keel token create --scopes ingest,read,admin)", flush=True)
    print(f"keel: serving on http://{settings.host}:{settings.port}  (database: {settings.database_url})", flush=True)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        ws_max_size=settings.max_frame_bytes + 1024 * 1024,
        ws_ping_interval=20,
        ws_ping_timeout=60,
    )
    return 0


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade"], help="upgrade: apply all migrations")
    _add_database_url(parser)


def _db(args: argparse.Namespace) -> int:
    from server import db

    settings = _settings(args)
    db.upgrade(settings.database_url)
    print(f"keel: database at head ({settings.database_url})")
    return 0


DEMO_ARMS = ("importance_sampling", "cispo")


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8750)
    parser.add_argument("--step-delay", type=float, default=0.15, help="seconds between toy steps")
    parser.add_argument("--database-url", default=None, help="default: a fresh ~/.keel/demo.db")


def _die_with_parent() -> None:
    """In a demo child: get SIGTERM when the demo process dies, however it dies (Linux)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the demo's finally block still terminates its children


def _wait_for_runs(base: str, names: set[str], stop: threading.Event, timeout_s: float = 120.0) -> list[str]:
    """Ids of the runs with these names once they have all said hello (newest first), or []."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        try:
            runs = httpx.get(f"{base}/api/v1/runs", timeout=5).json()
        except httpx.HTTPError:
            runs = []
        found: dict[str, str] = {}
        for run in runs:
            found.setdefault(run["name"], run["id"])
        if names <= found.keys():
            return [found[name] for name in sorted(names)]
        stop.wait(1.0)
    return []


def _demo(args: argparse.Namespace) -> int:
    """Serve on the embedded database and stream an A/B experiment of toy runs, round after round."""
    import subprocess
    import sys
    from pathlib import Path

    import uvicorn

    from server.app import create_app
    from server.config import Settings

    database_url = args.database_url
    if database_url is None:
        demo_db = Path.home() / ".keel" / "demo.db"
        for leftover in demo_db.parent.glob("demo.db*"):
            leftover.unlink()
        database_url = f"sqlite:///{demo_db}"
    settings = Settings(database_url=database_url, port=args.port, stale_after_s=30)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="warning"))
    children: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()

    def experiment() -> None:
        while not server.started:
            if stop.wait(0.1):
                return
        base = settings.base_url
        round_index = 0
        while not stop.is_set():
            seeds = [3 * round_index + s for s in range(3)]
            print(
                f"keel demo: round {round_index + 1}: {' vs '.join(DEMO_ARMS)} at lag 8, severe mismatch, seeds {seeds}",
                flush=True,
            )
            children[:] = [
                subprocess.Popen(
                    [sys.executable, "-m", "server", "sim", "--loss", loss, "--lag", "8", "--mismatch", "severe",
                     "--seed", str(seed), "--steps", "600", "--step-delay", str(args.step_delay), "--server", base,
                     "--name", f"{loss}-lag8-severe-s{seed}"],
                    stdout=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,
                )
                for loss in DEMO_ARMS
                for seed in seeds
            ]
            names = {f"{loss}-lag8-severe-s{seed}" for loss in DEMO_ARMS for seed in seeds}
            run_ids = _wait_for_runs(base, names, stop)
            if run_ids:
                print(f"keel demo: compare live at {base}/compare?runs={','.join(run_ids)}", flush=True)
            for child in children:
                while child.poll() is None:
                    if stop.wait(0.5):
                        return
            round_index += 1

    launcher = threading.Thread(target=experiment, daemon=True)
    launcher.start()
    print(f"keel demo: dashboard at {settings.base_url}/  (Ctrl-C to stop)", flush=True)
    try:
        server.run()
    finally:
        stop.set()
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=10)
    return 0


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part]


def _add_eval_alerts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--losses", type=_csv(str), default=None, help="default: the toy grid's 8 losses")
    parser.add_argument("--lags", type=_csv(int), default=[0, 2, 8, 32])
    parser.add_argument("--mismatch", type=_csv(str), default=["none", "mild", "severe"])
    parser.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--json", default=None, help="also write the scores to this file")


def _eval_alerts(args: argparse.Namespace) -> int:
    import json

    from server.alerts.evaluation import evaluate
    from trainer_hooks.toy import DEFAULT_LOSSES

    result = evaluate(args.losses or list(DEFAULT_LOSSES), args.lags, args.mismatch, args.seeds, args.steps, args.device, args.database_url)
    print(f"corpus: {result['runs']} toy runs, {result['collapsing']} collapsing "
          "(reward reached >= 0.5, then fell >= 0.2 below its running peak)")
    print(result["text"])
    if not result["rlwatch_available"]:
        print("(rlwatch is not installed: pip install rlwatch to compare)")
    timings = result["timings_s"]
    print(f"time: corpus {timings['corpus']:.0f} s, replay through ingest + alert engine {timings['keel_replay']:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({k: v for k, v in result.items() if k != "text"}, handle, indent=2)
    return 0


def _add_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create"])
    parser.add_argument("--name", default="cli")
    parser.add_argument("--scopes", default="ingest,read", help="comma-separated: ingest, read, admin")
    _add_database_url(parser)


def _token(args: argparse.Namespace) -> int:
    import asyncio

    from server import db
    from server.auth import create_token
    from server.storage import Store

    settings = _settings(args)
    db.upgrade(settings.database_url)

    async def create() -> str:
        store = Store(db.create_engine(settings.database_url))
        try:
            return await create_token(store, args.name, [s for s in args.scopes.split(",") if s])
        finally:
            await store.engine.dispose()

    try:
        token = asyncio.run(create())
    except ValueError as exc:
        print(f"keel: {exc}")
        return 2
    print(token)
    print(f"(scopes {args.scopes}; shown once: store it now)", flush=True)
    return 0


COMMANDS = {
    "token": ("Create an API token (printed once).", _add_token, _token),
    "eval-alerts": ("Score critical alerts on a labelled corpus of toy runs, beside rlwatch.", _add_eval_alerts, _eval_alerts),
    "demo": ("Serve on the embedded database and stream a live A/B experiment of toy runs.", _add_demo, _demo),
    "serve": ("Run the Keel server (ingest, API, dashboard).", _add_serve, _serve),
    "db": ("Database maintenance (migrations).", _add_db, _db),
}
