"""The docs say what the code does: docs/architecture.md's error tree is Keel's error
classes, each under its base, in the module named; README's `docker compose up` gives the
variables docker-compose.yml requires."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wire", "trainer_hooks", "learners", "server", "dashboard", "keel")
TREE_LINE = re.compile(r"^(?P<indent>(?:[│ ] {3})*)(?:[├└]── )?(?P<name>[A-Z]\w+)(?: +(?P<module>[a-z_]+(?:\.[a-z_]+)+))?")


def error_tree() -> dict[str, tuple[str | None, str | None]]:
    """docs/architecture.md's tree under "## Errors": class -> (its base, its module as drawn;
    a class drawn without a module is in its base's)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Errors", 1)[1].split("```", 2)[1]
    tree: dict[str, tuple[str | None, str | None]] = {}
    parents: list[str] = []
    for line in block.splitlines():
        match = TREE_LINE.match(line)
        if not match:
            continue
        depth = len(match["indent"]) // 4 + (1 if "──" in line else 0)
        name = match["name"]
        parents[depth:] = [name]
        base = parents[depth - 1] if depth else None
        module = match["module"] or (tree[base][1] if base else None)
        tree[name] = (base, module)
    return tree


def keel_errors_in_the_source() -> set[str]:
    """Every class of the product packages that derives from KeelError, by name, read from
    the source (a base named as an attribute, `errors.Conflict`, counts by its last part)."""
    bases: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    names = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}
                    bases.setdefault(node.name, set()).update(names)
    found = {"KeelError"}
    while grown := {name for name, of in bases.items() if of & found} - found:
        found |= grown
    return found


def test_the_error_tree_is_every_keel_error_under_its_base() -> None:
    tree = error_tree()
    assert tree["KeelError"] == (None, None)
    assert {"ClientError", "ImportSourceError", "ReaderNotInstalled", "SpoolBusyError", "RunConflict"} <= tree.keys()
    assert set(tree) == keel_errors_in_the_source()
    for name, (base, module) in tree.items():
        if base is None:
            continue
        cls = getattr(importlib.import_module(module or ""), name)
        parent = getattr(importlib.import_module(tree[base][1] or "wire.errors"), base)
        assert cls.__bases__[0] is parent, f"{name} is drawn under {base}, derives from {cls.__bases__[0].__name__}"


def test_the_readme_compose_command_sets_what_the_compose_file_requires() -> None:
    compose = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    required = set(re.findall(r"\$\{(\w+):\?", compose))
    assert required == {"KEEL_ADMIN_TOKEN"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (command,) = [line for line in readme.splitlines() if re.match(r"(\w+=.* )?docker compose up ", line)]
    assert all(f"{name}=" in command for name in required), command
    assert yaml.safe_load(compose)["services"]["server"]["environment"]["KEEL_BOOTSTRAP_TOKEN"] == "${KEEL_ADMIN_TOKEN:?set KEEL_ADMIN_TOKEN to a long random string}"


def test_every_module_the_architecture_names_exists() -> None:
    """docs/architecture.md's map and glossary name modules by path: each is in the tree (a
    rename that forgets the docs fails here)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:wire|trainer_hooks|learners|server|dashboard|keel|migrations|bench|tests)/[\w/.-]*?\.(?:py|js))\b", text))
    assert len(named) > 30, named  # the glossary and the map name dozens
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == []
    # A module named alone ("channel.py", beside the package it was just said to be in) is a
    # file of that name somewhere in the tree.
    alone = set(re.findall(r"(?<![\w/.-])([\w-]+\.(?:py|js))\b", text))
    assert len(alone) > 20, alone
    packages = ("wire", "trainer_hooks", "learners", "server", "dashboard", "keel", "migrations", "bench", "tests")
    in_tree = {path.name for package in packages for path in (ROOT / package).rglob("*.[pj][ys]")}
    assert sorted(alone - in_tree) == []
