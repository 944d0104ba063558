"""Metrics a trainer prints: the one reader of console output, shared by `keel run` (the
child's stdout and stderr, keel/run.py), `keel watch FILE` (a growing console log,
keel/watch_console.py: `ConsoleStream.snapshot`/`restore` carry its state across a restart) and
`keel import console FILE` (`read_console` below). docs/integrations/run.md.

Each line is recognised on its own, by its shape (ANSI colour codes, Ray's `(main_task
pid=...)` prefix and its `[repeated Nx across cluster]` suffix taken off first):

- verl's console logger (verl 0.9.1 verl/utils/logger/aggregate_logger.py
  `concat_dict_to_str`, printed by `LocalLogger.log`): `step:N - key:value - key:value`,
  each value `pprint.pformat` of a number (`0.5`, `nan`, `np.float64(0.5)` with numpy 2).
- A Python dict or a JSON object, the whole line (a prefix such as a logging header before
  its `{` is allowed): Hugging Face's Trainer and TRL print `str(logs)` each logging step
  (transformers 5.24 trainer_callback.py `ProgressCallback.on_log` / `PrinterCallback.on_log`,
  floats formatted `.4g`, as strings). Its step is the dict's own `step`, `global_step`,
  `_step`, `iteration` or `iter` when it has one; else, for the Trainer's dict (it carries
  `epoch`), the logging call's number: the first training log is step 1, the second step 2
  (with `logging_steps: N` the Keel step is the call's number, not N times it); an evaluation
  dict (only `eval_*` keys) or the end-of-training summary (`train_runtime`) is stored at the
  step of the last training log. The Trainer's names become what transformers' `rewrite_logs`
  makes of them for wandb and TensorBoard (`loss` -> `train/loss`, `eval_loss` ->
  `eval/loss`), so the same run lands the same names whichever way it is read.
- `key=value` or `key: value` pairs on a line with a step token: `[Step i/N]`, `step=N`,
  `step:N`, `Step N`, `global_step=N`, `iter N`.

Values: numbers, `nan`, `inf` (NaN and infinities are kept as values), numbers in quotes (the
Trainer's), and `np.float64(x)`-style or `tensor(x)` wrappers. Other values (text, lists,
booleans) are not metrics: skipped, counted by key. A line that is none of these is skipped
without a word; one that has a shape's head and cannot be read (a dict cut short, a verl line
without one readable value) is counted in `LineParser.unreadable`, its first kept for a report.

Runs: a step that goes back to 0 or 1 (below the last step read) starts a new run, as does a
Trainer dict whose `epoch` goes back: one log often holds several runs back to back. With
`resume`, it does not (the run goes on; a step read twice keeps its first value, as the server
does).

Standard library only at module level (see keel/cli.py).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from keel.importers import ImportedRun, PointTable, Renamer

__all__ = ["ConsoleStream", "LineParser", "LineSplitter", "Named", "Record", "read_console", "strip_terminal"]

MAX_LINE = 256 * 1024
"""Characters of a line read at most (a longer one is not a metrics line)."""
HOLD_RECORDS = 3
"""Records held back while `--framework auto` has not recognised a framework: it decides
on the first record that holds a framework's signature name, or on this many."""

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_RAY_PREFIX = re.compile(r"^\s*\([\w.:<>-]+(?:\s+pid=\d+)?(?:,\s*ip=[0-9A-Fa-f.:]+)?\)\s?")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")

_NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"
_WRAPPED = rf"(?:(?:np|numpy|torch)\.)?(?:float|int|uint|bfloat)\d*\(\s*({_NUM})\s*\)|tensor\(\s*({_NUM})[^)]*\)|({_NUM})"
_NUMBER = re.compile(rf"^\s*(?:{_WRAPPED})\s*$", re.IGNORECASE)

