"""The `keel` command.

Subcommands live next to what they drive; each module listed in `_COMMAND_MODULES`
exposes `COMMANDS = {name: (help, add_arguments, run)}` and must import only
the standard library at module level, so `keel sync` works on a GPU node that
has neither the server's dependencies nor (for some commands) torch.

Which commands an install has. The install profiles hold different parts of Keel:
`pip install keel-rl` (a GPU node) has no server dependencies and maybe no torch, the
Docker image (`.[server]`, Dockerfile) has no `learners/` and no torch. So each command
module names, in `_COMMAND_MODULES`, the top-level modules it needs beyond the base
install; for an extra of pyproject.toml that is one module the extra installs (pip
installs an extra whole). The rule:

- the module's own package is not installed (the image has no `learners/`): its
  commands are left out, unnamed;
- a module it needs is not installed: its commands are left out of the list in
  `keel --help` (named below it), and running one says what it needs;
- otherwise the module is imported, and any error on the way is raised. Presence is
  checked before importing (`importlib.util.find_spec`), never inferred from a
  ModuleNotFoundError, so one raised here is a bug (a typo, a dependency missing from
  pyproject.toml, a half-installed extra), not a profile, and is not hidden.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TextIO

_COMMAND_MODULES: Mapping[str, tuple[str, ...]] = {
    "server.cli": ("fastapi",),
    "keel.backtest": ("fastapi",),
    "learners.toy_cli": ("torch",),
    "learners.lm_cli": ("torch",),
    "keel.demo": ("fastapi", "torch", "learners"),  # demo, eval-alerts: a server and the learners
    "keel.parity": (),
    "keel.run": (),
    "keel.sync": (),
    "keel.transfer": (),
    "keel.watch": (),
}

_INSTALLED_BY = {
    "fastapi": "keel-rl[server]",
    "torch": "keel-rl[torch]",
    "learners": "left out of this install",  # every pip install has it; the server image does not
}
"""What installs a needed module, named where it is missing."""

CommandSpec = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


class Commands(NamedTuple):
    available: dict[str, CommandSpec]
    missing: dict[str, tuple[str, ...]]
    """Commands whose package is installed but not everything they need: name -> the absent modules."""


def _installed(top_level: str) -> bool:
    return importlib.util.find_spec(top_level) is not None


def installed_commands(modules: Mapping[str, tuple[str, ...]] = _COMMAND_MODULES) -> Commands:
    """The commands of this install, by the rule of the module docstring."""
    commands = Commands({}, {})
    for module_name, needs in modules.items():
        if not _installed(module_name.partition(".")[0]):
            continue
        absent = tuple(need for need in needs if not _installed(need))
        module: Any = importlib.import_module(module_name)
        if absent:
            commands.missing.update(dict.fromkeys(module.COMMANDS, absent))
        else:
            commands.available.update(module.COMMANDS)
    return commands


def _needs(absent: tuple[str, ...]) -> str:
    return "needs " + ", ".join(f"{name} ({_INSTALLED_BY[name]})" if name in _INSTALLED_BY else name for name in absent)


def _missing_epilog(missing: dict[str, tuple[str, ...]]) -> str | None:
    by_needs: dict[tuple[str, ...], list[str]] = {}
    for name, absent in sorted(missing.items()):
        by_needs.setdefault(absent, []).append(name)
    groups = [f"{', '.join(names)} ({_needs(absent)})" for absent, names in by_needs.items()]
    return f"Not in this install: {'; '.join(groups)}." if groups else None


def build_parser(commands: Commands | None = None) -> argparse.ArgumentParser:
    available, missing = commands if commands is not None else installed_commands()
    parser = argparse.ArgumentParser(
        prog="keel",
        description="Keel: live stability monitoring for off-policy RL training.",
        epilog=_missing_epilog(missing),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_arguments, run) in sorted(available.items()):
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command_parser)
        command_parser.set_defaults(_run=run)
    return parser


_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")
"""What a terminal acts on instead of showing: C0 and C1 controls (ESC starts the sequences
that move the cursor, erase a line or set a title), a carriage return not ending a line
(it rewrites the line), and the bidirectional overrides (they reorder what is shown). A tab
and a line end are text."""


def printable(text: str) -> str:
    """`text` with every control a terminal would act on written as its escape (`\\x1b`)."""
    return _UNPRINTABLE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def one_line(text: str) -> str:
    """`text` (a name, a key, a message a trainer chose) as part of one line of output:
    `printable`, and its line breaks escaped too. The stream keeps line ends as text, the
    command's own; one inside a name would start a line the name wrote (a verdict, say)."""
    return printable(text).replace("\r", "\\r").replace("\n", "\\n")


class _Printable:
    """A text stream that writes `printable(text)`: what a trainer named a run, a metric or
    a command reaches a `keel` command's terminal as text, never as a control sequence."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None, commands: Commands | None = None) -> int:
    """Run a `keel` command. Everything it prints to stdout and stderr goes through
    `printable` (names, keys and messages come from trainers and servers)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = commands if commands is not None else installed_commands()
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(out), _Printable(err)  # type: ignore[assignment]
    try:
        if argv and argv[0] in commands.missing:
            print(f"keel {argv[0]}: not in this install: {_needs(commands.missing[argv[0]])}", file=sys.stderr)
            return 2
        args = build_parser(commands).parse_args(argv)
        return int(args._run(args) or 0)
    finally:
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    sys.exit(main())
