"""Read Keel's REST API from a notebook or script (docs/read-api.md).

    from keel.client import Client
    client = Client("http://127.0.0.1:8750")
    client.runs(project="default", as_="pandas")
    loss = client.series("cispo-lag8-s0", "loss/policy")           # every point, numpy
    df = client.series(run_id, "grad/norm", as_="pandas")          # a pandas Series by step

The HTTP is the standard library's urllib, not httpx: the base install (what a GPU node
or a bare notebook has) carries websockets and cloudpickle only, and a few JSON GETs need
nothing more. numpy and pandas are imported only when a method returns them.

`series` returns every stored point unless `max_points` asks for the server's bucketed
downsampling: the series endpoint answers at most 100 000 points at full resolution, so a
longer series is read as consecutive step ranges and joined.

Step details (histograms, worst samples, sequence sums: docs/protocol.md) come back as the
server's JSON, parsed: `distributions`, `samples`, `sample_steps`, `sequences`, and
`details` for every stored one (what `keel export` writes).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, overload

from wire import KeelError, ProtocolError, decode_value
from wire.api import ApiRun, as_read
from wire.urls import api_url

__all__ = ["Client", "ClientError", "SeriesArrays", "SERIES_PAGE_POINTS"]

SERIES_PAGE_POINTS = 100_000
"""The most points GET /runs/{id}/series returns undownsampled (its `max_points` bound)."""

RunRef = str | dict[str, Any]
"""A run id, a run name, or a run dict as `runs()` returns it."""


class ClientError(KeelError, RuntimeError):
    """A request the server refused or could not answer; `status` is the HTTP status, if any."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SeriesArrays:
    """One metric of one run: `steps` (int64) and `values` (float64, NaN and ±inf kept)."""

    key: str
    steps: Any
    values: Any
    downsampled: bool = False
    """True when `max_points` was given and the server bucketed the series."""
    mins: Any = None
    """Per bucket (downsampled only): the smallest value."""
    maxs: Any = None
    """Per bucket (downsampled only): the largest value (NaN when the bucket holds a NaN)."""


