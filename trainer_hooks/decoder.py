"""`log_batch`'s `decode`, pickled for the Monitor's worker process.

The worker is a process of its own, so `decode` travels pickled, by reference: the worker
imports the function's module. A function defined in the script being run lives in
`__main__`, which in the worker is the worker itself. As multiprocessing does, a script run
as a module (`python -m pkg.train`) is found again under its import name (`pkg.train`,
imported in the worker without running its `if __name__ == "__main__":` block). A plain
`python train.py` has no import name: such a `decode` (and a lambda, or a function defined
inside another) is refused here with a message that says what to pass instead; the samples
then carry token ids without text.
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import types
from typing import Any

__all__ = ["dumps", "load_attr"]


def load_attr(module: str, qualname: str) -> Any:
    """`module`'s attribute `qualname` (dotted for a class's member), importing `module`."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, types.FunctionType | type) or getattr(obj, "__module__", None) != "__main__":
            return NotImplemented
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        where = "in a function" if "<locals>" in obj.__qualname__ else "in the script being run (__main__)"
        if spec is None or "<" in obj.__qualname__:
            raise pickle.PicklingError(
                f"{obj.__qualname__} is defined {where}, which the Monitor's worker process cannot import; "
                "pass a tokenizer's convert_ids_to_tokens, or a function defined in a module"
            )
        return load_attr, (spec.name, obj.__qualname__)


def dumps(decode: Any) -> bytes:
    """`decode` pickled for the worker; raises pickle.PicklingError (or what pickling raises)
    for one the worker could not load."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(decode)
    return buffer.getvalue()
