"""API models (REST bodies and responses), the types every route's input is checked with,
and the shape of error bodies. Wire frames are in wire/, the JSON of stored rows in
server/jsonview.py.

Errors: a 422 is always FastAPI's validation array, `{"detail": [{"loc", "msg", "type"}]}`,
whether a type check or the handler refused the request (`unprocessable`); every other
4xx is `{"detail": "<message>"}` (`ErrorOut`). Both are in the OpenAPI schema (`errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import HTTPException, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import AfterValidator, BaseModel, Field

from server.auth import Require, allowed, unauthorized
from server.jsonview import iso
from server.models import Run
from server.storage import KeyInfo, SeriesData
from wire import Limits, encode_value

MAX_INT = 2**31 - 1
"""Largest id of a rule, alert, silence or webhook, and largest rule step count: their
Integer columns are 32-bit on PostgreSQL."""
MAX_STEP = 2**63 - 1
"""Largest step a read may name: steps are BigInteger columns."""
MAX_NAME_LENGTH = 200
"""Characters in a name, project, group, run id or metric: their String(200) columns."""


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\x00) characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
"""Every string the API accepts, in a path, a query or a body: PostgreSQL text cannot hold
NUL, and SQLite would store what PostgreSQL refuses."""
Name = Annotated[Text, Field(max_length=MAX_NAME_LENGTH)]
RowId = Annotated[int, Path(ge=1, le=MAX_INT, description="the id the create call returned")]
Scope = Literal["ingest", "read", "admin"]
"""A token's scope (server.api_tokens.SCOPES, in its order: a test holds them equal); admin
implies the others."""


# -- errors ------------------------------------------------------------------------------


class ErrorOut(BaseModel):
    """The body of every 4xx response but 422."""

    detail: str


_ERROR_DESCRIPTIONS = {
    400: "The request could not be read: a body that is not valid JSON, a request line or headers over 16 KiB, bytes that are not HTTP",
    401: "No token, or a token without the route's scope (when auth is on)",
    404: "No such run, rule, alert, silence or webhook",
    413: "The body exceeds the server's limits",
    409: "Conflicts with what the server holds (a running run deleted without force)",
    429: "Too many writes from this client: retry after the Retry-After header's seconds",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for these error statuses (422 FastAPI documents itself)."""
    return {code: {"model": ErrorOut, "description": _ERROR_DESCRIPTIONS[code]} for code in codes}


RunId = Annotated[Text, Path(description="the run's id, as its client chose it")]


def unprocessable(message: str, *loc: str | int) -> HTTPException:
    """A refusal by the handler, in the same form as FastAPI's own validation errors."""
    return HTTPException(422, [{"loc": ["body", *loc], "msg": message, "type": "value_error"}])


