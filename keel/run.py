"""`keel run -- CMD ARGS...`: run a training command unchanged and stream the metrics it prints
to Keel as a run, with no line of Keel in it. docs/integrations/run.md.

    keel run --server http://keel-host:8750 --name grpo-7b -- python train.py --lr 1e-6

- The child is the command, in keel run's process group, with its stdin, environment and
  working directory. Its stdout and stderr are relayed byte for byte to keel run's own file
  descriptors 1 and 2 (never through `keel.cli.printable`, which escapes control characters
  in what Keel itself prints): colours and `\\r` progress bars are kept. Where keel run's
  stdout (stderr) is a terminal the child's is a pseudo-terminal of its own (output
  post-processing off, so no byte changes; the window size copied, and again on SIGWINCH), so
  the child colours and draws its bars as it would without Keel; where it is a pipe or a file,
  the child's is a pipe and `PYTHONUNBUFFERED=1` is set, so a Python trainer's lines arrive
  as it prints them.
- Every line of both streams goes through keel/console.py (verl's `step:N - k:v`, the Hugging
  Face Trainer's and TRL's dicts, JSON lines, `key=value` lines with a step token); what it
  recognises is logged to a trainer_hooks.Monitor under Keel's names (`--framework`, `auto`
  as `keel watch`). A step that goes back to 0 or 1 starts a new run (`<name> (2)`) unless
  `--resume`.
- Signals. SIGINT and SIGTERM are blocked in keel run and taken with `sigtimedwait`, so the
  kernel tells who sent them: a Ctrl-C at the terminal reaches the child by itself (the
  foreground process group), and keel run only waits; a SIGINT sent to keel run alone
  (`kill -INT`), or any SIGTERM, is passed to the child. keel run ends when the child has.
- The `stop` command (docs/alerts.md, "Acting on an alert"; the run page's Stop button)
  sends the child SIGINT, SIGTERM `--stop-grace` seconds later if it still runs, and SIGKILL
  as long again after that. Other commands fail with a message saying so.
- The end. Exit status 0 finishes the run `finished`; a child ended by a signal, or after a
  stop, `killed`; any other status `failed`. The Monitor has no field for why a run failed,
  so the exit status, the signal and the last `STDERR_TAIL` lines of stderr (as a terminal
  shows them: the text after a line's last `\\r`, colours taken out, credentials masked) are
  added to the run's config under `keel_run.exit` (`PATCH /api/v1/runs/{id}`), with the
  framework chosen. keel run exits with the child's status (128 + N for a child killed by
  signal N, as a shell reports it).
- Keel never holds the child up: the Monitor's `log` never waits or raises, its worker spools
  to disk and resends after an outage (`keel sync` uploads what a dead server never took);
  a Monitor that cannot start, or a reader that fails, is said once and the command runs on.
- The run's config records `keel_run.command` (the command line with credentials masked,
  keel/redact.py) and `keel_run.cwd`.

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

    from keel.console import ConsoleStream, LineSplitter, Named
    from trainer_hooks import Monitor
    from trainer_hooks.signals import Command

__all__ = ["COMMANDS", "Runner", "default_name"]

STDERR_TAIL = 20
"""Lines of the child's stderr recorded when it fails."""
_TAIL_BYTES = 64 * 1024
_DRAIN_AFTER_EXIT_S = 2.0
"""How long the output is read after the child exited (a process it started may hold it)."""
_SI_KERNEL = 0x80
"""siginfo's si_code of a signal the kernel sent (a terminal's Ctrl-C), not a process."""
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def default_name(command: Sequence[str]) -> str:
    """The run's name when --name is not given: the script or module a Python command runs
    (`python train.py` -> `train`, `python -m pkg.main` -> `pkg.main`), else the program."""
    program = Path(command[0]).name
    if program.startswith("python") or program in ("torchrun", "accelerate", "deepspeed", "uv"):
        rest = list(command[1:])
        while rest:
            arg = rest.pop(0)
            if arg == "-m" and rest:
                return rest[0]
            if arg.endswith(".py"):
                return Path(arg).stem
    return program or "keel-run"


class _Output:
    """One of the child's streams: relayed to `target` (1 or 2) as it comes, split into lines."""

    def __init__(self, read_fd: int, target: int) -> None:
        from keel.console import LineSplitter

        self.fd = read_fd
        self.target = target
        self.writable = True
        self.splitter: LineSplitter = LineSplitter()
        self.tail = bytearray()

    def relay(self, data: bytes) -> None:
        if self.target == 2:
            self.tail += data
            if len(self.tail) > 2 * _TAIL_BYTES:
                del self.tail[:-_TAIL_BYTES]
        view = memoryview(data)
        while self.writable and view:
            try:
                view = view[os.write(self.target, view) :]
            except InterruptedError:
                continue
            except OSError:  # the reader of keel run's output went away: the child goes on
                self.writable = False


