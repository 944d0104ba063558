"""Pure pieces of webhook delivery: Standard Webhooks signatures, the SSRF guard, the retry
policy, the receiver formats."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from server.webhooks import formats, signing
from server.webhooks.delivery import RetryPolicy, parse_retry_after
from server.webhooks.netguard import ForbiddenTarget, address_allowed, checked_address


def test_standard_webhooks_reference_vector() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = signing.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert signing.verify(
        secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body, f"v1,bogus {signature}"
    )
    assert not signing.verify(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265331", body, signature)
    assert signing.new_secret().startswith("whsec_")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.1",
        "172.16.5.4",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",
        "224.0.0.1",
        # Judged by what they reach: the IPv4 address inside, however it is spelled.
        "::127.0.0.1",  # IPv4-compatible
        "::7f00:1",
        "::a00:1",
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT)
        "64:ff9b::7f00:1",  # NAT64 well-known prefix: 127.0.0.1 behind the gateway
        "64:ff9b::a9fe:a9fe",  # ... 169.254.169.254, the metadata service
        "64:ff9b::a00:1",  # ... 10.0.0.1
        "64:ff9b::6440:1",  # ... 100.64.0.1 (CGNAT)
        "64:ff9b:1::a00:1",  # local-use NAT64 (RFC 8215)
        "64:ff9b:1:ff00:808:8:800::",  # ... even where its /48 embeds a public address
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
        "2001:0:a00:1::1",  # Teredo, server 10.0.0.1
        "fec0::1",  # site-local (deprecated, still routed inside sites)
        "fc00::1",
        "100.64.0.1",
        "100.127.255.254",
        "0.1.2.3",
        "192.0.0.8",
        "198.18.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "239.255.255.250",  # multicast
        "224.0.1.1",
        "ff02::1",
        "ff0e::1",  # global-scope multicast
        "2001:db8::1",
        "100::1",  # discard-only
        "::",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700::1111",
        "2a00:1450:4001:81c::200e",
        "::ffff:8.8.8.8",  # IPv4-mapped public address
        "64:ff9b::808:808",  # 8.8.8.8 through a NAT64 gateway
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "url",
    [
        "http://[::127.0.0.1]/x",
        "http://[::7f00:1]/x",
        "http://[::ffff:0:7f00:1]/x",
        "http://[fec0::1]/x",
        "http://[64:ff9b::7f00:1]/x",
        "http://[64:ff9b::a9fe:a9fe]/x",
        "http://[64:ff9b::a00:1]/x",
        "https://[2002:a00:1::1]:8443/x",
    ],
)
def test_webhook_urls_that_reach_private_addresses_are_refused(url: str) -> None:
    with pytest.raises(ForbiddenTarget, match="non-public"):
        asyncio.run(checked_address(url, allow_private=False))


def test_connect_time_check_resolves_names() -> None:
    with pytest.raises(ForbiddenTarget, match="non-public"):
        asyncio.run(checked_address("http://localhost:9/x", allow_private=False))
    with pytest.raises(ForbiddenTarget, match="non-public"):
        asyncio.run(checked_address("http://[::ffff:7f00:1]/x", allow_private=False))
    assert (
        str(asyncio.run(checked_address("http://127.0.0.1:9/x", allow_private=True))) == "127.0.0.1"
    )
    with pytest.raises(ValueError, match="http"):
        asyncio.run(checked_address("file:///etc/passwd", allow_private=True))


def test_retry_policy_backoff_jitter_and_retry_after() -> None:
    policy = RetryPolicy(base_s=1.0, max_s=60.0)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 60.0)]:
        delays = [policy.delay(attempt, None) for _ in range(200)]
        assert cap / 2 <= min(delays) and max(delays) <= cap
    assert policy.delay(1, 30.0) == 30.0
    assert parse_retry_after("7", 0.0) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == 10.0
    assert parse_retry_after("soon", 0.0) is None


EVENT = {
    "type": "alert.firing",
    "timestamp": "2026-01-01T00:00:00+00:00",
    "alert": {
        "id": 3,
        "run_id": "r-1",
        "run_name": "is-lag8-severe-s0",
        "project": "default",
        "group": "is",
        "rule": "collapse risk",
        "metric": "grad/norm",
        "severity": "critical",
        "state": "firing",
        "step": 140,
        "value": 31.5,
        "started_step": 138,
        "resolved_step": None,
        "fired_step": 140,
        "message": "x" * 5000,
        "fingerprint": "abc",
        "started_at": "2026-01-01T00:00:00+00:00",
        "resolved_at": None,
        "url": "http://keel:8750/compare?runs=r-1",
    },
}


def test_formats_name_the_essentials_and_respect_limits() -> None:
    import json

    for name in formats.FORMATS:
        body = formats.render(name, EVENT).decode()
        for needle in (
            "r-1",
            "is-lag8-severe-s0",
            "collapse risk",
            "grad/norm",
            "critical",
            "firing",
            "140",
            "31.5",
            "compare?runs=r-1",
        ):
            assert needle in body, (name, needle)
    slack = json.loads(formats.render("slack", EVENT))
    assert all(len(block["text"]["text"]) <= 3000 for block in slack["blocks"] if "text" in block)
    discord = json.loads(formats.render("discord", EVENT))
    assert len(discord["content"]) <= 2000 and len(discord["embeds"][0]["description"]) <= 4096
    am = json.loads(formats.render("alertmanager", EVENT))
    assert (
        am["version"] == "4"
        and am["status"] == "firing"
        and am["alerts"][0]["labels"]["alertname"] == "collapse risk"
    )
    assert am["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"


def test_a_masked_webhook_url_keeps_only_where_it_goes() -> None:
    from server.webhooks.registry import masked_url

    assert masked_url("https://hooks.slack.com/services/T0/B0/secret") == "https://hooks.slack.com/***"
    assert masked_url("https://discord.com/api/webhooks/1/secret?wait=true") == "https://discord.com/***"
    assert masked_url("http://user:pw@[::1]:8080/hook?token=x#f") == "http://[::1]:8080/***"
    assert masked_url("http://10.0.0.5") == "http://10.0.0.5/***"


def test_every_url_in_a_delivery_error_is_masked_for_a_read_token() -> None:
    from server.webhooks.registry import masked_urls

    error = "ConnectError: could not reach https://hooks.slack.com/services/T0/B0/secret123 (then http://10.0.0.5:8080/x?token=q)"
    masked = masked_urls(error)
    assert masked == "ConnectError: could not reach https://hooks.slack.com/*** (then http://10.0.0.5:8080/***)"
    assert masked_urls(None) is None and masked_urls("HTTP 500") == "HTTP 500"
