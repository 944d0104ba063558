"""What a fuzzer throws at the REST API: every client mistake is a 4xx that says what was
wrong, error bodies match the OpenAPI schema, and no secret reaches a log or a response."""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import make_url

from tests.support.raw_client import hello, new_run, open_ingest, points, recv

SECRET = "whsec_" + "c2VjcmV0LWtleS1vZi0zMi1ieXRlcy1sb25nLi4uLi4="


def _messages(response: httpx.Response) -> str:
    """The error's message(s): FastAPI's array form carries one `msg` per problem."""
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail, response.text
    for item in detail:
        assert {"loc", "msg", "type"} <= set(item), response.text
    return " | ".join(str(item["msg"]) for item in detail)


def _unprocessable(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 422, (response.request.method, str(response.request.url), response.status_code, response.text)
    text = _messages(response)
    for word in words:
        assert word in text, (str(response.request.url), text)


def _stored_run(server: Any) -> str:
    run = new_run("hardening")
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": {"a": 1.0}}]))
        assert recv(ws)["type"] == "ack"
    return str(run["id"])


# -- ids and integer bounds ----------------------------------------------------------

ID_ROUTES = [
    ("PATCH", "/rules/{id}", {"enabled": False}),
    ("DELETE", "/rules/{id}", None),
    ("DELETE", "/silences/{id}", None),
    ("DELETE", "/webhooks/{id}", None),
    ("POST", "/webhooks/{id}/test", None),
    ("GET", "/webhooks/{id}/deliveries", None),
    ("POST", "/alerts/{id}/ack", {"by": "ana"}),
]


def test_ids_beyond_the_integer_columns_are_422_and_unknown_ids_404(server) -> None:
    api = f"{server.url}/api/v1"
    for method, path, body in ID_ROUTES:
        for too_big in (2**31, 2**63, 2**64, 0, -1):
            response = httpx.request(method, api + path.format(id=too_big), json=body)
            _unprocessable(response, "less than or equal" if too_big > 0 else "greater than or equal")
        missing = httpx.request(method, api + path.format(id=2**31 - 1), json=body)
        assert missing.status_code == 404 and "not found" in missing.json()["detail"], (path, missing.text)


def test_every_missing_thing_is_one_404_body_with_its_message(server) -> None:
    """The app's one NotFound handler (server/app.py): each route's 404 is `{"detail": msg}`."""
    api = f"{server.url}/api/v1"
    last = 2**31 - 1
    expected = [
        ("GET", "/runs/nope", None, "run 'nope' not found"),
        ("GET", "/runs/nope/series?key=a", None, "run 'nope' not found"),
        ("GET", "/runs/nope/hazard", None, "run 'nope' not found"),
        ("DELETE", "/runs/nope", None, "run 'nope' not found"),
        ("POST", "/runs/nope/points", {"rows": [{"step": 0, "values": {"a": 1.0}}]}, "run 'nope' not found"),
        ("GET", "/runs/nope/commands", None, "run 'nope' not found"),
        ("POST", "/runs/nope/commands", {"action": "stop"}, "run 'nope' not found"),
        ("POST", "/backtest", {"run_ids": ["nope"]}, "run 'nope' not found"),
        ("POST", "/backtest", {"run_ids": ["nope"], "rule_ids": [last]}, f"rule {last} not found"),
        ("DELETE", f"/rules/{last}", None, f"rule {last} not found"),
        ("POST", f"/alerts/{last}/ack", None, f"alert {last} not found"),
        ("DELETE", f"/silences/{last}", None, f"silence {last} not found"),
        ("GET", f"/webhooks/{last}/deliveries", None, f"webhook {last} not found"),
    ]
    for method, path, body, message in expected:
        response = httpx.request(method, api + path, json=body)
        assert (response.status_code, response.json()) == (404, {"detail": message}), (method, path, response.text)
        assert response.headers["content-type"] == "application/json"


def test_series_step_bounds_are_the_bigint_range(server) -> None:
    run_id = _stored_run(server)
    url = f"{server.url}/api/v1/runs/{run_id}/series"
    for name in ("start", "end"):
        _unprocessable(httpx.get(url, params={"key": "a", name: 2**63}), "less than or equal")
        assert httpx.get(url, params={"key": "a", name: 2**63 - 1}).status_code == 200
    assert httpx.get(url, params={"key": "a", "start": 0, "end": 2**63 - 1}).json()["steps"] == [0]


def test_rule_counts_fit_their_integer_columns_and_text_fits_its_columns(server) -> None:
    api = f"{server.url}/api/v1"
    rule = {"name": "r", "metric": "m", "detector": "threshold", "params": {"threshold": 1}}
    _unprocessable(httpx.post(f"{api}/rules", json={**rule, "for_steps": 2**31}), "less than or equal")
    _unprocessable(httpx.post(f"{api}/rules", json={**rule, "keep_firing_for": 2**63}), "less than or equal")
    for field in ("project", "group", "run_id", "name", "metric"):
        _unprocessable(httpx.post(f"{api}/rules", json={**rule, field: "p" * 201}), "at most 200")
    created = httpx.post(f"{api}/rules", json={**rule, "project": "p" * 200})
    assert created.status_code == 201, created.text
    _unprocessable(httpx.patch(f"{api}/rules/{created.json()['id']}", json={"name": "n" * 201}), "at most 200")


# -- NUL characters (PostgreSQL text cannot hold them) ---------------------------------


def test_nul_is_refused_in_every_string_the_api_accepts(server) -> None:
    run_id = _stored_run(server)
    api = f"{server.url}/api/v1"
    rule = {"name": "r", "metric": "m", "detector": "threshold", "params": {"threshold": 1}}
    silence = {"matchers": {"run_name": "x"}, "duration_s": 60}
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/runs", {"params": {"project": "\x00"}}),
        ("GET", "/runs", {"params": {"group": "a\x00"}}),
        ("GET", "/runs/a%00", {}),
        ("GET", "/runs/a%00/keys", {}),
        ("GET", f"/runs/{run_id}/series", {"params": {"key": "a\x00"}}),
        ("GET", f"/runs/{run_id}/latest", {"params": {"keys": "a,\x00"}}),
        ("POST", f"/runs/{run_id}/points", {"json": {"rows": [{"step": 1, "values": {"a\x00": 1.0}}]}}),
        ("GET", "/alerts", {"params": {"run_id": "\x00"}}),
        ("GET", "/alerts", {"params": {"severity": "\x00"}}),
        ("GET", "/alerts", {"params": {"project": "\x00"}}),
        ("GET", "/rules", {"params": {"project": "\x00"}}),
        ("POST", "/rules", {"json": {**rule, "name": "r\x00"}}),
        ("POST", "/rules", {"json": {**rule, "metric": "m\x00"}}),
        ("POST", "/rules", {"json": {**rule, "project": "\x00"}}),
        ("POST", "/rules", {"json": {**rule, "detector": "collapse_risk", "params": {"reward_key": "r\x00"}}}),
        ("POST", "/silences", {"json": {**silence, "comment": "known\x00"}}),
        ("POST", "/silences", {"json": {**silence, "created_by": "\x00"}}),
        ("POST", "/silences", {"json": {**silence, "matchers": {"run_name": "x\x00"}}}),
        ("POST", "/silences", {"json": {**silence, "matchers": {"run\x00name": "x"}}}),
        ("POST", "/webhooks", {"json": {"url": "https://example.com/\x00"}}),
        ("POST", "/webhooks", {"json": {"url": "https://example.com/", "secret": SECRET + "\x00"}}),
    ]
    for method, path, kwargs in requests:
        _unprocessable(httpx.request(method, api + path, **kwargs), "NUL")
    created = httpx.post(f"{api}/rules", json=rule).json()
    _unprocessable(httpx.patch(f"{api}/rules/{created['id']}", json={"name": "\x00"}), "NUL")
    _unprocessable(httpx.post(f"{api}/alerts/1/ack", json={"by": "\x00"}), "NUL")


