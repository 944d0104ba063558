"""Reading a decoded JSON message's fields for the typed messages of `wire` (replies.py,
signals.py): each field that is missing or of the wrong type is a ProtocolError naming the
message and the field. Standard library only."""

from __future__ import annotations

from typing import Any

from wire.errors import ProtocolError

__all__ = ["message_of", "number", "opt_int", "opt_string", "require_int", "string", "strings"]


def message_of(raw: Any, kind: str) -> dict[str, Any]:
    """`raw` as a message of type `kind`: a JSON object whose `type` is `kind`."""
    if not isinstance(raw, dict):
        raise ProtocolError(f"a {kind} message must be a JSON object, not {type(raw).__name__}")
    if raw.get("type") != kind:
        raise ProtocolError(f"not a {kind} message: its type is {str(raw.get('type'))[:40]!r}")
    return raw


def require_int(raw: dict[str, Any], name: str, kind: str, low: int, high: int) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(f"{kind}.{name} must be an integer in {low}..{high}, not {str(value)[:40]}")
    return value


def opt_int(raw: dict[str, Any], name: str, kind: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{kind}.{name} must be an integer or null, not {str(value)[:40]}")
    return value


def string(raw: dict[str, Any], name: str, kind: str, default: str | None = None) -> str:
    """A string field; absent (or null) is `default`, or refused when there is none."""
    value = raw.get(name)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise ProtocolError(f"{kind}.{name} must be a string" + (" (it is missing)" if value is None else ""))
    return value


def opt_string(raw: dict[str, Any], name: str, kind: str) -> str | None:
    value = raw.get(name)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{kind}.{name} must be a string or null")
    return value


def strings(raw: dict[str, Any], name: str, kind: str) -> tuple[str, ...] | None:
    """A list of strings; None when absent (null included)."""
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ProtocolError(f"{kind}.{name} must be a list of strings")
    return tuple(value)


def number(raw: dict[str, Any], name: str, kind: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{kind}.{name} must be a number")
    try:
        return float(value)
    except OverflowError:
        raise ProtocolError(f"{kind}.{name} is an integer too large for a float") from None
