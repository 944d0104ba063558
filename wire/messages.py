"""Wire protocol v1: message shapes, value encoding and validation.

Stdlib only: shared by the trainer-side client and the server, so each rule of
the protocol is written once. See docs/protocol.md for the prose version; the
errors and close codes are in wire/errors.py.

A metric value on the wire is a JSON number or one of the strings "nan",
"inf", "-inf" (JSON has no non-finite numbers). Non-finite values are data.

A row may also carry step details (`histograms`, `samples`, `sequences`): validated here
with the row, all or nothing, and only looked for when the row has keys beyond `step`,
`time` and `values`, so rows without them cost what they did.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from wire.errors import CLOSE_TOO_LARGE, ProtocolError

__all__ = [
    "ACCEPTS",
    "ACTION",
    "FINISH_STATUSES",
    "MAX_ACTIONS",
    "MAX_ACTION_TEXT",
    "SIGNALS",
    "Finish",
    "Hello",
    "MAX_CONFIG_DEPTH",
    "MAX_SEQ",
    "MAX_STEP",
    "PROTOCOL_VERSION",
    "SAMPLE_FIELDS",
    "TOPK_FIELDS",
    "Histogram",
    "Limits",
    "Row",
    "RunInfo",
    "Sequences",
    "decode_value",
    "encode_details",
    "encode_rows",
    "encode_samples",
    "encode_value",
    "parse_action",
    "parse_config",
    "parse_rows",
    "parse_seq",
    "points_frame",
    "Points",
    "read_value",
]

PROTOCOL_VERSION = 1

MAX_SEQ = 2**63 - 1
MAX_STEP = 2**62 - 1
MAX_CONFIG_DEPTH = 32
"""Nesting of run.config: deeper is refused at hello and by PATCH /runs/{id} (it cannot be
stored and read back)."""
WRITER_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")

FINISH_STATUSES = ("finished", "failed", "killed")

SIGNALS = ("alerts", "hazard", "commands")
"""What a client may listen to (wire/signals.py), in the order the docs list them."""
ACTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A command's action: `checkpoint`, `stop` or a name of the user's own."""
MAX_ACTIONS = 16
"""Actions a client may declare for its command handler."""
MAX_ACTION_TEXT = 200
"""Characters of an action's description kept (the rest is cut)."""

ACCEPTS = ("histograms", "samples", "sequences")
"""The step details a row may carry, as the server's welcome lists them (`accepts`)."""

MAX_DETAIL_INT = 2**63 - 1
"""Largest integer a step detail holds (a count, a token id, a position): a 64-bit integer."""

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
    max_histograms_per_row: int = 16
    """Keys in one row's `histograms`."""
    max_histogram_edges: int = 1025
    """Edges of one histogram (its bins are one fewer)."""
    max_samples_per_row: int = 64
    """Sequences in one row's `samples`."""
    max_samples_bytes: int = 64 * 1024
    """One row's `samples`, as compact UTF-8 JSON."""
    max_sample_tokens: int = 1024
    """Tokens shown of one sample (the length of each of its per-token lists)."""
    max_token_length: int = 200
    """Characters in one of a sample's `tokens`, and in a string `seq_id`."""
    max_sequences_per_row: int = 4096
    """(length, log ratio) pairs in one row's `sequences`."""


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Histogram:
    """Counts of a quantity over a step's tokens: `counts[i]` in [edges[i], edges[i + 1])
    (the last bin closed; values outside the edges in the end bins), `nan` tokens in none."""

    edges: list[float]
    counts: list[int]
    nan: int = 0

    def to_json(self) -> dict[str, Any]:
        """As the wire (and the server's storage) carries it."""
        return _histogram_json(self)


@dataclass(frozen=True)
class Sequences:
    """(length, Σ log ratio) of some of a step's sequences: aligned lists."""

    length: list[int]
    log_ratio: list[float]

    def to_json(self) -> dict[str, Any]:
        """As the wire (and the server's storage) carries it: non-finite sums as strings."""
        return _sequences_json(self)