class ApiRoute(APIRoute):
    """FastAPI's route, except that a validation error does not send the input back, and is
    not given to a request without the route's scope.

    The echoed input could be a secret, and a non-finite number (`1e400` parses to inf)
    cannot be written as JSON at all, which turned the 422 into a 500. FastAPI parses a
    JSON body before it resolves the route's dependencies (authentication among them): a
    body that does not parse is answered 401, not 422, unless its sender has the scope.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        scopes = [d.dependency.scope for d in self.dependencies if isinstance(d.dependency, Require)]

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                for scope in scopes:
                    if not await allowed(request, scope):
                        raise unauthorized(scope) from None
                public = [{key: error[key] for key in ("loc", "msg", "type") if key in error} for error in exc.errors()]
                raise RequestValidationError(public) from None

        return handle


class LatestPoint(BaseModel):
    """A key's last point (`GET /runs?latest=k1,k2`, `GET /runs/{id}/latest`): wire.api.LatestPoint's
    fields, in its order (a test holds them equal)."""

    step: int
    value: WireValue


class RunOut(BaseModel):
    id: str
    name: str
    project: str
    group: str | None
    status: str
    """running, finished, failed, killed, or silent (running, but nothing sent for `KEEL_SILENT_AFTER_S`)."""
    last_step: int | None
    started_at: str
    last_seen_at: str
    finished_at: str | None
    tags: list[str]
    unsent: int | None = None
    """Frames its trainer ended without getting acknowledged: in its spool, for `keel sync`
    (null: none). A run that ended this way is `finished` (or `failed`), not `silent`."""
    actions: dict[str, str] | None = None
    """The command actions the run's trainer takes, each with what it does: null while no
    trainer of the run listens to commands, {} for one that listens without saying which."""
    latest: dict[str, LatestPoint] | None = None
    """Only when asked for (`GET /runs?latest=k1,k2`): the last point of each of these keys."""

    @classmethod
    def from_run(cls, run: Run, *, now: float, silent_after_s: float) -> RunOut:
        status = run.status
        if status == "running" and now - run.last_seen_at > silent_after_s:
            status = "silent"
        return cls(
            id=run.id,
            name=run.name,
            project=run.project,
            group=run.group,
            status=status,
            last_step=run.last_step,
            started_at=iso(run.started_at) or "",
            last_seen_at=iso(run.last_seen_at) or "",
            finished_at=iso(run.finished_at),
            tags=list(run.tags or []),
            actions=run.actions,
            unsent=run.unsent,
        )


class ListedRun(RunOut):
    """A run as `GET /runs` lists it."""

    hazard: float | None = Field(
        None,
        description="only when asked for (`GET /runs?hazard=true`), and only on a running run: its current collapse "
        "hazard, the last value of `GET /runs/{id}/hazard` (null while the run warms up, or once it collapsed: "
        "see `collapsed_at`)",
    )
    collapsed_at: int | None = Field(
        None, description="with `hazard=true`, on a running run whose reward fell for good (its hazard's `collapsed_at`): "
        "the fall's first step; its hazard, a collapse ahead, is then null",
    )

    @classmethod
    def from_run(cls, run: Run, *, now: float, silent_after_s: float) -> ListedRun:
        """Without `latest` and `hazard`: a read sets them when asked for, and only those it set are answered."""
        return cls(**RunOut.from_run(run, now=now, silent_after_s=silent_after_s).model_dump(exclude_unset=True))


class RunDetail(RunOut):
    config: dict[str, Any]
    acked_seq: int

    @classmethod
    def from_run(cls, run: Run, *, now: float, silent_after_s: float) -> RunDetail:
        base = RunOut.from_run(run, now=now, silent_after_s=silent_after_s)
        return cls(**base.model_dump(), config=run.config or {}, acked_seq=run.acked_seq)


class KeyOut(BaseModel):
    key: str
    count: int
    last_step: int | None

    @classmethod
    def from_info(cls, info: KeyInfo) -> KeyOut:
        return cls(key=info.key, count=info.count, last_step=info.last_step)


class KeysOfRuns(BaseModel):
    """The metric keys of several runs (GET /keys): each known run's, as GET /runs/{id}/keys
    answers."""

    runs: dict[str, list[KeyOut]]


WireValue = float | str


class SeriesOut(BaseModel):
    key: str
    downsampled: bool
    steps: list[int]
    values: list[WireValue]
    min: list[WireValue] | None = None
    max: list[WireValue] | None = None

    @classmethod
    def from_data(cls, data: SeriesData) -> SeriesOut:
        out = cls(
            key=data.key,
            downsampled=data.downsampled,
            steps=data.steps,
            values=[encode_value(v) for v in data.values],
        )
        if data.downsampled:
            out.min = [encode_value(v) for v in data.mins or []]
            out.max = [encode_value(v) for v in data.maxs or []]
        return out


class SeriesOfRuns(BaseModel):
    """One metric of several runs (GET /series): the runs that have it, each as GET
    /runs/{id}/series answers."""

    key: str
    runs: dict[str, SeriesOut]


class HazardOut(BaseModel):
    """A run's collapse hazard: at each step past the warm-up, the estimated probability that
    the run collapses within the next `horizon` steps (docs/read-api.md)."""

    run_id: str
    horizon: int = Field(description="steps ahead the hazard speaks about")
    steps: list[int] = Field(description="ascending; a bucket's entry is the step of its highest hazard")
    hazard: list[float] = Field(description="probabilities in [0, 1], one per step (the highest of each bucket)")
    warmup: int = Field(0, description="steps of the hazard's own before it gives one (it has no baseline yet)")
    collapsed_at: int | None = Field(
        None, description="the first step of a fall of the reward that lasted (wire/labels.py, as the corpora are "
        "labelled): the hazard, a collapse ahead, no longer speaks of the run past it",
    )
    falling_since: int | None = Field(None, description="the first step of a fall of the reward not judged yet (no regain so far)")
    dips: list[int] = Field(default_factory=list, description="first steps of the reward's falls that regained")
    missing: list[str] = Field(
        default_factory=list, description="metrics the hazard reads most that the run never logged (their features sit "
        "at the fitted corpus' mean); all four: no hazard at all",
    )


class HazardOfRuns(BaseModel):
    """The collapse hazard of several runs (GET /hazard): each known run's, as GET
    /runs/{id}/hazard answers it."""

    runs: dict[str, HazardOut]


class DistributionsOut(BaseModel):
    """A histogram key of a run per step (GET /runs/{id}/distributions, docs/protocol.md)."""

    key: str
    edges: list[float] = Field(description="the newest step's bin edges ([] for a key without histograms)")
    steps: list[int] = Field(description="ascending; a bucket's entry is its last step")
    counts: list[list[int]] = Field(description="per step (or bucket, summed): one count per bin")
    nan: list[int] = Field(description="per step (or bucket, summed): the tokens whose value was NaN")
    bucketed: bool = Field(description="whether each entry is a bucket of consecutive steps")
    left_out: int = Field(description="steps left out because their edges differ from the newest step's")


class SamplesOut(BaseModel):
    """A step's worst sequences (GET /runs/{id}/samples)."""

    step: int | None = Field(description="the step they are of; null when there is none")
    samples: list[dict[str, Any]] = Field(description="worst first, each as the wire carried it (docs/protocol.md)")


