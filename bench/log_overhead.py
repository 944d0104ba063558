"""What Keel costs a learner loop: the median `Monitor.log()` call, and a ~50 ms step with vs. without it.

    .venv/bin/python -m bench.log_overhead                 # starts its own `keel serve` (temp SQLite)
    .venv/bin/python -m bench.log_overhead --server URL    # or streams to a running server

1. `log()` with the five headline metrics (reward/mean, mismatch/kl, gate/frac,
   mismatch/ratio_max, grad/norm) as 0-dim tensors, called back to back: median,
   p90 and p99 in microseconds (target: median <= 10 us).
2. A CPU learner loop (embedding + MLP policy, cispo loss, backward, clip, SGD) sized
   to ~50 ms per step on a quiet 2-core machine, in five variants run side by side:
   plain; + `stability_metrics` (computed, not logged); + `stability_metrics` + `log()`
   on the training thread; `Monitor.log_batch()` (the same metrics and row, computed
   by the Monitor's worker process from copies of the inputs, with the step details); and
   the same with `token_ids`, advantages and `decode` (the worst sequences' tokens as
   text, the unbounded-token histogram). With --topk K, two more: `log_batch(logits=)`
   (the learner's logits shipped, the exact entropy) and the same with the sampler's
   top-K (`sampler_topk_ids`, `sampler_topk_logprobs`: the `mismatch/topk_*` metrics and
   both engines' top-K in the samples), reported as the ratio of the two. Every round runs each
   variant for a block of 20 consecutive steps, blocks in random order, so drift in
   machine load hits all alike; the Monitor's leftover work is waited for between blocks.
   Reports the median block of each and the overhead against plain, plus the median of
   the per-round relative differences (target: <= 1 % for log_batch).

The server shares this machine's CPUs unless --server points elsewhere; that is
included in what is measured (the worker process and the server are both real). With
--pin the learner's thread gets the first CPU to itself and the server and the Monitor's
worker process share the others, as on a GPU node whose training loop owns a core. Whole steps are
timed in wall time and in CPU time of the training thread. torch runs one intra-op thread
by default (--threads), leaving the other core of a 2-core box to the worker process and
the server, as a GPU trainer leaves its CPU mostly idle.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.support import keel_server, percentile
from trainer_hooks.losses import policy_loss
from trainer_hooks.metrics import stability_metrics
from trainer_hooks.monitor import Monitor

# With --pin: the learner's thread on the first CPU, everything else (the local server, the
# Monitor's worker process) on the others, as on a GPU node where the training loop owns
# a core and the rest are idle. Empty: no pinning.
SIDE_CPUS: set[int] = set()

HEADLINE = ("reward/mean", "mismatch/kl", "gate/frac", "mismatch/ratio_max", "grad/norm")


def bench_log_calls(server: str, spool: Path, calls: int) -> None:
    monitor = Monitor(server, run_name="bench-log", spool_dir=spool, tags=("bench",))
    # Fresh tensors per step, as a learner produces them; built outside the timed call.
    values = torch.rand(calls, len(HEADLINE))
    rows = [dict(zip(HEADLINE, values[i].unbind(), strict=True)) for i in range(calls)]
    warmup = min(200, calls // 2)
    for step in range(warmup):  # first-call imports, key cache
        monitor.log(step, rows[step])
    timings_us = []
    for step in range(warmup, calls):
        started = time.perf_counter_ns()
        monitor.log(step, rows[step])
        timings_us.append((time.perf_counter_ns() - started) / 1000)
    delivered = monitor.finish(timeout=120)
    print(
        f"log() with the 5 headline metrics as tensors, {len(timings_us)} calls: "
        f"median {statistics.median(timings_us):.1f} us, p90 {percentile(timings_us, 90):.1f} us, "
        f"p99 {percentile(timings_us, 99):.1f} us (all delivered: {delivered})"
    )


@dataclass
class Learner:
    """A small policy trained with cispo on synthetic off-policy batches, ~50 ms per step on CPU."""

    batch: int
    tokens: int
    vocab: int
    hidden: int
    device: torch.device
    topk: int = 0

    def __post_init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Embedding(self.vocab, self.hidden),
            torch.nn.Linear(self.hidden, 2 * self.hidden),
            torch.nn.GELU(),
            torch.nn.Linear(2 * self.hidden, self.vocab),
        ).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        shape = (self.batch, self.tokens)
        self.batches = []
        for _ in range(4):
            inputs_B_T = torch.randint(self.vocab, shape, generator=generator)
            sampled_B_T = torch.randint(self.vocab, shape, generator=generator)
            lengths_B = torch.randint(
                self.tokens // 2, self.tokens + 1, (self.batch,), generator=generator
            )
            mask_B_T = (torch.arange(self.tokens) < lengths_B[:, None]).float()
            with torch.no_grad():
                logits = self.model(inputs_B_T.to(self.device)).float().cpu()
                exact = torch.log_softmax(logits, -1).gather(-1, sampled_B_T[..., None]).squeeze(-1)
            # The sampler's numbers differ a little from the learner's (numerics / staleness).
            sampler_logp_B_T = exact + 0.05 * torch.randn(shape, generator=generator)
            rewards_B = torch.rand(self.batch, generator=generator)
            # The sampler's top-k, as vLLM's logprobs=k returns it: its own (noisy) logits'.
            noisy = torch.log_softmax(logits + 0.05 * torch.randn(logits.shape, generator=generator), -1)
            top = noisy.topk(max(1, self.topk), -1)
            batch = (
                inputs_B_T, sampled_B_T, mask_B_T, sampler_logp_B_T, rewards_B, top.indices, top.values
            )  # fmt: skip
            self.batches.append(tuple(t.to(self.device) for t in batch))

    def step(self, index: int, variant: str, monitor: Monitor) -> tuple[float, float]:
        """One learner step; `variant` is one of VARIANTS.

        Returns the milliseconds spent in stability_metrics and in log() (or in log_batch())
        within the step.
        """
        inputs_B_T, sampled_B_T, mask_B_T, sampler_logp_B_T, rewards_B, topk_ids, topk_logprobs = (
            self.batches[index % 4]
        )
        logits = self.model(inputs_B_T)
        learner_logp_B_T = (
            torch.log_softmax(logits, -1).gather(-1, sampled_B_T[..., None]).squeeze(-1)
        )
        advantages_B = rewards_B - rewards_B.mean()
        loss, gate_B_T = policy_loss(
            "cispo", learner_logp_B_T, sampler_logp_B_T, advantages_B, mask_B_T
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        if variant == "plain":
            self._sync()
            return 0.0, 0.0
        started = time.perf_counter()
        if variant in ("batch", *TOKEN_VARIANTS):
            extra: dict[str, Any] = {}
            if variant in TOKEN_VARIANTS:
                extra = {"token_ids": sampled_B_T, "decode": token_texts}
            if variant == "tokens":
                extra["advantages"] = advantages_B
            if variant in TOPK_VARIANTS:
                extra["logits"] = logits
            if variant == "topk":
                extra |= {"sampler_topk_ids": topk_ids, "sampler_topk_logprobs": topk_logprobs}
            monitor.log_batch(
                index,
                sampler_logp_B_T,
                learner_logp_B_T,
                mask_B_T,
                rewards=rewards_B,
                gate_mask=gate_B_T,
                metrics={"grad/norm": grad_norm, "loss/total": loss},
                **extra,
            )
            spent = 1000 * (time.perf_counter() - started)
            self._sync()
            return 0.0, spent
        metrics = stability_metrics(
            sampler_logp_B_T, learner_logp_B_T, mask_B_T, rewards=rewards_B, gate_mask=gate_B_T
        )
        computed = time.perf_counter()
        if variant == "monitored":
            monitor.log(index, {**metrics, "grad/norm": grad_norm, "loss/total": loss})
        logged = time.perf_counter()
        self._sync()
        return 1000 * (computed - started), 1000 * (logged - computed)

    def _sync(self) -> None:
        """On a GPU, the end of every step waits for its kernels (as a loop that reads its
        loss each step does), so a step's wall time is its GPU time and includes the metrics'
        kernels; the times "inside the step" stay the host's time to queue them."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