SAMPLE_FIELDS = (
    "seq_id", "version", "reward", "advantage", "length", "seq_log_ratio", "max_log_ratio",
    "start", "worst", "tokens", "token_ids", "log_ratio", "sampler_logprob", "learner_logprob",
    "topk",
)
"""The fields of a sample (one of a step's worst sequences), in the order they are kept."""
TOPK_FIELDS = (
    "position", "tv", "kl", "sampler_token_ids", "sampler_tokens", "sampler_logprobs",
    "learner_logprobs_of_sampler_ids", "learner_token_ids", "learner_tokens", "learner_logprobs",
)
"""The fields of one entry of a sample's `topk`: both engines' top-k at one token."""
_TOPK_KINDS = {
    "sampler_token_ids": "ids", "learner_token_ids": "ids", "sampler_tokens": "text", "learner_tokens": "text",
    "sampler_logprobs": "numbers", "learner_logprobs": "numbers", "learner_logprobs_of_sampler_ids": "numbers",
}
_TOPK_ALIGNED = (
    ("sampler_token_ids", "sampler_tokens", "sampler_logprobs", "learner_logprobs_of_sampler_ids"),
    ("learner_token_ids", "learner_tokens", "learner_logprobs"),
)
_SAMPLE_INTS = frozenset(("length", "start", "worst"))
_SAMPLE_NUMBERS = frozenset(("version", "reward", "advantage", "seq_log_ratio", "max_log_ratio"))
_TOKEN_NUMBERS = ("log_ratio", "sampler_logprob", "learner_logprob")
_TOKEN_LISTS = ("tokens", "token_ids", *_TOKEN_NUMBERS)


@dataclass(frozen=True)
class Row:
    step: int
    time: float | None
    values: dict[str, float]
    histograms: dict[str, Histogram] | None = None
    """Step details (docs/protocol.md): None when the row has none."""
    samples: list[dict[str, Any]] | None = None
    """The step's worst sequences, worst first: dicts of `SAMPLE_FIELDS` (those given),
    numbers as floats (ints kept as ints), per-token lists as lists."""
    sequences: Sequences | None = None

    @property
    def has_details(self) -> bool:
        return bool(self.histograms or self.samples or self.sequences)


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
        try:
            return float(raw)
        except OverflowError:
            raise ProtocolError("metric value is an integer too large for a float") from None
    if isinstance(raw, str):
        decoded = _NON_FINITE_IN.get(raw.strip().lower())
        if decoded is not None:
            return decoded
        raise ProtocolError(f"metric value {raw[:40]!r} is not a number, 'nan', 'inf' or '-inf'")
    raise ProtocolError(f"metric value of type {type(raw).__name__} is not a number")


def read_value(raw: Any, missing: float | None = math.nan) -> float | None:
    """A value read back from Keel's JSON to show it (pages, benchmarks): as `decode_value`,
    but null (no value) is `missing` and anything else it refuses reads as NaN, never an error."""
    if raw is None:
        return missing
    try:
        return decode_value(raw)
    except ProtocolError:
        return math.nan


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


def _parse_run(msg: Any, limits: Limits) -> RunInfo:
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
    config = parse_config(run.get("config") or {})
    tags = run.get("tags") or []
    if not isinstance(tags, list):
        raise ProtocolError("run.tags must be a list of strings")
    for tag in tags:
        _short_str(tag, "a tag", limits)
    return RunInfo(id=run_id, name=name, project=project, group=group, config=config, tags=tags)