# -- numbers: finite, strict, sane ---------------------------------------------------


def _post_raw(url: str, body: str) -> httpx.Response:
    # json.dumps cannot write 1e400; this is what a fuzzer (or another language) sends.
    return httpx.post(url, content=body.encode(), headers={"content-type": "application/json"})


def test_rule_parameters_must_be_finite_and_sane(server) -> None:
    url = f"{server.url}/api/v1/rules"
    _unprocessable(_post_raw(url, '{"name": "r", "metric": "m", "detector": "threshold", "params": {"threshold": 1e400}}'), "finite")
    _unprocessable(_post_raw(url, '{"name": "r", "metric": "m", "detector": "threshold", "params": {"resolve_at": -1e400}}'), "finite")
    _unprocessable(_post_raw(url, '{"name": "r", "metric": "m", "detector": "climb", "params": {"h": 1e400}}'), "finite")
    _unprocessable(_post_raw(url, '{"name": "r", "metric": "m", "detector": "climb", "params": {"warmup": 1e300}}'), "warmup")
    _unprocessable(_post_raw(url, '{"name": "r", "metric": "m", "detector": "climb", "params": {"k": 1e300}}'), "at most")
    _unprocessable(_post_raw(url, '{"name": "r", "metric": "m", "detector": "silent", "params": {"after_s": 1e400}}'), "finite")
    ok = _post_raw(url, '{"name": "r", "metric": "m", "detector": "threshold", "params": {"threshold": 1e6}}')
    assert ok.status_code == 201 and ok.json()["params"]["threshold"] == 1e6, ok.text


