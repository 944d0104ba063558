"""Every ```python block of README.md and docs/**/*.md is run here, or marked a sketch.

A block is run unless the line right before its opening fence is

    <!-- sketch: REASON -->

where REASON says why it cannot run (`...` standing for the reader's code, a framework or
a GPU CI does not have, a signature rather than a call). A block that is neither marked nor
run by an example below fails `test_every_python_block_is_run_or_marked`, as does a marker
without a reason and an example whose block is gone. Blocks are named `file:line` (the line
of the opening fence).

A runnable block is exec'd as written, in a namespace holding what its surrounding text says
exists: a real Keel server (its URL put in place of http://127.0.0.1:8750), small torch
tensors for the log-probs and masks, a run already streamed for the read API. Each example
then checks what the block did (the run on the server with its steps, the keys a metrics
call returns) and the values of its bare expression statements where they matter.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_URL = "http://127.0.0.1:8750"
FENCE = re.compile(r"^\s*```(?P<lang>\S*)\s*$")
SKETCH = re.compile(r"^\s*<!--\s*sketch:(?P<reason>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    sketch: str | None  # the marker's reason ("" for a marker without one), None unmarked

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def python_blocks() -> list[Block]:
    blocks: list[Block] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            opening = FENCE.match(lines[index])
            if not opening:
                index += 1
                continue
            end = index + 1
            while not FENCE.match(lines[end]) or FENCE.match(lines[end])["lang"]:  # type: ignore[index]
                end += 1
            if opening["lang"] in ("python", "py"):
                marker = SKETCH.match(lines[index - 1]) if index else None
                blocks.append(
                    Block(
                        str(path.relative_to(ROOT)),
                        index + 1,
                        "\n".join(lines[index + 1 : end]),
                        marker["reason"].strip() if marker else None,
                    )
                )
            index = end + 1
    return blocks


def run_block(code: str, namespace: dict[str, Any]) -> dict[int, Any]:
    """Exec `code` in `namespace`; the value of each top-level bare expression, by its line
    in the block (1-based)."""
    tree = ast.parse(code)
    values: dict[int, Any] = {}
    body: list[ast.stmt] = []
    for statement in tree.body:
        if isinstance(statement, ast.Expr):
            call = ast.Call(
                func=ast.Name("__record__", ast.Load()),
                args=[ast.Constant(statement.lineno), statement.value],
                keywords=[],
            )
            statement = ast.Expr(call)
        body.append(statement)
    tree.body = body
    namespace["__record__"] = values.__setitem__
    exec(compile(ast.fix_missing_locations(tree), "<doc>", "exec"), namespace)
    return values


# --- what the examples' text says exists -------------------------------------------------


def logprobs(batch: int, length: int, seed: int) -> tuple[Any, Any, Any]:
    """Sampler and learner log-probs [batch, length] a little apart, and a mask."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(batch, length, generator=generator) * 3
    learner = sampler + 0.2 * torch.randn(batch, length, generator=generator)
    mask = torch.rand(batch, length, generator=generator) > 0.2
    mask[:, 0] = True
    return sampler, learner, mask


def batches(steps: int, batch: int = 4, length: int = 6) -> list[SimpleNamespace]:
    import torch

    out = []
    for step in range(steps):
        sampler, _, mask = logprobs(batch, length, seed=step)
        generator = torch.Generator().manual_seed(100 + step)
        out.append(
            SimpleNamespace(
                tokens=torch.randint(0, 8, (batch, length), generator=generator),
                sampler_logprobs=sampler,
                mask=mask,
                rewards=torch.rand(batch, generator=generator),
                advantages=torch.randn(batch, generator=generator),
            )
        )
    return out


class TinyPolicy:
    """A policy over 8 tokens, position-independent: log π of the sampled tokens."""

    def __init__(self) -> None:
        import torch

        self.logits_V = torch.nn.Parameter(torch.zeros(8))

    def logprobs(self, tokens_B_T: Any) -> Any:
        return self.logits_V.log_softmax(-1)[tokens_B_T]

    def parameters(self) -> list[Any]:
        return [self.logits_V]