def parse_config(config: Any, what: str = "run.config") -> dict[str, Any]:
    """A run's config as a hello carries it, or an update of it (PATCH /runs/{id}, whose
    keys replace the stored config's): a JSON object nesting at most `MAX_CONFIG_DEPTH`
    levels, with no NUL in any string, key or value (PostgreSQL cannot store one, and
    SQLite would keep what PostgreSQL refuses). Raises ProtocolError naming `what`."""
    if not isinstance(config, dict):
        raise ProtocolError(f"{what} must be a JSON object")
    if _depth(config, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        raise ProtocolError(f"{what} nests deeper than {MAX_CONFIG_DEPTH} levels")
    if _has_nul(config):
        raise ProtocolError(f"{what} must not contain NUL (\\x00) characters")
    return config


def _has_nul(value: Any) -> bool:
    """Whether any string of a JSON value (a key or a value, at any depth) contains NUL."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _parse_writer(msg: dict[str, Any]) -> str:
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
        # Step details are looked for only in a row with keys beyond step, time and values.
        details = _parse_details(row, index, limits) if len(row) > 2 and (len(row) > 3 or "time" not in row) else _NO_DETAILS
        parsed.append(Row(step, wall_time, decoded, *details))
    return parsed


# -- step details ----------------------------------------------------------------------


def _too_large(message: str) -> ProtocolError:
    return ProtocolError(message, code="too_large", close_code=CLOSE_TOO_LARGE)


_Details = tuple[dict[str, Histogram] | None, list[dict[str, Any]] | None, Sequences | None]
_NO_DETAILS: _Details = (None, None, None)


def _parse_details(row: dict[str, Any], index: int, limits: Limits) -> _Details:
    """The row's step details (histograms, samples, sequences), validated; raise
    ProtocolError naming the field."""
    histograms, samples, sequences = row.get("histograms"), row.get("samples"), row.get("sequences")
    return (
        None if histograms is None else _parse_histograms(histograms, f"rows[{index}].histograms", limits) or None,
        None if samples is None else _parse_samples(samples, f"rows[{index}].samples", limits) or None,
        None if sequences is None else _parse_sequences(sequences, f"rows[{index}].sequences", limits),
    )


def _count(raw: Any, what: str) -> int:
    if type(raw) is not int or not 0 <= raw <= MAX_DETAIL_INT:
        raise ProtocolError(f"{what} must be a non-negative integer")
    return raw


def _parse_histograms(raw: Any, what: str, limits: Limits) -> dict[str, Histogram]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what} must be a JSON object of histograms by key")
    if len(raw) > limits.max_histograms_per_row:
        raise _too_large(f"{what} has {len(raw)} keys; the limit is {limits.max_histograms_per_row}")
    parsed: dict[str, Histogram] = {}
    for key, histogram in raw.items():
        if not isinstance(key, str) or not key or len(key) > limits.max_key_length or "\x00" in key:
            raise ProtocolError(f"{what}: a key must be 1..{limits.max_key_length} characters, no NUL")
        parsed[key] = _parse_histogram(histogram, f"{what}[{key!r}]", limits)
    return parsed


def _parse_histogram(raw: Any, what: str, limits: Limits) -> Histogram:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what} must be a JSON object {{\"edges\": [...], \"counts\": [...]}}")
    edges, counts = raw.get("edges"), raw.get("counts")
    if not isinstance(edges, list) or not 2 <= len(edges) <= limits.max_histogram_edges:
        if isinstance(edges, list) and len(edges) > limits.max_histogram_edges:
            raise _too_large(f"{what}.edges has {len(edges)} edges; the limit is {limits.max_histogram_edges}")
        raise ProtocolError(f"{what}.edges must be a list of 2..{limits.max_histogram_edges} numbers")
    parsed_edges: list[float] = []
    previous = -math.inf
    for position, edge in enumerate(edges):
        if type(edge) is not float:
            if type(edge) is not int:
                raise ProtocolError(f"{what}.edges[{position}] must be a finite number")
            try:
                edge = float(edge)
            except OverflowError:
                raise ProtocolError(f"{what}.edges[{position}] must be a finite number") from None
        if not math.isfinite(edge):
            raise ProtocolError(f"{what}.edges[{position}] must be a finite number")
        if edge <= previous:
            raise ProtocolError(f"{what}.edges must be strictly increasing (edges[{position}] is not)")
        parsed_edges.append(edge)
        previous = edge
    if not isinstance(counts, list) or len(counts) != len(edges) - 1:
        raise ProtocolError(f"{what}.counts must be a list of one count per bin ({len(edges) - 1})")
    for position, count in enumerate(counts):
        if type(count) is not int or not 0 <= count <= MAX_DETAIL_INT:
            raise ProtocolError(f"{what}.counts[{position}] must be a non-negative integer")
    nan = raw.get("nan")
    return Histogram(parsed_edges, list(counts), 0 if nan is None else _count(nan, f"{what}.nan"))


def _number(raw: Any, what: str) -> float:
    """A wire number (or "nan", "inf", "-inf") as a float."""
    if type(raw) is float:
        return raw
    try:
        return decode_value(raw)
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None


def _numbers(raw: list[Any], what: str) -> list[float]:
    out: list[float] = []
    for position, item in enumerate(raw):
        out.append(item if type(item) is float else _number(item, f"{what}[{position}]"))
    return out


def _parse_samples(raw: Any, what: str, limits: Limits) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ProtocolError(f"{what} must be a list of samples")
    if len(raw) > limits.max_samples_per_row:
        raise _too_large(f"{what} has {len(raw)} samples; the limit is {limits.max_samples_per_row}")
    parsed = [_parse_sample(sample, f"{what}[{position}]", limits) for position, sample in enumerate(raw)]
    if parsed:
        try:
            size = len(json.dumps(encode_samples(parsed), separators=(",", ":"), ensure_ascii=False).encode())
        except UnicodeEncodeError:
            raise ProtocolError(f"{what}: a string is not valid Unicode (a lone surrogate)") from None
        if size > limits.max_samples_bytes:
            raise _too_large(f"{what} are {size} bytes as JSON; the limit is {limits.max_samples_bytes}")
    return parsed


def _parse_sample(raw: Any, what: str, limits: Limits) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what} must be a JSON object")
    sample: dict[str, Any] = {}
    tokens = -1
    for name in SAMPLE_FIELDS:
        value = raw.get(name)
        if value is None:
            if name in raw and name not in (*_TOKEN_LISTS, "topk"):
                sample[name] = None
            continue
        field_what = f"{what}.{name}"
        if name == "seq_id":
            if isinstance(value, str):
                if len(value) > limits.max_token_length:
                    raise ProtocolError(f"{field_what} is longer than {limits.max_token_length} characters")
            elif type(value) is not int or not -MAX_DETAIL_INT - 1 <= value <= MAX_DETAIL_INT:
                raise ProtocolError(f"{field_what} must be a string or a 64-bit integer")
        elif name in _SAMPLE_INTS:
            value = _count(value, field_what)
        elif name in _SAMPLE_NUMBERS:
            if type(value) is not int or not -MAX_DETAIL_INT - 1 <= value <= MAX_DETAIL_INT:
                value = _number(value, field_what)
        elif name == "topk":
            value = _parse_topk(value, field_what, limits)
        else:  # a per-token list
            value = _parse_list(value, field_what, limits, "text" if name == "tokens" else "ids" if name == "token_ids" else "numbers")
            if tokens >= 0 and len(value) != tokens:
                raise ProtocolError(f"{what}: the per-token lists must be aligned ({name} has {len(value)}, not {tokens})")
            tokens = len(value)
        sample[name] = value
    return sample


def _parse_list(value: Any, what: str, limits: Limits, kind: str) -> list[Any]:
    """A list of strings ("text"), 64-bit integers ("ids") or wire numbers ("numbers")."""
    if not isinstance(value, list):
        raise ProtocolError(f"{what} must be a list")
    if len(value) > limits.max_sample_tokens:
        raise _too_large(f"{what} has {len(value)} tokens; the limit is {limits.max_sample_tokens}")
    if kind == "text":
        for position, token in enumerate(value):
            if not isinstance(token, str) or len(token) > limits.max_token_length:
                raise ProtocolError(f"{what}[{position}] must be a string of at most {limits.max_token_length} characters")
        return list(value)
    if kind == "ids":
        for position, token_id in enumerate(value):
            if type(token_id) is not int or not -MAX_DETAIL_INT - 1 <= token_id <= MAX_DETAIL_INT:
                raise ProtocolError(f"{what}[{position}] must be a 64-bit integer")
        return list(value)
    return _numbers(value, what)


def _parse_topk(raw: Any, what: str, limits: Limits) -> list[dict[str, Any]]:
    """A sample's `topk`: per token, both engines' top-k (`TOPK_FIELDS`; others dropped)."""
    if not isinstance(raw, list):
        raise ProtocolError(f"{what} must be a list")
    if len(raw) > limits.max_sample_tokens:
        raise _too_large(f"{what} has {len(raw)} entries; the limit is {limits.max_sample_tokens}")
    entries = []
    for number, item in enumerate(raw):
        item_what = f"{what}[{number}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{item_what} must be a JSON object")
        entry: dict[str, Any] = {"position": _count(item.get("position"), f"{item_what}.position")}
        for name in ("tv", "kl"):
            if item.get(name) is not None:
                entry[name] = _number(item[name], f"{item_what}.{name}")
        for group in _TOPK_ALIGNED:
            size = -1
            for name in group:
                if item.get(name) is None:
                    continue
                value = _parse_list(item[name], f"{item_what}.{name}", limits, _TOPK_KINDS[name])
                if size >= 0 and len(value) != size:
                    raise ProtocolError(f"{item_what}: {', '.join(group)} must be aligned ({name} has {len(value)}, not {size})")
                size = len(value)
                entry[name] = value
        entries.append({name: entry[name] for name in TOPK_FIELDS if name in entry})
    return entries


def _parse_sequences(raw: Any, what: str, limits: Limits) -> Sequences | None:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what} must be a JSON object {{\"length\": [...], \"log_ratio\": [...]}}")
    length, log_ratio = raw.get("length"), raw.get("log_ratio")
    if not isinstance(length, list) or not isinstance(log_ratio, list):
        raise ProtocolError(f"{what}.length and {what}.log_ratio must be lists")
    if len(length) != len(log_ratio):
        raise ProtocolError(f"{what}: length and log_ratio must be aligned ({len(length)} and {len(log_ratio)})")
    if len(length) > limits.max_sequences_per_row:
        raise _too_large(f"{what} has {len(length)} sequences; the limit is {limits.max_sequences_per_row}")
    for position, item in enumerate(length):
        if type(item) is not int or not 0 <= item <= MAX_DETAIL_INT:
            raise ProtocolError(f"{what}.length[{position}] must be a non-negative integer")
    if not length:
        return None
    return Sequences(list(length), _numbers(log_ratio, f"{what}.log_ratio"))


def _histogram_json(histogram: Histogram | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(histogram, Mapping):  # a client's own dict, in the wire's shape
        histogram = Histogram(list(histogram["edges"]), list(histogram["counts"]), int(histogram.get("nan") or 0))
    out: dict[str, Any] = {"edges": list(histogram.edges), "counts": list(histogram.counts)}
    if histogram.nan:
        out["nan"] = histogram.nan
    return out


def _sequences_json(sequences: Sequences | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(sequences, Mapping):
        sequences = Sequences(list(sequences["length"]), list(sequences["log_ratio"]))
    return {"length": list(sequences.length), "log_ratio": [_wire_number(v) for v in sequences.log_ratio]}


def _wire_number(value: Any) -> Any:
    """A float as the wire carries it; anything else (an int, a string, None) as it is."""
    return encode_value(value) if type(value) is float else value


def encode_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples as the wire (and the server's storage) carries them: non-finite numbers as
    "nan", "inf", "-inf"."""
    encoded = []
    for sample in samples:
        out: dict[str, Any] = {}
        for name, value in sample.items():
            if name in _TOKEN_NUMBERS and isinstance(value, list):
                out[name] = [_wire_number(v) for v in value]
            elif name == "topk" and isinstance(value, list):
                out[name] = [_topk_json(entry) for entry in value]
            else:
                out[name] = _wire_number(value)
        encoded.append(out)
    return encoded


def _topk_json(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        name: [_wire_number(v) for v in value] if isinstance(value, list) else _wire_number(value)
        for name, value in entry.items()
    }


def encode_details(row: Row) -> dict[str, Any]:
    """The row's step details as the wire carries them (only those it has)."""
    out: dict[str, Any] = {}
    if row.histograms:
        out["histograms"] = {key: _histogram_json(histogram) for key, histogram in row.histograms.items()}
    if row.samples:
        out["samples"] = encode_samples(row.samples)
    if row.sequences:
        out["sequences"] = _sequences_json(row.sequences)
    return out


def parse_seq(msg: dict[str, Any]) -> int:
    seq = msg.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        raise ProtocolError("points.seq must be an integer in 0..2**63-1")
    return seq


@dataclass(frozen=True)
class Points:
    """A frame of rows: `{"type": "points", "seq": n, "rows": [...]}`, acked by its seq.
    The server reads its parts (`parse_seq`, then `parse_rows`) so that a frame whose rows
    are refused is still refused by its seq; a client that spools encoded rows sends them
    with `points_frame` (the same text)."""

    seq: int
    rows: list[Row]

    def to_json(self) -> dict[str, Any]:
        return {"type": "points", "seq": self.seq, "rows": encode_rows(self.rows)}

    @classmethod
    def from_json(cls, msg: Any, limits: Limits = Limits()) -> Points:
        msg = _require_dict(msg, "points")
        return cls(parse_seq(msg), parse_rows(msg.get("rows"), limits))


@dataclass(frozen=True)
class Finish:
    """The client's `finish`: how its run ended, and, when it gives up waiting for the
    server's acks, the seq of its last frame (the server then knows how many it never got)."""

    status: str = "finished"
    last_seq: int | None = None

    def to_json(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "finish", "status": self.status}
        if self.last_seq is not None:
            message["last_seq"] = self.last_seq
        return message

    @classmethod
    def from_json(cls, msg: Any) -> Finish:
        msg = _require_dict(msg, "finish")
        status = msg.get("status", "finished")
        if status not in FINISH_STATUSES:
            raise ProtocolError(f"finish.status must be one of {', '.join(FINISH_STATUSES)}")
        last_seq = msg.get("last_seq")
        if last_seq is not None and (isinstance(last_seq, bool) or not isinstance(last_seq, int) or not -1 <= last_seq <= MAX_SEQ):
            raise ProtocolError("finish.last_seq must be an integer in -1..2**63-1")
        return cls(str(status), last_seq)


def parse_action(raw: Any) -> str:
    if not isinstance(raw, str) or not ACTION.fullmatch(raw):
        raise ValueError("an action is 1-64 of [A-Za-z0-9_.-], starting with a letter or digit")
    return raw


def parse_signals(msg: dict[str, Any]) -> frozenset[str]:
    """The signals a hello or a listen message asks for. Names this server does not know are
    left out (a newer client may ask for more); anything but a list of strings is malformed."""
    raw = msg.get("listen")
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise ProtocolError("listen must be a list of signal names")
    return frozenset(name for name in raw if name in SIGNALS)


def parse_actions(msg: dict[str, Any]) -> dict[str, str] | None:
    """The actions a hello or a listen message declares its command handler takes, each with
    what it does; None when it declares none (a client that does not say)."""
    raw = msg.get("actions")
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_ACTIONS:
        raise ProtocolError(f"actions must be an object of at most {MAX_ACTIONS} action names to descriptions")
    actions: dict[str, str] = {}
    for name, text in raw.items():
        if not isinstance(name, str) or not ACTION.fullmatch(name) or not isinstance(text, str):
            raise ProtocolError(f"actions: {str(name)[:64]!r} is not an action name (1-64 of [A-Za-z0-9_.-]) with a text")
        actions[name] = text[:MAX_ACTION_TEXT].replace("\x00", "")
    return actions


@dataclass(frozen=True)
class Hello:
    """A connection's first message: the protocol version, the run, the writer (the id of
    the client's own frame sequence, "" for one connection's) and, optionally, the signals it
    listens to and the command actions its handler takes (docs/protocol.md)."""

    run: RunInfo
    writer: str = ""
    listen: frozenset[str] = frozenset()
    actions: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "hello", "protocol": PROTOCOL_VERSION, "run": self.run.to_json()}
        if self.writer:
            message["writer"] = self.writer
        if self.listen:
            message["listen"] = sorted(self.listen)
        if self.actions is not None:
            message["actions"] = dict(self.actions)
        return message

    @classmethod
    def from_json(cls, msg: Any, limits: Limits = Limits()) -> Hello:
        run = _parse_run(msg, limits)
        return cls(run, _parse_writer(msg), parse_signals(msg), parse_actions(msg))


def encode_rows(rows: list[Row], *, details: bool = True) -> list[dict[str, Any]]:
    """Rows as every points message carries them (ingest frames and live pushes alike);
    with their step details unless `details` is False."""
    encoded = [
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
    if details:
        for row, out in zip(rows, encoded, strict=True):
            if row.histograms or row.samples or row.sequences:
                out.update(encode_details(row))
    return encoded


def points_frame(seq: int, rows_json: str) -> str:
    """`Points(seq, rows).to_json()` as text, from rows already encoded to JSON (`encode_rows`).

    The client spools a frame's rows once, when it cuts the frame; only the seq is
    added when sending, so a frame is never decoded and encoded again.
    """
    return f'{{"type":"points","seq":{seq},"rows":{rows_json}}}'
