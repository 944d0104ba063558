"""Refuse webhook targets on loopback, private, link-local, CGNAT, multicast, reserved or
metadata addresses (SSRF), however the address is spelled.

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

_V6 = ipaddress.IPv6Network
# IPv6 forms that are only another spelling of an IPv4 address: the host reached is the
# IPv4 one, so that is the address judged.
V4_MAPPED = _V6("::ffff:0:0/96")
V4_TRANSLATED = _V6("::ffff:0:0:0/96")  # SIIT (RFC 6145)
V4_COMPATIBLE = _V6("::/96")  # deprecated, still accepted by some stacks
NAT64 = _V6("64:ff9b::/96")  # well-known prefix (RFC 6052): the gateway forwards to the IPv4 inside
NOT_GLOBAL = (
    # Blocks the IANA special-purpose registries mark not globally reachable that older
    # Pythons' `is_global` still calls global.
    ipaddress.IPv4Network("192.0.0.0/24"),
    _V6("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215): translates on the local network
    _V6("fec0::/10"),  # site-local (deprecated, still routed within sites)
)


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a packet to `address` ends up at or passes through (tunnels)."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if any(address in network for network in (V4_TRANSLATED, V4_COMPATIBLE, NAT64)):
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    if address.sixtofour is not None:  # 2002:V4ADDR::/48
        return [address.sixtofour]
    if address.teredo is not None:  # (server, client); Teredo packets reach both
        return list(address.teredo)
    return []


def _global(address: IPAddress) -> bool:
    return (
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not any(address in network for network in NOT_GLOBAL)
    )


def address_allowed(address: IPAddress) -> bool:
    """Whether a webhook may go to `address`: judged by every address it reaches.

    An IPv6 address that embeds an IPv4 one (mapped, translated, compatible, NAT64,
    6to4, Teredo) is allowed only if that IPv4 address is global; a tunnel's own
    IPv6 address (6to4, Teredo) must be global as well.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return _global(address)
    inner = embedded_ipv4(address)
    if not all(_global(v4) for v4 in inner):
        return False
    if inner and any(address in network for network in (V4_MAPPED, V4_TRANSLATED, V4_COMPATIBLE, NAT64)):
        return True  # only a spelling of the IPv4 address just judged
    return _global(address)


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