class Client:
    """A Keel server's REST reads.

    Args:
        url: the server, e.g. "http://127.0.0.1:8750" (https://, ws:// and wss:// work too;
            wire/urls.py).
        token: an API token with read scope, when the server has auth on.
        timeout: seconds per HTTP request.
        page_points: points per series request when reading at full resolution; the
            server's bound (100 000) unless a test wants pages small.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        page_points: int = SERIES_PAGE_POINTS,
    ) -> None:
        self.base = api_url(url)
        self.timeout = timeout
        self.page_points = max(1, min(page_points, SERIES_PAGE_POINTS))
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    # -- runs -----------------------------------------------------------------------------

    @overload
    def runs(
        self, project: str | None = ..., group: str | None = ..., *, as_: Literal["list"] = ...
    ) -> list[dict[str, Any]]: ...
    @overload
    def runs(self, project: str | None = ..., group: str | None = ..., *, as_: Literal["pandas"]) -> Any: ...
    def runs(
        self, project: str | None = None, group: str | None = None, *, as_: Literal["list", "pandas"] = "list"
    ) -> list[dict[str, Any]] | Any:
        """The runs, newest first: dicts of id, name, project, group, status, last_step,
        started_at, last_seen_at, finished_at, tags; or a DataFrame of them (`as_="pandas"`)."""
        params = {"project": project, "group": group}
        runs = _decoded(self._get("/runs", params), many=True)
        if as_ == "pandas":
            return _pandas().DataFrame(runs, columns=list(runs[0]) if runs else None)
        return runs

    def run(self, run: RunRef) -> dict[str, Any]:
        """One run with its `config`, by id, by name (which must be unambiguous) or by dict."""
        by_id = str(run["id"]) if isinstance(run, dict) else run
        try:
            found: dict[str, Any] = _decoded(self._get(f"/runs/{_segment(by_id)}"))
            return found
        except ClientError as exc:
            if exc.status != 404 or isinstance(run, dict):
                raise
        matches = [candidate for candidate in self.runs() if candidate["name"] == run]
        if not matches:
            raise ClientError(f"no run with id or name {run!r}", status=404)
        if len(matches) > 1:
            ids = ", ".join(match["id"] for match in matches)
            raise ClientError(f"{len(matches)} runs are named {run!r} ({ids}); pass an id")
        detail: dict[str, Any] = _decoded(self._get(f"/runs/{_segment(matches[0]['id'])}"))
        return detail

    def keys(self, run: RunRef) -> list[dict[str, Any]]:
        """The run's metric keys: dicts of key, count (points) and last_step."""
        keys: list[dict[str, Any]] = self._get(f"/runs/{_segment(self._run_id(run))}/keys")
        return keys

    # -- series ---------------------------------------------------------------------------

    @overload
    def series(
        self, run: RunRef, key: str, *, start: int | None = ..., end: int | None = ...,
        max_points: int | None = ..., as_: Literal["numpy"] = ...,
    ) -> SeriesArrays: ...
    @overload
    def series(
        self, run: RunRef, key: str, *, start: int | None = ..., end: int | None = ...,
        max_points: int | None = ..., as_: Literal["pandas"],
    ) -> Any: ...
    def series(
        self,
        run: RunRef,
        key: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_points: int | None = None,
        as_: Literal["numpy", "pandas"] = "numpy",
    ) -> SeriesArrays | Any:
        """The points of `key` with start <= step <= end.

        Every stored point by default. With `max_points` (1..100 000), the server's
        downsampling instead: at most that many buckets, each its last step and value
        plus the bucket's min and max.

        Returns `SeriesArrays` (numpy), or with `as_="pandas"` a Series of the values
        indexed by step, or a DataFrame of value, min and max when downsampled.
        """
        run_id = self._run_id(run)
        if max_points is not None:
            if not 1 <= max_points <= SERIES_PAGE_POINTS:
                raise ValueError(f"max_points must be 1..{SERIES_PAGE_POINTS}, got {max_points}")
            page = self._series_page(run_id, key, start, end, max_points)
        else:
            page = self._full_series(run_id, key, start, end)
        return _shaped(page, as_)

    def points(self, run: RunRef, key: str, *, start: int | None = None, end: int | None = None) -> tuple[list[int], list[float]]:
        """Every stored point of `key` with start <= step <= end, as plain lists (steps,
        values): `series` without numpy (the base install has none)."""
        page = self._full_series(self._run_id(run), key, start, end)
        return page["steps"], page["values"]

    def _run_id(self, run: RunRef) -> str:
        if isinstance(run, dict):
            return str(run["id"])
        return str(self.run(run)["id"])

    def _series_page(
        self, run_id: str, key: str, start: int | None, end: int | None, max_points: int
    ) -> dict[str, Any]:
        params = {"key": key, "max_points": max_points, "start": start, "end": end}
        page: dict[str, Any] = self._get(f"/runs/{_segment(run_id)}/series", params)
        for column in ("values", "min", "max"):
            if column in page:
                page[column] = [decode_value(value) for value in page[column]]
        return page

    def _full_series(self, run_id: str, key: str, start: int | None, end: int | None) -> dict[str, Any]:
        first = self._series_page(run_id, key, start, end, self.page_points)
        if not first["downsampled"]:
            return first
        # More points than one page: split [lo, hi] into step ranges expected to hold ~80%
        # of a page each (from the key's point count) and halve any range that still overflows.
        lo, hi = start or 0, first["steps"][-1]
        count = next((info["count"] for info in self.keys({"id": run_id}) if info["key"] == key), 0)
        pieces = max(2, math.ceil(min(count, hi - lo + 1) / (0.8 * self.page_points)))
        width = math.ceil((hi - lo + 1) / pieces)
        ranges = deque((a, min(a + width - 1, hi)) for a in range(lo, hi + 1, width))
        steps: list[int] = []
        values: list[float] = []
        while ranges:
            a, b = ranges.popleft()
            page = self._series_page(run_id, key, a, b, self.page_points)
            if page["downsampled"]:
                middle = (a + b) // 2
                ranges.extendleft([(middle + 1, b), (a, middle)])
                continue
            steps += page["steps"]
            values += page["values"]
        return {"key": key, "downsampled": False, "steps": steps, "values": values}

    # -- step details ---------------------------------------------------------------------

    def distributions(
        self, run: RunRef, key: str, start: int | None = None, end: int | None = None, max_steps: int | None = None
    ) -> dict[str, Any]:
        """A histogram key per step: `{"key", "edges", "steps", "counts", "nan", "bucketed",
        "left_out"}`. More than `max_steps` (server default 500, at most 5000) steps come back
        as buckets of consecutive steps, counts summed; steps whose edges differ from the
        newest step's are left out."""
        params = {"key": key, "start": start, "end": end, "max_steps": max_steps}
        found: dict[str, Any] = self._get(f"/runs/{_segment(self._run_id(run))}/distributions", params)
        return found

    def samples(self, run: RunRef, step: int | None = None) -> dict[str, Any]:
        """The worst sequences of the latest step <= `step` that has samples (the run's
        latest without it): `{"step", "samples"}`, `{"step": None, "samples": []}` if none."""
        found: dict[str, Any] = self._get(f"/runs/{_segment(self._run_id(run))}/samples", {"step": step})
        return found

    def sample_steps(self, run: RunRef) -> list[int]:
        """The steps that have samples, ascending."""
        steps: list[int] = self._get(f"/runs/{_segment(self._run_id(run))}/samples/steps")["steps"]
        return steps

    def sequences(
        self, run: RunRef, start: int | None = None, end: int | None = None, max_points: int | None = None
    ) -> dict[str, Any]:
        """(length, Σℓ) pairs of steps start..end, an even subsample of `max_points` (server
        default 5000) when there are more: `{"steps", "length", "log_ratio", "fit"}`, `fit`
        being `{"slope_per_1k", "intercept", "n"}` or None. Non-finite Σℓ are the strings
        "nan", "inf", "-inf", as on the wire."""
        params = {"start": start, "end": end, "max_points": max_points}
        found: dict[str, Any] = self._get(f"/runs/{_segment(self._run_id(run))}/sequences", params)
        return found

    def details(self, run: RunRef, *, page: int = 100) -> Iterator[dict[str, Any]]:
        """Every step detail the run has stored, each as a wire row of its own (`values`
        empty; a histogram, the samples or the sequences of one step), read `page` at a time:
        what POST /runs/{id}/points takes back."""
        path = f"/runs/{_segment(self._run_id(run))}/details"
        cursor: str | None = None
        while True:
            found = self._get(path, {"cursor": cursor, "limit": page})
            yield from found["rows"]
            cursor = found["cursor"]
            if cursor is None:
                return

    # -- HTTP -----------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        url = f"{self.base}{path}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            try:
                detail = str(json.loads(detail).get("detail", detail))
            except (ValueError, AttributeError):
                pass
            raise ClientError(f"GET {url}: HTTP {exc.code}: {detail}", status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"cannot reach {self.base}: {reason}") from None


