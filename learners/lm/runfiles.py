"""A corpus kept as one compact file per run, so a killed command resumes where it stopped.

`DIR/<run name>.run.gz`: gzip of one JSON object `{"name", "spec", "wall_s", "series"}`,
each series the base64 of its little-endian float32 values (NaN and ±Inf kept), only the
keys the detectors, the hazard and the alert rules read (SERIES_KEYS; a key the run did not log
is left out: the sort task logs no `response/*`). A file is written under a temporary
name and renamed, so one that exists is complete. Labels are not stored: they are taken
from the series when the corpus is read (wire.labels), so a changed definition needs
no rerun.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import struct
import sys
from array import array
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SERIES_KEYS", "SUFFIX", "done_names", "read_dir", "read_run", "write_run"]

SUFFIX = ".run.gz"
SERIES_KEYS = (
    "reward/mean", "reward/std", "mismatch/kl", "mismatch/ratio_max", "mismatch/ratio_min",
    "mismatch/ess_frac", "mismatch/unbounded_frac", "mismatch/log_ratio_p99",
    "mismatch/log_ratio_abs_mean", "mismatch/tail_frac", "mismatch/tail_frac_2",
    "mismatch/low_tail_frac", "mismatch/log_ratio_abs_rare", "mismatch/log_ratio_abs_unlikely",
    "mismatch/log_ratio_abs_likely", "gate/frac", "grad/norm", "loss/total", "policy/entropy",
    "staleness/lag_mean", "reward/zero_std_frac", "response/length_mean", "response/length_max",
    "response/truncated_frac", "response/length_cap",
)  # fmt: skip


def _pack(values: Sequence[float]) -> str:
    packed = array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def _unpack(text: str) -> list[float]:
    values = array("f")
    values.frombytes(base64.b64decode(text))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def write_run(directory: str | os.PathLike[str], run: Mapping[str, Any], keys: Collection[str] | None = SERIES_KEYS) -> Path:
    """Write one run (learners.lm.grid.run_one's dict) as DIR/<name>.run.gz, its series of
    `keys` (None: every series it has), under a temporary name and renamed (a file that
    exists is complete); its path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    series = {key: _pack(values) for key, values in run["series"].items() if keys is None or key in keys}
    body = {"name": run["name"], "spec": run["spec"], "wall_s": run.get("wall_s"), "series": series}
    path = folder / f"{run['name']}{SUFFIX}"
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with gzip.open(partial, "wt", encoding="utf-8", compresslevel=9) as handle:
        json.dump(body, handle)
    os.replace(partial, path)
    return path


def read_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One run file: {"name", "spec", "wall_s", "series": {key: [float, ...]}}."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            body = json.load(handle)
        body["series"] = {key: _unpack(text) for key, text in body["series"].items()}
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise ValueError(f"{path}: not a corpus run file ({exc})") from exc
    return dict(body)


def read_dir(directory: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every run file of `directory`, in name order."""
    for path in sorted(Path(directory).glob(f"*{SUFFIX}")):
        yield read_run(path)


def done_names(directory: str | os.PathLike[str]) -> set[str]:
    """The runs already written to `directory`."""
    return {path.name[: -len(SUFFIX)] for path in Path(directory).glob(f"*{SUFFIX}")}
