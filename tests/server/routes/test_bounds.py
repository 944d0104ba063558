"""Every parameter a REST route takes, in its query or its path, given values no client
should send: integers and numbers at and past the bounds of what the database stores, and
malformed; booleans that are not; strings empty, long, with NUL, controls, bidi overrides,
bytes that are no UTF-8, SQL and path tricks; lists past their bound and of such strings.
Never a 5xx, nor a closed connection, on either database (a 64-bit overflow in SQL was a 500
and a closed connection). Read from the server's own OpenAPI schema, so a route or a
parameter added later is held to it; every other parameter a route requires is given a
valid value, so each hostile value reaches the route's own code."""

from __future__ import annotations

import itertools
from typing import Any
from urllib.parse import quote_from_bytes

import httpx
import pytest

from keel.importers import ImportedRun, PointTable
from keel.transfer import upload_run

ADMIN = "keel_test_admin_token_bounds_0123456789abcdef"
KEY = "mismatch/kl"
NUMBERS = (
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "18446744073709551616", "2147483647", "2147483648", "-2147483649", "-1", "0", "-0", "1.5", "1e3",
    "1e309", "-1e309", "1e-400", "nan", "inf", "-inf", "99999999999999999999999999999", "9" * 5000,
    "0x10", "1_000", "+1", " 1", "\u0663", "\uff11", "abc", "", "\x00",
)  # fmt: skip
BOOLEANS = ("2", "-1", "yes", "truee", "tRuE", "", " ", "\x00", "nan", "9" * 5000)
STRINGS = (
    "", " ", "\x00", "a\x00b", "\x1b[2K\rSAME", "\u202e", "\U0001f600", "x" * 201, "x" * 8000, ",", "," * 3000,
    "a," * 1500, "*", "%", "_", "\\", "..", "../../etc/passwd", "'; DROP TABLE runs; --", '"', "<script>",
    "9223372036854775808", "-1", "null", "[]", "{}",
)  # fmt: skip
DATES = (
    "0000-00-00", "2024-13-45", "2024-02-30T25:61:61Z", "9999-12-31T23:59:59.999999Z", "10000-01-01",
    "-2024-01-01", "0001-01-01T00:00:00-23:59", "2024-01-01T00:00:00+99:00", "1e309", "9223372036854775808",
)  # fmt: skip
"""For a date or date-time parameter (none yet: times are unix seconds, numbers)."""
RAW = (b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"a\xffb")
"""Bytes that are no UTF-8 (a lone surrogate, an overlong slash): sent percent-encoded."""
UNSET = {"cursor", "from", "to", "force"}
"""Optional parameters given only when under test: a page's cursor is the previous page's,
`from` and `to` are the deprecated names of `start` and `end` (both at once are refused),
and `force` would delete the run every other value is tried on."""
PAGES = (("GET", "/login", "next"), ("GET", "/compare", "runs"))
"""Routes outside the schema (the login form, the dashboard) that read a query parameter."""