VARIANTS = ("plain", "metrics", "monitored", "batch", "tokens")
TOPK_VARIANTS = ("logits", "topk")
"""With --topk: log_batch with the learner's logits, and with the sampler's top-k too."""
TOKEN_VARIANTS = ("tokens", *TOPK_VARIANTS)
"""The log_batch variants that send token ids (and decode them)."""


def token_texts(token_ids: list[int]) -> list[str]:
    """The bench's `decode`: a tokenizer's convert_ids_to_tokens, in shape."""
    return [f"tok{token}" for token in token_ids]


def settle(monitor: Monitor) -> None:
    """Untimed, between blocks: let the Monitor's worker take the block's calls and finish
    their rows (and log_batch's metrics: it waits one flush_interval to batch them), so
    its work lands in the block that caused it, not the next."""
    deadline = time.monotonic() + 10
    while not monitor._feed.idle and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(monitor._config.flush_interval + 0.1)


def process_cpu_s(pid: int) -> float:
    """CPU seconds of all threads of process `pid` so far (Linux schedstat: nanoseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total / 1e9


def worker_pid(monitor: Monitor) -> int:
    """The Monitor's worker process, once it has started."""
    monitor._link.ready.wait(60)
    pid = monitor._link.pid
    assert pid is not None, "the Monitor runs its worker on a thread (no process)"
    return pid


