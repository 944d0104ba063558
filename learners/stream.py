"""`ToyStreamer`: stream toy runs live, one Monitor per run (`keel sim`, `keel grid --server`)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from learners.toy import RunSpec, ToyBatch, token_texts
from trainer_hooks.monitor import Monitor, status_for_exit

__all__ = ["ToyStreamer"]


class ToyStreamer:
    """Streams toy runs live, one Monitor per run; `on_step` is a toy.StepCallback.

    `keel sim` streams one run with it; `keel grid --server` streams a whole grid:

        with ToyStreamer(specs, server_url, steps=config.steps) as streamer:
            simulate(specs, config, on_step=streamer.on_step)
    """

    def __init__(
        self,
        specs: Sequence[RunSpec],
        server_url: str,
        *,
        steps: int,
        project: str = "default",
        names: Sequence[str] | None = None,
        group: str | None = None,
        token: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        step_delay: float = 0.0,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.step_delay = step_delay
        self.monitors: list[Monitor] = []
        for index, spec in enumerate(specs):
            self.monitors.append(
                Monitor(
                    server_url,
                    run_name=names[index] if names else spec.name,
                    project=project,
                    group=group or spec.loss,
                    config={
                        "loss": spec.loss,
                        "lag": spec.lag,
                        "mismatch": spec.mismatch,
                        "seed": spec.seed,
                        "steps": steps,
                        **(config or {}),
                    },
                    tags=("toy",),
                    token=token,
                    spool_dir=spool_dir,
                )
            )

    def on_step(self, step: int, metrics: dict[str, Any]) -> None:
        """Log step `step` of every run; `metrics` maps each key to a tensor [R]."""
        keys = list(metrics)
        if len(self.monitors) == 1:
            self.monitors[0].log(step, {key: value[0] for key, value in metrics.items()})
        else:
            import torch

            # One copy for the whole grid instead of R × keys scalar tensors: the grid
            # is the reference loop, not a GPU job that must never sync.
            values_R_K = torch.stack([metrics[key].float() for key in keys], dim=1).tolist()
            for monitor, values in zip(self.monitors, values_R_K, strict=True):
                monitor.log(step, dict(zip(keys, values, strict=True)))
        if self.step_delay > 0:
            time.sleep(self.step_delay)

    def on_batch(self, step: int, metrics: dict[str, Any], batch: ToyBatch) -> None:
        """`on_step` through `Monitor.log_batch`: the worker computes the stability metrics
        from the batch (the toy's own win) and the step details, with the toy's tokens."""
        for run, monitor in enumerate(self.monitors):
            monitor.log_batch(
                step,
                batch.sampler_logp_R_B_T[run],
                batch.learner_logp_R_B_T[run],
                None,
                rewards=batch.rewards_R_B[run],
                advantages=batch.advantages_R_B[run],
                sampler_version=batch.sampler_version_R[run].expand(batch.rewards_R_B.shape[1]),
                learner_version=batch.learner_version,
                token_ids=batch.tokens_R_B_T[run],
                decode=token_texts,
                metrics={key: value[run] for key, value in metrics.items()},
            )
        if self.step_delay > 0:
            time.sleep(self.step_delay)

    def finish(self, status: str = "finished", *, timeout: float = 30.0) -> bool:
        """Finish every run within one shared `timeout` (not one per run)."""
        deadline = time.monotonic() + timeout
        for monitor in self.monitors:
            monitor._request_finish(status)  # all flush and say goodbye in parallel
        delivered = True
        # Newest first: each Monitor then puts back the SIGTERM handler it found.
        for monitor in reversed(self.monitors):
            remaining = max(1.0, deadline - time.monotonic())
            delivered = monitor.finish(status, timeout=remaining) and delivered
        return delivered

    def __enter__(self) -> ToyStreamer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        # A SIGTERM reaches every Monitor's handler (they chain); any of them will do.
        signalled = self.monitors[0]._exit_status if self.monitors else None
        self.finish(status_for_exit(exc_type, exc, signalled))


