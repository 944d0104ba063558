"""Under torch.distributed only rank 0 sends; every other rank's Monitor does nothing
(but log_batch still takes part in the metrics' all-reduces)."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from textwrap import dedent

import pytest

from tests.support.local_server import free_port
from tests.support.monitor import python_process, servers

make_server = pytest.fixture(name="make_server")(servers)

RANK = """
    import torch
    import torch.distributed as dist
    from trainer_hooks.monitor import Monitor

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank={rank}, world_size=2)
    monitor = Monitor({url!r}, run_name="ddp", run_id={run_id!r}, spool_dir={root!r} + "/rank{rank}")
    for step in range(20):
        monitor.log(step, {{"rank": torch.tensor(float(dist.get_rank())), "step": float(step)}})
    # log_batch all-reduces on every rank (rank 1 takes part though it sends nothing):
    # 6 tokens on rank 0 and 1 on rank 1.
    logprobs = torch.full((2, 3), -1.0)
    mask = torch.ones(2, 3) if {rank} == 0 else torch.tensor([[1.0, 0, 0], [0, 0, 0]])
    monitor.log_batch(20, logprobs, logprobs + 0.1, mask)
    # A second micro-batch of step 20, of another length: 2 more tokens on each rank.
    monitor.log_batch(20, torch.full((2, 1), -1.0), torch.full((2, 1), -0.8), None)
    delivered = monitor.finish()
    dist.barrier()
    dist.destroy_process_group()
    print(monitor.enabled, delivered)
"""


def test_only_rank_zero_sends(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    port, run_id = free_port(), str(uuid.uuid4())
    with ExitStack() as stack:
        ranks = [
            stack.enter_context(
                python_process(
                    dedent(RANK).format(
                        port=port, rank=rank, url=server.url, run_id=run_id, root=str(tmp_path)
                    )
                )
            )
            for rank in (0, 1)
        ]
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    for rank, (_, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err
    assert [out.strip() for out, _ in outputs] == ["True True", "False True"]
    keys = server.keys(run_id)
    assert (keys["rank"], keys["step"], keys["batch/tokens"]) == (20, 20, 1)
    assert server.series(run_id, "rank") == (list(range(20)), [0.0] * 20)
    assert server.series(run_id, "batch/tokens") == ([20], [11.0])
    assert server.series(run_id, "batch/seqs") == ([20], [7.0])
    # k1 = token-mean of −ℓ: 7 tokens at ℓ = 0.1 and 4 at ℓ = 0.2, over both ranks.
    assert server.series(run_id, "mismatch/kl_k1")[1] == pytest.approx([-(0.7 + 0.8) / 11])
    assert server.run(run_id)["status"] == "finished"
    assert not (tmp_path / "rank1").exists()


def test_launcher_rank_env_disables_before_the_process_group_exists(
    make_server, sqlite_url, tmp_path
) -> None:
    server = make_server(sqlite_url)
    code = f"""
        from trainer_hooks.monitor import Monitor
        monitor = Monitor({server.url!r}, run_name="rank3", spool_dir={str(tmp_path / "spool")!r})
        monitor.log(0, {{"x": 1.0}})
        print(monitor.enabled, monitor.finish(), monitor.run_id)
    """
    with python_process(code, env={"RANK": "3"}) as trainer:
        out, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 0, err
    enabled, delivered, run_id = out.split()
    assert (enabled, delivered) == ("False", "True")
    assert server.last_step(run_id) == -1
    assert not (tmp_path / "spool").exists()
