"""The training-thread half of the Monitor: snapshot one call without waiting on anything.

`Capture` turns `(step, metrics)` into a `Captured` record: floats as they are, CPU tensors
read at once (a CPU tensor's value is there: no wait), device tensors stacked into one
tensor per device whose copy to host memory is merely *started*. `ship_inputs` does the
same for the tensors of a `log_batch` call. `Captured.row()` finishes the job once the
copies have landed (`link.Feed` checks, or waits on its own thread). Nothing here does
I/O or blocks on a GPU: no `.item()` or `.cpu()` on a device tensor, no synchronize.

What cannot be stored is reported to `drop(kind, count, detail)`, never coerced: a string
(even "0.5"), None, any other non-number, a non-scalar tensor, a bad key or step.

torch is never imported here: if the caller passes tensors, torch is already in
`sys.modules`, and floats-only callers never need it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wire import Limits, Row

if TYPE_CHECKING:  # batched imports torch; this module must not
    from trainer_hooks.channel import Buffer, FieldSpec
    from trainer_hooks.metrics import BatchInputs

__all__ = ["Capture", "Captured", "HostCopy", "Shipped", "ship_inputs", "to_host"]

# Metric keys remembered as valid, so each key is checked once (bounded for odd callers).
_KNOWN_KEYS_CACHE = 10_000


@dataclass(frozen=True)
class HostCopy:
    """A tensor on its way to host memory (`to_host`); `wait()` on the background thread."""

    tensor: Any
    """Pinned host memory on CUDA, the tensor itself elsewhere."""
    event: Any = None
    """The CUDA event that marks the end of the copy, or None."""

    def ready(self) -> bool:
        """Has the copy landed (never blocks)? A tensor on another accelerator is only read
        by `wait()`, on the Feed's own thread."""
        if self.event is not None:
            return bool(self.event.query())
        return bool(self.tensor.device.type == "cpu")

    def wait(self) -> Any:
        """The tensor in host memory; blocks (this thread only) until the copy has landed."""
        if self.event is not None:
            self.event.synchronize()  # waits for the copy here, not in the training thread
        return self.tensor.cpu()


@dataclass
class Captured:
    """One log() call on its way to the worker."""

    step: int
    time: float
    values: dict[str, float]
    """The plain-number metrics (CPU tensors included)."""
    snapshots: list[tuple[list[str], HostCopy]]
    """Per accelerator: the keys and their values, stacked into one tensor."""

    @property
    def copies(self) -> list[HostCopy]:
        return [copy for _, copy in self.snapshots]

    def row(self) -> Row:
        """Read the device tensors back; blocks until their copies have landed."""
        values = self.values
        for keys, copy in self.snapshots:
            # float(): a stack of bool (or int) tensors reads back as bools, not numbers
            values.update(zip(keys, map(float, copy.wait().tolist()), strict=True))
        return Row(step=self.step, time=self.time, values=values)


class Capture:
    """Validates and snapshots log() calls.

    `drop(kind, count, detail)` reports `count` values that cannot be stored, by kind:
    "string", "none", "not_a_number", "key", "too_many_keys", "step".
    """

    def __init__(self, drop: Callable[[str, int, str], None], limits: Limits) -> None:
        self._drop = drop
        self._limits = limits
        self._known_keys: set[str] = set()

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> Captured | None:
        wall_time = time.time()
        if isinstance(step, bool) or not isinstance(step, int):
            try:
                step = int(step)  # numpy integers; a CUDA tensor here would sync, so pass ints
            except (TypeError, ValueError):
                step = -1
        if step < 0:
            self._drop("step", max(1, len(metrics)), f"step {step!r} is not an int >= 0")
            return None
        torch = sys.modules.get("torch")
        tensor_type = torch.Tensor if torch is not None else None
        floats: dict[str, float] = {}
        tensor_keys: list[str] = []
        tensors: list[Any] = []
        items: Iterable[tuple[Any, Any]] = metrics.items()
        if len(metrics) > self._limits.max_keys_per_row:
            limit = self._limits.max_keys_per_row
            self._drop("too_many_keys", len(metrics) - limit, f"more than {limit} keys in a row")
            items = list(items)[:limit]
        for key, value in items:
            if key not in self._known_keys and not self._accept_key(key):
                continue
            if tensor_type is not None and isinstance(value, tensor_type):
                if value.is_cpu:  # (`is_cpu`, not `device.type`: a third of the call's cost)
                    try:
                        floats[key] = float(value.item())  # no copy to wait for: read it now
                    except (RuntimeError, TypeError):  # not a single element, or complex
                        self._drop_tensor(key, value)
                    continue
                if value.dim() != 0:
                    if value.numel() != 1:
                        self._drop_tensor(key, value)
                        continue
                    value = value.reshape(())
                if value.requires_grad:
                    value = value.detach()  # do not keep the autograd graph alive in the queue
                tensor_keys.append(key)
                tensors.append(value)
            elif isinstance(value, str):  # float("0.5") would parse: a string is never a value
                self._drop("string", 1, f"{key!r} is the string {value[:40]!r}")
            elif value is None:
                self._drop("none", 1, f"{key!r} is None")
            else:
                try:
                    floats[key] = float(value)
                except (TypeError, ValueError):
                    self._drop("not_a_number", 1, f"{key!r} is a {type(value).__name__}")
        snapshots = _snapshot(torch, tensor_keys, tensors) if tensors else []
        return Captured(step, wall_time, floats, snapshots)

    def _drop_tensor(self, key: str, value: Any) -> None:
        self._drop("not_a_number", 1, f"{key!r} is a {value.dtype} tensor of shape {value.shape}")

    def _accept_key(self, key: Any) -> bool:
        if not isinstance(key, str) or not 0 < len(key) <= self._limits.max_key_length:
            limit = self._limits.max_key_length
            self._drop("key", 1, f"metric key {key!r:.60} is not a 1..{limit} character string")
            return False
        if len(self._known_keys) < _KNOWN_KEYS_CACHE:
            self._known_keys.add(key)
        return True


