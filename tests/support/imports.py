"""What a Python source file imports, as the layering tests read it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def imported_modules(name: str, path: Path) -> Iterator[str]:
    """Every module the file of module `name` imports, anywhere in it (inside functions and
    under TYPE_CHECKING too: dependencies all the same), as dotted names, relative imports
    resolved; `from pkg import name` gives both `pkg` and `pkg.name` (name may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
