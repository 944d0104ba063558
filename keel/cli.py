"""The `keel` command.

Subcommands live next to what they drive; each module listed in `_COMMAND_MODULES`
exposes `COMMANDS = {name: (help, add_arguments, run)}` and must import only
the standard library at module level, so `keel sync` works on a GPU node that
has neither the server's dependencies nor (for some commands) torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

_COMMAND_MODULES = (
    "server.commands",
    "learners.toy_cli",
    "learners.lm_cli",
    "keel.sync",
    "keel.transfer",
    "keel.commands",
)

CommandSpec = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _command_specs() -> dict[str, CommandSpec]:
    specs: dict[str, CommandSpec] = {}
    for module_name in _COMMAND_MODULES:
        try:
            module: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        specs.update(module.COMMANDS)
    return specs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keel", description="Keel: live stability monitoring for off-policy RL training."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_arguments, run) in sorted(_command_specs().items()):
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command_parser)
        command_parser.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
