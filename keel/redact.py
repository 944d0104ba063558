"""No secret in what Keel stores about a command: `keel run` records the command line and the
end of the child's stderr in the run's config, with credentials masked as `***`.

The patterns are server/redaction.py's (which `keel` may not import: the GPU-node install has
no server), kept in step by tests/keel/test_run.py: a credential-named `name=value`
(`--hf_token=...`, `WANDB_API_KEY=...`, `?token=...`), a URL's password
(`postgresql://user:pass@host`), a `Bearer` token, a Keel API token or webhook secret; and,
for a command line, what commonly holds a key whatever its name: Hugging Face (`hf_...`),
OpenAI-style (`sk-...`), GitHub (`ghp_...`) and wandb (40 hex digits after a key-named flag)
tokens, and the argument after a flag named like a credential (`--token SECRET`).

Standard library only (see keel/cli.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["MASK", "redact", "redact_argv"]

MASK = "***"

_CREDENTIAL = r"(?:token|secret|password|passwd|pwd|api[_-]?key|auth|authorization|credentials?)"
_PATTERNS = (
    # server/redaction.py's four, the same expressions.
    re.compile(
        r"(?i)((?:^|[?&;\s'\"(,])[\w.%-]*(?:token|secret|password|passwd|pwd|api[_-]?key|auth|authorization|credentials?)=)"
        r"[^&;\s\"'#]+"
    ),
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@\"']*:)[^/\s@\"']+(?=@)"),
    re.compile(r"(?i)(\bbearer(?:\s+|%20|\+))[^\s\"',&;#?]+"),
    re.compile(r"()\b(?:keel_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])|whsec_[A-Za-z0-9+/=]{16,})"),
    # A command line's own: `--hf_token=...` starts the argument (no separator before it).
    re.compile(rf"(?i)(^-*[\w.-]*{_CREDENTIAL}[\w.-]*[=:])\S+"),
    re.compile(r"()\b(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,})\b"),
)
_SECRET_FLAG = re.compile(rf"(?i)^--?[\w.-]*{_CREDENTIAL}[\w.-]*$")


def redact(text: str) -> str:
    """`text` with every credential the patterns find as `***`."""
    for pattern in _PATTERNS:
        text = pattern.sub(lambda match: match.group(1) + MASK, text)
    return text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with its credentials masked: each argument by `redact`, and the whole
    argument after a flag named like a credential (`--token X`, `--api-key X`)."""
    out: list[str] = []
    after_flag = False
    for arg in argv:
        out.append(MASK if after_flag and not arg.startswith("-") else redact(arg))
        after_flag = bool(_SECRET_FLAG.match(arg))
    return out
