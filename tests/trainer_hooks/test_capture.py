"""The training-thread snapshot of a log() call: what becomes a number, what is dropped."""

from __future__ import annotations

import json

import torch

from trainer_hooks.capture import Capture, Captured, HostCopy
from wire import Limits


def test_one_element_tensors_become_floats_and_others_are_dropped_with_their_shape() -> None:
    dropped: list[tuple[str, int, str]] = []
    captured = Capture(lambda *drop: dropped.append(drop), Limits())(
        3, {"flag": torch.tensor(True), "count": torch.tensor([[4]]), "pair": torch.ones(2), "none": torch.empty(0, 3), "complex": torch.tensor(1 + 2j)}
    )
    assert captured is not None and captured.values == {"flag": 1.0, "count": 4.0}
    assert all(type(v) is float for v in captured.values.values())  # JSON numbers, never true/false
    assert [(kind, detail) for kind, _, detail in dropped] == [
        ("not_a_number", "'pair' is a torch.float32 tensor of shape torch.Size([2])"),
        ("not_a_number", "'none' is a torch.float32 tensor of shape torch.Size([0, 3])"),
        ("not_a_number", "'complex' is a torch.complex64 tensor of shape torch.Size([])"),
    ]


def test_device_snapshots_of_bool_tensors_read_back_as_floats() -> None:
    """What a stack of bool tensors on an accelerator reads back as (here the copy is the CPU tensor)."""
    captured = Captured(1, 0.0, {}, [(["ok", "bad"], HostCopy(torch.tensor([True, False])))])
    row = captured.row()
    assert row.values == {"ok": 1.0, "bad": 0.0} and json.dumps(row.values) == '{"ok": 1.0, "bad": 0.0}'
