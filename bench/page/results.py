"""The page benchmarks' figures: each printed as it is measured, then all in one table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Figure", "Results", "report"]


@dataclass
class Figure:
    part: str
    name: str
    value: float | str | None
    unit: str = ""
    target: str = ""
    ok: bool | None = None
    """None: for reference, no target."""
    note: str = ""


@dataclass
class Results:
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    """What the figures were computed from, by part (the --json file's "details")."""

    def add(self, part: str, name: str, value: float | str | None, unit: str = "", target: str = "",
            check: Callable[[float], bool] | None = None, note: str = "") -> None:  # fmt: skip
        ok = None
        if check is not None:
            ok = False if not isinstance(value, (int, float)) else check(float(value))
        self.figures.append(Figure(part, name, value, unit, target, ok, note))
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        print(f"  [{part}] {name}: {shown} {unit} {note}".rstrip(), flush=True)


def report(results: Results) -> None:
    print("\n" + "=" * 100)
    print(f"{'part':7s} {'figure':66s} {'value':>12s} {'target':>10s}  result")
    for f in results.figures:
        if isinstance(f.value, float):
            value = f"{f.value:,.3g}" if abs(f.value) < 1000 else f"{f.value:,.0f}"
        else:
            value = str(f.value if f.value is not None else "-")
        verdict = {True: "pass", False: "FAIL", None: ""}[f.ok]
        print(f"{f.part:7s} {f.name[:66]:66s} {value + ' ' + f.unit:>12s} {f.target:>10s}  {verdict}")