def siblings(cpu: int) -> set[int]:
    """The CPUs sharing `cpu`'s core (hyperthreads), itself included; {cpu} if unknown."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        found: set[int] = set()
        for part in path.read_text().strip().split(","):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
        return found
    except (OSError, ValueError):
        return {cpu}


def bench_loop(
    server: str, spool: Path, rounds: int, block: int, learner: Learner, variants: tuple[str, ...] = VARIANTS
) -> None:
    monitor = Monitor(server, run_name="bench-loop", spool_dir=spool, tags=("bench",))
    worker = worker_pid(monitor)
    if SIDE_CPUS:
        os.sched_setaffinity(worker, SIDE_CPUS)
    for index in range(2 * len(variants)):
        learner.step(index, variants[index % len(variants)], monitor)
    shuffle = random.Random(0)
    # Per round and variant, the mean step of its block (first step dropped): wall time, and
    # CPU time of the training thread (immune to the scheduler giving the core to another
    # process, which on a shared VM swings wall time by several %).
    wall_ms: dict[str, list[float]] = {variant: [] for variant in variants}
    cpu_ms: dict[str, list[float]] = {variant: [] for variant in variants}
    metrics_ms, log_ms, log_batch_ms, tokens_ms = [], [], [], []
    inside_ms: dict[str, list[float]] = {variant: [] for variant in TOPK_VARIANTS}
    # CPU time of the Monitor's worker process per step (sending; log_batch's metrics).
    background_ms: dict[str, list[float]] = {variant: [] for variant in variants}
    step = 2 * len(variants)  # after the warm-up's steps: each step is logged once
    for _ in range(rounds):
        # Each round runs every variant for `block` consecutive steps, blocks in random
        # order, so load drift hits all alike. Consecutive steps, because the Monitor's
        # background work (sending, and log_batch's metrics) overlaps the steps after the
        # one that logged: inside a block it lands on the same variant, as in a real loop.
        # The work left at the end of a block is waited for, untimed (settle), so it does
        # not land on the next block; a block of 20 steps (~1 s) keeps most of it inside.
        for variant in shuffle.sample(variants, len(variants)):
            block_wall, block_cpu = [], []
            background_started = process_cpu_s(worker)
            for _ in range(block):
                started, started_cpu = time.perf_counter(), time.thread_time()
                inside = learner.step(step, variant, monitor)
                block_wall.append(1000 * (time.perf_counter() - started))
                block_cpu.append(1000 * (time.thread_time() - started_cpu))
                if variant == "monitored":
                    metrics_ms.append(inside[0])
                    log_ms.append(inside[1])
                elif variant == "batch":
                    log_batch_ms.append(inside[1])
                elif variant == "tokens":
                    tokens_ms.append(inside[1])
                elif variant in inside_ms:
                    inside_ms[variant].append(inside[1])
                step += 1
            wall_ms[variant].append(statistics.fmean(block_wall[1:]))
            cpu_ms[variant].append(statistics.fmean(block_cpu[1:]))
            settle(monitor)
            background = process_cpu_s(worker) - background_started
            background_ms[variant].append(1000 * background / block)
    delivered = monitor.finish(timeout=120)

    def overhead(samples: dict[str, list[float]], variant: str) -> str:
        plain = statistics.median(samples["plain"])
        paired = [
            with_ms / plain_ms - 1
            for with_ms, plain_ms in zip(samples[variant], samples["plain"], strict=True)
        ]
        return (
            f"{statistics.median(samples[variant]):6.2f} ms, overhead "
            f"{100 * (statistics.median(samples[variant]) / plain - 1):+5.2f} % "
            f"(median of per-round differences {100 * statistics.median(paired):+5.2f} %)"
        )

    def share(samples: list[float]) -> str:
        plain = statistics.median(wall_ms["plain"])
        return f"{statistics.median(samples):.3f} ms ({100 * statistics.median(samples) / plain:.2f} %)"

    names = {
        "metrics": "+ stability_metrics",
        "monitored": "+ stability_metrics + log()",
        "batch": "+ log_batch() (metrics in the worker)",
        "tokens": "+ log_batch(token_ids=, decode=)",
        "logits": "+ log_batch(logits=, token_ids=)",
        "topk": f"+ log_batch(logits=, top-{learner.topk})",
    }
    lines = [
        f"learner loop on {learner.device}, {rounds} rounds of {block}-step blocks, torch "
        f"threads {torch.get_num_threads()}:"
    ]
    for label, samples in (("wall time", wall_ms), ("training-thread CPU time", cpu_ms)):
        lines.append(f"  {label}: plain step {statistics.median(samples['plain']):.2f} ms")
        lines += [f"    {names[v]:36s} {overhead(samples, v)}" for v in variants[1:]]
    lines.append(
        f"  timed inside the steps: stability_metrics {share(metrics_ms)}, log() {share(log_ms)}, "
        f"log_batch() {share(log_batch_ms)}, with tokens {share(tokens_ms)}"
    )
    lines.append(
        "  the Monitor's worker process, CPU per step: "
        + ", ".join(
            f"{names.get(v, 'plain').lstrip('+ ')} {statistics.median(background_ms[v]):.3f} ms"
            for v in variants
        )
    )
    if inside_ms["topk"]:
        logits_ms, topk_ms = statistics.median(inside_ms["logits"]), statistics.median(inside_ms["topk"])
        lines.append(
            f"  log_batch() host time with logits {logits_ms:.3f} ms, with the sampler's top-{learner.topk} "
            f"too {topk_ms:.3f} ms: x{topk_ms / logits_ms:.2f} ({topk_ms - logits_ms:+.3f} ms)"
        )
    lines.append(f"  (all delivered: {delivered})")
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server", default=None, help="stream to this server instead of a local one"
    )
    parser.add_argument("--calls", type=int, default=20_000, help="log() calls to time (the first half, at most 200, warm up)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the loop variants")
    parser.add_argument(
        "--block", type=int, default=20, help="consecutive steps per variant and round"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a 2-core box, 2 threads oversubscribe "
        "against the Monitor's worker process and the local server and the step time swings 5x)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="the learner's device; on cuda size it up to ~50 ms a step, e.g. --batch 16 "
        "--tokens 1024 --hidden 2048 --vocab 32768",
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument(
        "--topk",
        type=int,
        default=0,
        help="also time log_batch with the learner's logits, with and without the sampler's "
        "top-K (sampler_topk_ids/_logprobs), and print their ratio",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="learner thread on CPU 0; the server and the Monitor's worker on the other CPUs",
    )
    args = parser.parse_args()
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error("--pin needs at least 2 CPUs")
        # Not the learner CPU's SMT siblings: they share its core, and work there slows it.
        side = set(cpus[1:]) - siblings(cpus[0])
        SIDE_CPUS.update(side or cpus[1:])
        os.sched_setaffinity(0, {cpus[0]})  # this (the learner's) thread
        print(f"pinned: learner on CPU {cpus[0]}, the rest on CPUs {sorted(SIDE_CPUS)}")
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = True  # as GPU trainers run fp32 matmuls
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="keel-bench-")))
        database = f"sqlite:///{workdir / 'keel.db'}"
        server = args.server or stack.enter_context(
            keel_server(database, log=workdir / "server.log", cpus=SIDE_CPUS or None)
        ).url
        print(f"server: {server}{'' if args.server else ' (local keel serve, same CPUs)'}")
        bench_log_calls(server, workdir / "spool", args.calls)
        bench_loop(
            server,
            workdir / "spool",
            args.rounds,
            args.block,
            Learner(args.batch, args.tokens, args.vocab, args.hidden, torch.device(args.device), args.topk),
            VARIANTS + TOPK_VARIANTS if args.topk else VARIANTS,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
