"""A sample's `topk` on the wire (docs/protocol.md, "Step details"): kept as sent (its known
fields), non-finite numbers as strings both ways, refused when its lists do not align."""

from __future__ import annotations

import json
import math

import pytest

from wire import ProtocolError, Row, encode_details, parse_rows

ENTRY = {
    "position": 12,
    "tv": 0.25,
    "kl": "inf",
    "sampler_token_ids": [5, 9],
    "sampler_tokens": [" a", " b"],
    "sampler_logprobs": [-0.5, -1.5],
    "learner_logprobs_of_sampler_ids": ["-inf", -0.1],
    "learner_token_ids": [9],
    "learner_tokens": [" b"],
    "learner_logprobs": [-0.1],
    "rank": 3,  # not a field of an entry: dropped
}


def _parsed(entry: dict) -> Row:  # type: ignore[type-arg]
    (row,) = parse_rows([{"step": 1, "values": {}, "samples": [{"seq_id": 1, "worst": 12, "topk": [entry]}]}])
    return row


def test_a_top_k_entry_round_trips() -> None:
    row = _parsed(ENTRY)
    assert row.samples is not None
    (entry,) = row.samples[0]["topk"]
    assert "rank" not in entry and entry["position"] == 12
    assert math.isinf(entry["kl"]) and entry["learner_logprobs_of_sampler_ids"][0] == -math.inf
    wire = json.loads(json.dumps(encode_details(row)))
    again = wire["samples"][0]["topk"][0]
    assert again == {k: v for k, v in ENTRY.items() if k != "rank"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sampler_tokens": [" a"]}, "must be aligned"),
        ({"learner_logprobs": [-0.1, -2.0]}, "must be aligned"),
        ({"position": -1}, "non-negative integer"),
        ({"position": None}, "non-negative integer"),
        ({"sampler_token_ids": [5, "9"]}, "64-bit integer"),
        ({"learner_tokens": [3]}, "must be a string"),
    ],
)
def test_a_malformed_entry_is_refused(change: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ProtocolError, match=message):
        _parsed({**ENTRY, **change})