_VERL = re.compile(r"(?:^|\s)step:(\d+)((?: - [^\s:][^:]*:[^ ]*)+)\s*$")
_VERL_HEAD = re.compile(r"(?:^|\s)step:\d+ - ")
_PAIR = re.compile(rf"(?<![\w./@-])([A-Za-z_][\w./@-]*)\s*[=:]\s*(?:{_WRAPPED})(?![\w.:%])", re.IGNORECASE)
_STEP_TOKENS = (
    re.compile(r"\[\s*(?:global[_ ])?step\s*[:=]?\s*(\d+)\s*(?:/\s*\d+)?\s*\]", re.IGNORECASE),
    re.compile(r"(?<![\w./-])(?:global_)?step\s*[=:]\s*(\d+)(?:\s*/\s*\d+)?(?![\w.])", re.IGNORECASE),
    re.compile(r"(?<![\w./-])step\s+(\d+)(?:\s*/\s*\d+)?(?![\w.])", re.IGNORECASE),
    re.compile(r"(?<![\w./-])iter(?:ation)?\s*[=:]?\s*(\d+)(?:\s*/\s*\d+)?(?![\w.])", re.IGNORECASE),
)
DICT_STEP_KEYS = ("step", "global_step", "_step", "iteration", "iter")
"""A dict's keys that give its step (the first present wins); never stored as metrics."""
_NAMES = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf, "infinity": math.inf,
          "true": True, "false": False, "null": None, "None": None, "True": True, "False": False}  # fmt: skip
_WRAPPERS = re.compile(r"^(?:(?:np|numpy|torch)\.)?(?:float|int|uint|bfloat)\d*$|^(?:torch\.)?tensor$|^array$")


def strip_terminal(line: str) -> str:
    """`line` without ANSI escape sequences, Ray's `(name pid=N)` prefix and its repeat note."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if line.startswith(("(", " ")):
        line = _RAY_PREFIX.sub("", line, count=1)
    if line.endswith("cluster]"):
        line = _RAY_REPEAT.sub("", line)
    return line.strip()


def number(text: str) -> float | None:
    """The number `text` prints (`0.5`, `nan`, `np.float64(0.5)`, `tensor(0.5)`), or None."""
    match = _NUMBER.match(text)
    if match is None:
        return None
    return float(next(group for group in match.groups() if group is not None))


def _literal(node: ast.AST) -> Any:
    """The value of a dict literal's node: Python's and JSON's constants, nan/inf names and
    number wrappers (`np.float64(0.5)`); ValueError for anything else (no code is run)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
        raise ValueError("a sign before a non-number")
    if isinstance(node, ast.Name):
        if node.id in _NAMES:
            return _NAMES[node.id]
        raise ValueError(f"name {node.id}")
    if isinstance(node, ast.Dict):
        return {_literal(key) if key is not None else None: _literal(value) for key, value in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Call) and node.args:
        name = ast.unparse(node.func)
        if _WRAPPERS.match(name):
            return _literal(node.args[0])
    raise ValueError(type(node).__name__)


def _as_metric(raw: Any) -> float | str:
    """A dict value as a metric value, or why it is not one."""
    if isinstance(raw, bool):
        return "a boolean, not a number"
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        value = number(raw)
        return "text" if value is None else value
    if raw is None:
        return "null"
    return f"a {type(raw).__name__}, not a number"


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flat(f"{prefix}/{key}" if prefix else str(key), inner)
    else:
        yield prefix, value


def _rewrite_hf(key: str) -> str:
    """transformers' integration_utils.rewrite_logs: what wandb and TensorBoard store."""
    if key.startswith("eval_"):
        return "eval/" + key[5:]
    if key.startswith("test_"):
        return "test/" + key[5:]
    return "train/" + key


@dataclass
class Record:
    """One metrics line: its step, its values by printed name, and what was not a number."""

    step: int
    values: dict[str, float]
    kind: str
    """"verl", "hf" (a Trainer's dict), "dict" (another dict or JSON object), "pairs"."""
    new_run: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(name, why) of the line's values that are not numbers."""


