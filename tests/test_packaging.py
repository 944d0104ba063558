"""trainer_hooks (with wire) goes on GPU nodes: it must import without the server's dependencies; the
base install (`pip install keel-rl`) is exactly that. The `.[server]` profile is the Docker
image's, tested in test_image.py; `.[dev]` is what `make test` installs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.installs import (
    copy_source_tree,
    fresh_venv,
    listed_commands,
    pip_install,
    product_env,
)

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


EVERY_COMMAND = {
    "backtest", "db", "demo", "eval-alerts", "export", "grid", "import", "lm", "lm-corpus", "lm-edge", "lm-grid", "lm-regimes", "parity",
    "prune", "run", "serve", "sim", "sync", "token", "watch",
}  # fmt: skip
"""What `keel --help` lists in the dev install (every extra installed: none under "Not in this install:")."""


def test_keel_cli_help_lists_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert listed_commands(result.stdout) == EVERY_COMMAND


@pytest.fixture(scope="module")
def base_install(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """`pip install .` from a copy of the tree into a fresh venv: the environment to run it in."""
    source = copy_source_tree(tmp_path_factory.mktemp("base") / "src")
    venv = fresh_venv(tmp_path_factory.mktemp("base") / "venv")
    pip_install(venv, ["."], cwd=source)
    return product_env(venv, tmp_path_factory.mktemp("home"))


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=env, cwd=env["HOME"], capture_output=True, text=True, timeout=120)


def test_the_base_install_is_the_trainer_side(base_install: dict[str, str]) -> None:
    found = _run(base_install, "python", "-c", textwrap.dedent(
        """
        import importlib.util
        from trainer_hooks import Monitor
        print(sorted(m for m in ("websockets", "cloudpickle", "fastapi", "sqlalchemy", "torch") if importlib.util.find_spec(m)))
        """
    ))  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "['cloudpickle', 'websockets']"  # cloudpickle: log_batch's decode
    assert _run(base_install, "keel", "sync", "--help").returncode == 0


def test_the_base_install_lists_the_commands_it_has(base_install: dict[str, str]) -> None:
    help_result = _run(base_install, "keel", "--help")
    assert help_result.returncode == 0, help_result.stderr
    assert listed_commands(help_result.stdout) == {"sync", "import", "export", "watch", "parity", "run"}
    assert "Not in this install:" in help_result.stdout and "serve" in help_result.stdout
    serve = _run(base_install, "keel", "serve", "--port", "8750")
    assert serve.returncode == 2
    assert serve.stderr.strip() == "keel serve: not in this install: needs fastapi (keel-rl[server])"
    grid = _run(base_install, "keel", "grid")
    assert grid.returncode == 2 and "needs torch (keel-rl[torch])" in grid.stderr


def test_the_wheel_holds_every_file_of_the_packages(tmp_path: Path) -> None:
    """What `pip install .` (and so the image) gets: every tracked file of the packages, the
    live updater's scripts under dashboard/assets/live/ among them."""
    import zipfile

    source = copy_source_tree(tmp_path / "src")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    packages = ("server", "dashboard", "trainer_hooks", "wire", "learners", "keel", "migrations")
    tracked = subprocess.run(["git", "ls-files", *packages], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert any(path.startswith("dashboard/assets/live/") for path in tracked)
    assert sorted(set(tracked) - shipped) == []
