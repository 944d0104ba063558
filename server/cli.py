"""Server-side `keel` subcommands: serve, db, token. Stdlib imports only at module level."""

from __future__ import annotations

import argparse
import sys


def _add_database_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help="sqlite:///path or postgresql://user@host/db (env KEEL_DATABASE_URL; default ~/.keel/keel.db)",
    )


def _settings(args: argparse.Namespace, **overrides: object):  # type: ignore[no-untyped-def]
    """The settings, or exit 2 with each invalid one named (never its value: it may be a secret)."""
    from pydantic import ValidationError

    from server.config import Settings

    values = {k: v for k, v in overrides.items() if v is not None}
    if getattr(args, "database_url", None):
        values["database_url"] = args.database_url
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        for error in exc.errors():
            name = "KEEL_" + "_".join(str(part) for part in error["loc"]).upper()
            print(f"keel: invalid setting {name}: {error['msg']}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _add_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8750)")
    _add_database_url(parser)
    parser.add_argument(
        "--log-level",
        default="info",
        help="critical, error, warning, info or debug (trace is run as debug: it would log requests' headers and queries unmasked)",
    )
    parser.add_argument(
        "--allow-private-webhooks",
        action="store_true",
        default=None,
        help="allow webhook URLs on loopback/private addresses (local receivers)",
    )


def masked_url(database_url: str) -> str:
    """The database URL as printed: its password, if any, as *** (in the userinfo, or as a
    query parameter: `?password=...`, and any other credential-like parameter)."""
    from sqlalchemy.engine import make_url

    from server.redaction import redact

    try:
        return redact(make_url(database_url).render_as_string(hide_password=True))
    except Exception:  # not a URL SQLAlchemy can parse: say nothing of it
        return "<unparsable database URL>"


def _serve(args: argparse.Namespace) -> int:
    import gc

    import uvicorn

    from server.app import create_app
    from server.serving import uvicorn_config

    settings = _settings(args, host=args.host, port=args.port, allow_private_webhooks=args.allow_private_webhooks)
    from server.api_tokens import is_loopback

    if not settings.auth_enabled and not is_loopback(settings.host):
        print(f"keel: refusing to serve on {settings.host} with auth off; unset KEEL_AUTH=false or bind 127.0.0.1", flush=True)
        return 2
    if settings.auth_enabled:
        print("keel: auth is on: clients need a token (keel token create --scopes ingest,read,admin)", flush=True)
    print(f"keel: serving on http://{settings.host}:{settings.port}  (database: {masked_url(settings.database_url)})", flush=True)
    if args.log_level.lower() == "trace":
        print("keel: --log-level trace logs requests' headers and query strings unmasked; logging at debug instead", flush=True)
    server = uvicorn.Server(uvicorn_config(create_app(settings), settings, log_level=args.log_level, keel_loggers=True))
    # What importing the server made (hundreds of thousands of objects: the dashboard, Plotly)
    # lives as long as the process: out of the collector's sight, a full collection after a
    # huge frame scans only what came after, not a pause of every client's acks.
    gc.collect()
    gc.freeze()
    # A huge frame is decoded in a worker thread (server/ingest.py); each await of every other
    # client waits for the interpreter lock to come back from it, up to this interval (5 ms by
    # default). bench/fairness.py, PostgreSQL: a trainer's ack p99 beside 7.5 MiB frames
    # 192-388 ms at 5 ms, 91-98 ms at 0.5 ms.
    sys.setswitchinterval(0.0005)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down, then raises the Ctrl-C it caught again
        pass
    if server.started:  # (the Ctrl-C may also come back after run() returned: said either way)
        print("keel serve: stopped", file=sys.stderr)
    return 0 if server.started else 3  # 3: did not start (uvicorn's exit code for it)


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade"], help="upgrade: apply all migrations")
    _add_database_url(parser)


def _db(args: argparse.Namespace) -> int:
    from server import db

    settings = _settings(args)
    db.upgrade(settings.database_url)
    print(f"keel: database at head ({masked_url(settings.database_url)})")
    return 0


def _add_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create", "list", "revoke"],
                        help="create (printed once), list (names, scopes, revoked), revoke NAME (every live token of that name)")  # fmt: skip
    parser.add_argument("revoked_name", nargs="?", default=None, metavar="NAME", help="revoke: the tokens' name")
    parser.add_argument("--name", default="cli", help="create: the token's name")
    parser.add_argument("--scopes", default="ingest,read", help="comma-separated: ingest, read, admin")
    _add_database_url(parser)


def _token(args: argparse.Namespace) -> int:
    import asyncio

    from server import db
    from server.api_tokens import create_token, list_tokens, revoke_tokens
    from server.storage import Store

    if args.action == "revoke" and not args.revoked_name:
        print("keel token revoke: name the tokens to revoke (keel token list shows them)")
        return 2
    settings = _settings(args)
    db.upgrade(settings.database_url)

    async def with_store(job):  # type: ignore[no-untyped-def]
        store = Store(db.create_engine(settings.database_url))
        try:
            return await job(store)
        finally:
            await store.close()

    if args.action == "list":
        for row in asyncio.run(with_store(list_tokens)):
            state = "revoked" if row.revoked else "live"
            print(f"{row.id:>4}  {row.name:<24} {','.join(row.scopes):<20} {state}")
        return 0
    if args.action == "revoke":
        count = asyncio.run(with_store(lambda store: revoke_tokens(store, args.revoked_name)))
        print(f"keel: revoked {count} token(s) named {args.revoked_name!r}; their open sockets close within seconds")
        return 0 if count else 1
    try:
        token = asyncio.run(with_store(lambda store: create_token(store, args.name, [s for s in args.scopes.split(",") if s])))
    except ValueError as exc:
        print(f"keel: {exc}")
        return 2
    print(token)
    print(f"(scopes {args.scopes}; shown once: store it now)", flush=True)
    return 0


def _add_prune(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--older-than", type=float, required=True, metavar="DAYS", help="runs that ended and sent nothing for this many days")
    parser.add_argument("--project", default=None, help="only this project's runs")
    parser.add_argument("--dry-run", action="store_true", help="list the runs, delete nothing")
    _add_database_url(parser)


def _prune(args: argparse.Namespace) -> int:
    """Retention: delete ended runs older than --older-than, in batches that never stall ingest."""
    import asyncio

    from server import db
    from server.retention import delete_run, prunable_runs
    from server.storage import Store

    if args.older_than < 0:
        print("keel prune: --older-than must be >= 0 days")
        return 2
    settings = _settings(args)
    db.upgrade(settings.database_url)

    async def prune() -> int:
        store = Store(db.create_engine(settings.database_url))
        try:
            runs = await prunable_runs(store, older_than_s=args.older_than * 86400, project=args.project)
            for run in runs:
                points = 0 if args.dry_run else await delete_run(store, run.id)
                verb = "would delete" if args.dry_run else f"deleted ({points} points)"
                print(f"keel prune: {verb} run {run.name!r} ({run.id!r}, project {run.project!r}, {run.status})", flush=True)
            return len(runs)
        finally:
            await store.close()

    count = asyncio.run(prune())
    print(f"keel prune: {count} run(s) {'found' if args.dry_run else 'deleted'}")
    return 0


COMMANDS = {
    "prune": ("Delete runs that ended long ago (retention), without stalling ingest.", _add_prune, _prune),
    "token": ("API tokens: create (printed once), list, revoke NAME.", _add_token, _token),
    "serve": ("Run the Keel server (ingest, API, dashboard).", _add_serve, _serve),
    "db": ("Database maintenance (migrations).", _add_db, _db),
}