class LineParser:
    """Lines -> Records, with the step and run bookkeeping of one log (module docstring)."""

    def __init__(self, *, resume: bool = False) -> None:
        self.resume = resume
        self.unreadable = 0
        self.first_unreadable: str | None = None
        self.last_step: int | None = None
        self.records = 0
        self.kinds: Counter[str] = Counter()
        self._counted = 0  # the Trainer's logging calls of this run
        self._epoch: float | None = None

    def snapshot(self) -> dict[str, Any]:
        """The bookkeeping of the lines read so far, as JSON: `keel watch` saves it with its
        byte offset, so that a restarted watcher reads on as this parser would (no spurious
        new run, the Trainer's count going on)."""
        return {"last_step": self.last_step, "counted": self._counted, "epoch": self._epoch, "records": self.records,
                "kinds": dict(self.kinds), "unreadable": self.unreadable, "first_unreadable": self.first_unreadable}  # fmt: skip

    def restore(self, saved: dict[str, Any]) -> None:
        """Go on from a `snapshot` (`resume` stays this parser's own)."""
        self.last_step, self._counted, self._epoch = saved["last_step"], saved["counted"], saved["epoch"]
        self.records, self.kinds = saved["records"], Counter(saved["kinds"])
        self.unreadable, self.first_unreadable = saved["unreadable"], saved["first_unreadable"]

    def parse(self, line: str) -> Record | None:
        if len(line) > MAX_LINE:
            return None
        text = strip_terminal(line)
        if not text:
            return None
        try:
            record = self._verl(text)
            if record is None and "{" in text and text.endswith("}"):
                record = self._dict(text)
            if record is None and ("=" in text or ":" in text):
                record = self._pairs(text)
        except _Unreadable:
            self.unreadable += 1
            if self.first_unreadable is None:
                self.first_unreadable = text[:300]
            return None
        if record is None:
            return None
        self.records += 1
        self.kinds[record.kind] += 1
        return record

    # -- the runs ------------------------------------------------------------------------

    def _stepped(self, step: int, values: dict[str, float], kind: str, skipped: list[tuple[str, str]]) -> Record:
        new_run = self.last_step is not None and step < self.last_step and step <= 1 and not self.resume
        if new_run:
            self._counted = 0
            self._epoch = None
        self.last_step = step if self.last_step is None or new_run else max(step, self.last_step)
        return Record(step, values, kind, new_run, skipped)

    def _hf_counted(self, values: dict[str, float], skipped: list[tuple[str, str]]) -> Record:
        keys = [key for key in values if key != "train/epoch"]
        attached = any(key.startswith("train/train_") for key in keys) or (
            bool(keys) and all(key.startswith(("eval/", "test/")) for key in keys)
        )
        if attached:  # at the step of the last training log, which has the epoch already
            values.pop("train/epoch", None)
            return Record(self._counted, values, "hf", False, skipped)
        epoch = values.get("train/epoch")
        new_run = not self.resume and epoch is not None and self._epoch is not None and epoch < self._epoch
        if new_run:
            self._counted = 0
        self._counted += 1
        if epoch is not None:
            self._epoch = epoch
        self.last_step = self._counted
        return Record(self._counted, values, "hf", new_run, skipped)

    # -- the shapes ----------------------------------------------------------------------

    def _verl(self, text: str) -> Record | None:
        match = _VERL.search(text)
        if match is None:
            if _VERL_HEAD.search(text):
                raise _Unreadable
            return None
        values: dict[str, float] = {}
        skipped: list[tuple[str, str]] = []
        for part in match.group(2).split(" - ")[1:]:
            key, _, raw = part.rpartition(":")
            value = number(raw)
            if value is None:
                skipped.append((key, "not a number"))
            elif key not in values:
                values[key] = value
        if not values:
            raise _Unreadable
        return self._stepped(int(match.group(1)), values, "verl", skipped)

    def _dict(self, text: str) -> Record | None:
        start = text.index("{")
        body = text[start:]
        if not re.match(r"\{\s*['\"]", body):
            return None
        try:
            raw = _literal(ast.parse(body, mode="eval").body)
        except (SyntaxError, ValueError, RecursionError):
            raise _Unreadable from None
        if not isinstance(raw, dict):
            raise _Unreadable
        step: Any = None
        for key in DICT_STEP_KEYS:
            if key in raw:
                step = raw.pop(key)
                break
        if isinstance(step, str):
            step = number(step)
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        hf = step is None and "epoch" in raw and body[1:].lstrip().startswith("'")
        values: dict[str, float] = {}
        skipped: list[tuple[str, str]] = []
        for key, item in raw.items():
            for name, inner in _flat(str(key), item):
                name = _rewrite_hf(name) if hf else name
                value = _as_metric(inner)
                if isinstance(value, str):
                    skipped.append((name, value))
                elif name not in values:
                    values[name] = value
        if not values:
            return None  # a dict of words: not metrics
        if hf:
            return self._hf_counted(values, skipped)
        if step is None:
            self._counted += 1
            return self._stepped(self._counted, values, "dict", skipped)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise _Unreadable
        return self._stepped(step, values, "dict", skipped)

    def _pairs(self, text: str) -> Record | None:
        for token in _STEP_TOKENS:
            match = token.search(text)
            if match is not None:
                break
        else:
            return None
        rest = text[: match.start()] + " " + text[match.end() :]
        values: dict[str, float] = {}
        for pair in _PAIR.finditer(rest):
            key = pair.group(1)
            raw = next(group for group in pair.groups()[1:] if group is not None)
            if key.lower() in ("step", "global_step", "iter", "iteration") or key in values:
                continue
            values[key] = float(raw)
        if not values:
            return None
        return self._stepped(int(match.group(1)), values, "pairs", [])


