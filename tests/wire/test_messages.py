"""Step details on rows (docs/protocol.md, "Step details"): parsed with the row, all or
nothing, written back by encode_rows, and each malformed or oversized one refused with a
ProtocolError that names the row and the field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire import (
    ACCEPTS,
    Hello,
    Histogram,
    Limits,
    ProtocolError,
    Row,
    Sequences,
    encode_rows,
    parse_config,
    parse_rows,
)


def _sample(**fields: Any) -> dict[str, Any]:
    return {
        "seq_id": "prompt-3/1", "version": 7, "reward": 1.0, "advantage": "-inf", "length": 900,
        "seq_log_ratio": 12.5, "max_log_ratio": "nan", "start": 10, "worst": 12,
        "tokens": ["The", " cat", " sat"], "token_ids": [464, 3797, 3332],
        "log_ratio": [0.01, "inf", -0.5], "sampler_logprob": [-1.0, -2.0, "-inf"], "learner_logprob": [-1.01, 3.0, -0.5],
        **fields,
    }


def _row(**details: Any) -> dict[str, Any]:
    return {"step": 3, "time": 1.7e9, "values": {"x": 1.0}, **details}


HISTOGRAM = {"edges": [-1.0, 0, 0.5, 2], "counts": [3, 0, 9], "nan": 2}
SEQUENCES = {"length": [10, 200, 3000], "log_ratio": [0.5, "nan", -2.25]}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and type(a) is type(b)


def test_accepts_names_the_three_details() -> None:
    assert ACCEPTS == ("histograms", "samples", "sequences")


def test_details_survive_a_round_trip_through_json() -> None:
    wire = [_row(histograms={"mismatch/log_ratio": HISTOGRAM, "other": {"edges": [0, 1], "counts": [5]}}, samples=[_sample(), {"seq_id": 4}], sequences=SEQUENCES)]
    (row,) = parse_rows(json.loads(json.dumps(wire)))
    assert row.values == {"x": 1.0}
    assert row.histograms == {
        "mismatch/log_ratio": Histogram(edges=[-1.0, 0.0, 0.5, 2.0], counts=[3, 0, 9], nan=2),
        "other": Histogram(edges=[0.0, 1.0], counts=[5]),
    }
    assert row.samples is not None and len(row.samples) == 2
    first = row.samples[0]
    assert first["advantage"] == -math.inf and math.isnan(first["max_log_ratio"])
    assert first["log_ratio"][1] == math.inf and first["version"] == 7 and type(first["version"]) is int
    assert row.samples[1] == {"seq_id": 4}
    assert row.sequences is not None and row.sequences.length == [10, 200, 3000]
    assert math.isnan(row.sequences.log_ratio[1])

    encoded = encode_rows([row])
    text = json.dumps(encoded, allow_nan=False)  # non-finite numbers went out as strings
    assert encoded[0]["histograms"]["mismatch/log_ratio"] == {"edges": [-1.0, 0.0, 0.5, 2.0], "counts": [3, 0, 9], "nan": 2}
    assert encoded[0]["samples"][0] == {**_sample(), "advantage": "-inf", "max_log_ratio": "nan"}
    assert encoded[0]["sequences"] == {"length": [10, 200, 3000], "log_ratio": [0.5, "nan", -2.25]}
    (again,) = parse_rows(json.loads(text))
    assert _same(again.samples, row.samples) and again.histograms == row.histograms
    assert _same(again.sequences.log_ratio, row.sequences.log_ratio)  # type: ignore[union-attr]
    assert encode_rows([row], details=False) == [{"step": 3, "time": 1.7e9, "values": {"x": 1.0}}]


def test_rows_without_details_have_none_and_encode_as_before() -> None:
    (row,) = parse_rows([{"step": 1, "values": {"a": 2}}, ][:1])
    assert (row.histograms, row.samples, row.sequences) == (None, None, None) and not row.has_details
    assert encode_rows([row]) == [{"step": 1, "values": {"a": 2.0}}]
    # Empty details are no details; unknown keys of a row are ignored, as before.
    (empty,) = parse_rows([{"step": 1, "values": {}, "histograms": {}, "samples": [], "sequences": {"length": [], "log_ratio": []}, "other": 1}])
    assert not empty.has_details and encode_rows([empty]) == [{"step": 1, "values": {}}]


def test_a_client_built_row_encodes_its_floats_as_the_wire_does() -> None:
    row = Row(
        step=5, time=None, values={},
        histograms={"h": Histogram([0.0, 1.0], [4])},
        samples=[{"seq_id": 1, "reward": math.nan, "log_ratio": [math.inf, 0.5]}],
        sequences=Sequences([3], [-math.inf]),
    )
    assert encode_rows([row]) == [{
        "step": 5, "values": {}, "histograms": {"h": {"edges": [0.0, 1.0], "counts": [4]}},
        "samples": [{"seq_id": 1, "reward": "nan", "log_ratio": ["inf", 0.5]}],
        "sequences": {"length": [3], "log_ratio": ["-inf"]},
    }]


LIMITS = Limits()
BAD = [
    # histograms
    (_row(histograms=[]), "rows[1].histograms must be a JSON object", "malformed"),
    (_row(histograms={"": HISTOGRAM}), "rows[1].histograms: a key must be", "malformed"),
    (_row(histograms={"a\x00": HISTOGRAM}), "rows[1].histograms: a key must be", "malformed"),
    (_row(histograms={f"k{i}": HISTOGRAM for i in range(17)}), "rows[1].histograms has 17 keys", "too_large"),
    (_row(histograms={"h": [1, 2]}), "rows[1].histograms['h'] must be a JSON object", "malformed"),
    (_row(histograms={"h": {"edges": [0.0], "counts": []}}), "rows[1].histograms['h'].edges must be a list of 2..1025", "malformed"),
    (_row(histograms={"h": {"edges": list(range(1026)), "counts": [0] * 1025}}), "edges has 1026 edges", "too_large"),
    (_row(histograms={"h": {"edges": [0, 2, 1], "counts": [1, 1]}}), "edges must be strictly increasing (edges[2]", "malformed"),
    (_row(histograms={"h": {"edges": [0, 0], "counts": [1]}}), "strictly increasing", "malformed"),
    (_row(histograms={"h": {"edges": [0, "inf"], "counts": [1]}}), "rows[1].histograms['h'].edges[1] must be a finite number", "malformed"),
    (_row(histograms={"h": {"edges": [0, True], "counts": [1]}}), "edges[1] must be a finite number", "malformed"),
    (_row(histograms={"h": {"edges": [0, 1, 2], "counts": [1]}}), "rows[1].histograms['h'].counts must be a list of one count per bin (2)", "malformed"),
    (_row(histograms={"h": {"edges": [0, 1], "counts": [-1]}}), "rows[1].histograms['h'].counts[0] must be a non-negative integer", "malformed"),
    (_row(histograms={"h": {"edges": [0, 1], "counts": [1.5]}}), "counts[0] must be a non-negative integer", "malformed"),
    (_row(histograms={"h": {"edges": [0, 1], "counts": [2**63]}}), "counts[0] must be a non-negative integer", "malformed"),
    (_row(histograms={"h": {"edges": [0, 1], "counts": [1], "nan": -2}}), "rows[1].histograms['h'].nan must be a non-negative integer", "malformed"),
    # samples
    (_row(samples={}), "rows[1].samples must be a list", "malformed"),
    (_row(samples=[_sample()] * 65), "rows[1].samples has 65 samples; the limit is 64", "too_large"),
    (_row(samples=[{"tokens": ["x" * 200] * 10}] * 40), "rows[1].samples are 81721 bytes as JSON; the limit is 65536", "too_large"),
    (_row(samples=[_sample(), 3]), "rows[1].samples[1] must be a JSON object", "malformed"),
    (_row(samples=[_sample(seq_id=1.5)]), "rows[1].samples[0].seq_id must be a string or a 64-bit integer", "malformed"),
    (_row(samples=[_sample(seq_id="s" * 201)]), "rows[1].samples[0].seq_id is longer than 200", "malformed"),
    (_row(samples=[_sample(length=-1)]), "rows[1].samples[0].length must be a non-negative integer", "malformed"),
    (_row(samples=[_sample(start=2.0)]), "rows[1].samples[0].start must be a non-negative integer", "malformed"),
    (_row(samples=[_sample(reward="big")]), "rows[1].samples[0].reward: metric value 'big' is not a number", "malformed"),
    (_row(samples=[_sample(reward=True)]), "rows[1].samples[0].reward: metric values must be numbers", "malformed"),
    (_row(samples=[_sample(tokens="abc")]), "rows[1].samples[0].tokens must be a list", "malformed"),
    (_row(samples=[_sample(tokens=["a", 1, "c"])]), "rows[1].samples[0].tokens[1] must be a string", "malformed"),
    (_row(samples=[_sample(tokens=["a", "b" * 201, "c"])]), "tokens[1] must be a string of at most 200", "malformed"),
    (_row(samples=[_sample(token_ids=[1, "2", 3])]), "rows[1].samples[0].token_ids[1] must be a 64-bit integer", "malformed"),
    (_row(samples=[_sample(log_ratio=[0.1, 0.2])]), "rows[1].samples[0]: the per-token lists must be aligned", "malformed"),
    (_row(samples=[_sample(learner_logprob=[0.1, None, 0.3])]), "rows[1].samples[0].learner_logprob[1]: metric value of type NoneType", "malformed"),
    (_row(samples=[_sample(tokens=["a"] * 1025, token_ids=None, log_ratio=None, sampler_logprob=None, learner_logprob=None)]), "tokens has 1025 tokens; the limit is 1024", "too_large"),
    (_row(samples=[_sample(tokens=["\ud800", "b", "c"])]), "rows[1].samples: a string is not valid Unicode", "malformed"),
    # sequences
    (_row(sequences=[1, 2]), "rows[1].sequences must be a JSON object", "malformed"),
    (_row(sequences={"length": [1, 2]}), "rows[1].sequences.length and rows[1].sequences.log_ratio must be lists", "malformed"),
    (_row(sequences={"length": [1, 2], "log_ratio": [0.5]}), "rows[1].sequences: length and log_ratio must be aligned (2 and 1)", "malformed"),
    (_row(sequences={"length": [1] * 4097, "log_ratio": [0.0] * 4097}), "rows[1].sequences has 4097 sequences; the limit is 4096", "too_large"),
    (_row(sequences={"length": [1, 2.5], "log_ratio": [0.0, 1.0]}), "rows[1].sequences.length[1] must be a non-negative integer", "malformed"),
    (_row(sequences={"length": [1, 2], "log_ratio": [0.0, "x"]}), "rows[1].sequences.log_ratio[1]: metric value 'x' is not a number", "malformed"),
    (_row(sequences={"length": [1, 2], "log_ratio": [0.0, [1]]}), "rows[1].sequences.log_ratio[1]: metric value of type list", "malformed"),
]


@pytest.mark.parametrize("row, message, code", BAD, ids=[message[:60] for _, message, _ in BAD])
def test_each_malformed_or_oversized_detail_refuses_the_whole_frame(row: dict[str, Any], message: str, code: str) -> None:
    good = _row(histograms={"h": HISTOGRAM}, samples=[_sample()], sequences=SEQUENCES)
    with pytest.raises(ProtocolError) as refused:
        parse_rows([good, row])
    assert message in str(refused.value)
    assert refused.value.code == code
    assert (refused.value.close_code == 4413) == (code == "too_large")


def test_samples_may_leave_out_any_field_and_null_a_scalar() -> None:
    (row,) = parse_rows([_row(samples=[{"seq_id": None, "reward": None, "length": None}, {"tokens": []}])])
    assert row.samples == [{"seq_id": None, "reward": None, "length": None}, {"tokens": []}]
    assert encode_rows([row])[0]["samples"] == row.samples


def test_the_limits_are_the_servers_to_set() -> None:
    small = Limits(max_histograms_per_row=1, max_samples_per_row=1, max_sequences_per_row=2, max_samples_bytes=100)
    with pytest.raises(ProtocolError, match="histograms has 2 keys; the limit is 1"):
        parse_rows([_row(histograms={"a": HISTOGRAM, "b": HISTOGRAM})], small)
    with pytest.raises(ProtocolError, match="sequences has 3 sequences; the limit is 2"):
        parse_rows([_row(sequences=SEQUENCES)], small)
    with pytest.raises(ProtocolError, match="bytes as JSON; the limit is 100"):
        parse_rows([_row(samples=[_sample()])], small)
    assert parse_rows([_row(samples=[{"seq_id": 1}])], small)[0].samples == [{"seq_id": 1}]


@pytest.mark.parametrize(
    "config",
    [{"note": "a\x00b"}, {"a\x00": 1}, {"nested": {"deep": ["ok", "x\x00"]}}, {"list": [{"k\x00": None}]}],
)
def test_a_hello_config_with_nul_is_refused_as_patch_refuses_it(config: dict[str, Any]) -> None:
    """PostgreSQL cannot store NUL; PATCH /runs/{id} refused it, the hello did not."""
    hello = {"type": "hello", "protocol": 1, "run": {"id": "r1", "config": config}}
    with pytest.raises(ProtocolError, match=r"run.config must not contain NUL") as refused:
        Hello.from_json(hello)
    assert refused.value.code == "malformed" and refused.value.close_code == 4400
    with pytest.raises(ProtocolError, match=r"^config must not contain NUL"):
        parse_config(config, "config")
    assert Hello.from_json({**hello, "run": {"id": "r1", "config": {"note": "a\\x00b", "ok": ["\\u0000"]}}}).run.config


# -- fuzz --------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.sampled_from(["nan", "inf", "-inf"])
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=40,
)
numbers = st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.sampled_from(["nan", "inf", "-inf", "x", None, True])
valid_histograms = st.lists(st.floats(-10, 10), min_size=2, max_size=6, unique=True).flatmap(
    lambda edges: st.fixed_dictionaries(
        {"edges": st.just(sorted(edges)), "counts": st.lists(st.integers(0, 2**63 - 1), min_size=len(edges) - 1, max_size=len(edges) - 1)},
        optional={"nan": st.integers(0, 5)},
    )
)
valid_sequences = st.integers(0, 5).flatmap(
    lambda n: st.fixed_dictionaries({
        "length": st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n),
        "log_ratio": st.lists(st.floats() | st.sampled_from(["nan", "inf", "-inf"]), min_size=n, max_size=n),
    })
)
histograms = st.dictionaries(
    st.text(min_size=1, max_size=6),
    valid_histograms,
    max_size=3,
) | st.dictionaries(
    st.text(max_size=6),
    json_values
    | st.fixed_dictionaries(
        {"edges": st.lists(numbers, max_size=6) | st.lists(st.floats(-10, 10), min_size=2, max_size=6).map(sorted)},
        optional={"counts": st.lists(st.integers(-2, 2**64) | numbers, max_size=6), "nan": numbers},
    ),
    max_size=3,
)
samples = st.lists(
    json_values | st.fixed_dictionaries({}, optional={name: json_values | numbers | st.lists(numbers | st.text(max_size=3), max_size=4) for name in (
        "seq_id", "version", "reward", "length", "start", "tokens", "token_ids", "log_ratio", "learner_logprob",
    )}),
    max_size=4,
)
sequences = valid_sequences | json_values | st.fixed_dictionaries(
    {}, optional={"length": st.lists(st.integers(-1, 2**64) | numbers, max_size=5), "log_ratio": st.lists(numbers, max_size=5)}
)
rows = st.lists(
    st.fixed_dictionaries(
        {"step": st.integers(0, 10), "values": st.just({})},
        optional={"histograms": histograms, "samples": samples, "sequences": sequences},
    ),
    max_size=3,
)


@settings(max_examples=400, deadline=None)
@given(rows)
def test_any_details_are_parsed_or_refused_with_a_protocol_error(candidate: list[dict[str, Any]]) -> None:
    try:
        parsed = parse_rows(candidate, Limits(max_samples_bytes=2_000))
    except ProtocolError:
        return
    # What was accepted goes back out as strict JSON and parses to the same rows.
    text = json.dumps(encode_rows(parsed), allow_nan=False)
    again = parse_rows(json.loads(text), Limits(max_samples_bytes=2_000))
    assert json.dumps(encode_rows(again), allow_nan=False) == text


def test_read_value_is_decode_value_that_never_raises_and_says_what_null_is() -> None:
    import math

    from wire import read_value

    assert read_value(0.5) == 0.5 and read_value(3) == 3.0
    assert math.isnan(read_value("nan")) and read_value("inf") == math.inf and read_value("-Inf") == -math.inf
    assert read_value("+inf") == math.inf
    assert math.isnan(read_value(None)) and read_value(None, missing=None) is None
    for junk in ("0.5", "abc", True, [1], {"a": 1}, 10**400):
        assert math.isnan(read_value(junk)), junk  # refused by decode_value: NaN, never an error
