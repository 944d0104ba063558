"""Wire protocol v1: message shapes, value encoding and validation.

Stdlib only: shared by the trainer-side client and the server, so each rule of
the protocol is written once. See docs/protocol.md for the prose version; the
errors and close codes are in wire/errors.py.

A metric value on the wire is a JSON number or one of the strings "nan",
"inf", "-inf" (JSON has no non-finite numbers). Non-finite values are data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from wire.errors import CLOSE_TOO_LARGE, ProtocolError

__all__ = [
    "FINISH_STATUSES",
    "MAX_CONFIG_DEPTH",
    "MAX_SEQ",
    "MAX_STEP",
    "PROTOCOL_VERSION",
    "Limits",
    "Row",
    "RunInfo",
    "decode_value",
    "encode_rows",
    "encode_value",
    "finish_message",
    "hello_message",
    "parse_finish",
    "parse_hello",
    "parse_points",
    "parse_rows",
    "parse_seq",
    "parse_writer",
    "points_frame",
    "points_message",
    "reject_message",
]

PROTOCOL_VERSION = 1

MAX_SEQ = 2**63 - 1
MAX_STEP = 2**62 - 1
MAX_CONFIG_DEPTH = 32
"""Nesting of run.config: deeper is refused at hello (it cannot be stored and read back)."""
WRITER_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")

FINISH_STATUSES = ("finished", "failed", "killed")

_NON_FINITE_IN = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True)
class Limits:
    """Bounds on what one message may carry; the server enforces them."""

    max_frame_bytes: int = 8 * 1024 * 1024
    """Largest accepted websocket message or POST body, in bytes."""
    max_rows: int = 10_000
    """Rows per points frame."""
    max_keys_per_row: int = 1_000
    """Metric keys in one row's `values`."""
    max_key_length: int = 200
    """Characters in one metric key."""
    max_name_length: int = 200
    """Characters in a run name, project, group or tag."""


@dataclass
class RunInfo:
    id: str
    name: str
    project: str = "default"
    group: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "project": self.project,
            "group": self.group,
            "config": self.config,
            "tags": list(self.tags),
        }


@dataclass
class Row:
    step: int
    time: float | None
    values: dict[str, float]