def _terminal_lines(raw: bytes, count: int) -> list[str]:
    """The last `count` non-empty lines of `raw` as a terminal leaves them, credentials masked."""
    from keel.console import strip_terminal
    from keel.redact import redact

    lines = []
    for line in raw.decode("utf-8", "replace").split("\n"):
        shown = strip_terminal(line.rstrip("\r").rsplit("\r", 1)[-1])
        if shown:
            lines.append(redact(shown)[:1000])
    return lines[-count:]


class Runner:
    """One `keel run`: the child, its output, the Monitors of its runs."""

    def __init__(self, args: argparse.Namespace, command: list[str]) -> None:
        from keel.console import ConsoleStream
        from keel.redact import redact_argv

        self.args = args
        self.command = command
        self.token: str | None = args.token if args.token is not None else os.environ.get("KEEL_TOKEN")
        self.name: str = args.name or default_name(command)
        self.config: dict[str, Any] = {"keel_run": {"command": redact_argv(command), "cwd": os.getcwd()}}
        self.stream: ConsoleStream = ConsoleStream(args.framework, resume=args.resume)
        self.process: subprocess.Popen[bytes] | None = None
        self.outputs: list[_Output] = []
        self._ptys: list[tuple[int, int]] = []  # (master, the terminal it copies its size from)
        self.monitor: Monitor | None = None
        self.monitors: list[Monitor] = []
        self._finishing: list[threading.Thread] = []
        self._reading = True
        self._warned_unreadable = False
        self._steps = 0
        self._stop_lock = threading.Lock()
        self.stopped_by: str | None = None
        self.signalled = False
        self._keel_ok = True

    def say(self, text: str) -> None:
        """One line of keel run's own (a name in it, a rule's say, is escaped: keel.cli.one_line)."""
        from keel.cli import one_line

        print(f"keel run: {one_line(text)}", file=sys.stderr, flush=True)

    # -- the child ----------------------------------------------------------------------

    def start(self) -> None:
        import subprocess

        env = dict(os.environ)
        ends: list[int] = []
        for target in (1, 2):
            if os.isatty(target):
                read_fd, write_fd = self._pty(target)
            else:
                read_fd, write_fd = os.pipe()
                env["PYTHONUNBUFFERED"] = "1"
            self.outputs.append(_Output(read_fd, target))
            ends.append(write_fd)
        try:
            self.process = subprocess.Popen(self.command, stdout=ends[0], stderr=ends[1], env=env)
        except BaseException:
            for output in self.outputs:
                os.close(output.fd)
            raise
        finally:
            for fd in ends:
                os.close(fd)

    def _pty(self, target: int) -> tuple[int, int]:
        import pty
        import termios

        master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # no "\n" -> "\r\n": the bytes arrive as written
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        self._ptys.append((master, target))
        self._copy_size(master, target)
        return master, slave

    @staticmethod
    def _copy_size(master: int, terminal: int) -> None:
        import fcntl
        import termios

        try:
            size = fcntl.ioctl(terminal, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(master, termios.TIOCSWINSZ, size)
        except OSError:
            pass

    def _on_winch(self, *_: Any) -> None:
        for master, terminal in self._ptys:
            self._copy_size(master, terminal)

    # -- Keel ---------------------------------------------------------------------------

    def _open_monitor(self) -> Monitor | None:
        if not self._keel_ok:
            return None
        from trainer_hooks import Monitor

        number = len(self.monitors) + 1
        name = self.name if number == 1 else f"{self.name} ({number})"
        try:
            monitor = Monitor(self.args.server, run_name=name, project=self.args.project, group=self.args.group,
                              config=self.config, tags=self.args.tag, token=self.token)  # fmt: skip
            grace = self.args.stop_grace
            monitor.on_command(self._on_command, {"stop": f"interrupts the command (SIGINT, then SIGTERM after {grace:g} s)"})
        except Exception as exc:  # noqa: BLE001 - Keel's failure is never the command's
            self._keel_ok = False
            self.say(f"not streaming to Keel ({exc!r}); the command runs on without it")
            return None
        self.monitors.append(monitor)
        return monitor

    def _on_command(self, command: Command) -> str:  # a stop: the only action it names
        return self.stop(f"stop command from {command.requested_by or 'the server'}")

    def stop(self, why: str) -> str:
        """SIGINT now, SIGTERM after --stop-grace s, SIGKILL as long again after that."""
        process = self.process
        assert process is not None
        with self._stop_lock:
            if self.stopped_by is not None:
                return f"already stopping ({self.stopped_by})"
            self.stopped_by = why
        grace = self.args.stop_grace
        self.say(f"{why}: sending SIGINT to {process.pid}")
        process.send_signal(signal.SIGINT)
        self._later(grace, signal.SIGTERM)
        return f"SIGINT sent to pid {process.pid}; SIGTERM after {grace:g} s if it still runs"

    def _later(self, delay: float, signum: int) -> None:
        def escalate() -> None:
            process = self.process
            if process is None or process.poll() is not None:
                return
            self.say(f"the command still runs {delay:g} s after the last signal: sending {signal.Signals(signum).name}")
            process.send_signal(signum)
            if signum == signal.SIGTERM:
                self._later(delay, signal.SIGKILL)

        timer = threading.Timer(delay, escalate)
        timer.daemon = True
        timer.start()

    def _lines(self, lines: list[str]) -> None:
        if not self._reading or not lines:
            return
        try:
            for named in self.stream.feed(lines):
                self._log(named)
            self._report_unreadable()
        except Exception as exc:  # noqa: BLE001 - a reader's bug must not touch the command
            self._reading = False
            self.say(f"reading metrics stopped ({exc!r}); the command's output still passes through")

    def _log(self, named: Named) -> None:
        if named.new_run and self.monitor is not None:
            old = self.monitor
            finishing = threading.Thread(target=old.finish, kwargs={"timeout": self.args.finish_timeout}, daemon=True)
            finishing.start()
            self._finishing.append(finishing)
            self.monitor = self._open_monitor()
            self.say(f"the step went back to {named.step}: a new run")
        if self.monitor is not None and named.values:
            self.monitor.log(named.step, named.values)
            self._steps += 1

    def _report_unreadable(self) -> None:
        parser = self.stream.parser
        if parser.unreadable and not self._warned_unreadable:
            self._warned_unreadable = True
            self.say(f"a line that looks like metrics could not be read (skipped, counted): {parser.first_unreadable!r}")

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        import selectors

        assert self.process is not None
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # before any thread: they inherit it
        if self._ptys:
            signal.signal(signal.SIGWINCH, self._on_winch)
        self.monitor = self._open_monitor()
        selector = selectors.DefaultSelector()
        for output in self.outputs:
            selector.register(output.fd, selectors.EVENT_READ, output)
        exited_at: float | None = None
        while selector.get_map():
            for key, _ in selector.select(timeout=0.1):
                output = key.data
                try:
                    data = os.read(output.fd, 65536)
                except OSError:  # EIO: a pseudo-terminal whose other end is closed
                    data = b""
                if not data:
                    selector.unregister(output.fd)
                    os.close(output.fd)
                    self._lines(output.splitter.close())
                    continue
                output.relay(data)
                self._lines(output.splitter.feed(data))
            self._take_signals()
            if self.process.poll() is not None:
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > _DRAIN_AFTER_EXIT_S:
                    break
        for key in list(selector.get_map().values()):
            os.close(key.fd)
        selector.close()
        while True:
            try:
                code = self.process.wait(timeout=0.1)
                break
            except Exception:  # subprocess.TimeoutExpired
                self._take_signals()
        self._lines_end()
        self._finish(code)
        return code if code >= 0 else 128 - code

    def _take_signals(self) -> None:
        while True:
            info = signal.sigtimedwait(_SIGNALS, 0)
            if info is None:
                return
            self.signalled = True
            if info.si_signo == signal.SIGINT and info.si_code == _SI_KERNEL:
                continue  # a Ctrl-C: the terminal sent it to the child's process group too
            assert self.process is not None
            self.process.send_signal(info.si_signo)

    def _lines_end(self) -> None:
        if self._reading:
            try:
                for named in self.stream.close():
                    self._log(named)
            except Exception as exc:  # noqa: BLE001
                self.say(f"reading metrics stopped ({exc!r})")

    # -- the end ------------------------------------------------------------------------

    def _finish(self, code: int) -> None:
        if code == 0:
            status = "finished"
        elif code < 0 or self.stopped_by is not None or self.signalled:
            status = "killed"
        else:
            status = "failed"
        parser = self.stream.parser
        formats = ", ".join(f"{kind} {count}" for kind, count in sorted(parser.kinds.items()))
        summary = f"{parser.records} metrics line(s) read ({formats or 'none recognised'})"
        if parser.unreadable:
            summary += f", {parser.unreadable} unreadable"
        if self.stream.decided:
            summary += f"; names: framework {self.stream.framework or 'none'} ({self.stream.why})"
        exit_info: dict[str, Any] = {"code": code if code >= 0 else None, "status": status}
        if code < 0:
            try:
                exit_info["signal"] = signal.Signals(-code).name
            except ValueError:
                exit_info["signal"] = -code
        if self.stopped_by:
            exit_info["stopped_by"] = self.stopped_by
        if status != "finished":
            stderr = next((output for output in self.outputs if output.target == 2), None)
            exit_info["stderr_tail"] = _terminal_lines(bytes(stderr.tail), STDERR_TAIL) if stderr else []
        for thread in self._finishing:
            thread.join(self.args.finish_timeout + 15)
        monitor = self.monitor
        if monitor is None:
            self.say(f"the command ended ({status}, exit {code}); {summary}; nothing streamed to Keel")
            return
        delivered = monitor.finish(status, timeout=self.args.finish_timeout)
        self.say(f"the command ended ({status}, exit {code}); {summary}; run {monitor.url}")
        if delivered:
            keel_run = {**self.config["keel_run"], "exit": exit_info,
                        "framework": self.stream.framework, "framework_why": self.stream.why}  # fmt: skip
            self._patch_config(monitor.run_id, {"keel_run": keel_run})

    def _patch_config(self, run_id: str, config: dict[str, Any], timeout: float = 15.0) -> None:
        from keel.config_push import ConfigPush

        push = ConfigPush(self.args.server, run_id, self.token, timeout=5.0, backoff_max=2.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            push.send(config)
            sent = push.result()
            if sent is not None and (sent.error is None or sent.final):
                if sent.error is not None:
                    self.say(f"the exit status was not added to the run's config ({sent.error})")
                return
            time.sleep(0.05)
        self.say("the exit status was not added to the run's config (the server did not answer)")


def _add_run(parser: argparse.ArgumentParser) -> None:
    from keel.importers import FRAMEWORK_CHOICES
    from wire.urls import DEFAULT_SERVER_URL

    parser.add_argument("--server", default=None, help=f"Keel server URL (default: $KEEL_URL, else {DEFAULT_SERVER_URL})")
    parser.add_argument("--project", default="default", help="Keel project of the run (default: default)")
    parser.add_argument("--name", default=None, help="run name (default: the script or program, e.g. train)")
    parser.add_argument("--group", default=None, help="Keel group of the run")
    parser.add_argument("--tag", action="append", default=[], help="a tag to add (repeatable)")
    parser.add_argument("--token", default=None, help="API token with ingest scope (default: $KEEL_TOKEN)")
    parser.add_argument("--framework", choices=FRAMEWORK_CHOICES, default="auto",
                        help="whose metric names to map to Keel's (default auto: recognised from the names)")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="a step that goes back to 0 or 1 goes on in the same run (default: it starts a new run)")  # fmt: skip
    parser.add_argument("--stop-grace", type=float, default=30.0,
                        help="after a stop command's SIGINT, seconds until SIGTERM (and as long again until SIGKILL; default 30)")  # fmt: skip
    parser.add_argument("--finish-timeout", type=float, default=30.0,
                        help="seconds to wait at the end for the server to take the run's last points (default 30)")  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                        help="the command to run, after --")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    import logging

    from trainer_hooks.sender import ingest_url
    from wire import Hello, ProtocolError, RunInfo
    from wire.urls import default_server

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("keel run: no command given: keel run [options] -- CMD ARGS...", file=sys.stderr)
        return 2
    args.server = default_server(args.server)
    try:
        ingest_url(args.server)
    except ValueError as exc:
        print(f"keel run: {exc}", file=sys.stderr)
        return 2
    runner = Runner(args, command)
    try:  # the server's own check of the run's description, before the command starts
        Hello.from_json(Hello(RunInfo(id="00000000-0000-0000-0000-000000000000", name=runner.name,
                                      project=args.project, group=args.group, config=runner.config, tags=args.tag)).to_json())  # fmt: skip
    except ProtocolError as exc:
        print(f"keel run: the server would refuse this run: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        runner.start()
    except FileNotFoundError:
        print(f"keel run: {command[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError as exc:
        print(f"keel run: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return runner.run()


COMMANDS = {
    "run": (
        "Run a training command and stream the metrics it prints to Keel (no code: verl, TRL, any loop that prints).",
        _add_run,
        _run,
    ),
}