def to_host(torch: Any, tensor: Any) -> HostCopy:
    """Start copying `tensor` to host memory, without waiting for it.

    On CUDA the copy goes into pinned memory with non_blocking=True and a CUDA event,
    recorded on the current stream, marks its completion. A CPU tensor needs no copy (the
    caller passes a fresh one). Other accelerators are read back with .cpu() by the
    background thread, which blocks only that thread.
    """
    if tensor.device.type != "cuda":
        return HostCopy(tensor)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    # Blocking: the background thread sleeps until the copy lands instead of spinning
    # a CPU core for the rest of the step.
    event = torch.cuda.Event(blocking=True)
    event.record(torch.cuda.current_stream(tensor.device))
    return HostCopy(host, event)


def _snapshot(torch: Any, keys: list[str], tensors: list[Any]) -> list[tuple[list[str], HostCopy]]:
    """Stack the tensors of each device into one and start its copy to host memory."""
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
    # One stack per device (one kernel; dtypes promote, bf16 + fp32 -> fp32), one copy each.
    return [
        (group_keys, to_host(torch, torch.stack(group_tensors)))
        for group_keys, group_tensors in groups.values()
    ]


@dataclass(frozen=True)
class Shipped:
    """The tensors of a log_batch call on their way to the worker (`ship_inputs`)."""

    fields: list[FieldSpec]
    """Per BatchInputs field: None, an int, or (dtype name, shape, nbytes) of a tensor."""
    buffers: list[Buffer]
    """The tensors' bytes, in field order: the caller's own memory on CPU (written before
    log_batch returns, or copied), pinned host memory on CUDA (valid once `copies` land)."""
    copies: list[HostCopy]
    """On CUDA: one HostCopy whose event marks the end of every copy; else empty."""


def ship_inputs(torch: Any, inputs: BatchInputs) -> Shipped:
    """Start moving a batch's tensors to host memory: CPU tensors as they are (contiguous),
    CUDA tensors copied asynchronously into pinned memory, one event after the last copy.
    Any other device raises ValueError (the caller computes partials on the device then)."""
    fields: list[FieldSpec] = []
    buffers: list[Buffer] = []
    hosts: list[Any] = []
    device = inputs.learner_logprobs.device
    for name, value in inputs.arguments().items():
        if not isinstance(value, torch.Tensor):
            fields.append((name, value))
            continue
        kind = value.device.type
        if kind == "cuda":
            if value.device != device:
                raise ValueError(f"{name} is on {value.device}, the batch on {device}")
            host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            host.copy_(value.detach(), non_blocking=True)
        elif kind == "cpu":
            host = value.detach()
            if not host.is_contiguous():
                host = host.contiguous()
            if device.type != "cpu":  # written only once the GPU copies land
                host = host.clone()
        else:
            raise ValueError(f"no asynchronous copy from {value.device}")
        hosts.append(host)
        dtype = str(host.dtype).removeprefix("torch.")
        fields.append((name, (dtype, tuple(host.shape), host.nbytes)))
        try:
            buffers.append(host.numpy())  # a view of the tensor's memory, no copy
        except TypeError:  # numpy has no bfloat16 (nor float8): the same bytes as uint8
            buffers.append(host.reshape(-1).view(torch.uint8).numpy())
    copies: list[HostCopy] = []
    if device.type == "cuda":
        event = torch.cuda.Event(blocking=True)
        event.record(torch.cuda.current_stream(device))
        copies.append(HostCopy(hosts[0], event))
    return Shipped(fields, buffers, copies)
