"""Refuse webhook targets on loopback, private, link-local or metadata addresses (SSRF).

Checked when a webhook is created and again at connect time: the host is
resolved, every address must be public, and the request goes to the checked
address (Host header and TLS SNI keep the name), so DNS cannot be rebound
between the check and the connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from server.errors import ForbiddenTarget

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_allowed(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return address_allowed(mapped)
    return address.is_global and not address.is_multicast


def check_url_shape(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("webhook URL must be http:// or https://")
    if not parts.hostname:
        raise ValueError("webhook URL has no host")
    if parts.username or parts.password:
        raise ValueError("webhook URL must not carry credentials")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port


async def resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ForbiddenTarget(f"cannot resolve {host!r}: {exc}") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


async def checked_address(url: str, *, allow_private: bool) -> IPAddress:
    """The address to connect to, after checking that every address of the host is allowed."""
    _, host, port = check_url_shape(url)
    addresses = await resolve(host, port)
    if not addresses:
        raise ForbiddenTarget(f"{host!r} has no address")
    if not allow_private:
        refused = [str(a) for a in addresses if not address_allowed(a)]
        if refused:
            raise ForbiddenTarget(
                f"{host!r} resolves to non-public address(es) {', '.join(refused)}; "
                "start the server with --allow-private-webhooks to allow local receivers"
            )
    return addresses[0]