def _decoded(raw: Any, *, many: bool = False) -> Any:
    """A run answer (a list of them, `many`) as wire.api reads it; a ClientError naming the
    field for one that is not a run."""
    try:
        return as_read(ApiRun, raw, many=many)
    except ProtocolError as exc:
        raise ClientError(f"the server's answer is not a Keel run: {exc}") from None


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _shaped(page: dict[str, Any], as_: str) -> SeriesArrays | Any:
    if as_ == "pandas":
        pd = _pandas()
        index = pd.Index(page["steps"], dtype="int64", name="step")
        if not page["downsampled"]:
            return pd.Series(page["values"], index=index, dtype="float64", name=page["key"])
        columns = {"value": page["values"], "min": page["min"], "max": page["max"]}
        return pd.DataFrame(columns, index=index, dtype="float64")
    if as_ != "numpy":
        raise ValueError(f"as_ must be 'numpy' or 'pandas', got {as_!r}")
    np = _numpy()
    downsampled = bool(page["downsampled"])
    return SeriesArrays(
        key=page["key"],
        steps=np.asarray(page["steps"], dtype=np.int64),
        values=np.asarray(page["values"], dtype=np.float64),
        downsampled=downsampled,
        mins=np.asarray(page["min"], dtype=np.float64) if downsampled else None,
        maxs=np.asarray(page["max"], dtype=np.float64) if downsampled else None,
    )


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError("Client.series returns numpy arrays: pip install numpy") from None
    return numpy


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("as_='pandas' needs pandas: pip install pandas") from None
    return pandas
