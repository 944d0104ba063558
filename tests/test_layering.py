"""The package layering of docs/architecture.md, enforced on the source (imports inside
functions and under TYPE_CHECKING count: they are dependencies all the same)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.imports import imported_modules

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wire", "trainer_hooks", "learners", "server", "dashboard", "keel", "migrations")

# What the server and the dashboard need; none of it may reach a trainer's GPU node.
SERVER_DEPENDENCIES = {
    "fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "pydantic", "pydantic_settings",
    "dash", "dash_ag_grid", "plotly", "orjson", "httpx", "aiosqlite", "psycopg",
}
CLI_OR_SIMULATION = {"argparse", "learners", "keel"}


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _graph() -> dict[str, set[str]]:
    return {
        name: {imported for imported in imported_modules(name, path) if imported in MODULES and imported != name}
        for name, path in MODULES.items()
    }


def _top(module: str) -> str:
    return module.split(".")[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of two or more (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_two_product_modules_import_each_other_directly_or_through_a_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_direct_and_indirect_cycles() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def _module_of(imported: str) -> str:
    """The product module a dotted import names (`pkg.module.Name` -> `pkg.module`)."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return imported


def _importers(package: str) -> Iterator[tuple[str, str]]:
    for name, path in MODULES.items():
        if _top(name) == package:
            for imported in imported_modules(name, path):
                yield name, _module_of(imported)


def test_wire_imports_the_standard_library_only() -> None:
    """The contract both sides import: it may not pull in either side, or anything that is
    not on every machine that runs Python."""
    imports = set(_importers("wire"))
    assert imports, "no wire package to check"
    wrong = {
        (name, imported)
        for name, imported in imports
        if _top(imported) != "wire" and _top(imported) not in sys.stdlib_module_names
    }
    assert wrong == set()


@pytest.mark.parametrize("package", ["server", "dashboard"])
def test_server_and_dashboard_share_with_the_trainer_side_only_through_wire(package: str) -> None:
    wrong = {
        (name, imported)
        for name, imported in _importers(package)
        if _top(imported) in ("trainer_hooks", "learners", "keel")
    }
    assert wrong == set()


WEB_FRAMEWORK = {"fastapi", "starlette"}
HTTP_API = ("server.app", "server.deps", "server.routes", "server.schemas")


def _reachable(roots: set[str]) -> set[str]:
    """`roots` and every product module they import, directly or through others."""
    graph, seen, todo = _graph(), set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


@pytest.mark.parametrize("package", ["server.alerts", "server.webhooks"])
def test_the_alert_pipeline_reaches_neither_the_http_api_nor_the_web_framework(package: str) -> None:
    """Alerts are evaluated and delivered the same way whatever serves the API: the
    pipeline's JSON comes from server.jsonview, not from the API models."""
    roots = {name for name in MODULES if name == package or name.startswith(f"{package}.")}
    assert roots, f"no {package} modules to check"
    reached = _reachable(roots)
    assert {name for name in reached if any(name == api or name.startswith(f"{api}.") for api in HTTP_API)} == set()
    wrong = {
        (name, imported)
        for name in reached
        for imported in imported_modules(name, MODULES[name])
        if _top(imported) in WEB_FRAMEWORK
    }
    assert wrong == set()


def test_webhooks_deliver_what_the_alert_pipeline_queues_without_importing_it() -> None:
    """server.alerts queues outbox rows through server.webhooks.registry; an import back would
    tie delivering a webhook to evaluating alerts (and make a cycle of the two packages)."""
    wrong = {
        (name, imported)
        for name, imported in _importers("server")
        if name.startswith("server.webhooks") and imported.startswith("server.alerts")
    }
    assert wrong == set()


def test_trainer_hooks_hold_no_command_line_or_simulation_code_and_no_server_dependencies() -> None:
    wrong = {
        (name, imported)
        for name, imported in _importers("trainer_hooks")
        if _top(imported) in SERVER_DEPENDENCIES | CLI_OR_SIMULATION | {"server", "dashboard"}
    }
    assert wrong == set()
    for name, path in MODULES.items():
        if _top(name) == "trainer_hooks":
            tree = ast.parse(path.read_text())
            defined = {
                target.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            assert "COMMANDS" not in defined, f"{name} defines keel commands"
            programs = [
                node
                for node in ast.walk(tree)
                if isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Name)
                and node.left.id == "__name__"
            ]
            assert not programs and path.name != "__main__.py", f"{name} is a program"


def test_learners_are_built_on_trainer_hooks_alone() -> None:
    """A reference learner loop is what a user's trainer is: it may not reach into the server."""
    wrong = {
        (name, imported)
        for name, imported in _importers("learners")
        if _top(imported) in {"server", "dashboard", "keel"} | SERVER_DEPENDENCIES - {"httpx"}
    }
    assert wrong == set()


def test_this_check_sees_imports_inside_functions() -> None:
    """The graph above counts a function-level import (the kind that hides a cycle)."""
    assert "learners.stream" in _graph()["learners.toy_cli"]


def test_the_parity_statistics_need_no_server_dependency() -> None:
    """`keel parity` runs on the base install (no Dash, no FastAPI) and decides with
    wire.parity, as the compare page's parity view does: the module imports the standard
    library and `wire` only (the rule for all of wire, checked above, and here by name)."""
    parity = set(imported_modules("wire.parity", MODULES["wire.parity"]))
    wrong = {name for name in parity if _top(name) != "wire" and _top(name) not in sys.stdlib_module_names}
    assert wrong == set()
    assert "wire.parity" in _graph()["keel.parity"]
    assert "wire.parity" in _graph()["dashboard.views.parity"]