def test_booleans_are_not_numbers_and_numbers_are_not_booleans(server) -> None:
    api = f"{server.url}/api/v1"
    _unprocessable(httpx.post(f"{api}/silences", json={"matchers": {"run_name": "x"}, "duration_s": True}), "number")
    rule = {"name": "r", "metric": "m", "detector": "threshold"}
    _unprocessable(httpx.post(f"{api}/rules", json={**rule, "for_steps": True}), "integer")
    _unprocessable(httpx.post(f"{api}/rules", json={**rule, "keep_firing_for": 1.5}), "integer")
    _unprocessable(httpx.post(f"{api}/rules", json={**rule, "enabled": "yes"}), "boolean")
    # An integer is a fine number of seconds.
    assert httpx.post(f"{api}/silences", json={"matchers": {"run_name": "x"}, "duration_s": 60}).status_code == 201


def test_silences_are_bounded_in_time(server) -> None:
    url = f"{server.url}/api/v1/silences"
    _unprocessable(_post_raw(url, '{"matchers": {"run_name": "x"}, "ends_at": 1e400}'), "finite")
    _unprocessable(_post_raw(url, '{"matchers": {"run_name": "x"}, "duration_s": 1e400}'), "finite")
    _unprocessable(_post_raw(url, '{"matchers": {"run_name": "x"}, "starts_at": -1e400, "duration_s": 5}'), "finite")
    _unprocessable(httpx.post(url, json={"matchers": {"run_name": "x"}, "duration_s": 11 * 365 * 86400}), "less than or equal to 315360000")
    _unprocessable(httpx.post(url, json={"matchers": {"run_name": "x"}, "ends_at": 1e15}), "10 years")
    _unprocessable(httpx.post(url, json={"matchers": {"run_name": "x"}, "starts_at": 1e15, "duration_s": 5}), "10 years")
    _unprocessable(httpx.post(url, json={"matchers": {"run_name": "x"}, "starts_at": 0, "ends_at": 4e8}), "10 years")
    _unprocessable(httpx.post(url, json={"matchers": {"run_name": "x"}}), "duration_s")
    assert httpx.post(url, json={"matchers": {"run_name": "x"}, "duration_s": 9 * 365 * 86400}).status_code == 201


# -- paging ------------------------------------------------------------------------------


def test_silences_are_paged_newest_first_and_filter_by_activity(server) -> None:
    url = f"{server.url}/api/v1/silences"
    ids = []
    for i in range(7):
        body = {"matchers": {"run_name": f"r{i}"}, "duration_s": 600} if i % 2 else {"matchers": {"run_name": f"r{i}"}, "starts_at": 1, "ends_at": 2}
        response = httpx.post(url, json=body)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    first = httpx.get(url, params={"limit": 3}).json()
    assert [s["id"] for s in first] == ids[::-1][:3]
    second = httpx.get(url, params={"limit": 3, "before_id": first[-1]["id"]}).json()
    assert [s["id"] for s in second] == ids[::-1][3:6]
    assert [s["id"] for s in httpx.get(url).json()] == ids[::-1]
    active = httpx.get(url, params={"active": "true"}).json()
    assert [s["id"] for s in active] == [ids[5], ids[3], ids[1]] and all(s["active"] for s in active)
    expired = httpx.get(url, params={"active": "false", "limit": 2}).json()
    assert [s["id"] for s in expired] == [ids[6], ids[4]]
    for bad in ({"limit": 0}, {"limit": 10_001}, {"before_id": 2**31}):
        assert httpx.get(url, params=bad).status_code == 422


# -- the OpenAPI schema and the error bodies ----------------------------------------------


def test_error_bodies_match_the_documented_schema(server) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    api = f"{server.url}/api/v1"

    def documented(path: str, method: str) -> dict[str, Any]:
        return dict(schema["paths"][f"/api/v1{path}"][method]["responses"])

    error_ref = {"$ref": "#/components/schemas/ErrorOut"}
    assert schema["components"]["schemas"]["ErrorOut"]["properties"]["detail"]["type"] == "string"
    for path, method in [("/rules/{rule_id}", "delete"), ("/runs/{run_id}", "get"), ("/silences/{silence_id}", "delete")]:
        responses = documented(path, method)
        assert responses["404"]["content"]["application/json"]["schema"] == error_ref
        assert responses["401"]["content"]["application/json"]["schema"] == error_ref
        assert responses["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/HTTPValidationError"}
    points = documented("/runs/{run_id}/points", "post")
    assert {"400", "401", "404", "413", "422"} <= set(points)
    # The refusals the handlers raise themselves are in the validation array form too.
    _unprocessable(httpx.post(f"{api}/rules", json={"name": "x", "metric": "m", "detector": "climb", "params": {"k": -1}}), "positive")
    _unprocessable(httpx.post(f"{api}/rules", json={"name": "x", "metric": "m", "detector": "nope"}), "unknown detector")
    _unprocessable(httpx.post(f"{api}/webhooks", json={"url": "http://10.0.0.1/x"}), "non-public")
    _unprocessable(httpx.post(f"{api}/silences", json={"matchers": {}, "duration_s": 5}), "matcher")
    run_id = _stored_run(server)
    _unprocessable(httpx.post(f"{api}/runs/{run_id}/points", json={"rows": [{"step": "two", "values": {}}]}), "step")
    assert httpx.post(f"{api}/runs/{run_id}/points", content=b"{oops").json()["detail"].startswith("body is not valid JSON")


