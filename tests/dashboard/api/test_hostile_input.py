"""A corpus of hostile requests against every operation of the API schema, the token endpoint and the login page:
none may end in a server error, and the limits answer as documented (docs/api.md "Limits").

Corpus: JSON nested 1,000 deep (arrays and objects), bodies past the 1 MiB limit, a 900,000-character field,
non-ASCII digits and 64-bit overflows in path ids, blank and garbage query values, content types the views do
not parse (or with an unknown charset, or multipart without a boundary), invalid UTF-8 in the body, query and
path, a Content-Length that is not a number, NUL characters, NaN and huge numbers.
"""
from __future__ import annotations

import json
import re

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from knox.models import AuthToken

from agent.sim.master import free_ports
from dashboard.limits import DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_REQUEST_BYTES, json_depth_exceeds
from tenants.models import Node
from tenants.validators import MAX_TEXT_LENGTH
from tests.support.factories import make_model, make_node, make_release, make_tenant

DEEP_ARRAYS = "[" * 1000 + "]" * 1000
DEEP_OBJECTS = '{"a":' * 1000 + "1" + "}" * 1000
JUST_TOO_DEEP = "[" * (DEFAULT_MAX_JSON_DEPTH + 1) + "]" * (DEFAULT_MAX_JSON_DEPTH + 1)
HUGE_FIELD = "x" * 900_000

#: (label, body bytes, content type); each is sent with every method of every operation.
BODIES: list[tuple[str, bytes, str]] = [
    ("deep arrays", DEEP_ARRAYS.encode(), "application/json"),
    ("deep objects", DEEP_OBJECTS.encode(), "application/json"),
    ("deep under */*", DEEP_ARRAYS.encode(), "*/*"),
    ("just too deep", JUST_TOO_DEEP.encode(), "application/json"),
    ("over the size limit", b'{"description": "' + b"x" * DEFAULT_MAX_REQUEST_BYTES + b'"}', "application/json"),
    ("huge fields", json.dumps({key: HUGE_FIELD for key in ("tenant_id", "description", "name", "namespace",
                                                            "username", "password")}).encode(), "application/json"),
    ("invalid UTF-8", b'{"tenant_id": "\xff\xfe", "name": "\xc3("}', "application/json"),
    ("invalid UTF-8 form", b"tenant_id=%ff&name=\xff\xfe&username=\xc3(", "application/x-www-form-urlencoded"),
    ("unknown charset", b'{"name": "x"}', "application/json; charset=no-such-codec"),
    ("unknown form charset", b"name=x", "application/x-www-form-urlencoded; charset=no-such-codec"),
    ("multipart without boundary", b"--x\r\n\r\n", "multipart/form-data"),
    ("multipart garbage", b"\x00\xff" * 64, "multipart/form-data; boundary=zz"),
    ("text", b"tenant_id=x", "text/plain"),
    ("xml", b"<tenant/>", "application/xml"),
    ("NUL characters", json.dumps({"tenant_id": "a\x00b", "description": "\x00", "name": "\x00",
                                   "adapters": [{"name": "a\x00", "path": "/a\x00"}]}).encode(), "application/json"),
    ("NaN and huge numbers", b'{"quota_bytes": NaN, "num_layers": 1e999, "port": -Infinity, "tp_size": '
                             + b"9" * 5000 + b"}", "application/json"),
    ("wrong shapes", json.dumps([1, "two", None, {"three": [4]}]).encode(), "application/json"),
    ("scalar", b"null", "application/json"),
    ("empty", b"", "application/json"),
]

#: Query strings sent to every operation (blank values mean "absent", garbage is a 400 naming the parameter).
QUERIES = ["limit=&offset=&ordering=&tenant=&engine=&state=&has_served=&level=&drift=&since=&assignment=",
           "limit=%D9%A1&offset=%D9%A1&tenant=%D9%A1&model=%D9%A1&assignment=%D9%A1",
           "limit=99999999999999999999999&offset=99999999999999999999999&tenant=99999999999999999999999",
           "limit={0}&offset={0}&tenant={0}".format("9" * 5000),  # past int()'s 4,300 digits
           "since=%ff%fe&until=0001-01-01T00:00:00%2B05:00&ordering=%ff&tenant_id=%00",
           "ordering=-,-,--id&level=%00&drift=" + "x" * 10_000,
           "&".join(f"p{index}=1" for index in range(2000))]  # more fields than Django parses

#: Replacements of a path parameter: non-ASCII digits (Arabic-Indic, fullwidth, superscript), out-of-range ids,
#: invalid UTF-8, a huge value.
PATH_IDS = ["%D9%A1", "%EF%BC%91", "%C2%B2", "0", "-1", "+1", "01x", "99999999999999999999999",
            "9223372036854775808", "%ff", "%00", "x" * 5000, "9" * 5000]


