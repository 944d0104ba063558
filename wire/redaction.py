"""What a credential looks like in text: the patterns the server's log filter
(server/redaction.py) and `keel run`'s record of a command (keel/redact.py) both mask, so a
secret is masked the same way whichever side writes it. Standard library only.

Each pattern's first group is kept and the rest of the match becomes `MASK`.
"""

from __future__ import annotations

import re

__all__ = ["CREDENTIAL", "MASK", "PATTERNS", "mask_patterns"]

MASK = "***"
CREDENTIAL = r"(?:token|secret|password|passwd|pwd|api[_-]?key|auth|authorization|credentials?)"
"""What a name that holds a credential contains."""

PATTERNS = (
    # ?token=..., &access_token=..., ;password=..., client_secret=..., api_key=..., ?auth=...,
    # ?authorization=Bearer%20...; also inside a quoted or bytes value (b'token=...', as a
    # request's scope prints it).
    re.compile(rf"(?i)((?:^|[?&;\s'\"(,])[\w.%-]*{CREDENTIAL}=)[^&;\s\"'#]+"),
    # scheme://user:password@host
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@\"']*:)[^/\s@\"']+(?=@)"),
    # Authorization: Bearer <token>, and Bearer%20<token> or Bearer+<token> in a URL
    re.compile(r"(?i)(\bbearer(?:\s+|%20|\+))[^\s\"',&;#?]+"),
    # A Keel API token (server/api_tokens.py) or webhook secret (server/webhooks/signing.py) anywhere.
    # (keel_ + token_urlsafe(32): exactly 43 characters, so names like keel_test_... stay legible)
    re.compile(r"()\b(?:keel_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])|whsec_[A-Za-z0-9+/=]{16,})"),
)


def mask_patterns(text: str, patterns: tuple[re.Pattern[str], ...] = PATTERNS) -> str:
    """`text` with what each of `patterns` finds masked (its first group kept)."""
    for pattern in patterns:
        text = pattern.sub(lambda match: match.group(1) + MASK, text)
    return text
