"""A Keel server's URL, as every client takes it: one normaliser for the trainer's Monitor,
its ingest socket, `keel sync / import / export / watch` and `keel.client.Client`.

A server URL is `http://`, `https://`, `ws://` or `wss://`, a host, an optional port and an
optional path prefix (a server behind a proxy at `https://example.org/keel`). A trailing
`/`, `/api/v1` or `/api/v1/ingest` is accepted too (an ingest URL pasted from the docs names
the same server). ws(s):// is the same server as http(s)://: the REST API is read over
http(s), the ingest socket dialled over ws(s).

    server_base("wss://h/keel/api/v1/ingest") == "https://h/keel"
    api_url("http://h:8750/") == "http://h:8750/api/v1"
    ingest_url("https://h") == "wss://h/api/v1/ingest"
    run_page_url("ws://h:1", "R") == "http://h:1/runs/R"

Anything else (no scheme, another scheme, no host, a bad port, a query or a fragment)
raises ValueError saying what was expected.
"""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit, urlunsplit

__all__ = ["DEFAULT_SERVER_URL", "SCHEMES", "api_url", "default_server", "ingest_url", "run_page_url", "server_base"]

DEFAULT_SERVER_URL = "http://127.0.0.1:8750"
"""The local server `keel serve` starts by default."""

SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
"""The schemes a server URL may have, each to the http(s) scheme of the same server."""
_SOCKET_SCHEMES = {"http": "ws", "https": "wss"}
_API = "/api/v1"
_INGEST = "/api/v1/ingest"
_EXPECTED = "http://host:port[/prefix] (or https://, ws://, wss://; the port optional)"


def server_base(url: str) -> str:
    """`http(s)://host[:port][/prefix]` (no trailing /) of a server URL; ValueError if `url`
    is not one (see the module's docstring)."""

    def refuse(why: str) -> ValueError:
        return ValueError(f"server URL must look like {_EXPECTED}, got {url!r}{why}")

    if not isinstance(url, str):
        raise refuse("")
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:  # a port that is not a number in 0..65535, a bad IPv6 literal
        raise refuse(f" ({exc})") from None
    scheme = SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        if "://" in text:
            raise refuse(f" (scheme {parts.scheme or text.split('://')[0]!r})")
        raise refuse(f"; did you mean http://{text}?" if text else "")
    if not parts.hostname:
        raise refuse(" (no host)")
    if port == 0:
        raise refuse(" (port 0)")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise refuse(" (a server URL has no ?query or #fragment)")
    path = parts.path.rstrip("/")
    for suffix in (_INGEST, _API):
        if path.endswith(suffix):
            path = path[: -len(suffix)].rstrip("/")
            break
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def api_url(url: str) -> str:
    """`http(s)://host[:port][/prefix]/api/v1`: the REST API of the server at `url`."""
    return server_base(url) + _API


def ingest_url(url: str) -> str:
    """`ws(s)://host[:port][/prefix]/api/v1/ingest`: the ingest socket of the server at `url`."""
    base = server_base(url)
    scheme, rest = base.split("://", 1)
    return f"{_SOCKET_SCHEMES[scheme]}://{rest}{_INGEST}"


def run_page_url(url: str, run_id: str) -> str:
    """The dashboard's page of run `run_id` (dashboard/app.py PAGE_PATHS: /runs/{run_id})."""
    return f"{server_base(url)}/runs/{quote(str(run_id), safe='')}"


def default_server(given: str | None = None) -> str:
    """The server a client talks to: `given` (a `--server` option), else $KEEL_URL, else the
    local server (every `keel` command and integration resolves it the same way)."""
    return given or os.environ.get("KEEL_URL") or DEFAULT_SERVER_URL