@pytest.fixture
def env(db, django_user_model, settings):
    """A small registry, a superuser's token; nothing reaches a master or a broker."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.KVPOOL_MASTER_SYNC = False
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1
    make_release(make_model(make_tenant()))
    make_node()
    user = django_user_model.objects.create_superuser("hostile-admin", "h@example.com", "hostile-pw")
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user)[1]}")
    schema = client.get("/api/schema/?format=json").json()
    operations = [(path, method.upper()) for path, item in schema["paths"].items() for method in item
                  if method in ("get", "post", "put", "patch", "delete")]
    return client, operations


def _concrete(path: str, value: str = "1") -> str:
    return re.sub(r"\{[^}]+\}", value, path)


def _send(client: Client, method: str, url: str, body: bytes = b"", content_type: str = "application/json", **extra):
    return client.generic(method, url, body, content_type=content_type, **extra)


def test_the_corpus_covers_every_api_operation(env):
    _client, operations = env
    paths = {path for path, _method in operations}
    assert {"/api/v1/tenants/", "/api/v1/tenants/{id}/", "/api/v1/auth-token/", "/api/v1/releases/{id}/copy/",
            "/api/v1/telemetry/nodes/{name}/push/", "/api/v1/nodes/{id}/secret/"} <= paths
    assert len(operations) >= 40


def test_no_hostile_body_is_a_server_error(env):
    client, operations = env
    anonymous = Client(raise_request_exception=False)
    targets = [(client, method, _concrete(path)) for path, method in operations]
    targets += [(anonymous, "POST", "/api/v1/auth-token/"), (anonymous, "POST", "/accounts/login/")]
    errors = []
    for who, method, url in targets:
        for label, body, content_type in BODIES:
            status = _send(who, method, url, body, content_type).status_code
            if status >= 500:
                errors.append(f"{method} {url} with {label}: {status}")
    assert not errors, "\n".join(errors)


def test_no_hostile_query_or_path_is_a_server_error(env):
    client, operations = env
    errors = []
    for path, method in operations:
        urls = [f"{_concrete(path)}?{query}" for query in QUERIES]
        if "{" in path:
            urls += [_concrete(path, value) for value in PATH_IDS]
        for url in urls:
            body = b"{}" if method in ("POST", "PUT", "PATCH") else b""
            status = _send(client, method, url, body).status_code
            if status >= 500:
                errors.append(f"{method} {url[:120]}: {status}")
    for url in ("/accounts/login/?next=%ff%00", "/tenants/%D9%A1/", "/tenants/99999999999999999999999/",
                "/releases/1/config/%D9%A1.json", "/api/v1/%ff/", "/api/%00"):
        status = client.get(url).status_code
        if status >= 500:
            errors.append(f"GET {url}: {status}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("body", [DEEP_ARRAYS, DEEP_OBJECTS, JUST_TOO_DEEP])
def test_deep_json_is_a_400_naming_the_limit_even_anonymously(db, body):
    response = Client().post("/api/v1/auth-token/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"detail": f"JSON body is nested more than {DEFAULT_MAX_JSON_DEPTH} "
                                         "arrays/objects deep."}


def test_json_at_the_depth_limit_is_parsed(env):
    client, _operations = env
    at_limit = "[" * DEFAULT_MAX_JSON_DEPTH + "]" * DEFAULT_MAX_JSON_DEPTH
    response = client.post("/api/v1/tenants/", at_limit, content_type="application/json")
    assert response.status_code == 400
    assert "non_field_errors" in response.json()  # the serializer's complaint, not the limit's


def test_a_body_over_the_limit_is_a_413_before_authentication(db):
    body = b"[" + b"1," * (DEFAULT_MAX_REQUEST_BYTES // 2) + b"1]"
    response = Client().post("/api/v1/tenants/", body, content_type="application/json")
    assert response.status_code == 413
    assert response.json() == {"detail": f"Request body of {len(body)} bytes exceeds the limit of "
                                         f"{DEFAULT_MAX_REQUEST_BYTES} bytes."}


def test_the_limits_follow_the_settings(env, settings):
    client, _operations = env
    settings.KVPOOL_MAX_REQUEST_BYTES = 100
    settings.KVPOOL_MAX_JSON_DEPTH = 2
    response = client.post("/api/v1/tenants/", "[[1]]", content_type="application/json")
    assert response.status_code == 400 and "non_field_errors" in response.json()
    response = client.post("/api/v1/tenants/", "[[[1]]]", content_type="application/json")
    assert response.json() == {"detail": "JSON body is nested more than 2 arrays/objects deep."}
    assert client.post("/api/v1/tenants/", "x" * 101, content_type="text/plain").status_code == 413
    assert client.post("/api/v1/tenants/", "x" * 100, content_type="text/plain").status_code == 415


def test_a_content_length_that_is_not_a_number_is_a_400(db):
    response = Client().generic("POST", "/api/v1/auth-token/", b"{}", content_type="application/json",
                                CONTENT_LENGTH="12abc")
    assert response.status_code == 400
    assert response.json() == {"detail": "Content-Length '12abc' is not a byte count."}


@pytest.mark.parametrize(("body", "deeper"), [
    (b"[]", False), (b"[[]]", False), (b'["[[[[[[[["]', False), (b'{"a": "\\"[[[[[[["}', False),
    (b"[[[]]]", True), (b'[{"a": [1]}]', True), ('["ٱ", [["é"]]]'.encode(), True),
])
def test_json_depth_counts_arrays_and_objects_not_strings(body, deeper):
    assert json_depth_exceeds(body, 2) is deeper


@pytest.mark.parametrize("path_id", ["%D9%A1", "%EF%BC%91", "0", "99999999999999999999999", "9223372036854775808"])
def test_path_ids_follow_the_query_rule(env, path_id, django_user_model):
    """``/tenants/١/`` used to resolve to tenant 1 (the ORM reads Unicode digits) while ``?tenant=١`` was a 400;
    now an id in a path is ASCII digits in [1, 2**63 - 1] or 404, in the API and on the pages."""
    client, _operations = env
    client.force_login(django_user_model.objects.get(username="hostile-admin"))
    response = client.get(f"/api/v1/tenants/{path_id}/")
    assert response.status_code == 404
    assert "detail" in response.json()
    assert client.get(f"/tenants/{path_id}/").status_code == 404
    tenant = client.get("/api/v1/tenants/").json()["results"][0]["id"]
    assert client.get(f"/api/v1/tenants/{tenant}/").status_code == 200
    assert client.get(f"/tenants/{tenant}/").status_code == 200


@pytest.mark.parametrize("url", ["/api/v1/telemetry/nodes/a%00b/", "/api/v1/tenants/?tenant_id=%00",
                                 "/occupancy/data.json?tenant=%00", "/api/v1/tenants/?a%00=1"])
def test_nul_characters_in_the_url_are_a_400(env, url):
    client, _operations = env
    response = client.get(url)
    assert response.status_code == 400
    assert response.json() == {"detail": "The URL holds a NUL character (%00)."}


@pytest.mark.parametrize("header", ["Token \xff\xfe", "Token " + "\xe9" * 40, "token \u00e9 x", "Token " + "a" * 9000])
def test_a_garbage_token_is_a_401_even_when_not_utf8(db, header):
    """Knox decodes the token as UTF-8; a Latin-1 header byte was a 500 for any anonymous caller."""
    response = Client(raise_request_exception=False).get("/api/v1/tenants/", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["detail"] in ("Invalid token.", "Invalid token header. Token string should not contain "
                                                           "spaces.")


def test_requests_django_refuses_answer_json_under_api(env):
    client, _operations = env
    response = client.get("/api/v1/tenants/?" + "&".join(f"p{index}=1" for index in range(2000)))
    assert response.status_code == 400
    assert response.json() == {"detail": "Bad request."}


def test_unknown_api_paths_answer_json(env):
    client, _operations = env
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_blank_query_values_mean_absent(env):
    client, _operations = env
    release = client.get("/api/v1/releases/").json()["results"][0]["id"]
    assert client.get(f"/api/v1/releases/{release}/config/?assignment=").json()["release"] == release
    assert client.get("/api/v1/releases/?engine=&has_served=&state=").json()["count"] == 1


def test_free_text_is_capped_in_the_api_and_the_model(env):
    client, _operations = env
    tenant = client.get("/api/v1/tenants/").json()["results"][0]["id"]
    response = client.patch(f"/api/v1/tenants/{tenant}/", {"description": "d" * (MAX_TEXT_LENGTH + 1)},
                            content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"description": [f"Ensure this field has no more than {MAX_TEXT_LENGTH} characters."]}
    response = client.patch(f"/api/v1/tenants/{tenant}/", {"description": "d" * MAX_TEXT_LENGTH},
                            content_type="application/json")
    assert response.status_code == 200 and len(response.json()["description"]) == MAX_TEXT_LENGTH
    node = Node(name="node-long", hostname="10.0.0.9", description="n" * (MAX_TEXT_LENGTH + 1))
    with pytest.raises(ValidationError) as refused:  # the admin and the page forms call full_clean() too
        node.full_clean()
    assert list(refused.value.message_dict) == ["description"]
