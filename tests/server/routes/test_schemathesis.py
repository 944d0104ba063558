"""The REST API fuzzed from its own OpenAPI schema (schemathesis), against a real server on
each database with auth on: no request, valid or not, gets a 5xx, and every response is
one the schema documents (status, content type, body)."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

ADMIN = "keel_test_admin_token_schemathesis_0123456789"
EXAMPLES = 40
"""Cases per operation and generation mode: ~20 operations x 2 modes stays near a minute
per database on a small machine."""
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


GENERATED: dict[tuple[str, str], list[Any]] = {}
"""Each operation's and mode's cases as the first database's test generated them, all of
them: the other database's test sends the very same requests (generation is derandomized,
so it would draw these again) without paying for drawing them twice."""


def _fuzz(operation: Any, mode: GenerationMode, base_url: str, failures: list[str]) -> None:
    def send(case: Any) -> None:
        try:
            case.call_and_validate(base_url=base_url, headers={"Authorization": f"Bearer {ADMIN}"}, checks=CHECKS, timeout=30)
        except (AssertionError, FailureGroup) as exc:
            failures.append(f"{operation.label} [{mode.value}]: {exc}")

    key = (operation.label, mode.value)
    if key in GENERATED:
        for case in GENERATED[key]:
            send(case)
        return
    drawn: list[Any] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report the case as found
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(mode))
    def run(case: Any) -> None:
        drawn.append(case)
        send(case)

    try:
        run()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE, operation.label  # nothing to get wrong (no parameters)
    GENERATED[key] = drawn


@pytest.mark.slow
def test_no_5xx_and_every_response_is_documented(server_factory, database_url) -> None:
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    failures: list[str] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(operation, mode, server.url, failures)
    assert not failures, "\n\n".join(failures[:10])
