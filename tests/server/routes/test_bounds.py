"""Every integer and number a REST route takes, in its query or its path, at and past the
bounds of what the database stores: never a 5xx, on either database (a 64-bit overflow in
SQL was a 500 and a closed connection). Read from the server's own OpenAPI schema, so a
route added later is held to it."""

from __future__ import annotations

from typing import Any

import httpx

from keel.importers import ImportedRun, PointTable
from keel.transfer import upload_run

ADMIN = "keel_test_admin_token_bounds_0123456789abcdef"
VALUES = (
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551616",
    "2147483648", "-1", "0", "1e309", "-1e309", "nan", "99999999999999999999999999999", "abc", "",
)


def _numeric(parameter: dict[str, Any]) -> bool:
    schema = parameter.get("schema", {})
    kinds = [schema.get("type"), *(option.get("type") for option in schema.get("anyOf", []))]
    return "integer" in kinds or "number" in kinds


def test_no_integer_or_number_parameter_gets_a_5xx(server_factory, database_url) -> None:
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    table = PointTable()
    for step in range(5):
        table.add(step, "mismatch/kl", 0.01 * (step + 1))
    run = ImportedRun(identity="bounds-run", name="bounds", table=table)
    assert upload_run(run, table.rows(), server.url, token=ADMIN, timeout=60) is None
    headers = {"Authorization": f"Bearer {ADMIN}"}
    schema = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    tried = 0
    failures = []
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        for path, operations in schema["paths"].items():
            for method, operation in operations.items():
                parameters = operation.get("parameters", [])
                numeric = [p for p in parameters if _numeric(p) and p["in"] in ("query", "path")]
                if not numeric:
                    continue
                for parameter in numeric:
                    for value in VALUES:
                        url = path.replace("{run_id}", run.run_id)
                        params: dict[str, str] = {}
                        if parameter["in"] == "path":
                            url = url.replace("{" + parameter["name"] + "}", value or "0")
                        else:
                            params[parameter["name"]] = value
                        url = url.replace("{", "").replace("}", "")  # any other path parameter: a literal
                        body = {} if method in ("post", "patch", "put") else None
                        response = client.request(method.upper(), url, params=params, json=body)
                        tried += 1
                        if response.status_code >= 500:
                            failures.append(f"{method.upper()} {url} {parameter['name']}={value!r}: {response.status_code} {response.text[:200]}")
    assert tried > 100, tried
    assert not failures, "\n".join(failures[:20])