class _Unreadable(Exception):
    """A line with a metrics shape's head that cannot be read."""


# -- streams of lines ---------------------------------------------------------------------


class LineSplitter:
    """Bytes in, whole lines out: a line ends at `\\n` or at a `\\r` (a progress bar's redraw
    ends the text before it). An unfinished line longer than MAX_LINE is dropped."""

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        text = self._partial + self._decoder.decode(data)
        lines = re.split(r"\r\n|\r|\n", text)
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self._partial = ""
        return lines

    def close(self) -> list[str]:
        text = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [text] if text else []


@dataclass
class Named:
    """A record under Keel's names, ready for a Monitor or a PointTable."""

    step: int
    values: dict[str, float]
    new_run: bool
    run: int
    """The run's number in this stream, from 0."""


class ConsoleStream:
    """Lines -> `Named` records: the parser, then the framework's names (`--framework`, as
    `keel watch` and `keel import` name a log's: keel/importers.py's Renamer). With `auto`,
    records are held until one of them shows a framework's signature name, or
    HOLD_RECORDS of them are read, or the stream ends (`close`)."""

    def __init__(self, framework: str = "auto", *, resume: bool = False) -> None:
        from keel.importers import PointTable

        self.parser = LineParser(resume=resume)
        self.option = framework
        self.renamer: Renamer | None = None
        self.framework: str | None = None
        self.why = ""
        self.table: PointTable = PointTable()
        """Where the names the server would refuse, and values that are not numbers, are
        counted (`skipped`); its points are not used."""
        self._held: list[Record] = []
        self.run = 0

    @property
    def decided(self) -> bool:
        return self.renamer is not None

    def snapshot(self) -> dict[str, Any]:
        """Everything this stream holds, as JSON (the parser's bookkeeping, the framework
        decided, the records held while `auto` decides, the run's number): `restore` on a
        new stream goes on exactly where this one is (`keel watch` of a console log)."""
        return {
            "parser": self.parser.snapshot(), "decided": self.renamer is not None, "framework": self.framework,
            "why": self.why, "held": [asdict(record) for record in self._held], "run": self.run,
            "skipped": [[name, why, count] for (name, why), count in self.table.skipped.items()],
        }  # fmt: skip

    def restore(self, saved: dict[str, Any]) -> None:
        from keel.importers import Renamer

        self.parser.restore(saved["parser"])
        if saved["decided"]:
            self.framework, self.why = saved["framework"], saved["why"]
            self.renamer = Renamer(self.framework)
        self._held = [Record(held["step"], held["values"], held["kind"], held["new_run"], [(name, why) for name, why in held["skipped"]])
                      for held in saved["held"]]  # fmt: skip
        self.run = saved["run"]
        self.table.skipped = Counter({(name, why): count for name, why, count in saved["skipped"]})

    def feed(self, lines: Iterable[str]) -> list[Named]:
        out: list[Named] = []
        for line in lines:
            record = self.parser.parse(line)
            if record is None:
                continue
            for name, why in record.skipped:
                self.table.skipped[(name[:60], why)] += 1
            if self.renamer is None:
                self._held.append(record)
                self._maybe_decide(final=False)
                if self.renamer is None:
                    continue
                held, self._held = self._held, []
                out += [self._name(r) for r in held]
            else:
                out.append(self._name(record))
        return out

    def close(self) -> list[Named]:
        """The records still held (the stream ended before `auto` decided)."""
        if self.renamer is None and self._held:
            self._maybe_decide(final=True)
        held, self._held = self._held, []
        return [self._name(record) for record in held]

    def _maybe_decide(self, *, final: bool) -> None:
        from keel.importers import Renamer, choose_framework

        names = {name for record in self._held for name in record.values}
        framework, why = choose_framework(self.option, names, {})
        if self.option == "auto" and framework is None and not final and len(self._held) < HOLD_RECORDS:
            return
        self.framework, self.why = framework, why
        self.renamer = Renamer(framework)

    def _name(self, record: Record) -> Named:
        assert self.renamer is not None
        if record.new_run:
            self.run += 1
        values: dict[str, float] = {}
        for column, value in record.values.items():
            if column in self.renamer.step_keys:
                continue
            name = self.renamer.name(column, self.table, record.values)
            if name is not None and name not in values:
                values[name] = value
        return Named(record.step, values, record.new_run, self.run)


