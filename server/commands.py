"""Server-side `keel` subcommands: serve, db, demo. Stdlib imports only at module level."""

from __future__ import annotations

import argparse


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


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app

    settings = _settings(args, host=args.host, port=args.port)
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


COMMANDS = {
    "serve": ("Run the Keel server (ingest, API, dashboard).", _add_serve, _serve),
    "db": ("Database maintenance (migrations).", _add_db, _db),
}