def test_the_points_body_is_in_the_schema(server) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    body = schema["paths"]["/api/v1/runs/{run_id}/points"]["post"]["requestBody"]
    assert body["required"] is True
    rows = body["content"]["application/json"]["schema"]["properties"]["rows"]
    assert rows["type"] == "array" and rows["maxItems"] == 10_000
    row = rows["items"]
    assert row["required"] == ["step", "values"] and row["properties"]["step"]["maximum"] == 2**62 - 1
    value = row["properties"]["values"]["additionalProperties"]
    assert {"type": "number"} in value["anyOf"] and {"enum": ["nan", "inf", "-inf"], "type": "string"} in value["anyOf"]


def test_405_lists_every_method_of_the_path(server) -> None:
    api = f"{server.url}/api/v1"
    for method, path, expected in [
        ("PUT", "/rules", {"GET", "POST"}),
        ("DELETE", "/rules", {"GET", "POST"}),
        ("PUT", "/rules/1", {"PATCH", "DELETE"}),
        ("GET", "/rules/1", {"PATCH", "DELETE"}),
        ("DELETE", "/runs", {"GET"}),
        ("OPTIONS", "/silences", {"GET", "POST"}),
    ]:
        response = httpx.request(method, api + path)
        assert response.status_code == 405, (method, path, response.text)
        assert {m.strip() for m in response.headers["allow"].split(",")} == expected, (method, path, response.headers["allow"])
        assert response.json() == {"detail": "Method Not Allowed"}
    assert httpx.put(f"{api}/nothing-here").status_code == 404


# -- secrets --------------------------------------------------------------------------


def _refuse_webhook_inserts(database_url: str) -> None:
    """Make the database itself reject new webhooks, the way a failing insert looks."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        with sqlite3.connect(str(url.database)) as conn:
            conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON webhooks BEGIN SELECT RAISE(ABORT, 'refused by test'); END")
        return
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused by test'; END $$ LANGUAGE plpgsql")
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON webhooks FOR EACH ROW EXECUTE FUNCTION refuse()")


def test_a_failing_statement_does_not_log_its_parameters(server_factory, database_url, caplog) -> None:
    server = server_factory(database_url, allow_private_webhooks=True)
    _refuse_webhook_inserts(database_url)
    server_log = logging.getLogger("uvicorn")  # where the server logs a failed request; it does not propagate
    server_log.addHandler(caplog.handler)
    try:
        response = httpx.post(f"{server.url}/api/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "secret": SECRET})
        assert response.status_code == 500  # the database refused: a server fault, not the client's
        deadline = time.monotonic() + 10
        while "refused by test" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)  # the traceback is logged after the answer is sent
    finally:
        server_log.removeHandler(caplog.handler)
    assert "refused by test" in caplog.text  # the failure itself is still logged
    assert SECRET not in caplog.text and "127.0.0.1:9/hook" not in caplog.text


def test_a_webhook_secret_is_returned_once_only(server_factory, sqlite_url) -> None:
    server = server_factory(sqlite_url, allow_private_webhooks=True)
    api = f"{server.url}/api/v1"
    created = httpx.post(f"{api}/webhooks", json={"url": "http://127.0.0.1:9/hook", "secret": SECRET})
    assert created.status_code == 201 and created.json()["secret"] == SECRET
    hook_id = created.json()["id"]
    generated = httpx.post(f"{api}/webhooks", json={"url": "http://127.0.0.1:9/other"}).json()["secret"]
    later = [
        httpx.get(f"{api}/webhooks"),
        httpx.post(f"{api}/webhooks/{hook_id}/test"),
        httpx.get(f"{api}/webhooks/{hook_id}/deliveries"),
        httpx.get(f"{server.url}/openapi.json"),
    ]
    for response in later:
        assert response.status_code < 300, response.text
        assert SECRET not in response.text and generated not in response.text
