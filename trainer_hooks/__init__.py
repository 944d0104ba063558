"""Keel's trainer-side hooks: import these in the learner loop.

    from trainer_hooks import Monitor, stability_metrics

Depends on torch (for metrics and losses), websockets (for Monitor) and the
stdlib-only `wire` package it shares with the server; never on the server's packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "LOSSES",
    "Alert",
    "BatchInputs",
    "Command",
    "Monitor",
    "SenderConfig",
    "compute_advantages",
    "grad_norm",
    "loss_terms",
    "nonfinite_count",
    "policy_loss",
    "stability_metrics",
]

if TYPE_CHECKING:
    from trainer_hooks.losses import LOSSES, compute_advantages, loss_terms, policy_loss
    from trainer_hooks.metrics import BatchInputs, grad_norm, nonfinite_count, stability_metrics
    from trainer_hooks.monitor import Monitor
    from trainer_hooks.sender import SenderConfig
    from trainer_hooks.signals import Alert, Command

_LAZY = {
    "Monitor": "trainer_hooks.monitor",
    "SenderConfig": "trainer_hooks.sender",
    "Alert": "trainer_hooks.signals",
    "Command": "trainer_hooks.signals",
    "stability_metrics": "trainer_hooks.metrics",
    "BatchInputs": "trainer_hooks.metrics",
    "grad_norm": "trainer_hooks.metrics",
    "nonfinite_count": "trainer_hooks.metrics",
    "loss_terms": "trainer_hooks.losses",
    "policy_loss": "trainer_hooks.losses",
    "compute_advantages": "trainer_hooks.losses",
    "LOSSES": "trainer_hooks.losses",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `from trainer_hooks import Monitor` works where torch is absent
    # (Monitor logs plain floats without it) and `import trainer_hooks` stays cheap.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer_hooks' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
