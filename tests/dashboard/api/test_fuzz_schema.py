"""Property-based fuzzing of the REST API against its own live OpenAPI schema (schemathesis).

The schema is fetched from ``/api/schema/`` through the Django WSGI app with a superuser's token, and every
operation it lists gets generated requests, both ones the schema allows and ones it forbids (wrong types,
out-of-range ids, pattern violations, missing fields), sent with that token. Each response must:

* not be a server error (5xx);
* have a status code the schema documents for the operation, with the documented content type and a body that
  validates against the documented schema;
* refuse (4xx) a request the schema forbids (``negative_data_rejection``): the documented rules are really
  enforced.

Bounded: ``MAX_EXAMPLES`` valid and as many invalid requests per operation, no shrinking, a fixed seed
(reproducible in CI): about 2,000 requests, 90 s on two cores (SQLite; 110 s on PostgreSQL). The work is bounded
by the number of examples, not by time: the pytest timeout is only a hang guard, far above what a loaded machine
needs.
"""
from __future__ import annotations

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from knox.models import AuthToken
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agent.sim.master import free_ports
from tests.support.factories import make_model, make_node, make_release, make_tenant

#: Requests generated per operation and mode (valid, invalid).
MAX_EXAMPLES = 25

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture
def token(db, django_user_model, settings) -> str:
    """A superuser's API token over a small registry; nothing reaches a master or a broker."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.KVPOOL_MASTER_SYNC = False
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1
    make_release(make_model(make_tenant()))
    make_node()
    user = django_user_model.objects.create_superuser("fuzz-admin", "fuzz@example.com", "fuzz-pw")
    return AuthToken.objects.create(user)[1]


@pytest.fixture
def live_schema(token):
    """The schema the running app serves at ``/api/schema/``, bound to the app (requests go through WSGI).

    As Django's test client does, requests do not close the database connection when they finish: the test's
    transaction (and on PostgreSQL the connection itself) must outlive them.
    """
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application(),
                                             headers={"Authorization": f"Token {token}"})
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _fuzz(operation, mode: GenerationMode, token: str) -> None:
    """Send ``MAX_EXAMPLES`` generated requests of ``mode`` to ``operation``; raise on the first failed check."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case) -> None:
        case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)

    run()


@pytest.mark.timeout(1800)  # hang guard only (see the module docstring)
def test_api_conforms_to_its_schema(live_schema, token):
    """Every operation, positive and negative examples: no 5xx, nothing the schema does not document."""
    operations = [result.ok() for result in live_schema.get_all_operations()]
    assert len(operations) >= 40  # every resource of /api/v1/ (a schema that lost its paths fails here)
    failures = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, token)
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE, f"no request for {operation.method} {operation.path}"
                continue  # no parameters and no body: nothing to get wrong
            except (Exception, FailureGroup) as error:  # collected, then reported together
                failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}):\n{error}")
    assert not failures, "\n\n".join(failures)


def test_the_fuzzer_finds_what_the_schema_does_not_document(live_schema, token):
    """The same run against a schema that hides the 400 of ``GET /api/v1/releases/`` fails: the checks bite."""
    del live_schema.raw_schema["paths"]["/api/v1/releases/"]["get"]["responses"]["400"]
    operation = next(result.ok() for result in live_schema.get_all_operations()
                     if result.ok().path == "/api/v1/releases/" and result.ok().method.upper() == "GET")
    with pytest.raises(FailureGroup, match="Undocumented status code"):
        _fuzz(operation, GenerationMode.NEGATIVE, token)
