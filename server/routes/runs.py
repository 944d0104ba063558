"""Runs, their metric keys, series and step details (REST); points and config updates
written to a run, and its deletion."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response

from server.alerts.hazard import WARMUP
from server.auth import ADMIN, INGEST, READ, presented_token, speaker_of
from server.components import Components
from server.deps import CommittedDep, ComponentsDep, SettingsDep, StoreDep
from server.errors import Conflict, Forbidden, TooLarge
from server.fairlock import WRITE_OWNER
from server.ratelimit import client_key
from server.retention import delete_run
from server.schemas import (
    CONFIG_BODY,
    MAX_STEP,
    POINTS_BODY,
    ApiRoute,
    DetailsPage,
    DistributionsOut,
    HazardOfRuns,
    HazardOut,
    KeyOut,
    KeysOfRuns,
    LatestPoint,
    ListedRun,
    PointsWritten,
    RunDetail,
    RunId,
    SamplesOut,
    SampleStepsOut,
    SequencesOut,
    SeriesOfRuns,
    SeriesOut,
    Text,
    errors,
    unprocessable,
)
from server.storage import Store
from server.storage.details import parse_cursor
from wire import CLOSE_TOO_LARGE, ProtocolError, encode_value, parse_config, parse_rows

router = APIRouter(tags=["runs"], route_class=ApiRoute, responses=errors(401))

StepBound = Annotated[int | None, Query(ge=0, le=MAX_STEP)]
RunStatus = Literal["running", "finished", "failed", "killed", "silent", "stale"]
"""`stale` is the deprecated name of `silent`."""
MAX_RUNS_PER_READ = 1000
"""Runs one read may name."""
MAX_KEYS_PER_READ = 1000
"""Keys one `latest` read may name."""


@router.get("/runs", response_model=list[ListedRun], response_model_exclude_unset=True, dependencies=[READ])
async def list_runs(
    components: ComponentsDep,
    settings: SettingsDep,
    project: Text | None = None,
    group: Text | None = None,
    status: RunStatus | None = None,
    run_id: Annotated[list[Text] | None, Query(max_length=MAX_RUNS_PER_READ, description="only these runs (repeat the parameter)")] = None,
    latest: Annotated[Text | None, Query(description="comma-separated metric keys: each run's last point of each, as `latest`")] = None,
    hazard: Annotated[bool, Query(description="each running run's current collapse hazard, as `hazard` (null while it warms up)")] = False,
    limit: Annotated[int | None, Query(ge=1, le=MAX_STEP, description="only the newest this many runs (of those the other parameters select)")] = None,
) -> list[ListedRun]:
    """The runs, newest first; with `latest`, each with the last point of those keys; with
    `hazard`, each running run with its current collapse hazard (the runs table's one read).

    The hazard is the last value of the run's `GET /runs/{id}/hazard` series, read through
    the same cache: a run already read costs the steps stored since, so a table that asks
    every few seconds does not read each run's history again. Only runs whose status is
    `running` are read (not finished or silent ones), and at most as many as the cache
    keeps (newest first), so that one call's reads never push each other out of it. With
    `limit`, only the newest runs are read: a page shows its first rows before the rest."""
    store = components.store
    now = time.time()
    listed = [
        (stored, ListedRun.from_run(stored, now=now, silent_after_s=settings.silent_after_s))
        # A status is known only once read (silent is running with an old last_seen_at):
        # with one asked, the limit applies after it.
        for stored in await store.list_runs(project=project, group=group, ids=run_id, limit=limit if status is None else None)
    ]
    wanted = "silent" if status == "stale" else status
    listed = [(stored, out) for stored, out in listed if wanted is None or out.status == wanted][:limit]
    runs = [out for _, out in listed]
    if latest is not None:
        keys = [key for key in latest.split(",") if key][:MAX_KEYS_PER_READ]
        points = await store.latest_of_runs([run.id for run in runs], keys) if runs and keys else {}
        for run in runs:
            run.latest = {key: LatestPoint(step=step, value=encode_value(value)) for key, (step, value) in points.get(run.id, {}).items()}
    if hazard:
        running = [(stored, out) for stored, out in listed if out.status == "running"][: components.hazards.runs]
        for stored, out in running:
            course = await components.hazards.so_far(components.store, stored.id, stored.started_at)
            collapsed = course.fall().collapsed_at
            out.hazard = course.hazard[-1] if course.hazard and collapsed is None else None
            out.collapsed_at = collapsed
    return runs


@router.get("/series", response_model=SeriesOfRuns, response_model_exclude_none=True, dependencies=[READ])
async def series_of_runs(
    store: StoreDep,
    key: Text,
    run_id: Annotated[list[Text], Query(max_length=MAX_RUNS_PER_READ, description="the runs (repeat the parameter)")],
    max_points: int = Query(1000, ge=1, le=100_000),
    start: StepBound = None,
    end: StepBound = None,
) -> SeriesOfRuns:
    """One metric of several runs in one read, each as `GET /runs/{id}/series` answers it;
    unknown runs are left out (a chart of many runs asks once, not once per run)."""
    found = await store.series_of_runs(run_id, key, max_points=max_points, start=start, end=end)
    return SeriesOfRuns(key=key, runs={one: SeriesOut.from_data(data) for one, data in found.items()})


@router.get("/keys", response_model=KeysOfRuns, dependencies=[READ])
async def keys_of_runs(
    store: StoreDep,
    run_id: Annotated[list[Text], Query(max_length=MAX_RUNS_PER_READ, description="the runs (repeat the parameter)")],
) -> KeysOfRuns:
    """The metric keys of several runs in one read, each as `GET /runs/{id}/keys` answers;
    unknown runs are left out."""
    found = await store.keys_of_runs(run_id)
    return KeysOfRuns(runs={one: [KeyOut.from_info(info) for info in infos] for one, infos in found.items()})


@router.get("/runs/{run_id}", response_model=RunDetail, dependencies=[READ], responses=errors(404))
async def get_run(run_id: RunId, store: StoreDep, settings: SettingsDep) -> RunDetail:
    run = await store.get_run(run_id)
    return RunDetail.from_run(run, now=time.time(), silent_after_s=settings.silent_after_s)


@router.get("/runs/{run_id}/keys", response_model=list[KeyOut], dependencies=[READ], responses=errors(404))
async def run_keys(run_id: RunId, store: StoreDep) -> list[KeyOut]:
    return [KeyOut.from_info(info) for info in await store.keys(run_id)]


@router.get("/runs/{run_id}/latest", response_model=dict[str, LatestPoint], dependencies=[READ], responses=errors(404))
async def run_latest(
    run_id: RunId, store: StoreDep, keys: Annotated[Text, Query(description="comma-separated metric keys")]
) -> dict[str, LatestPoint]:
    """The last logged point of each key: `{key: {"step", "value"}}` (keys without points are left out)."""
    latest = await store.latest(run_id, [key for key in keys.split(",") if key][:MAX_KEYS_PER_READ])
    return {key: LatestPoint(step=step, value=encode_value(value)) for key, (step, value) in latest.items()}


@router.get(
    "/runs/{run_id}/series", response_model=SeriesOut, response_model_exclude_none=True, dependencies=[READ], responses=errors(404)
)
async def run_series(
    run_id: RunId,
    store: StoreDep,
    key: Text,
    max_points: int = Query(1000, ge=1, le=100_000),
    start: StepBound = None,
    end: StepBound = None,
) -> SeriesOut:
    data = await store.series(run_id, key, max_points=max_points, start=start, end=end)
    return SeriesOut.from_data(data)


HAZARD_POINTS = 2000
"""Points of a hazard answer by default; a longer run is answered in buckets."""


def max_per_bucket(steps: Sequence[int], values: Sequence[float], max_points: int) -> tuple[list[int], list[float]]:
    """At most `max_points` points: consecutive runs of ceil(n / max_points) points, each
    answered by its highest value and that value's step (the first, on a tie), so no spike
    is averaged or sampled away."""
    if len(steps) <= max_points:
        return list(steps), list(values)
    size = math.ceil(len(steps) / max_points)
    kept_steps, kept_values = [], []
    for start in range(0, len(steps), size):
        top = max(range(start, min(start + size, len(steps))), key=values.__getitem__)
        kept_steps.append(steps[top])
        kept_values.append(values[top])
    return kept_steps, kept_values


HazardPoints = Annotated[
    int, Query(ge=1, le=100_000, description="buckets of a longer answer; each keeps its highest hazard")
]


async def _hazard_of(components: Components, run_id: str, started_at: float, max_points: int) -> HazardOut:
    course = await components.hazards.so_far(components.store, run_id, started_at)
    steps, hazard = max_per_bucket(course.steps, course.hazard, max_points)
    fall = course.fall()
    return HazardOut(
        run_id=run_id, horizon=components.hazards.model.horizon, steps=steps, hazard=hazard, warmup=WARMUP,
        collapsed_at=fall.collapsed_at, falling_since=fall.falling_since, dips=list(fall.dips), missing=course.missing(),
    )  # fmt: skip


@router.get("/runs/{run_id}/hazard", response_model=HazardOut, dependencies=[READ], responses=errors(404))
async def run_hazard(run_id: RunId, components: ComponentsDep, max_points: HazardPoints = HAZARD_POINTS) -> HazardOut:
    """The run's collapse hazard from its stored points: at each step past the warm-up, the
    estimated probability that the run collapses within the next `horizon` steps."""
    run = await components.store.get_run(run_id)
    return await _hazard_of(components, run_id, run.started_at, max_points)


@router.get("/hazard", response_model=HazardOfRuns, dependencies=[READ])
async def hazard_of_runs(
    components: ComponentsDep,
    run_id: Annotated[list[Text], Query(max_length=MAX_RUNS_PER_READ, description="the runs (repeat the parameter)")],
    max_points: HazardPoints = HAZARD_POINTS,
) -> HazardOfRuns:
    """The collapse hazard of several runs in one read, each as `GET /runs/{id}/hazard`
    answers it; unknown runs are left out."""
    asked = list(dict.fromkeys(run_id))
    found = {run.id: run for run in await components.store.list_runs(ids=asked)}
    return HazardOfRuns(runs={
        one: await _hazard_of(components, one, found[one].started_at, max_points) for one in asked if one in found
    })  # fmt: skip


# -- step details ----------------------------------------------------------------------------

From = Annotated[int | None, Query(alias="from", ge=0, le=MAX_STEP, deprecated=True, description="deprecated name of `start`")]
To = Annotated[int | None, Query(alias="to", ge=0, le=MAX_STEP, deprecated=True, description="deprecated name of `end`")]
DETAILS_PAGE = 100
"""Details per page of GET /runs/{id}/details by default."""


def _json(content: bytes) -> Response:
    """A body already encoded (by orjson, or joined from stored JSON): the response model
    documents it, and nothing converts it again."""
    return Response(content=content, media_type="application/json")


@router.get("/runs/{run_id}/distributions", response_model=DistributionsOut, dependencies=[READ], responses=errors(404))
async def run_distributions(
    run_id: RunId,
    store: StoreDep,
    key: Text,
    from_: From = None,
    to: To = None,
    start: StepBound = None,
    end: StepBound = None,
    max_steps: int = Query(500, ge=1, le=5000, description="more steps than this are answered in buckets, counts summed"),
) -> Response:
    """A histogram key's counts per step (docs/protocol.md, "Step details"): steps whose edges
    differ from the newest step's are left out; more than `max_steps` steps are answered in
    buckets of consecutive steps (each its last step), their counts summed exactly."""
    data = await store.distributions(
        run_id, key, start=start if from_ is None else from_, end=end if to is None else to, max_steps=max_steps
    )
    body = {
        "key": data.key, "edges": data.edges, "steps": data.steps, "counts": data.counts, "nan": data.nans,
        "bucketed": data.bucketed, "left_out": data.left_out,
    }
    return _json(await asyncio.to_thread(orjson.dumps, body))


@router.get("/runs/{run_id}/samples", response_model=SamplesOut, dependencies=[READ], responses=errors(404))
async def run_samples(
    run_id: RunId,
    store: StoreDep,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="the latest step at or before this one that has samples")] = None,
) -> Response:
    """The worst sequences of the latest step <= `step` that has samples (the run's latest
    such step without `step`), worst first; `{"step": null, "samples": []}` when none."""
    found = await store.samples(run_id, step)
    return _json(b'{"step":' + orjson.dumps(found.step) + b',"samples":' + found.samples_json.encode() + b"}")


@router.get("/runs/{run_id}/samples/steps", response_model=SampleStepsOut, dependencies=[READ], responses=errors(404))
async def run_sample_steps(run_id: RunId, store: StoreDep) -> Response:
    """The steps that have samples, ascending."""
    steps = await store.sample_steps(run_id)
    return _json(orjson.dumps({"steps": steps}))


@router.get("/runs/{run_id}/sequences", response_model=SequencesOut, dependencies=[READ], responses=errors(404))
async def run_sequences(
    run_id: RunId,
    store: StoreDep,
    from_: From = None,
    to: To = None,
    start: StepBound = None,
    end: StepBound = None,
    max_points: int = Query(5000, ge=1, le=100_000, description="an even subsample of this many pairs when there are more"),
) -> Response:
    """The (length, Σℓ) pairs of steps `from`..`to`, and the least-squares line of Σℓ on
    length through the finite ones answered (`slope_per_1k`: Σℓ per 1,000 tokens)."""
    data = await store.sequences(
        run_id, start=start if from_ is None else from_, end=end if to is None else to, max_points=max_points
    )
    fit = None
    if data.fit is not None:
        fit = {"slope_per_1k": encode_value(data.fit.slope_per_1k), "intercept": encode_value(data.fit.intercept), "n": data.fit.n}
    body = {"steps": data.steps, "length": data.length, "log_ratio": [encode_value(v) for v in data.log_ratio], "fit": fit}
    return _json(await asyncio.to_thread(orjson.dumps, body))


@router.get("/runs/{run_id}/details", response_model=DetailsPage, dependencies=[READ], responses=errors(404))
async def run_details(
    run_id: RunId,
    store: StoreDep,
    cursor: Annotated[Text | None, Query(description="the previous page's `cursor`")] = None,
    limit: int = Query(DETAILS_PAGE, ge=1, le=1000, description="details per page"),
) -> Response:
    """Every stored step detail of the run, a page at a time, each as a wire row of its own
    (`values` empty): what `keel export` writes, and POST /runs/{id}/points takes back."""
    after = None
    if cursor is not None:
        try:
            after = parse_cursor(cursor)
        except ValueError as exc:
            raise HTTPException(422, [{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]) from None
    found = await store.stored_details(run_id, after=after, limit=limit)
    rows = []
    for detail in found:
        head = b'{"step":%d,"values":{},' % detail.step
        if detail.kind == "histogram":
            rows.append(head + b'"histograms":{' + orjson.dumps(detail.key) + b":" + detail.body.encode() + b"}}")
        else:
            rows.append(head + orjson.dumps(detail.kind) + b":" + detail.body.encode() + b"}")
    next_cursor = found[-1].cursor if len(found) == limit else None
    return _json(b'{"rows":[' + b",".join(rows) + b'],"cursor":' + orjson.dumps(next_cursor) + b"}")


@router.post(
    "/runs/{run_id}/points",
    response_model=PointsWritten,
    dependencies=[INGEST],
    responses=errors(404, 413, 429),
    openapi_extra={"requestBody": POINTS_BODY},
)
async def post_points(
    run_id: RunId, request: Request, store: StoreDep, settings: SettingsDep, committed: CommittedDep
) -> PointsWritten:
    """`{"rows": [...]}`, stored as a points frame on the ingest socket would be (docs/protocol.md)."""
    WRITE_OWNER.set(client_key(request, settings.auth_enabled, presented_token(request)))
    body = await request.body()
    try:
        payload = orjson.loads(body)
        if not isinstance(payload, dict):
            raise ProtocolError("body must be a JSON object {\"rows\": [...]}")
        rows = parse_rows(payload.get("rows"), settings.limits)
    except orjson.JSONDecodeError as exc:
        raise HTTPException(400, f"body is not valid JSON: {exc}") from None
    except ProtocolError as exc:
        if exc.close_code == CLOSE_TOO_LARGE:
            raise HTTPException(413, str(exc)) from None
        raise unprocessable(str(exc)) from None
    await _may_write(request, store, run_id)
    try:
        result = await store.write_points(run_id, rows, time.time())
    except TooLarge as exc:  # new keys past the run's limit
        raise HTTPException(413, str(exc)) from None
    await committed.points(run_id, result.started_at, rows)
    return PointsWritten(stored_rows=len(rows), last_step=result.last_step)


async def _may_write(request: Request, store: Store, run_id: str) -> None:
    """403 unless the request's token may write to the run (its owner's name, or an admin);
    404 for no such run (docs/security.md, "Who speaks for a run")."""
    try:
        await store.check_owner(run_id, await speaker_of(request))
    except Forbidden as exc:
        raise HTTPException(403, str(exc)) from None


@router.patch(
    "/runs/{run_id}",
    response_model=RunDetail,
    dependencies=[INGEST],
    responses=errors(404, 413, 429),
    openapi_extra={"requestBody": CONFIG_BODY},
)
async def update_run(run_id: RunId, request: Request, store: StoreDep, settings: SettingsDep) -> RunDetail:
    """`{"config": {...}}`: each top-level key of `config` takes its new value in the run's
    config, the run's other keys are kept; the run as stored after. A hello keeps the config
    of a run that exists, so config that a trainer sets after its run started (wandb's
    `config.update`, which `keel watch` follows) arrives this way. Sending the same update
    again changes nothing: a client may repeat it until it sees the answer."""
    WRITE_OWNER.set(client_key(request, settings.auth_enabled, presented_token(request)))
    body = await request.body()
    try:
        payload = orjson.loads(body)  # the hello's parser: no NaN, no 1e400, no lone surrogate
    except orjson.JSONDecodeError as exc:
        raise HTTPException(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise unprocessable('body must be a JSON object {"config": {...}}')
    for field in payload:
        if field != "config":
            raise unprocessable("only the run's config can be changed", field[:40])
    if "config" not in payload:
        raise unprocessable("config is required", "config")
    try:
        config = parse_config(payload["config"], "config")
    except ProtocolError as exc:
        raise unprocessable(str(exc), "config") from None
    await _may_write(request, store, run_id)
    try:
        run = await store.update_config(run_id, config)
    except TooLarge as exc:  # the merged config past its limit
        raise HTTPException(413, str(exc)) from None
    return RunDetail.from_run(run, now=time.time(), silent_after_s=settings.silent_after_s)


@router.delete("/runs/{run_id}", status_code=204, dependencies=[ADMIN], responses=errors(404, 409, 429))
async def remove_run(run_id: RunId, store: StoreDep, force: bool = False) -> None:
    """Delete a run and everything stored with it, in short batches that never stall ingest.
    A running run is refused (409) unless `force`."""
    try:
        await delete_run(store, run_id, force=force)
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from None