class SampleStepsOut(BaseModel):
    steps: list[int] = Field(description="the steps that have samples, ascending")


class FitOut(BaseModel):
    slope_per_1k: WireValue = Field(description="Σℓ per 1,000 tokens of length")
    intercept: WireValue
    n: int = Field(description="the finite pairs the line was fitted to")


class SequencesOut(BaseModel):
    """(length, Σℓ) pairs of a run's sequences (GET /runs/{id}/sequences)."""

    steps: list[int] = Field(description="each pair's step")
    length: list[int]
    log_ratio: list[WireValue]
    fit: FitOut | None = Field(description="least squares of log_ratio on length over the finite pairs answered; null with fewer than 2 distinct lengths")


class DetailsPage(BaseModel):
    """A page of a run's stored step details (GET /runs/{id}/details), for export."""

    rows: list[dict[str, Any]] = Field(description="wire rows of one detail each (`values` empty), as POST /runs/{id}/points takes them")
    cursor: str | None = Field(description="pass it back for the next page; null on the last")


_LIMITS = Limits()
_WIRE_NUMBER: dict[str, Any] = {"anyOf": [{"type": "number"}, {"type": "string", "enum": ["nan", "inf", "-inf"]}]}
POINTS_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["rows"],
                "properties": {
                    "rows": {
                        "type": "array",
                        "maxItems": _LIMITS.max_rows,
                        "description": "the rows of one points frame (docs/protocol.md); the limits are the server's defaults",
                        "items": {
                            "type": "object",
                            "required": ["step", "values"],
                            "properties": {
                                "step": {"type": "integer", "minimum": 0, "maximum": 2**62 - 1},
                                "time": {"type": "number", "description": "unix seconds; the server's clock when omitted"},
                                "values": {
                                    "type": "object",
                                    "maxProperties": _LIMITS.max_keys_per_row,
                                    "propertyNames": {"minLength": 1, "maxLength": _LIMITS.max_key_length, "pattern": "^[^\\x00]*$"},
                                    "additionalProperties": _WIRE_NUMBER,
                                },
                                "histograms": {
                                    "type": "object",
                                    "maxProperties": _LIMITS.max_histograms_per_row,
                                    "description": "step details: histograms by key (docs/protocol.md)",
                                    "additionalProperties": {
                                        "type": "object",
                                        "required": ["edges", "counts"],
                                        "properties": {
                                            "edges": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": _LIMITS.max_histogram_edges},
                                            "counts": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                                            "nan": {"type": "integer", "minimum": 0},
                                        },
                                    },
                                },
                                "samples": {
                                    "type": "array",
                                    "maxItems": _LIMITS.max_samples_per_row,
                                    "items": {"type": "object"},
                                    "description": "step details: the step's worst sequences, worst first (docs/protocol.md)",
                                },
                                "sequences": {
                                    "type": "object",
                                    "required": ["length", "log_ratio"],
                                    "description": "step details: (length, sum of log ratios) of some of the step's sequences",
                                    "properties": {
                                        "length": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": _LIMITS.max_sequences_per_row},
                                        "log_ratio": {"type": "array", "items": _WIRE_NUMBER, "maxItems": _LIMITS.max_sequences_per_row},
                                    },
                                },
                            },
                        },
                    }
                },
            }
        }
    },
}
"""The POST /runs/{id}/points body, for the OpenAPI schema only: the handler parses the
bytes itself (wire.parse_rows), as the ingest socket does."""


class PointsWritten(BaseModel):
    stored_rows: int
    last_step: int | None


CONFIG_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["config"],
                "additionalProperties": False,
                "properties": {
                    "config": {
                        "type": "object",
                        "description": (
                            "top-level keys to set in the run's config, each to its new value (the run's other keys "
                            "are kept); at most 32 levels deep, no NUL in any string"
                        ),
                    }
                },
            }
        }
    },
}
"""The PATCH /runs/{id} body, for the OpenAPI schema only: the handler parses the bytes itself
and checks the config as a hello's (wire.parse_config)."""
