"""One step logged in several calls, against a real `keel serve`: log_batch() micro-batches
merge into the metrics of the whole step; what the server would not keep is counted.

The reference for every merged metric is `stability_metrics` on the step's micro-batches
concatenated along the batch dim, the shorter ones padded with mask 0.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import httpx
import pytest
import torch

from tests.support.monitor import (
    FAST,
    python_process,
    servers,
    spooled_steps,
    wait_until,
)
from tests.support.server import ServerProcess
from trainer_hooks.metrics import stability_metrics
from trainer_hooks.monitor import Monitor, dashboard_url

make_server = pytest.fixture(name="make_server")(servers)

MicroBatch = dict[str, Any]


def micro_batch(seed: int, seqs: int, length: int, *, vocab: int = 0) -> MicroBatch:
    """One micro-batch's log_batch() inputs, padding (mask 0) filled with NaN."""
    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(seqs, length, generator=generator) * 3
    learner = sampler + 0.4 * torch.randn(seqs, length, generator=generator)
    mask = torch.rand(seqs, length, generator=generator) > 0.2
    mask[:, 0] = True
    batch: MicroBatch = {
        "sampler_logprobs": sampler.masked_fill(~mask, math.nan),
        "learner_logprobs": learner.masked_fill(~mask, math.nan),
        "mask": mask,
        "rewards": torch.rand(seqs, generator=generator),
        "gate_mask": torch.rand(seqs, length, generator=generator) > 0.7,
        "sampler_version": torch.randint(0, 4, (seqs,), generator=generator),
        "learner_version": 4,
    }
    if vocab:
        batch["logits"] = torch.randn(seqs, length, vocab, generator=generator)
    return batch


def concatenated(batches: list[MicroBatch]) -> MicroBatch:
    """The micro-batches as one batch: padded to the longest with mask 0, then concatenated."""
    length = max(b["learner_logprobs"].shape[1] for b in batches)

    def pad(tensor: torch.Tensor, value: float) -> torch.Tensor:
        if tensor.dim() < 2:
            return tensor
        width = length - tensor.shape[1]
        out = torch.full((tensor.shape[0], width, *tensor.shape[2:]), value, dtype=tensor.dtype)
        return torch.cat([tensor, out], dim=1)

    joined: MicroBatch = {}
    for key, value in batches[0].items():
        if isinstance(value, torch.Tensor):
            fill = 0 if value.dtype == torch.bool else math.nan
            joined[key] = torch.cat([pad(b[key], fill) for b in batches])
        else:
            joined[key] = value
    return joined


def expected_metrics(batches: list[MicroBatch]) -> dict[str, float]:
    whole = concatenated(batches)
    args = dict(whole)
    tensors = (args.pop("sampler_logprobs"), args.pop("learner_logprobs"), args.pop("mask"))
    return {key: value.item() for key, value in stability_metrics(*tensors, **args).items()}


def plain_metrics(batch: MicroBatch) -> dict[str, float]:
    """stability_metrics of the batch's log-probs and mask alone (no optional inputs)."""
    return expected_metrics(
        [{k: batch[k] for k in ("sampler_logprobs", "learner_logprobs", "mask")}]
    )


def log_micro_batches(monitor: Monitor, step: int, batches: list[MicroBatch]) -> None:
    for batch in batches:
        args = dict(batch)
        monitor.log_batch(
            step, args.pop("sampler_logprobs"), args.pop("learner_logprobs"), args.pop("mask"),
            **args,
        )  # fmt: skip


def assert_stored(
    server: ServerProcess, run_id: str, expected: dict[int, dict[str, float]]
) -> None:
    """Each key holds exactly these steps' values (1e-5: float32 sums in another order)."""
    keys = sorted({key for values in expected.values() for key in values})
    assert sorted(server.keys(run_id)) == keys
    for key in keys:
        steps = [step for step, values in expected.items() if key in values]
        stored_steps, stored = server.series(run_id, key)
        assert stored_steps == steps, key
        want = [expected[step][key] for step in steps]
        stored = [float(value) for value in stored]  # NaN comes back as "nan"
        assert stored == pytest.approx(want, rel=1e-5, abs=1e-7, nan_ok=True), key


