"""No secret in what Keel stores about a command: `keel run` records the command line and the
end of the child's stderr in the run's config, with credentials masked as `***`.

The patterns are the server log's (wire/redaction.py, shared): a credential-named `name=value`
(`--hf_token=...`, `WANDB_API_KEY=...`, `?token=...`), a URL's password
(`postgresql://user:pass@host`), a `Bearer` token, a Keel API token or webhook secret; and,
for a command line, what commonly holds a key whatever its name: Hugging Face (`hf_...`),
OpenAI-style (`sk-...`), GitHub (`ghp_...`) and wandb (40 hex digits after a key-named flag)
tokens, and the argument after a flag named like a credential (`--token SECRET`).

Standard library and `wire` only (see keel/cli.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from wire.redaction import CREDENTIAL, MASK, PATTERNS, mask_patterns

__all__ = ["MASK", "redact", "redact_argv"]

# A command line's own, beside the shared patterns: `--hf_token=...` starts the argument (no
# separator before it), and what commonly holds a key whatever its name.
_COMMAND_LINE = (
    re.compile(rf"(?i)(^-*[\w.-]*{CREDENTIAL}[\w.-]*[=:])\S+"),
    re.compile(r"()\b(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,})\b"),
)
_SECRET_FLAG = re.compile(rf"(?i)^--?[\w.-]*{CREDENTIAL}[\w.-]*$")


def redact(text: str) -> str:
    """`text` with every credential the patterns find as `***`."""
    return mask_patterns(text, PATTERNS + _COMMAND_LINE)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with its credentials masked: each argument by `redact`, and the whole
    argument after a flag named like a credential (`--token X`, `--api-key X`)."""
    out: list[str] = []
    after_flag = False
    for arg in argv:
        out.append(MASK if after_flag and not arg.startswith("-") else redact(arg))
        after_flag = bool(_SECRET_FLAG.match(arg))
    return out
