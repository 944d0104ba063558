"""trainer_hooks (with wire) goes on GPU nodes: it must import without the server's dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

BLOCK_SERVER_DEPS = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = ("fastapi", "sqlalchemy", "dash", "starlette", "alembic", "uvicorn", "plotly", "pydantic", "server", "dashboard")
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"blocked: {name}", name=name)
            return None
    sys.meta_path.insert(0, Block())
    """
)


def test_trainer_hooks_imports_without_server_dependencies() -> None:
    code = BLOCK_SERVER_DEPS + textwrap.dedent(
        """
        import trainer_hooks, wire
        import pkgutil, importlib
        for module in pkgutil.iter_modules(trainer_hooks.__path__):
            importlib.import_module(f"trainer_hooks.{module.name}")
        assert "fastapi" not in sys.modules and "sqlalchemy" not in sys.modules
        print("ok", sorted(trainer_hooks.__all__) if hasattr(trainer_hooks, "__all__") else [])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_keel_cli_help_lists_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for command in ("serve", "db", "demo", "sync", "sim", "grid", "eval-alerts", "token"):
        assert command in result.stdout


def test_packages_type_check(tmp_path) -> None:
    """mypy (config in pyproject.toml) over every package; a fresh cache, as on a clean clone."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--cache-dir",
            str(tmp_path),
            "server",
            "dashboard",
            "trainer_hooks",
            "wire",
            "learners",
            "keel",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
