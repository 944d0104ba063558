"""Every JSON route of the API declares what it answers (a response model, in the OpenAPI
schema), and the models of the routes once answering bare dicts write those dicts byte for
byte: the same keys, in the same order, with the same values."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, get_args

import httpx
from fastapi.routing import APIRoute
from pydantic import TypeAdapter

from server.alerts.backtest import Episode, RuleBacktest, RunBacktest
from server.alerts.catalog import RuleSpec
from server.api_tokens import SCOPES, token_json
from server.app import create_app
from server.config import Settings
from server.models import ApiToken
from server.routes import api_tokens, backtest, run_commands, runs
from server.routes.api_tokens import NewTokenOut, RevokedOut, TokenOut
from server.routes.backtest import (
    BacktestOut,
    EpisodeOut,
    ReplayedRuleOut,
    RuleBacktestOut,
    RunBacktestOut,
)
from server.routes.run_commands import WhoamiOut
from server.schemas import LatestPoint, Scope

NO_BODY = {
    ("DELETE", "/api/v1/runs/{run_id}"): "204: the run is deleted, nothing to answer",
    ("DELETE", "/api/v1/rules/{rule_id}"): "204: the rule is deleted, nothing to answer",
    ("DELETE", "/api/v1/webhooks/{hook_id}"): "204: the webhook is deleted, nothing to answer",
}
"""The /api/v1 operations without a response model, each with why."""

BARE = TypeAdapter(Any)
"""How FastAPI wrote a route's bare dict (its `dict[str, Any]` annotation): what the models
below must write byte for byte."""


def _operations(database_url: str) -> dict[tuple[str, str], dict[str, Any]]:
    schema = create_app(Settings(database_url=database_url)).openapi()
    return {
        (method.upper(), path): operation
        for path, methods in schema["paths"].items()
        if path.startswith("/api/v1/")
        for method, operation in methods.items()
    }


def _declared(schema: dict[str, Any]) -> bool:
    """Whether a response schema says what the answer holds: a model, or a list or map of
    models, not an object of anything (what a bare `dict[str, Any]` documents)."""
    if "$ref" in schema:
        return True
    if schema.get("type") == "array":
        return _declared(schema["items"])
    if schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
        return _declared(schema["additionalProperties"])
    return False


def test_every_api_json_operation_documents_its_answer(empty_sqlite_url: str) -> None:
    operations = _operations(empty_sqlite_url)
    undeclared = {}
    for key, operation in operations.items():
        (status, response), *more = [(code, r) for code, r in operation["responses"].items() if code.startswith("2")]
        assert more == [], key
        schema = response.get("content", {}).get("application/json", {}).get("schema")
        if schema is None or not _declared(schema):
            undeclared[key] = (status, schema)
    assert undeclared == {key: ("204", None) for key in NO_BODY}
    assert len(operations) >= 35


def test_the_routes_once_answering_bare_dicts_answer_their_models() -> None:
    routers = (api_tokens.router, backtest.router, run_commands.router, runs.router)
    model = {route.name: route.response_model for router in routers for route in router.routes if isinstance(route, APIRoute)}
    assert (model["tokens"], model["new_token"], model["revoke"]) == (list[TokenOut], NewTokenOut, RevokedOut)
    assert (model["backtest"], model["whoami"], model["run_latest"]) == (BacktestOut, WhoamiOut, dict[str, LatestPoint])


def test_scope_is_the_servers_scopes() -> None:
    assert get_args(Scope) == SCOPES


def test_the_token_models_write_what_the_routes_wrote() -> None:
    row = ApiToken(id=3, name="trainer-7", token_hash="h", scopes=["read", "ingest"], created_at=1.7e9 + 0.25, revoked=True)
    written = token_json(row)
    assert list(TokenOut.model_fields) == list(written)
    assert TokenOut.model_validate(written).model_dump_json() == BARE.dump_json(written).decode()
    assert TokenOut.model_validate(written).model_dump_json() == (
        '{"id":3,"name":"trainer-7","scopes":["read","ingest"],"created_at":1700000000.25,"revoked":true}'
    )
    made = NewTokenOut(name="t", scopes=["admin"], token="keel_x")
    assert made.model_dump_json() == BARE.dump_json({"name": "t", "scopes": ["admin"], "token": "keel_x"}).decode()
    assert RevokedOut(name="t", revoked=2).model_dump_json() == '{"name":"t","revoked":2}'


def test_the_whoami_model_writes_what_the_route_wrote() -> None:
    answers: list[dict[str, Any]] = [
        {"auth": False, "name": "local", "scopes": list(SCOPES)},
        {"auth": True, "name": None, "scopes": []},
        {"auth": True, "name": "ops", "scopes": ["ingest", "read"]},
    ]
    for answer in answers:
        assert WhoamiOut.model_validate(answer).model_dump_json() == BARE.dump_json(answer).decode()


def test_the_backtest_models_are_the_backtests_json() -> None:
    """The backtest's answer is its dataclasses' `to_json`: the models hold their fields, in
    their order, and write a non-finite value as the bare dict did (null)."""
    assert list(ReplayedRuleOut.model_fields) == [field.name for field in dataclasses.fields(RuleSpec)]
    assert list(EpisodeOut.model_fields) == [field.name for field in dataclasses.fields(Episode)]
    rule = RuleSpec("kl above 1", "mismatch/kl", "threshold", "critical", 2, 3, {"threshold": 1, "op": ">"})
    fired = RuleBacktest(rule, [Episode(20, 21, 28, 3.0, "kl = 3 > 1"), Episode(30, 30, None, math.nan, "nan")], 1, 40)
    skipped = RuleBacktest(RuleSpec("quiet", "*", "silent", "warning"), skipped="runs on the server's clock")
    run = RunBacktest("r", "ppo", 40, [fired, skipped])
    assert list(RuleBacktestOut.model_fields) == list(fired.to_json())
    assert list(RunBacktestOut.model_fields) == list(run.to_json())
    answer: dict[str, Any] = {"runs": [run.to_json()]}
    typed = BacktestOut.model_validate(answer).model_dump_json()
    assert typed == BARE.dump_json(answer).decode()
    assert '"params":{"threshold":1,"op":">"}' in typed and '"resolved_step":null,"value":null' in typed


def test_whoami_answers_as_before(server_factory, sqlite_url: str) -> None:  # type: ignore[no-untyped-def]
    admin = "keel_admin_token_for_the_whoami_test_0123456789"
    secured = server_factory(sqlite_url, auth=True, bootstrap_token=admin)
    url = f"{secured.url}/api/v1/whoami"
    assert httpx.get(url, headers={"Authorization": f"Bearer {admin}"}).content == b'{"auth":true,"name":"bootstrap","scopes":["admin","ingest","read"]}'
    assert httpx.get(url).content == b'{"auth":true,"name":null,"scopes":[]}'
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}).content == b'{"auth":true,"name":null,"scopes":[]}'