# Per step: micro-batches of other numbers of sequences and other lengths.
SHAPES = [[(2, 5), (3, 11), (2, 8), (1, 3)], [(4, 7)], [(1, 12), (2, 4)]]


def test_micro_batches_of_a_step_merge_into_the_metrics_of_the_whole_step(
    make_server, sqlite_url, tmp_path
) -> None:
    server = make_server(sqlite_url)
    steps = {  # step 2 with logits: the exact entropy, [B, T, V] padded along T
        step: [
            micro_batch(10 * step + i, *shape, vocab=5 if step == 2 else 0)
            for i, shape in enumerate(shapes)
        ]
        for step, shapes in enumerate(SHAPES)
    }
    expected: dict[int, dict[str, float]] = {}
    with Monitor(server.url, run_name="accumulate", spool_dir=tmp_path, sender_config=FAST) as m:
        for step, batches in steps.items():
            log_micro_batches(m, step, batches)
            m.log(step, {"grad/norm": 0.5 + step})  # after the micro-batches: joins the step
            expected[step] = {**expected_metrics(batches), "grad/norm": 0.5 + step}
    assert expected[0]["batch/seqs"] == 8.0  # all micro-batches count, not the first one
    assert_stored(server, m.run_id, expected)
    assert m.dropped == {}
    # Exact where the values are counts or extremes.
    for key in ("batch/seqs", "batch/tokens", "mismatch/ratio_max", "staleness/lag_max"):
        assert server.series(m.run_id, key)[1] == [expected[s][key] for s in steps], key


def test_a_step_of_many_micro_batches_merges_partials_from_the_training_thread(
    make_server, sqlite_url, tmp_path
) -> None:
    """80 micro-batches of one step, of many shapes, reach the worker and merge into
    the metrics of the whole step exactly."""
    server = make_server(sqlite_url)
    batches = [micro_batch(i, 1 + i % 3, 2 + i % 9) for i in range(80)]
    with Monitor(server.url, run_name="many", spool_dir=tmp_path, sender_config=FAST) as m:
        log_micro_batches(m, 7, batches)
        log_micro_batches(m, 8, batches[:3])
    assert_stored(
        server, m.run_id, {7: expected_metrics(batches), 8: expected_metrics(batches[:3])}
    )
    assert m.dropped == {}