def _options(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A parameter's schema and each of its `anyOf` (an optional one is its type or null)."""
    return [schema, *schema.get("anyOf", [])]


def _kinds(schema: dict[str, Any]) -> set[str]:
    return {option["type"] for option in _options(schema) if option.get("type") not in (None, "null")}


def _hostile(schema: dict[str, Any]) -> list[list[bytes]]:
    """The values to try for a parameter of `schema`: each a list of raw values (a list
    parameter repeats; every other takes one)."""
    kinds = _kinds(schema)
    values: list[list[bytes]] = []
    if kinds & {"integer", "number"}:
        values += [[value.encode()] for value in NUMBERS]
    if "boolean" in kinds:
        values += [[value.encode()] for value in BOOLEANS]
    if "string" in kinds or "array" in kinds or not kinds:
        values += [[value.encode()] for value in (*STRINGS, *NUMBERS[:4])] + [[raw] for raw in RAW]
    if any(option.get("format") in ("date", "date-time") for option in _options(schema)):
        values += [[value.encode()] for value in DATES]
    if "array" in kinds:
        item = next(option.get("items", {}) for option in _options(schema) if option.get("type") == "array")
        bound = max(option.get("maxItems", 0) for option in _options(schema))
        values += [[b"x"] * (bound + 1), [b"x"] * 5000, [b""] * 3, [b"\x00", b"a"], [b"a" * 201] * 50, [b"\xff"]]
        values += [[f"r{i}".encode() for i in range(bound or 1000)]]
        if _kinds(item) & {"integer", "number"}:
            values += [[value.encode()] for value in NUMBERS]
    return values


def _valid(name: str, schema: dict[str, Any], ids: dict[str, str]) -> list[bytes]:
    """A value the route takes for a parameter not under test (so the hostile one reaches
    the route's own code)."""
    if name in ids:
        return [ids[name].encode()]
    kinds = _kinds(schema)
    if "array" in kinds:
        return [ids["run_id"].encode()]
    if kinds & {"integer", "number"}:
        low = [int(option["minimum"]) for option in _options(schema) if "minimum" in option]
        return [str(max([1, *low])).encode()]
    if "boolean" in kinds:
        return [b"false"]
    enum = [value for option in _options(schema) for value in option.get("enum", [])]
    return [str(enum[0] if enum else KEY).encode()]


def _target(path: str, query: list[tuple[str, bytes]]) -> str:
    encoded = "&".join(f"{quote_from_bytes(name.encode(), safe='')}={quote_from_bytes(value, safe='')}" for name, value in query)
    return path + ("?" + encoded if encoded else "")


def _call(client: httpx.Client, method: str, target: str, failures: list[str], what: str) -> None:
    body = {} if method in ("POST", "PATCH", "PUT") else None
    try:
        response = client.request(method, target, json=body)
    except httpx.HTTPError as exc:  # the connection closed without an answer
        failures.append(f"{what}: {type(exc).__name__} {exc}")
        return
    if response.status_code >= 500:
        failures.append(f"{what}: {response.status_code} {response.text[:200]}")


def _requests(schema: dict[str, Any], ids: dict[str, str]) -> list[tuple[str, str, str]]:
    """(method, target, what) for every hostile value of every path and query parameter of
    every operation, twice: beside only the parameters the route requires, and beside every
    other one it takes (but those in UNSET); DELETEs last (they name a run of their own)."""
    requests: list[tuple[str, str, str]] = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            given = dict(ids, run_id=ids["victim"]) if method == "delete" else ids
            parameters = [p for p in operation.get("parameters", []) if p["in"] in ("query", "path")]
            for parameter, every in itertools.product(parameters, (False, True)):
                assert _hostile(parameter.get("schema", {})), f"no values to try for {parameter}"
                for hostile in _hostile(parameter.get("schema", {})):
                    url, query = path, []
                    for other in parameters:
                        values = hostile if other is parameter else _valid(other["name"], other.get("schema", {}), given)
                        if other is not parameter and not other.get("required") and (not every or other["name"] in UNSET):
                            continue
                        if other["in"] == "path":
                            url = url.replace("{" + other["name"] + "}", quote_from_bytes(values[0], safe=""))
                        else:
                            query += [(other["name"], value) for value in values]
                    what = f"{method.upper()} {path}{' (every parameter)' if every else ''} {parameter['name']}={[v[:40] for v in hostile[:3]]}{'...' if len(hostile) > 3 else ''}"
                    requests.append((method.upper(), _target(url, query), what))
    requests.sort(key=lambda request: request[0] == "DELETE")
    return requests


@pytest.mark.slow
def test_no_parameter_of_any_route_gets_a_5xx(server_factory, database_url) -> None:
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    ids = {}
    for name in ("bounds", "victim"):
        table = PointTable()
        for step in range(5):
            table.add(step, KEY, 0.01 * (step + 1))
        run = ImportedRun(identity=f"{name}-run", name=name, table=table)
        assert upload_run(run, table.rows(), server.url, group="g", token=ADMIN, timeout=60) is None
        ids[name] = run.run_id
    ids |= {"run_id": ids["bounds"], "key": KEY, "keys": KEY, "latest": KEY, "name": "nobody", "project": "default", "group": "g"}
    schema = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    requests = _requests(schema, ids)
    for method, path, name in PAGES:
        requests += [(method, _target(path, [(name, value)]), f"{method} {path} {name}={value[:40]!r}")
                     for value in (*(v.encode() for v in STRINGS), *RAW)]  # fmt: skip
    requests += [("GET", f"/runs/{quote_from_bytes(value.encode(), safe='')}", f"GET /runs/{value[:40]!r}") for value in STRINGS if value]
    names = {(p["name"], p["in"]) for operations in schema["paths"].values() for op in operations.values() for p in op.get("parameters", [])}
    assert {("run_id", "query"), ("run_id", "path"), ("limit", "query"), ("start", "query"), ("alert_id", "path")} <= names
    failures: list[str] = []
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60) as client:
        for method, target, what in requests:
            _call(client, method, target, failures, what)
    assert len(requests) > 4000, len(requests)
    assert not failures, f"{len(failures)} of {len(requests)}:\n" + "\n".join(failures[:30])
