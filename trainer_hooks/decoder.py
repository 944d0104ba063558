"""`log_batch`'s `decode`, sent to the Monitor's worker process.

The worker is a process of its own (a fresh interpreter, `link.py`), so `decode` travels
pickled, with cloudpickle: a function the worker could not import by name (a lambda, a
closure, a function of the script being run, `__main__` in a plain `python train.py`) goes
by value, its code and what it refers to (the tokenizer a lambda calls, pickled as pickle
does). A function of an importable module (a tokenizer's method, a helper in a sibling file
of the script) goes by reference and is imported in the worker: the trainer's `sys.path`
goes with it (`import_path`), so what the trainer imports the worker finds.

What cannot be pickled (a decode holding a socket, a lock, an open file) raises in `dumps`;
the Monitor then says why, once, and the samples carry token ids without text.
"""

from __future__ import annotations

import os
import pickle
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["dumps", "import_path", "loads", "same"]


def dumps(decode: Any) -> bytes:
    """`decode` pickled for the worker; raises (pickle.PicklingError, TypeError, ...) for one
    that cannot be pickled."""
    import cloudpickle  # only once a decode is given

    return bytes(cloudpickle.dumps(decode, protocol=pickle.HIGHEST_PROTOCOL))


def import_path() -> tuple[str, ...]:
    """This process's `sys.path`, absolute (the worker's working directory may differ, and
    "" means the current one)."""
    return tuple(os.path.abspath(entry) if entry else os.getcwd() for entry in sys.path if isinstance(entry, str))


def loads(blob: bytes, path: Sequence[str] = (), *, own_process: bool = True) -> Any:
    """The decode pickled by `dumps`, importing with the trainer's `path` first: `sys.path`
    becomes `path` followed by this process's entries it lacks (modules already imported
    stay). `own_process=False` (a worker on a thread of the trainer itself) leaves
    `sys.path` alone: it is the trainer's already."""
    if own_process and path and list(path) != sys.path[: len(path)]:
        sys.path[:] = [*path, *(entry for entry in sys.path if entry not in path)]
    return pickle.loads(blob)


def same(a: Any, b: Any) -> bool:
    """Does `a` stand for the decode `b` (already sent)? A new object per call is usual: a
    bound method (`tok.convert_ids_to_tokens` is a fresh one at each attribute access), or a
    lambda written in the call (a fresh function each time, of the same code). Such a one is
    the same when its code, globals, closure and defaults are the same objects."""
    if a is b:
        return True
    if a is None or b is None or type(a) is not type(b):
        return False
    if isinstance(a, types.MethodType | types.BuiltinMethodType):
        return a.__self__ is b.__self__ and (
            same(a.__func__, b.__func__) if isinstance(a, types.MethodType) else a.__name__ == b.__name__
        )
    if isinstance(a, types.FunctionType):
        return (
            a.__code__ is b.__code__
            and a.__globals__ is b.__globals__
            and _same_items(_contents(a.__closure__), _contents(b.__closure__))
            and _same_items(a.__defaults__, b.__defaults__)
            and _same_items(tuple((a.__kwdefaults__ or {}).items()), tuple((b.__kwdefaults__ or {}).items()))
        )
    return False


_EMPTY = object()


def _contents(closure: tuple[types.CellType, ...] | None) -> tuple[Any, ...] | None:
    if closure is None:
        return None
    values = []
    for cell in closure:
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            values.append(_EMPTY)
    return tuple(values)


def _same_items(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x is y or (isinstance(x, tuple) and isinstance(y, tuple) and _same_items(x, y)) for x, y in zip(a, b, strict=True)
    )
