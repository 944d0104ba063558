"""Properties of the wire protocol (hypothesis): values survive encoding exactly, rows
survive a round trip, and any JSON at all is either parsed or refused with ProtocolError."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from wire import (
    MAX_STEP,
    Hello,
    Limits,
    ProtocolError,
    Row,
    decode_value,
    encode_rows,
    encode_value,
    parse_rows,
    parse_seq,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
keys = st.text(min_size=1, max_size=200).filter(lambda key: "\x00" not in key)
rows = st.lists(
    st.builds(
        Row,
        step=st.integers(min_value=0, max_value=MAX_STEP),
        time=st.none() | st.floats(min_value=0, max_value=4e9),
        values=st.dictionaries(keys, st.floats(), max_size=8),
    ),
    max_size=20,
)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@given(st.floats())
def test_every_float_survives_encoding_exactly(value: float) -> None:
    wire = json.loads(json.dumps(encode_value(value), allow_nan=False))
    assert _same(decode_value(wire), value)


@given(rows)
def test_rows_survive_a_round_trip_through_json(original: list[Row]) -> None:
    text = json.dumps(encode_rows(original), allow_nan=False)
    parsed = parse_rows(json.loads(text))
    assert [(r.step, r.time) for r in parsed] == [(r.step, r.time) for r in original]
    for got, sent in zip(parsed, original, strict=True):
        assert got.values.keys() == sent.values.keys()
        assert all(_same(got.values[key], sent.values[key]) for key in sent.values)


@settings(max_examples=300)
@given(json_values)
def test_any_rows_json_is_parsed_or_refused_with_a_protocol_error(candidate: Any) -> None:
    try:
        parsed = parse_rows(candidate, Limits(max_rows=50))
    except ProtocolError:
        return
    assert all(0 <= row.step <= MAX_STEP and all("\x00" not in key for key in row.values) for row in parsed)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["type", "protocol", "run", "writer", "listen", "actions", "seq"]), json_values, max_size=7))
def test_any_hello_or_seq_is_parsed_or_refused_with_a_protocol_error(message: dict[str, Any]) -> None:
    for parse in (Hello.from_json, parse_seq):
        try:
            parse(message)
        except ProtocolError:
            pass
