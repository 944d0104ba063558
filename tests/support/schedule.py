"""The order the suite's files are dealt to `make test`'s workers."""

from __future__ import annotations

import pytest

SLOW_FILES = (
    "tests/dashboard/test_browser.py",
    "tests/server/routes/test_bounds.py",
    "tests/dashboard/test_browser_demo.py",
    "tests/keel/test_watch.py",
    "tests/server/routes/test_schemathesis.py",
    "tests/trainer_hooks/integrations/test_trl.py",
    "tests/keel/test_run.py",
    "tests/test_image.py",
)
"""The files that take a minute or more, run first: `make test` gives each file to one of its
workers as one turns free (`-n 3 --dist loadfile`), and a long file dealt last would leave the
other workers idle while it ends."""


def slow_files_first(items: list[pytest.Item]) -> None:
    """SLOW_FILES' tests first, in that order; every other test after them, as collected."""
    rank = {path: place for place, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: within a file, its order