def test_micro_batches_with_per_token_and_per_sequence_inputs_still_merge(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    """Inputs that do not concatenate (advantages per sequence in one call, per token in
    another) are merged from partials; an input some calls lack leaves its metric out."""
    server = make_server(sqlite_url)
    first, second = micro_batch(1, 3, 6), micro_batch(2, 2, 9)
    first["advantages"] = torch.randn(3)
    second["advantages"] = torch.randn(2, 9)
    second["advantages"][1, 0] = math.nan  # a valid token: counted in nonfinite/count
    without_rewards = {k: v for k, v in micro_batch(3, 2, 4).items() if k != "rewards"}
    with caplog.at_level(logging.WARNING, logger="keel"):
        with Monitor(server.url, run_name="mixed", spool_dir=tmp_path, sender_config=FAST) as m:
            log_micro_batches(m, 0, [first, second])
            log_micro_batches(m, 1, [first, without_rewards])
    # Advantages of other shapes do not concatenate: the reference leaves them out, adds their
    # NaN to nonfinite/count, and their unbounded tokens (counts add) to the share.
    no_advantages = [{**b, "advantages": None} for b in (first, second)]
    expected_0 = expected_metrics(no_advantages)
    expected_0["nonfinite/count"] += 1
    alone = [expected_metrics([batch]) for batch in (first, second)]
    unbounded = sum(m["mismatch/unbounded_frac"] * m["batch/tokens"] for m in alone)
    expected_0["mismatch/unbounded_frac"] = unbounded / expected_0["batch/tokens"]
    expected_1 = {
        key: value
        for key, value in expected_metrics(
            [{**no_advantages[0], "rewards": None}, without_rewards]
        ).items()
        if not key.startswith("reward/")
    }
    assert_stored(server, m.run_id, {0: expected_0, 1: expected_1})
    assert "different optional inputs" in caplog.text
    assert m.dropped == {}


def test_a_step_is_held_until_a_later_step_or_step_timeout(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url, start=False)
    batches = [micro_batch(i, 2, 6) for i in range(3)]
    monitor = Monitor(
        server.url, run_name="held", spool_dir=tmp_path, sender_config=FAST, step_timeout=1.5
    )
    assert monitor.spool_path is not None
    log_micro_batches(monitor, 0, batches[:1])
    time.sleep(0.5)  # ten flush intervals: log() rows would be spooled by now
    monitor.log(0, {"loss/total": 1.0})
    log_micro_batches(monitor, 0, batches[1:2])
    time.sleep(0.5)
    assert spooled_steps(monitor.spool_path) == []  # step 0 is still open
    log_micro_batches(monitor, 1, batches[2:])  # a later step completes step 0
    wait_until(lambda: spooled_steps(monitor.spool_path) == [0], what="step 0 spooled")
    started = time.monotonic()
    wait_until(lambda: spooled_steps(monitor.spool_path) == [0, 1], what="step 1 after its timeout")
    assert time.monotonic() - started > 0.5
    # Step 1 was sent: another micro-batch for it cannot change what the server keeps.
    with caplog.at_level(logging.WARNING, logger="keel"):
        log_micro_batches(monitor, 1, batches[:1])
        server.start()
        assert monitor.finish()
    assert monitor.dropped == {"repeated": len(expected_metrics(batches[2:]))}
    assert caplog.text.count("came after the step was sent") == 1
    assert "not stored in run 'held'" in caplog.text and "repeated" in caplog.text
    assert_stored(
        server,
        monitor.run_id,
        {
            0: {**expected_metrics(batches[:2]), "loss/total": 1.0},
            1: expected_metrics(batches[2:]),
        },
    )


def test_log_calls_of_a_step_add_up_and_a_repeated_key_keeps_its_first_value(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url)
    batch = micro_batch(0, 2, 5)
    with caplog.at_level(logging.WARNING, logger="keel"):
        with Monitor(server.url, run_name="log", spool_dir=tmp_path, sender_config=FAST) as m:
            m.log(3, {"a": 1.0})
            m.log(3, {"b": 2.0})
            m.log(3, {"a": 9.0, "c": 3.0})  # "a" again: the first value stays
            time.sleep(0.3)
            m.log(3, {"b": 8.0})  # long after the row was sent: the same rule
            log_micro_batches(m, 4, [batch])
            m.log(4, {"grad/norm": 1.0, "mismatch/kl": -1.0})  # the caller's own value wins
            m.log(4, {"grad/norm": 2.0})  # repeated within the open step
    computed = expected_metrics([batch])
    assert_stored(
        server,
        m.run_id,
        {
            3: {"a": 1.0, "b": 2.0, "c": 3.0},
            4: {**computed, "grad/norm": 1.0, "mismatch/kl": -1.0},
        },
    )
    assert m.dropped == {"repeated": 3}
    assert caplog.text.count("Counted in Monitor.dropped") == 1  # one warning per kind


def test_single_element_tensors_of_any_shape_and_dtype_are_stored_as_numbers(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    with Monitor(server.url, run_name="tensors", spool_dir=tmp_path, sender_config=FAST) as m:
        m.log(
            0,
            {
                "scalar": torch.tensor(0.25),
                "one_by_one": torch.full((1, 1), 2.5),
                "integer": torch.tensor(7),
                "flag": torch.tensor(True),
                "half": torch.tensor(1.5, dtype=torch.bfloat16),
                "with_grad": torch.tensor(3.0, requires_grad=True) * 2,
                "empty": torch.empty(0),
                "pair": torch.ones(2),
            },
        )
    assert_stored(
        server, m.run_id,
        {0: {"scalar": 0.25, "one_by_one": 2.5, "integer": 7.0, "flag": 1.0, "half": 1.5, "with_grad": 6.0}},
    )
    assert m.dropped == {"not_a_number": 2}


def test_strings_none_and_other_non_numbers_are_counted_not_coerced(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url)
    with caplog.at_level(logging.WARNING, logger="keel"):
        with Monitor(server.url, run_name="bad", spool_dir=tmp_path, sender_config=FAST) as m:
            for step in range(3):
                m.log(
                    step,
                    {
                        "ok": float(step),
                        "text": "0.5",  # parses as a number: still not a value
                        "trl/all_nan": None,  # TRL's "no valid value in the window"
                        "vector": torch.ones(3),
                        "listed": [1.0],
                        "": 1.0,
                    },
                )
            m.log(-1, {"ok": 1.0, "other": 2.0})
            m.log(4, None)  # type: ignore[arg-type]
    assert server.keys(m.run_id) == {"ok": 3}
    assert m.dropped == {"string": 3, "none": 3, "not_a_number": 6, "key": 3, "step": 2, "error": 1}
    assert caplog.text.count("'text' is the string '0.5'; dropped (string)") == 1
    assert "none 3 (first: 'trl/all_nan' is None)" in caplog.text  # finish()'s summary


def test_the_run_page_is_printed_once_on_rank_zero_only(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    code = f"""
        from trainer_hooks.monitor import Monitor
        monitor = Monitor({server.url + "/"!r}, run_name="hello", spool_dir={str(tmp_path)!r})
        monitor.log(0, {{"x": 1.0}})
        monitor.finish()
        print(monitor.run_id)
    """
    outputs = {}
    for rank in ("0", "1"):
        with python_process(code, env={"RANK": rank}) as trainer:
            outputs[rank] = trainer.communicate(timeout=60)
            assert trainer.returncode == 0, outputs[rank][1]
    run_id = outputs["0"][0].strip()
    page = f"{server.url}/runs/{run_id}"
    assert outputs["0"][1].count(page) == 1
    assert f"run 'hello' ({run_id})" in outputs["0"][1]
    assert outputs["1"][1] == ""
    assert httpx.get(page, timeout=30).status_code == 200  # the dashboard serves that path


def test_the_run_page_goes_to_the_keel_logger_when_it_shows_info(
    make_server, sqlite_url, tmp_path, caplog, capsys
) -> None:
    server = make_server(sqlite_url)
    with caplog.at_level(logging.INFO, logger="keel"):
        monitor = Monitor(server.url, run_name="logged", spool_dir=tmp_path, sender_config=FAST)
        monitor.finish()
    assert caplog.text.count(f"{server.url}/runs/{monitor.run_id}") == 1
    assert monitor.url not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("server_url", "page"),
    [
        ("http://127.0.0.1:8750", "http://127.0.0.1:8750/runs/R"),
        ("https://keel.example.org/", "https://keel.example.org/runs/R"),
        ("http://host:80/keel", "http://host:80/keel/runs/R"),
        ("wss://host:1/keel/api/v1/ingest", "https://host:1/keel/runs/R"),
    ],
)
def test_dashboard_url_of_a_server_url(server_url: str, page: str) -> None:
    assert dashboard_url(server_url, "R") == page


def test_steps_that_go_back_are_counted_not_merged_into_an_open_step(
    make_server, sqlite_url, tmp_path
) -> None:
    """A loop that restarts its step numbers: each log_batch for another step completes
    the open one, so step 1 logged again is a repeat (counted), never merged into the first
    step 1; a log() for an earlier step leaves the open step open."""
    server = make_server(sqlite_url)
    batches = [micro_batch(i, 2, 5) for i in range(4)]
    with Monitor(server.url, run_name="restart", spool_dir=tmp_path, sender_config=FAST) as m:
        m.log_batch(0, *(batches[0][k] for k in ("sampler_logprobs", "learner_logprobs", "mask")),
                    metrics={"loss/total": 1.0})  # fmt: skip
        log_micro_batches(m, 1, batches[1:2])
        m.log(0, {"perf/step_s": 0.5, "loss/total": 2.0})  # late, for step 0: step 1 stays open
        log_micro_batches(m, 1, batches[2:3])  # joins step 1
        log_micro_batches(m, 0, batches[3:])  # step 0 again: step 1 completes
        log_micro_batches(m, 1, batches[3:])  # step 1 again, after it was sent
    again = expected_metrics(batches[3:])
    assert_stored(
        server,
        m.run_id,
        {
            # Step 0 again: the keys its first log_batch lacked (rewards...) are new there.
            0: {**again, **plain_metrics(batches[0]), "perf/step_s": 0.5, "loss/total": 1.0},
            1: expected_metrics(batches[1:3]),
        },
    )
    # loss/total of the log(); the keys step 0 had already; all of step 1 again.
    assert m.dropped == {"repeated": 1 + len(plain_metrics(batches[0])) + len(again)}
