"""gzip for what the server sends a browser, with immutable files compressed once.

The dashboard's page pulls about 9 MB of JavaScript (plotly.js, the grid, Dash) and
figures of a few hundred KiB each: uncompressed, a cold load of a compare page moves
over 14 MiB. The server (server/app.py) adds two layers:

- `StaticGzip` (outer): Dash's component files (plotly.js and the rest) are compressed
  once per version (their ETag, or the fingerprint in their URL) and kept in memory
  (bounded), rather than once per page load;
- Starlette's `GZipMiddleware` (inner) for everything else: pages, callbacks, the API.

Only when the client says it accepts gzip; websockets pass untouched.
"""

from __future__ import annotations

import gzip
from collections import OrderedDict

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["StaticGzip", "LEVEL", "MINIMUM_SIZE"]

MINIMUM_SIZE = 1024
"""Smaller bodies go as they are (gzip's header would eat the gain)."""
LEVEL = 6
"""zlib's default: within a few percent of level 9's size at a third of its time."""
STATIC_PREFIXES = ("/_dash-component-suites/",)


def _accepts_gzip(scope: Scope) -> bool:
    return any(name == b"accept-encoding" and b"gzip" in value for name, value in scope.get("headers", ()))


class StaticGzip:
    """Compress each version of the files under `prefixes` once."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = STATIC_PREFIXES, max_bytes: int = 64 * 2**20):
        self.app = app
        self.prefixes = prefixes
        self.max_bytes = max_bytes
        self._cache: OrderedDict[tuple[str, bytes, bytes], bytes] = OrderedDict()
        self._bytes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not scope["path"].startswith(self.prefixes)
            or not _accepts_gzip(scope)
        ):
            await self.app(scope, receive, send)
            return
        # The app answers as ever (cheap: a file read), without gzip; its body is compressed
        # here, once per version of the file (its ETag, or its fingerprinted URL).
        identity = {**scope, "headers": [(n, v) for n, v in scope["headers"] if n != b"accept-encoding"]}
        start: Message = {}
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(identity, receive, capture)
        body = b"".join(chunks)
        headers = [(n.lower(), v) for n, v in start.get("headers", [])]
        found = dict(headers)
        if start.get("status") != 200 or len(body) < MINIMUM_SIZE or b"content-encoding" in found:
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        version = found.get(b"etag") or (found.get(b"cache-control", b"") if b"max-age" in found.get(b"cache-control", b"") else None)
        key = (scope["path"], scope.get("query_string", b""), version or b"")
        packed = self._cache.get(key) if version else None
        if packed is None:
            packed = await anyio.to_thread.run_sync(gzip.compress, body, LEVEL)
            if version and len(packed) <= self.max_bytes:
                self._cache[key] = packed
                self._bytes += len(packed)
                while self._bytes > self.max_bytes:
                    _, old = self._cache.popitem(last=False)
                    self._bytes -= len(old)
        else:
            self._cache.move_to_end(key)
        headers = [(n, v) for n, v in headers if n not in (b"content-length", b"vary")]
        headers += [
            (b"content-encoding", b"gzip"),
            (b"content-length", str(len(packed)).encode()),
            (b"vary", b"Accept-Encoding"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": packed})