# -- a whole log (`keel import console`) ---------------------------------------------------


def read_console(path: Path, *, name: str | None = None, framework: str = "auto", resume: bool = False) -> list[ImportedRun]:
    """A plain-text log of what a trainer printed (verl's console lines, the Hugging Face
    Trainer's and TRL's dicts, JSON lines, `key=value` lines with a step), read as `keel run`
    reads a command's output. A step that goes back to 0 or 1 starts a
    new run unless `resume`: one ImportedRun per run in the log, in order."""
    from keel.importers import ImportedRun, ImportSourceError, PointTable, _name

    if not path.is_file():
        raise ImportSourceError(f"{path} is not a file")
    stream = ConsoleStream(framework, resume=resume)
    tables: list[PointTable] = []
    firsts: list[str] = []

    def add(records: list[Named]) -> None:
        for named in records:
            while len(tables) <= named.run:
                tables.append(PointTable())
                firsts.append(json.dumps([named.step, named.values], sort_keys=True))
            tables[named.run].add_row(named.step, named.values.items())

    splitter = LineSplitter()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            add(stream.feed(splitter.feed(chunk)))
    add(stream.feed(splitter.close()))
    add(stream.close())
    if not tables:
        raise ImportSourceError(f"{path}: no line of metrics recognised (docs/integrations/run.md lists the formats)")
    notes = []
    parser = stream.parser
    if parser.unreadable:
        notes.append(f"{parser.unreadable} line(s) that look like metrics and cannot be read (first: {parser.first_unreadable!r})")
    runs = []
    for index, table in enumerate(tables):
        digest = hashlib.sha256(firsts[index].encode()).hexdigest()[:16]
        if index == 0:
            table.skipped.update(stream.table.skipped)
        runs.append(
            ImportedRun(
                # The file's name, the run's place in it and its first record: the same log,
                # moved or grown, imports into the same runs.
                identity=f"console/{path.name}/{index}/{digest}",
                name=_name(str(index + 1), name, single=len(tables) == 1, base=path.stem),
                table=table,
                config={"keel_import": {"source": "console", "path": str(path.resolve()), "run": index + 1,
                                        "framework": stream.framework, "formats": dict(parser.kinds)}},  # fmt: skip
                not_imported=notes if index == 0 else [],
                framework=stream.framework,
                framework_why=stream.why,
            )
        )
    return runs
