"""`keel demo` prints one compare page per A/B of a round (keel/demo.py): the toy A/B,
the guarded PPO beside its unguarded twin, and the transformer A/B."""

from __future__ import annotations

from keel.demo import _demo_comparisons, _demo_runs


def test_a_demo_round_has_a_compare_page_per_ab_and_the_guard_beside_its_twin() -> None:
    runs = _demo_runs("http://h:1", 0, 0.1)
    pages = dict(_demo_comparisons(runs))
    assert len(pages) == 3
    toy, guard, transformer = pages.values()
    assert toy == {f"{loss}-lag8-severe-s{s}" for loss in ("importance_sampling", "cispo") for s in range(3)}
    assert guard == {"lm-ppo-lag4-bf16-s0", "lm-ppo-lag4-bf16-s0-guard"}
    assert transformer == {f"lm-{loss}-lag8-bf16-s{s}" for loss in ("ppo", "cispo") for s in range(2)}
    assert set().union(*pages.values()) == set(runs)  # every run of the round is on a page
