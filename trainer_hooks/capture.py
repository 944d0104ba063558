"""The training-thread half of the Monitor: snapshot one log() call without waiting on anything.

`Capture` turns `(step, metrics)` into a `Captured` record: floats as they are, tensors
stacked into one tensor per device whose copy to host memory is merely *started*.
`Captured.row()` finishes the job on the background thread. Nothing here does I/O or
blocks on a GPU: no `.item()`, no `.cpu()` on a device tensor, no synchronize.

torch is never imported here: if the caller passes tensors, torch is already in
`sys.modules`, and floats-only callers never need it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer_hooks.protocol import Limits, Row

if TYPE_CHECKING:  # batched imports torch; this module must not
    from trainer_hooks.batched import BatchInputs

__all__ = ["Capture", "Captured"]

# Metric keys remembered as valid, so each key is checked once (bounded for odd callers).
_KNOWN_KEYS_CACHE = 10_000


@dataclass
class Captured:
    """One log() call on its way to the background thread."""

    step: int
    time: float
    values: dict[str, float]
    """The plain-number metrics."""
    snapshots: list[tuple[list[str], Any, Any]]
    """Per device: (keys, stacked tensor (pinned host memory on CUDA), CUDA event or None)."""
    deferred: BatchInputs | None = None
    """Inputs whose stability metrics the background thread adds (log_batch on CPU)."""

    def row(self) -> Row:
        """Read the tensors back; blocks (this thread only) until their copies have landed."""
        values = self.values
        for keys, host, event in self.snapshots:
            if event is not None:
                event.synchronize()  # waits for the copy here, not in the training thread
            values.update(zip(keys, host.cpu().tolist(), strict=True))
        return Row(step=self.step, time=self.time, values=values)


class Capture:
    """Validates and snapshots log() calls. `warn(what, message)` reports a problem once per `what`."""

    def __init__(self, warn: Callable[[str, str], None], limits: Limits) -> None:
        self._warn = warn
        self._limits = limits
        self._known_keys: set[str] = set()

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> Captured | None:
        wall_time = time.time()
        if isinstance(step, bool) or not isinstance(step, int):
            step = int(step)  # numpy integers; a CUDA tensor here would sync, so pass ints
        if step < 0:
            self._warn("step", f"step must be >= 0, got {step}; row dropped")
            return None
        torch = sys.modules.get("torch")
        tensor_type = torch.Tensor if torch is not None else None
        floats: dict[str, float] = {}
        tensor_keys: list[str] = []
        tensors: list[Any] = []
        items: Iterable[tuple[Any, Any]] = metrics.items()
        if len(metrics) > self._limits.max_keys_per_row:
            limit = self._limits.max_keys_per_row
            self._warn("keys", f"more than {limit} metrics in one row; extra keys dropped")
            items = list(items)[:limit]
        for key, value in items:
            if key not in self._known_keys and not self._accept_key(key):
                continue
            if tensor_type is not None and isinstance(value, tensor_type):
                if value.dim() != 0:
                    if value.numel() != 1:
                        self._warn(f"shape:{key}", f"{key!r} is not a scalar; skipped")
                        continue
                    value = value.reshape(())
                if value.requires_grad:
                    value = value.detach()  # do not keep the autograd graph alive in the queue
                tensor_keys.append(key)
                tensors.append(value)
            else:
                try:
                    floats[key] = float(value)
                except (TypeError, ValueError):
                    self._warn(f"value:{key}", f"{key!r}: {type(value).__name__} is not a number")
        snapshots = _snapshot(torch, tensor_keys, tensors) if tensors else []
        return Captured(step, wall_time, floats, snapshots)

    def _accept_key(self, key: Any) -> bool:
        if not isinstance(key, str) or not 0 < len(key) <= self._limits.max_key_length:
            limit = self._limits.max_key_length
            self._warn(f"key:{key!r}", f"metric key {key!r} is not a 1..{limit} character string")
            return False
        if len(self._known_keys) < _KNOWN_KEYS_CACHE:
            self._known_keys.add(key)
        return True


def _snapshot(torch: Any, keys: list[str], tensors: list[Any]) -> list[tuple[list[str], Any, Any]]:
    """Stack the tensors of each device into one and start its copy to host memory.

    On CUDA the copy goes into pinned memory with non_blocking=True and a CUDA event,
    recorded on the current stream, marks its completion. CPU tensors need no copy (the
    stack is already a snapshot). Other accelerators are read back with .cpu() by the
    background thread, which blocks only that thread.
    """
    device = tensors[0].device
    groups: dict[Any, tuple[list[str], list[Any]]]
    if all(tensor.device == device for tensor in tensors):
        groups = {device: (keys, tensors)}
    else:
        groups = {}
        for key, tensor in zip(keys, tensors, strict=True):
            group_keys, group_tensors = groups.setdefault(tensor.device, ([], []))
            group_keys.append(key)
            group_tensors.append(tensor)
    snapshots: list[tuple[list[str], Any, Any]] = []
    for group_device, (group_keys, group_tensors) in groups.items():
        stacked = torch.stack(group_tensors)  # one kernel; dtypes promote (bf16 + fp32 -> fp32)
        if group_device.type != "cuda":
            snapshots.append((group_keys, stacked, None))
            continue
        host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
        host.copy_(stacked, non_blocking=True)
        # Blocking: the background thread sleeps until the copy lands instead of spinning
        # a CPU core for the rest of the step.
        event = torch.cuda.Event(blocking=True)
        event.record(torch.cuda.current_stream(group_device))
        snapshots.append((group_keys, host, event))
    return snapshots
