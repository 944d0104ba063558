"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

webhook-signature = "v1," + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")), where the
key is the base64 part of a "whsec_..." secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    encoded = secret[len(PREFIX):] if secret.startswith(PREFIX) else secret
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        raise ValueError("webhook secret must be 'whsec_' followed by base64") from None


def validate_secret(secret: str) -> None:
    if len(_key(secret)) < 16:
        raise ValueError("webhook secret must hold at least 16 bytes of key")


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_key(secret), signed, hashlib.sha256).digest()).decode()


def headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def verify(secret: str, message_id: str, timestamp: str, body: bytes, signature_header: str) -> bool:
    """Receiver-side check (used by tests and documented for users)."""
    expected = sign(secret, message_id, int(timestamp), body).split(",", 1)[1]
    return any(
        hmac.compare_digest(expected, candidate.split(",", 1)[1])
        for candidate in signature_header.split()
        if candidate.startswith("v1,")
    )