def finished_run(url: str, name: str) -> dict[str, Any]:
    from tests.support.stored_runs import run_named

    return run_named(url, name)


def steps_of(url: str, run_id: str, key: str) -> list[int]:
    from tests.support.stored_runs import stored

    return sorted(stored(url, run_id, key))


@pytest.fixture
def keel_url(
    server_factory: Any, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A real server's URL; the Monitors a block starts spool under tmp_path."""
    monkeypatch.setenv("KEEL_SPOOL_DIR", str(tmp_path / "spool"))
    return str(server_factory(sqlite_url).url)


Example = Callable[[Block, str], None]


def readme_monitor(block: Block, url: str) -> None:
    import torch

    def train_step(batch: SimpleNamespace) -> tuple[Any, Any, Any]:
        learner = batch.sampler_logprobs + 0.1
        return learner.mean(), learner, torch.tensor(1.5)

    run_block(block.code.replace(DOC_URL, url), {"loader": batches(3), "train_step": train_step})
    run = finished_run(url, "cispo-lag8")
    assert (run["group"], run["status"]) == ("cispo", "finished")
    assert (
        steps_of(url, run["id"], "grad/norm")
        == steps_of(url, run["id"], "mismatch/kl")
        == [0, 1, 2]
    )


def integrate_five_lines(block: Block, url: str) -> None:
    import argparse

    import torch

    policy = TinyPolicy()
    namespace = {
        "args": argparse.Namespace(lr=0.1, loss="cispo"),
        "batches": batches(3),
        "policy": policy,
        "optimizer": torch.optim.SGD(policy.parameters(), lr=0.1),
    }
    run_block(block.code.replace(DOC_URL, url), namespace)
    run = finished_run(url, "cispo-lag8")
    assert run["config"]["lr"] == 0.1 and run["status"] == "finished"
    for key in ("grad/norm", "loss/total", "gate/frac", "mismatch/kl", "reward/mean"):
        assert steps_of(url, run["id"], key) == [0, 1, 2], key
    assert not torch.equal(policy.logits_V.detach(), torch.zeros(8))  # it trained


def integrate_context_manager(block: Block, url: str) -> None:
    from trainer_hooks import Monitor  # imported by "The five lines" above it

    sampler, learner, _ = logprobs(4, 6, seed=0)
    run_block(
        block.code,
        {"Monitor": Monitor, "url": url, "batches": batches(2), "learner_logprobs": learner},
    )
    run = finished_run(url, "cispo-lag8")
    assert run["status"] == "finished"
    assert steps_of(url, run["id"], "mismatch/kl") == [0, 1]


def integrate_alerts(block: Block, url: str) -> None:
    from tests.support.monitor import wait_until
    from trainer_hooks import Monitor

    saved: list[str] = []

    def save_checkpoint(name: str) -> str:
        saved.append(name)
        return name

    with Monitor(url, run_name="alerts") as monitor:
        monitor.log(0, {"reward/mean": 0.5})
        wait_until(
            lambda: httpx.get(f"{url}/api/v1/runs/{monitor.run_id}").is_success,
            what="the run on the server",
        )
        namespace = {"monitor": monitor, "step": 7, "save_checkpoint": save_checkpoint}
        namespace["lower_the_learning_rate"] = lambda: pytest.fail("no alert fires on a new run")
        run_block(block.code, namespace)
        assert saved == []  # a new run: no hazard yet, no alert
        commands = f"{url}/api/v1/runs/{monitor.run_id}/commands"
        wait_until(lambda: httpx.get(f"{url}/api/v1/runs/{monitor.run_id}").json()["actions"], what="the actions named")
        httpx.post(commands, json={"action": "checkpoint"}).raise_for_status()
        refused = httpx.post(commands, json={"action": "rollback"})  # not named: refused, not left pending
        assert refused.status_code == 409 and "takes checkpoint, not 'rollback'" in refused.json()["detail"]

        def answered() -> list[dict[str, Any]] | None:
            listed = httpx.get(commands).json()
            return listed if all(c["state"] in ("acked", "failed") for c in listed) else None

        (checkpoint,) = wait_until(answered, what="the command answered")
    assert (checkpoint["action"], checkpoint["state"], checkpoint["message"]) == (
        "checkpoint",
        "acked",
        "saved step-7",
    )
    assert saved == ["step-7"]


def losses_example(block: Block, url: str) -> None:
    import torch

    sampler, learner, mask = logprobs(16, 5, seed=1)
    learner.requires_grad_(True)
    namespace = {
        "rewards_B": torch.rand(16),
        "learner_logp_B_T": learner,
        "sampler_logp_B_T": sampler,
        "mask_B_T": mask,
    }
    run_block(block.code, namespace)
    assert namespace["loss"].shape == () and torch.isfinite(namespace["loss"])
    assert namespace["gate_mask"].shape == mask.shape
    assert learner.grad is not None and torch.isfinite(learner.grad).all()
    assert namespace["unit"] == "token"


def documented_keys() -> set[str]:
    """The metric keys docs/metrics.md names: `group/name`, and a row's `_suffix` after one
    (`staleness/lag_mean`, `_max`) for that name with its last part replaced."""
    keys: set[str] = set()
    for line in (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        for key, suffixes in re.findall(r"`([a-z_]+/[a-z0-9_]+)`((?:, `_[a-z0-9_]+`)*)", line):
            keys.add(key)
            keys.update(
                key.rsplit("_", 1)[0] + suffix
                for suffix in re.findall(r"`(_[a-z0-9_]+)`", suffixes)
            )
    return keys


def metrics_example(block: Block, url: str) -> None:
    import torch

    sampler, learner, mask = logprobs(4, 6, seed=2)
    model = torch.nn.Linear(3, 2)
    namespace = {
        "sampler_logp_B_T": sampler,
        "learner_logp_B_T": learner,
        "mask_B_T": mask,
        "rewards_B": torch.rand(4),
        "adv_B": torch.randn(4),
        "gate_mask": torch.zeros_like(mask),
        "logits_B_T_V": torch.randn(4, 6, 5),
        "version_B": torch.tensor([5, 6, 7, 7]),
        "step": 8,
        "model": model,
        "loss": model(torch.ones(3)).sum(),
    }
    run_block(block.code, namespace)
    metrics = namespace["metrics"]
    assert set(metrics) - documented_keys() == set()
    assert {
        "mismatch/kl",
        "policy/entropy",
        "staleness/lag_mean",
        "grad/norm",
        "reward/mean",
    } <= set(metrics)
    assert all(value.shape == () and value.dtype == torch.float32 for value in metrics.values())
    assert metrics["staleness/lag_mean"].item() == pytest.approx(1.75)


def metrics_merge(block: Block, url: str) -> None:
    import torch

    from trainer_hooks import metrics

    micro_batches = [logprobs(size, 6, seed=size) for size in (2, 3, 4)]
    namespace = {
        name: getattr(metrics, name)
        for name in ("finalize", "merge_partials", "stability_partials")
    }
    namespace["step"] = micro_batches
    (merged,) = run_block(block.code, namespace).values()
    whole = metrics.stability_metrics(
        *(torch.cat(parts) for parts in zip(*micro_batches, strict=True))
    )
    assert merged.keys() == whole.keys()
    for key in whole:
        assert torch.allclose(merged[key], whole[key], equal_nan=True), key


def metrics_vllm_topk(block: Block, url: str) -> None:
    import torch

    from trainer_hooks import Monitor

    batch, length, vocab, k = 2, 4, 6, 3
    sampler_logits = torch.randn(batch, length, vocab, generator=torch.Generator().manual_seed(3))
    sampler_logp_V = sampler_logits.log_softmax(-1)
    tokens = sampler_logp_V.argmax(-1)
    outputs = []
    for b in range(batch):
        positions = []
        for t in range(length):
            order = sampler_logp_V[b, t].argsort(descending=True).tolist()
            positions.append(
                {
                    token: SimpleNamespace(
                        logprob=sampler_logp_V[b, t, token].item(), rank=rank + 1
                    )
                    for rank, token in enumerate(order[: k + 1])
                }
            )
        outputs.append(SimpleNamespace(outputs=[SimpleNamespace(logprobs=positions)]))
    logits = sampler_logits + 0.1
    with Monitor(url, run_name="topk") as monitor:
        namespace: dict[str, Any] = {
            "torch": torch,
            "math": math,
            "B": batch,
            "T": length,
            "k": k,
            "outputs": outputs,
            "monitor": monitor,
            "step": 0,
            "logits": logits,
            "mask": torch.ones(batch, length, dtype=torch.bool),
            "sampler_logp": sampler_logp_V.gather(-1, tokens[..., None])[..., 0],
            "learner_logp": logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0],
        }
        run_block(block.code, namespace)
    assert (namespace["topk_ids"] >= 0).all()  # k + 1 entries each: the rank > k one dropped
    run = finished_run(url, "topk")
    assert steps_of(url, run["id"], "mismatch/topk_kl") == [0]


def stream_run(
    url: str, name: str, group: str, values: Callable[[int], dict[str, float]], steps: range
) -> str:
    from tests.support.raw_client import hello, new_run, open_ingest, points, recv

    run = new_run(name, group=group)
    with open_ingest(SimpleNamespace(ws_url=url.replace("http", "ws", 1))) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": s, "time": time.time(), "values": values(s)} for s in steps]))
        assert recv(ws)["type"] == "ack"
    return str(run["id"])


def read_api_series(block: Block, url: str) -> None:
    steps = range(0, 6000, 100)
    run_id = stream_run(
        url,
        "cispo-lag8-s0",
        "cispo",
        lambda s: {"grad/norm": s / 100, "loss/policy": -s / 1000},
        steps,
    )
    values = run_block(block.code.replace(DOC_URL, url), {"run_id": run_id})
    by_call = {
        line.split("#")[0].strip(): values[number]
        for number, line in enumerate(block.code.splitlines(), 1)
        if number in values
    }
    assert [run["id"] for run in by_call["client.runs()"]] == [run_id]
    assert list(by_call['client.runs(project="default", group="cispo", as_="pandas")']["id"]) == [
        run_id
    ]
    assert by_call['client.run("cispo-lag8-s0")']["id"] == run_id
    assert {k["key"]: k["count"] for k in by_call['client.keys("cispo-lag8-s0")']} == {
        "grad/norm": 60,
        "loss/policy": 60,
    }
    stored_steps, stored_values = by_call["s.steps, s.values"]
    assert list(stored_steps) == list(steps) and list(stored_values) == [s / 100 for s in steps]
    ranged = by_call['client.series(run_id, "loss/policy", start=1000, end=5000, as_="pandas")']
    assert list(ranged.index) == list(range(1000, 5001, 100))
    assert len(by_call['client.series(run_id, "loss/policy", max_points=500)'].steps) == 60


def read_api_details(block: Block, url: str) -> None:
    from keel.client import Client
    from trainer_hooks import Monitor

    with Monitor(url, run_name="details") as monitor:
        for step, batch in enumerate(batches(3)):
            monitor.log_batch(
                step, batch.sampler_logprobs, batch.sampler_logprobs + 0.3, batch.mask
            )
    values = run_block(block.code, {"client": Client(url), "run_id": monitor.run_id})
    distributions, samples, at_1200, sample_steps, sequences = (
        values[line] for line in sorted(values)
    )
    assert set(distributions) == {"key", "edges", "steps", "counts", "nan", "bucketed", "left_out"}
    assert distributions["steps"] == [0, 1, 2]
    assert set(samples) == {"step", "samples"} and samples["step"] == at_1200["step"] == 2
    assert sample_steps == [0, 1, 2]
    assert set(sequences) == {"steps", "length", "log_ratio", "fit"}


def trl_actions(block: Block, url: str) -> None:
    from trainer_hooks.integrations.trl import KeelCallback  # imported in "The two lines"

    values = run_block(block.code, {"KeelCallback": KeelCallback, "url": url})
    first, second, third = (values[line] for line in sorted(values))
    assert first.actions == {"checkpoint": "save", "stop": "stop", "halt": "stop"}
    assert (second.actions, third.actions) == ({"checkpoint": "save"}, {})


# Which example runs a block: (file, a line of the block) -> the example.
EXAMPLES: dict[tuple[str, str], Example] = {
    (
        "README.md",
        'monitor = Monitor("http://127.0.0.1:8750", run_name="cispo-lag8", group="cispo")',
    ): readme_monitor,
    (
        "docs/integrate.md",
        "from trainer_hooks import Monitor                                   # 1",
    ): integrate_five_lines,
    (
        "docs/integrate.md",
        'with Monitor(url, run_name="cispo-lag8") as monitor:',
    ): integrate_context_manager,
    ("docs/integrate.md", 'monitor.on_command(on_checkpoint, {"checkpoint": "saves a checkpoint now"})'): integrate_alerts,
    (
        "docs/losses.md",
        'adv_B = compute_advantages(rewards_B, "group", group_size=8)   # or "batch" / "given"',
    ): losses_example,
    (
        "docs/metrics.md",
        "from trainer_hooks.metrics import grad_norm, stability_metrics",
    ): metrics_example,
    (
        "docs/metrics.md",
        "finalize(merge_partials([stability_partials(*micro_batch) for micro_batch in step]))",
    ): metrics_merge,
    ("docs/metrics.md", "for b, out in enumerate(outputs):             # vLLM"): metrics_vllm_topk,
    (
        "docs/read-api.md",
        'client = Client("http://127.0.0.1:8750")          # token="keel_..." when auth is on',
    ): read_api_series,
    (
        "docs/read-api.md",
        "client.sample_steps(run_id)       # [steps that have samples]",
    ): read_api_details,
    (
        "docs/integrations/trl.md",
        "KeelCallback(url, actions={})                        # acts on nothing: commands stay pending",
    ): trl_actions,
}


def example_of(block: Block) -> Example | None:
    lines = set(block.code.splitlines())
    found = [
        example
        for (path, line), example in EXAMPLES.items()
        if path == block.path and line in lines
    ]
    assert len(found) <= 1, f"{block.id}: more than one example runs it"
    return found[0] if found else None


BLOCKS = python_blocks()
RUN = [block for block in BLOCKS if block.sketch is None and example_of(block) is not None]


def test_every_python_block_is_run_or_marked() -> None:
    assert len(BLOCKS) >= 20  # the collection finds the docs' blocks
    wrong = [
        f"{b.id}: neither run here nor marked <!-- sketch: reason -->"
        for b in BLOCKS
        if b.sketch is None and example_of(b) is None
    ]
    wrong += [f"{b.id}: a sketch marker without a reason" for b in BLOCKS if b.sketch == ""]
    wrong += [
        f"{b.id}: marked a sketch, yet run here" for b in BLOCKS if b.sketch and example_of(b)
    ]
    run_by = {example_of(b) for b in RUN}
    wrong += [
        f"{example.__name__}: runs no block of {path} (its line changed?)"
        for (path, _), example in EXAMPLES.items()
        if example not in run_by
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("block", RUN, ids=[block.id for block in RUN])
def test_doc_example_runs(block: Block, keel_url: str) -> None:
    example = example_of(block)
    assert example is not None
    example(block, keel_url)


def test_the_monitor_options_block_is_the_signature() -> None:
    """docs/integrate.md's "Options" block is a signature, not a call (a sketch): its
    parameters and defaults are Monitor's."""
    from trainer_hooks import Monitor

    (block,) = [
        b
        for b in BLOCKS
        if b.path == "docs/integrate.md" and b.code.startswith("Monitor(server_url, *,")
    ]
    (drawn,) = ast.parse("def " + re.sub(r"\s*#.*", "", block.code) + ": pass").body
    assert isinstance(drawn, ast.FunctionDef)
    parameters = inspect.signature(Monitor).parameters
    names = [a.arg for a in drawn.args.args + drawn.args.kwonlyargs]
    assert names == ["server_url", *list(parameters)[1:]]
    defaults = {
        a.arg: ast.literal_eval(d)
        for a, d in zip(drawn.args.kwonlyargs, drawn.args.kw_defaults, strict=True)
        if d is not None
    }
    assert defaults == {
        name: p.default
        for name, p in parameters.items()
        if p.default is not inspect.Parameter.empty
    }
