"""Which browser requests the server serves: those for its own names, from its own pages.

A server on loopback with auth off is reachable from any web page the user visits, by
two attacks (docs/security.md):

- DNS rebinding: a page on evil.example points its own name at 127.0.0.1 and then reads
  and writes Keel as if it were its own origin; its requests carry `Host: evil.example`.
  With auth off, the Host check refuses (400) every name that is not the server's:
  `localhost`, the name it binds, the host of `public_url`, and `allowed_hosts`. IP
  addresses are always served: a request for an address involved no DNS, so nothing was
  rebound. With auth on there is nothing to check: a rebound page holds neither a token
  nor Keel's cookie (a cookie belongs to the name it was set for), so trainers and
  proxies may reach the server by any name.
- Cross-site writes and websocket hijacking: any page may POST to http://127.0.0.1:8750
  or open a websocket on it, and the browser sends it without asking the server first
  (a websocket is not subject to CORS at all). The browser names the page in `Origin`.
  A websocket handshake, or an HTTP POST/PUT/PATCH/DELETE, whose Origin is not the
  server's own (the same host and port as the request's Host), `public_url`'s, or one of
  `allowed_origins` is refused (403). A request without Origin is not a browser's page
  (the Monitor, scripts, curl) and passes; `Origin: null` (sandboxed frames, files) is
  foreign.

Cross-site reads need nothing here: the server sends no CORS headers, so a foreign page
cannot read what it fetches. Every HTTP response also forbids framing by other sites
(clickjacking) and content sniffing: `SecurityHeaders`, outside everything else, this
guard's own refusals included; server/serving.py adds the same to the responses uvicorn
makes itself (a malformed request's 400, a slow head's 408, a websocket refusal).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.config import Settings

__all__ = ["SECURITY_HEADERS", "OriginGuard", "SecurityHeaders", "SitePolicy", "with_security_headers"]

log = logging.getLogger("keel.origins")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost"})
"""Names no page can rebind: they resolve on the user's machine, never through DNS."""
DEFAULT_PORTS = {"http": 80, "https": 443}
SECURITY_HEADERS = (
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
)
"""On every HTTP response (docs/security.md): no other site may frame a page
(clickjacking), and no browser may sniff a type other than the one sent."""


def with_security_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` and each of SECURITY_HEADERS it lacks (a response that sets one keeps its own)."""
    headers = list(headers)
    present = {name.lower() for name, _ in headers}
    return headers + [(name, value) for name, value in SECURITY_HEADERS if name not in present]


def host_name(host: str) -> str:
    """The name or address of a Host header value: lowercase, without port or brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_of(url: str) -> str | None:
    """`scheme://host[:port]` of an http(s) URL or Origin header, lowercase, default port
    dropped (as browsers send it); None for "null" or anything else that is no such origin."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    return f"{scheme}://{netloc}" + (f":{port}" if port is not None and port != DEFAULT_PORTS[scheme] else "")


@dataclass(frozen=True)
class SitePolicy:
    names: frozenset[str]
    """Host names served besides IP addresses (lowercase, no port)."""
    any_name: bool
    """The Host check is off: auth is on (a rebound page has no credential to use), or
    `allowed_hosts` holds "*" (a proxy in front checks it)."""
    origins: frozenset[str]
    """Origins whose pages may write, besides the request's own (as `origin_of` gives them)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> SitePolicy:
        names = set(LOOPBACK_NAMES) | {host_name(name) for name in settings.allowed_hosts if name != "*"}
        bound = host_name(settings.host)
        if bound and not is_address(bound):  # bound by name (`--host keel.lan`): served by it
            names.add(bound)
        origins = set(_origins(settings.allowed_origins))
        if settings.public_url:
            public = origin_of(settings.public_url)
            if public is None:
                raise ValueError(f"KEEL_PUBLIC_URL must be an http(s) URL, not {settings.public_url!r}")
            names.add(host_name(urlsplit(public).netloc))
            origins.add(public)
        any_name = settings.auth_enabled or "*" in settings.allowed_hosts
        return cls(names=frozenset(names), any_name=any_name, origins=frozenset(origins))

    def serves_host(self, host: str | None) -> bool:
        # No Host at all is no browser's request (HTTP/1.1 requires one; h11 enforces it).
        if host is None or self.any_name:
            return True
        name = host_name(host)
        return name in self.names or is_address(name)

    def trusts_origin(self, origin: str, host: str | None) -> bool:
        normalized = origin_of(origin)
        if normalized is None:
            return False
        # Same page as the request: same host and port. The scheme may differ: behind a
        # proxy that ends TLS, an https page's requests arrive here as http.
        if host is not None and normalized.split("://", 1)[1] == host.strip().lower():
            return True
        return normalized in self.origins


def _origins(entries: Iterable[str]) -> Iterable[str]:
    for entry in entries:
        origin = origin_of(entry)
        if origin is None:
            raise ValueError(f"KEEL_ALLOWED_ORIGINS entries are origins like https://app.example.com, not {entry!r}")
        yield origin


class SecurityHeaders:
    """ASGI middleware, outermost on the app: SECURITY_HEADERS on every HTTP response and
    every refused websocket handshake, whoever inside answered it (OriginGuard's 400 and
    403, a 408, a 429, a 500)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                message["headers"] = with_security_headers(message.get("headers", []))
            await send(message)

        await self.app(scope, receive, send_with_headers)


class OriginGuard:
    """ASGI middleware: refuses foreign Host names and foreign pages' writes and websockets
    (see the module doc)."""

    def __init__(self, app: ASGIApp, policy: SitePolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            # A websocket handshake is answered with this status and text too: every uvicorn
            # websocket implementation has the denial-response extension.
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> PlainTextResponse | None:
        host = headers.get("host")
        if not self.policy.serves_host(host):
            log.warning("refused a request for Host %r: not a name of this server (KEEL_ALLOWED_HOSTS)", host)
            return PlainTextResponse(
                f"Host {host!r} is not a name of this server; if it is, add it to KEEL_ALLOWED_HOSTS "
                "or set KEEL_PUBLIC_URL (docs/security.md)",
                400,
            )
        origin = headers.get("origin")
        if origin is None or (scope["type"] == "http" and scope["method"] not in WRITE_METHODS):
            return None
        if self.policy.trusts_origin(origin, host):
            return None
        log.warning("refused a %s from a page of %r (KEEL_ALLOWED_ORIGINS)", _what(scope), origin)
        return PlainTextResponse(
            f"cross-site {_what(scope)} from {origin!r} refused; to allow that page, add its origin to "
            "KEEL_ALLOWED_ORIGINS (docs/security.md)",
            403,
        )


def _what(scope: Scope) -> str:
    return "websocket" if scope["type"] == "websocket" else str(scope["method"])
