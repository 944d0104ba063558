"""Monitor.log and log_batch on the training device, against a real `keel serve`.

On a GPU both must only queue work: called while the GPU is still busy with the step
that produced their inputs, they return long before that work ends, and the values
that reach the server are those of the finished computation. On CPU the same test
checks the values.
"""

from __future__ import annotations

import time

import pytest
import torch

from tests.support.monitor import FAST, learner_batches, metric_per_step, servers
from trainer_hooks.monitor import Monitor

make_server = pytest.fixture(name="make_server")(servers)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BUSY_MS = 300.0
"""GPU work queued ahead of each call; log()/log_batch() must return well within it."""


def _queue_gpu_work(ms: float) -> torch.Tensor:
    """Queue about `ms` of matmuls on the GPU; returns a 0-dim zero that depends on them.

    Few large kernels (a launch queue that fills up would block the host itself).
    """
    a = torch.randn(16384, 16384, device=DEVICE, dtype=torch.bfloat16)

    def pair(x: torch.Tensor) -> torch.Tensor:
        x = x @ x
        return x / x.abs().amax().clamp_min(1.0)  # keep it finite

    a = pair(pair(a))  # warm-up: library handles, kernel selection
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(4):
        a = pair(a)
    torch.cuda.synchronize()
    per_pair = (time.perf_counter() - started) * 1000 / 4
    for _ in range(int(ms / per_pair) + 1):
        a = pair(a)
    return (a[0, 0] * 0).float()


def test_log_and_log_batch_queue_device_work_and_send_its_values(
    make_server, sqlite_url, tmp_path
) -> None:
    server = make_server(sqlite_url)
    batches = learner_batches(8, 16, 32, seed=5)
    # On the device before any work is queued: a copy from pageable host memory waits for it.
    on_device = [t.to(DEVICE) for t in batches]
    # The first calls of a process may wait for the GPU once, while CUDA loads the metrics'
    # kernels (lazy module loading) and pins host memory: made by another run, untimed.
    with Monitor(server.url, run_name="warm-up", spool_dir=tmp_path, sender_config=FAST) as warm:
        warm.log_batch(0, *(t[0] for t in on_device[:3]), rewards=on_device[3][0])
    call_ms: list[float] = []
    with Monitor(server.url, run_name="device", spool_dir=tmp_path, sender_config=FAST) as monitor:
        for step in range(8):
            zero = _queue_gpu_work(BUSY_MS) if DEVICE.type == "cuda" else torch.zeros(())
            # Inputs that exist only once the queued work is done.
            s, l_, m, r = (t[step] for t in on_device)
            s, l_, value = s + zero, l_ + zero, zero + step
            started = time.perf_counter()
            if step % 2:
                monitor.log(step, {"probe/value": value, "probe/double": 2 * value})
            else:
                monitor.log_batch(
                    step,
                    s,
                    l_,
                    m,
                    rewards=r,
                    metrics={"probe/value": value},
                )
            call_ms.append((time.perf_counter() - started) * 1000)
            if DEVICE.type == "cuda":
                idle = torch.cuda.current_stream().query()
                assert not idle, f"the GPU was idle after call {step} (ms per call: {call_ms})"
    if DEVICE.type == "cuda":
        # A call that waited for the GPU would take the rest of the queued ~300 ms.
        assert max(call_ms) < BUSY_MS / 3, call_ms
    print(f"{DEVICE.type}: log()/log_batch() wall per call, ms: {[round(m, 2) for m in call_ms]}")
    assert server.series(monitor.run_id, "probe/value") == (
        list(range(8)),
        [float(s) for s in range(8)],
    )
    assert server.series(monitor.run_id, "probe/double") == ([1, 3, 5, 7], [2.0, 6.0, 10.0, 14.0])
    for key in ("mismatch/kl", "mismatch/ratio_max", "mismatch/ess_frac", "reward/std"):
        expected = metric_per_step(batches, key, range(0, 8, 2))
        steps, values = server.series(monitor.run_id, key)
        assert steps == [0, 2, 4, 6], key
        assert values == pytest.approx(expected, rel=1e-4), key
