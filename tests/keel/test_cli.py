"""Which commands an install has (keel/cli.py's rule), on command modules written to disk:
a package or a dependency that is not installed leaves its commands out; a module that
fails to import once everything it needs is there is a bug, and raises."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.cli import build_parser, installed_commands, main
from tests.support.installs import listed_commands

COMMAND_MODULE = textwrap.dedent(
    """
    import argparse

    def _run(args: argparse.Namespace) -> int:
        print("ran", args.times)
        return 0

    def _add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--times", type=int, default=1)

    COMMANDS = {"%s": ("Do the thing.", _add, _run)}
    """
)


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package on sys.path holding `present` (command `thing`) and `broken` (a typo in an import)."""
    name = f"keel_test_commands_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "present.py").write_text(COMMAND_MODULE % "thing")
    (tmp_path / name / "broken.py").write_text(f"import {name}.no_such_modul\n" + COMMAND_MODULE % "broken")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [module for module in sys.modules if module.startswith(name)]:
        del sys.modules[module]


def test_a_module_with_everything_it_needs_is_listed_and_runs(package: str, capsys: pytest.CaptureFixture[str]) -> None:
    commands = installed_commands({f"{package}.present": ("json",)})
    assert set(commands.available) == {"thing"} and commands.missing == {}
    assert main(["thing", "--times", "3"], commands) == 0
    assert capsys.readouterr().out == "ran 3\n"


def test_a_package_that_is_not_installed_is_left_out_unnamed(package: str) -> None:
    commands = installed_commands({"keel_no_such_package.cli": (), f"{package}.present": ()})
    assert set(commands.available) == {"thing"} and commands.missing == {}


def test_a_missing_dependency_leaves_the_commands_out_and_says_why(package: str, capsys: pytest.CaptureFixture[str]) -> None:
    commands = installed_commands({f"{package}.present": ("keel_no_such_dependency", "json", "torch_absent_too")})
    assert commands.available == {}
    assert commands.missing == {"thing": ("keel_no_such_dependency", "torch_absent_too")}
    help_text = build_parser(commands).format_help()
    assert listed_commands(help_text) == set()
    assert "Not in this install: thing (needs keel_no_such_dependency, torch_absent_too)." in " ".join(help_text.split())
    assert main(["thing", "--times", "3"], commands) == 2
    assert capsys.readouterr().err == "keel thing: not in this install: needs keel_no_such_dependency, torch_absent_too\n"


def test_a_module_that_fails_to_import_with_everything_installed_raises(package: str) -> None:
    with pytest.raises(ModuleNotFoundError) as raised:
        installed_commands({f"{package}.present": (), f"{package}.broken": ()})
    assert raised.value.name == f"{package}.no_such_modul"


def test_a_full_install_has_every_command() -> None:
    """The dev install (`make test`'s) has every extra: nothing is left out."""
    commands = installed_commands()
    assert commands.missing == {}
    assert {"serve", "db", "token", "backtest", "sync", "grid", "lm", "demo", "eval-alerts"} <= set(commands.available)
