"""The order in which `make test`'s workers take the test files (the hook in tests/conftest.py)."""

from __future__ import annotations

from collections import Counter

import pytest

__all__ = ["slow_files_first"]


def slow_files_first(items: list[pytest.Item]) -> None:
    """Sorts `items` in place into the order `make test`'s workers should take their files:
    files holding a `slow` test first (most such tests first), then the rest by number of
    tests, most first.

    `make test` hands each file whole to one of its xdist workers in collection order
    (`--dist loadfile --no-loadscope-reorder`). xdist's own order (most tests first) started
    the few long tests last, and the run ended with one worker busy on them while the others
    waited. Each file's tests keep their order (a stable sort on a per-file key)."""

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    tests = Counter(file_of(item) for item in items)
    slow = Counter(file_of(item) for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (-slow[file_of(item)], -tests[file_of(item)]))
