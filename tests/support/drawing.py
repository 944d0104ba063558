"""The one table of cases of the drawing arithmetic (tests/dashboard/drawing_spec.json), as
both sides' tests read it: the server's (tests/dashboard/test_drawing_spec.py) and the page's
(tests/dashboard/test_browser_math.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = json.loads((Path(__file__).parents[1] / "dashboard" / "drawing_spec.json").read_text())
SMOOTHED_REL = 1e-12
"""How close a smoothed value, or a band's mean or edge, must be to the table's (the rest is exact: its "about" says why)."""


def close(got: float | None, want: float | None) -> bool:
    """Equal, or both smoothed values within SMOOTHED_REL of each other (None only to None)."""
    if got is None or want is None:
        return got is want
    return got == want or abs(got - want) <= SMOOTHED_REL * max(abs(got), abs(want))