def encode_value(value: float) -> float | str:
    """A float as the wire carries it: finite numbers as numbers, the rest as strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def decode_value(raw: Any) -> float:
    """A wire value back to a float. Raises ProtocolError for anything else."""
    if isinstance(raw, bool):
        raise ProtocolError("metric values must be numbers, not booleans")
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        decoded = _NON_FINITE_IN.get(raw.strip().lower())
        if decoded is not None:
            return decoded
        raise ProtocolError(f"metric value {raw[:40]!r} is not a number, 'nan', 'inf' or '-inf'")
    raise ProtocolError(f"metric value of type {type(raw).__name__} is not a number")


def _require_dict(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object")
    return obj


def _short_str(obj: Any, what: str, limits: Limits, *, optional: bool = False) -> str | None:
    if obj is None and optional:
        return None
    if not isinstance(obj, str) or not obj:
        raise ProtocolError(f"{what} must be a non-empty string")
    if len(obj) > limits.max_name_length:
        raise ProtocolError(f"{what} is longer than {limits.max_name_length} characters")
    if "\x00" in obj:
        raise ProtocolError(f"{what} contains a NUL character")
    return obj


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counting no further than `limit` + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_hello(msg: Any, limits: Limits = Limits()) -> RunInfo:
    msg = _require_dict(msg, "hello")
    if msg.get("type") != "hello":
        raise ProtocolError("the first message must be {'type': 'hello', ...}")
    if msg.get("protocol") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported protocol {msg.get('protocol')!r}; this server speaks {PROTOCOL_VERSION}",
            code="unsupported_protocol",
        )
    run = _require_dict(msg.get("run"), "hello.run")
    run_id = _short_str(run.get("id"), "run.id", limits)
    assert run_id is not None
    name = _short_str(run.get("name", run_id), "run.name", limits)
    assert name is not None
    project = _short_str(run.get("project", "default"), "run.project", limits)
    assert project is not None
    group = _short_str(run.get("group"), "run.group", limits, optional=True)
    config = run.get("config") or {}
    if not isinstance(config, dict):
        raise ProtocolError("run.config must be a JSON object")
    if _depth(config, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        raise ProtocolError(f"run.config nests deeper than {MAX_CONFIG_DEPTH} levels")
    tags = run.get("tags") or []
    if not isinstance(tags, list):
        raise ProtocolError("run.tags must be a list of strings")
    for tag in tags:
        _short_str(tag, "a tag", limits)
    return RunInfo(id=run_id, name=name, project=project, group=group, config=config, tags=tags)


def parse_writer(msg: dict[str, Any]) -> str:
    """The hello's `writer`: the id of the client's own frame sequence ("" when absent)."""
    writer = msg.get("writer", "")
    if not isinstance(writer, str) or len(writer) > 64 or not set(writer) <= WRITER_ID_CHARS:
        raise ProtocolError("hello.writer must be up to 64 characters of [A-Za-z0-9_-]")
    return writer


def parse_rows(rows: Any, limits: Limits = Limits()) -> list[Row]:
    """Validate the `rows` array of a points frame or POST body, all or nothing."""
    if not isinstance(rows, list):
        raise ProtocolError("rows must be a list")
    if len(rows) > limits.max_rows:
        raise ProtocolError(
            f"{len(rows)} rows in one frame; the limit is {limits.max_rows}",
            code="too_large",
            close_code=CLOSE_TOO_LARGE,
        )
    parsed: list[Row] = []
    valid_keys: set[str] = set()
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ProtocolError(f"rows[{index}] must be a JSON object")
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise ProtocolError(f"rows[{index}].step must be an integer in 0..2**62-1")
        wall_time = row.get("time")
        if wall_time is not None:
            if isinstance(wall_time, bool) or not isinstance(wall_time, (int, float)):
                raise ProtocolError(f"rows[{index}].time must be a number (unix seconds)")
            wall_time = float(wall_time)
            if not math.isfinite(wall_time):
                raise ProtocolError(f"rows[{index}].time must be finite")
        values = row.get("values")
        if not isinstance(values, dict):
            raise ProtocolError(f"rows[{index}].values must be a JSON object")
        if len(values) > limits.max_keys_per_row:
            raise ProtocolError(
                f"rows[{index}] has {len(values)} keys; the limit is {limits.max_keys_per_row}",
                code="too_large",
                close_code=CLOSE_TOO_LARGE,
            )
        decoded: dict[str, float] = {}
        for key, raw in values.items():
            if key not in valid_keys:  # rows repeat their keys: check each once
                if not isinstance(key, str) or not key or len(key) > limits.max_key_length or "\x00" in key:
                    raise ProtocolError(
                        f"rows[{index}]: metric key must be 1..{limits.max_key_length} characters, no NUL"
                    )
                valid_keys.add(key)
            if type(raw) is float:
                decoded[key] = raw
                continue
            try:
                decoded[key] = decode_value(raw)
            except ProtocolError as exc:
                raise ProtocolError(f"rows[{index}].values[{key!r}]: {exc}") from None
        parsed.append(Row(step=step, time=wall_time, values=decoded))
    return parsed


def parse_seq(msg: dict[str, Any]) -> int:
    seq = msg.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        raise ProtocolError("points.seq must be an integer in 0..2**63-1")
    return seq


def parse_points(msg: dict[str, Any], limits: Limits = Limits()) -> tuple[int, list[Row]]:
    return parse_seq(msg), parse_rows(msg.get("rows"), limits)


def parse_finish(msg: dict[str, Any]) -> str:
    status = msg.get("status", "finished")
    if status not in FINISH_STATUSES:
        raise ProtocolError(f"finish.status must be one of {', '.join(FINISH_STATUSES)}")
    return str(status)


def hello_message(run: RunInfo, writer: str = "") -> dict[str, Any]:
    message = {"type": "hello", "protocol": PROTOCOL_VERSION, "run": run.to_json()}
    if writer:
        message["writer"] = writer
    return message


def encode_rows(rows: list[Row]) -> list[dict[str, Any]]:
    """Rows as every points message carries them (ingest frames and live pushes alike)."""
    return [
        {
            "step": row.step,
            **({"time": row.time} if row.time is not None else {}),
            "values": {
                key: value if isfinite(value) else encode_value(value)
                for key, value in row.values.items()
            },
        }
        for row in rows
    ]


def points_message(seq: int, rows: list[Row]) -> dict[str, Any]:
    return {"type": "points", "seq": seq, "rows": encode_rows(rows)}


def points_frame(seq: int, rows_json: str) -> str:
    """`points_message` as text, from rows already encoded to JSON (`encode_rows`).

    The client spools a frame's rows once, when it cuts the frame; only the seq is
    added when sending, so a frame is never decoded and encoded again.
    """
    return f'{{"type":"points","seq":{seq},"rows":{rows_json}}}'


def finish_message(status: str = "finished") -> dict[str, Any]:
    return {"type": "finish", "status": status}


def reject_message(seq: int, error: ProtocolError) -> dict[str, Any]:
    """The server will never store frame `seq` (it breaks the protocol); the seq is used up,
    so the writer goes on with the next frame."""
    return {"type": "reject", "seq": seq, "code": error.code, "message": str(error)}
