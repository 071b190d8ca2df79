"""REST API: authentication, CRUD with filtering and pagination, 400s naming the field, no half writes."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db
V1 = "/api/v1"
RELEASE_BODY = {"num_layers": 36, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "engine": "vllm", "engine_version": "0.33.0"}


# --- authentication ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("resource", ["tenants", "models", "releases", "request-groups", "nodes", "assignments", "audit"])
def test_anonymous_reads_refused(anon, resource):
    response = anon.get(f"{V1}/{resource}/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Token")


def test_anonymous_writes_refused_and_nothing_written(anon):
    assert anon.post(f"{V1}/tenants/", {"tenant_id": "acme", "quota_bytes": "8MB"}, format="json").status_code == 401
    assert not Tenant.objects.exists()


def test_session_login_works_too(client, operator):
    client.force_login(operator)
    assert client.get(f"{V1}/tenants/").status_code == 200


def test_bad_token_refused(anon):
    anon.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert anon.get(f"{V1}/tenants/").status_code == 401


def test_schema_endpoint(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/v1/tenants/", "/api/v1/releases/{id}/config/", "/api/v1/releases/{id}/copy/", "/api/v1/nodes/{id}/secret/"):
        assert path in paths


# --- CRUD of every resource --------------------------------------------------------------------------------


def _payloads(kind: str) -> tuple[dict, dict]:
    """(create body, patch body) for ``kind``; creates the objects it refers to."""
    if kind == "tenants":  # no master answers in these tests: a new quota needs confirm_overcommit
        return {"tenant_id": "acme", "quota_bytes": "200GB", "confirm_overcommit": True}, {"description": "edited"}
    tenant = make_tenant("owner")
    if kind == "models":
        return {"tenant": tenant.pk, "served_model_name": "qwen3-8b", "model_path": "Qwen/Qwen3-8B"}, {"description": "x"}
    if kind == "request-groups":
        return {"tenant": tenant.pk, "name": "app-a"}, {"budget_bytes": "1GB"}
    if kind == "nodes":
        return {"name": "node-a", "hostname": "10.0.0.1"}, {"hostname": "10.0.0.2"}
    model = make_model(tenant)
    if kind == "releases":
        return {"model": model.pk, "namespace": "production-2026-07", **RELEASE_BODY}, {"state": "serving"}
    release = make_release(model)
    return {"node": make_node().pk, "release": release.pk, "port": 8000, "role": "prefill"}, {"port": 8001}


@pytest.mark.parametrize("kind", ["tenants", "models", "releases", "request-groups", "nodes", "assignments"])
def test_crud(api, kind):
    create, patch = _payloads(kind)
    response = api.post(f"{V1}/{kind}/", create, format="json")
    assert response.status_code == 201, response.json()
    url = f"{V1}/{kind}/{response.json()['id']}/"
    assert api.get(url).status_code == 200
    listing = api.get(f"{V1}/{kind}/").json()
    assert listing["count"] == 1 and listing["results"][0]["id"] == response.json()["id"]
    updated = api.patch(url, patch, format="json")
    assert updated.status_code == 200, updated.json()
    if kind == "releases":
        assert api.patch(url, {"state": "draining"}, format="json").status_code == 200
        assert api.delete(url).status_code == 409  # has served
    else:
        assert api.delete(url).status_code == 204
        assert api.get(url).status_code == 404


def test_tenant_quota_as_string_or_int(api):
    confirm = {"confirm_overcommit": True}  # no master answers: the capacity is unknown
    body = api.post(f"{V1}/tenants/", {"tenant_id": "acme", "quota_bytes": "8MB", **confirm}, format="json").json()
    assert body["quota_bytes"] == 8388608 and body["quota"] == "8MB" and body["budgeted_bytes"] == 0
    body = api.post(f"{V1}/tenants/", {"tenant_id": "beta", "quota_bytes": 1000, **confirm}, format="json").json()
    assert body["quota_bytes"] == 1000 and body["quota"] == "1000B"


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"tenant_id": "acme", "quota_bytes": "8mb"}, "quota_bytes", "has the unit 'mb'"),
        ({"tenant_id": "acme", "quota_bytes": 0}, "quota_bytes", "must be at least 1 byte"),
        ({"tenant_id": "acme", "quota_bytes": "1.5GB"}, "quota_bytes", "is not a byte size"),
        ({"tenant_id": "_acme", "quota_bytes": 1}, "tenant_id", "tenant_id must not start with '_'"),
        ({"tenant_id": "ac\u0007me", "quota_bytes": 1}, "tenant_id", "(found U+0007)"),
        ({"quota_bytes": 1}, "tenant_id", "This field is required."),
    ],
)
def test_tenant_400_names_the_field(api, body, field, message):
    response = api.post(f"{V1}/tenants/", body, format="json")
    assert response.status_code == 400
    assert message in response.json()[field][0]
    assert not Tenant.objects.exists()


def test_duplicate_tenant_400(api, tenant):
    response = api.post(f"{V1}/tenants/", {"tenant_id": "acme", "quota_bytes": 1}, format="json")
    assert response.status_code == 400
    assert response.json() == {"tenant_id": ["A tenant with this tenant_id already exists."]}


def test_release_rules_reach_the_api(api, release):
    body = {"model": release.model_id, "namespace": "Prod_1", **RELEASE_BODY}
    response = api.post(f"{V1}/releases/", body, format="json")
    assert response.status_code == 400 and response.json()["namespace"][0].startswith("Release namespace 'Prod_1' must not contain '_'")
    api.patch(f"{V1}/releases/{release.pk}/", {"state": "serving"}, format="json")
    response = api.patch(f"{V1}/releases/{release.pk}/", {"block_size": 32}, format="json")
    assert response.status_code == 400
    assert "A new release namespace is required" in response.json()["block_size"][0]
    release.refresh_from_db()
    assert release.block_size == 16


ADAPTERS = [{"name": "b", "path": "/adapters/b"}, {"name": "a", "path": "org/a-lora", "rank": 64}]


def test_release_fields_computed_and_read_only(api, served_model):
    body = {"model": served_model.pk, "namespace": "canary", "fingerprint": "f" * 64, "adapters": ADAPTERS, **RELEASE_BODY}
    data = api.post(f"{V1}/releases/", body, format="json").json()
    release = Release.objects.get(pk=data["id"])
    assert data["fingerprint"] == release.fingerprint != "f" * 64
    assert data["tenant_id"] == "acme" and data["served_model_name"] == "qwen3-8b" and data["hash_seed"] == release.hash_seed
    assert data["adapters"] == ADAPTERS
    model = api.post(
        f"{V1}/models/", {"tenant": served_model.tenant_id, "served_model_name": "m2", "model_path": "/x/Y", "vllm_model_name": "hacked"}, format="json"
    ).json()
    assert model["vllm_model_name"] == "Y" and model["tenant_id"] == "acme"


def test_budget_over_quota_400(api):
    tenant = make_tenant("small", quota="10MB")
    make_group(tenant, budget_bytes=8 << 20)
    response = api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "b", "budget_bytes": "3MB"}, format="json")
    assert response.status_code == 400
    assert response.json()["budget_bytes"][0].startswith("Budgets in tenant 'small' would total 11534336 bytes")
    response = api.patch(f"{V1}/tenants/{tenant.pk}/", {"quota_bytes": "4MB"}, format="json")
    assert response.status_code == 400 and "exceed it by 4194304 bytes" in response.json()["quota_bytes"][0]


def test_request_group_salt(api, tenant):
    generated = api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "a"}, format="json").json()
    assert len(generated["cache_salt"]) == 32
    shared = api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "shared", "cache_salt": ""}, format="json")
    assert shared.status_code == 201 and shared.json()["cache_salt"] == ""
    response = api.patch(f"{V1}/request-groups/{generated['id']}/", {"cache_salt": "other"}, format="json")
    assert response.status_code == 400 and response.json()["cache_salt"][0].startswith("cache_salt is stable")


# --- filtering and pagination ------------------------------------------------------------------------------


def test_filters_and_pagination(api, tenant):
    model = make_model(tenant)
    other = make_model(make_tenant("other"), "llama", model_path="meta/Llama")
    serving = make_release(model, "prod-a", state="serving")
    make_release(model, "prod-b")
    make_release(other, "prod-c")
    ids = lambda response: sorted(item["id"] for item in response.json()["results"])  # noqa: E731
    assert ids(api.get(f"{V1}/releases/?state=serving")) == [serving.pk]
    assert len(ids(api.get(f"{V1}/releases/?state=serving&state=warming"))) == 3
    assert len(ids(api.get(f"{V1}/releases/?tenant_id=acme"))) == 2
    assert ids(api.get(f"{V1}/releases/?has_served=true")) == [serving.pk]
    assert len(ids(api.get(f"{V1}/models/?tenant_id=other"))) == 1
    page = api.get(f"{V1}/releases/?limit=1&ordering=namespace").json()
    assert page["count"] == 3 and len(page["results"]) == 1 and page["results"][0]["namespace"] == "prod-a"
    assert "offset=1" in page["next"]
    assert api.get(f"{V1}/releases/?state=bogus").status_code == 400


@pytest.mark.parametrize("value", ["maybe", "1", "yes", "TRUE", "True"])
def test_invalid_boolean_filter_is_400_naming_it(api, release, value):
    response = api.get(f"{V1}/releases/?has_served={value}")
    assert response.status_code == 400
    assert response.json() == {"has_served": [f"'{value}' is not a boolean: use true or false."]}


def test_boolean_filter_true_false_and_blank(api, served_model):
    serving = make_release(served_model, "prod-a", state="serving")
    warming = make_release(served_model, "prod-b")
    ids = lambda query: [item["id"] for item in api.get(f"{V1}/releases/?{query}").json()["results"]]  # noqa: E731
    assert ids("has_served=true") == [serving.pk]
    assert ids("has_served=false") == [warming.pk]
    assert sorted(ids("has_served=")) == sorted([serving.pk, warming.pk])


@pytest.mark.parametrize(("query", "parameter"), [
    ("releases/?engine=tensorrt", "engine"),
    ("releases/?state=serving&state=bogus", "state"),
    ("releases/?tenant=x", "tenant"),
    ("assignments/?role=leader", "role"),
    ("assignments/?node=1.5", "node"),
    ("audit/?action=rename", "action"),
    ("audit/?since=yesterday", "since"),
])
def test_invalid_choice_and_typed_filters_are_400_naming_them(api, release, query, parameter):
    response = api.get(f"{V1}/{query}")
    assert response.status_code == 400 and list(response.json()) == [parameter]


@pytest.mark.parametrize("resource", ["tenants", "models", "releases", "request-groups", "nodes", "assignments",
                                      "audit"])
def test_unknown_ordering_field_is_400_naming_ordering(api, resource):
    response = api.get(f"{V1}/{resource}/?ordering=-bogus")
    assert response.status_code == 400
    message = response.json()["ordering"][0]
    assert message.startswith("Cannot order by '-bogus': use ") and "prefix '-' for descending" in message


def test_valid_ordering_still_applies(api, served_model):
    make_release(served_model, "prod-a")
    make_release(served_model, "prod-b")
    names = [r["namespace"] for r in api.get(f"{V1}/releases/?ordering=-namespace,created_at").json()["results"]]
    assert names == ["prod-b", "prod-a"]


def test_unknown_parameter_names_are_ignored(api, release):
    assert api.get(f"{V1}/releases/?colour=blue").json()["count"] == 1


# --- rendered config, copy, secrets --------------------------------------------------------------------------


def test_release_config_endpoint(api, release):
    prefill = make_assignment(make_node("node-a"), release, role="prefill")
    decode = make_assignment(make_node("node-b"), release, role="decode")
    data = api.get(f"{V1}/releases/{release.pk}/config/").json()
    assert data["namespace"] == "production-2026-07" and data["fingerprint"] == release.fingerprint
    assert [item["assignment"] for item in data["instances"]] == [prefill.pk, decode.pk]
    one = api.get(f"{V1}/releases/{release.pk}/config/?assignment={decode.pk}").json()
    assert one["role"] == "decode" and one["argv"][:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert one["instance_id"] == str(decode.pk) and "PYTHONHASHSEED" in one["env"]
    foreign = make_assignment(make_node("node-c"), make_release(release.model, "other-ns"))
    for value, message in ((foreign.pk, "does not belong to release"), ("x", "Must be an instance assignment id")):
        response = api.get(f"{V1}/releases/{release.pk}/config/?assignment={value}")
        assert response.status_code == 400 and message in response.json()["assignment"][0]


def test_master_config_endpoint(api, tenant):
    data = api.get(f"{V1}/tenants/master-config/").json()
    assert data["kind"] == "mooncake_master" and "--enable_multi_tenants=true" in data["argv"]
    (content,) = data["files"].values()
    assert "name: acme" in content and "quota: 200GB" in content


def test_copy_endpoint(api, release):
    response = api.post(f"{V1}/releases/{release.pk}/copy/", {"namespace": "production-2026-08"}, format="json")
    assert response.status_code == 201
    assert response.json()["fingerprint"] == release.fingerprint and response.json()["state"] == "warming"
    response = api.post(f"{V1}/releases/{release.pk}/copy/", {"namespace": "production-2026-08"}, format="json")
    assert response.status_code == 400 and "already has a release" in response.json()["namespace"][0]
    response = api.post(f"{V1}/releases/{release.pk}/copy/", {}, format="json")
    assert response.status_code == 400 and "namespace" in response.json()
    assert Release.objects.count() == 2


def test_node_secret_only_for_admins(api, admin_api, node):
    detail = api.get(f"{V1}/nodes/{node.pk}/").json()
    assert "signing_secret" not in detail and node.signing_secret not in str(api.get(f"{V1}/nodes/").content)
    assert api.get(f"{V1}/nodes/{node.pk}/secret/").status_code == 403
    response = admin_api.get(f"{V1}/nodes/{node.pk}/secret/")
    assert response.status_code == 200 and response.json() == {"node": "node-a", "signing_secret": node.signing_secret}
    assert response["Cache-Control"] == "no-store"
    rotated = admin_api.post(f"{V1}/nodes/{node.pk}/secret/").json()["signing_secret"]
    node.refresh_from_db()
    assert rotated == node.signing_secret and len(rotated) == 64


def test_node_post_cannot_set_secret(api):
    data = api.post(f"{V1}/nodes/", {"name": "node-x", "hostname": "h", "signing_secret": "0" * 64}, format="json").json()
    assert Node.objects.get(pk=data["id"]).signing_secret != "0" * 64


# --- conflicts and atomicity -------------------------------------------------------------------------------


def test_delete_of_referenced_objects_is_409(api, release):
    response = api.delete(f"{V1}/tenants/{release.model.tenant_id}/")
    assert response.status_code == 409 and "still referenced by 1 served model" in response.json()["detail"]
    make_assignment(make_node(), release)
    assert api.delete(f"{V1}/releases/{release.pk}/").status_code == 409
    assert Tenant.objects.count() == 1 and Release.objects.count() == 1 and InstanceAssignment.objects.count() == 1


def test_served_release_delete_is_409_with_reason(api, release):
    api.patch(f"{V1}/releases/{release.pk}/", {"state": "serving"}, format="json")
    response = api.delete(f"{V1}/releases/{release.pk}/")
    assert response.status_code == 409 and "retire it instead" in response.json()["detail"]
    assert Release.objects.filter(pk=release.pk).exists()


def test_failure_after_the_write_leaves_nothing(api, monkeypatch):
    def broken_audit(*args, **kwargs):
        raise RuntimeError("audit store down")

    monkeypatch.setattr(AuditEntry.objects, "create", broken_audit)
    with pytest.raises(RuntimeError):
        api.post(f"{V1}/tenants/", {"tenant_id": "acme", "quota_bytes": "8MB", "confirm_overcommit": True},
                 format="json")
    assert not Tenant.objects.exists()


def test_refused_writes_leave_nothing(api, tenant):
    before = (ServedModel.objects.count(), RequestGroup.objects.count(), AuditEntry.objects.count())
    api.post(f"{V1}/models/", {"tenant": tenant.pk, "served_model_name": "a b", "model_path": "x"}, format="json")
    api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "g", "budget_bytes": "1TB"}, format="json")
    assert (ServedModel.objects.count(), RequestGroup.objects.count(), AuditEntry.objects.count()) == before


def test_obtain_token_with_password(anon, operator):
    response = anon.post(f"{V1}/auth-token/", {"username": "operator", "password": "operator-pw"}, format="json")
    assert response.status_code == 200
    anon.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    assert anon.get(f"{V1}/tenants/").status_code == 200
    assert APIClient().post(f"{V1}/auth-token/", {"username": "operator", "password": "wrong"}).status_code == 400


# --- pagination bounds and strict ids (new-user test findings) ---------------------------------------------


@pytest.mark.parametrize("resource", ["releases", "audit", "telemetry/occupancy", "tenants"])
def test_huge_limit_is_capped(api, release, resource):
    response = api.get(f"{V1}/{resource}/?limit=99999999999999999999")
    assert response.status_code == 200, response.content
    assert "results" in response.json()


def test_limit_capped_at_max(api):
    for index in range(3):
        make_tenant(f"t{index}")
    from dashboard.api.pagination import BoundedLimitOffsetPagination

    assert BoundedLimitOffsetPagination.max_limit == 1000
    body = api.get(f"{V1}/tenants/?limit=5000").json()
    assert body["count"] == 3 and len(body["results"]) == 3


@pytest.mark.parametrize("resource", ["releases", "audit", "telemetry/occupancy"])
def test_huge_offset_refused_naming_offset(api, release, resource):
    response = api.get(f"{V1}/{resource}/?offset=99999999999999999999")
    assert response.status_code == 400, response.content
    assert "offset" in response.json()


def test_large_but_valid_offset_gives_empty_page(api, release):
    body = api.get(f"{V1}/releases/?offset=2147483647").json()
    assert body["count"] == 1 and body["results"] == []


@pytest.mark.parametrize("value", ["%C2%B2", "99999999999999999999", "0", "%D9%A1"])
def test_release_config_assignment_must_be_ascii_id(api, release, value):
    response = api.get(f"{V1}/releases/{release.pk}/config/?assignment={value}")
    assert response.status_code == 400, response.content
    assert "assignment" in response.json()


@pytest.mark.parametrize("value", [1.5, 1.0, "1.9", True, "²", 99999999999999999999, -1, [1]])
def test_related_ids_must_be_integers(api, tenant, value):
    value = tenant.pk + 0.5 if value == 1.5 else value
    response = api.post(f"{V1}/models/", {"tenant": value, "served_model_name": "m", "model_path": "Org/M"}, format="json")
    assert response.status_code == 400, response.content
    assert "tenant" in response.json()
    assert not ServedModel.objects.exists()


def test_related_id_as_digit_string_accepted(api, tenant):
    response = api.post(f"{V1}/models/", {"tenant": str(tenant.pk), "served_model_name": "m", "model_path": "Org/M"}, format="json")
    assert response.status_code == 201, response.json()


def test_decimal_model_and_node_ids_refused(api, release, node):
    body = {"model": release.model.pk + 0.9, "namespace": "other-ns", **RELEASE_BODY}
    response = api.post(f"{V1}/releases/", body, format="json")
    assert response.status_code == 400 and "model" in response.json()
    body = {"node": node.pk + 0.9, "release": release.pk, "port": 8000, "role": "prefill"}
    response = api.post(f"{V1}/assignments/", body, format="json")
    assert response.status_code == 400 and "node" in response.json()
    assert not InstanceAssignment.objects.exists()


def test_deleted_group_salt_stays_reserved(api, tenant):
    created = api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "old-app", "cache_salt": "s3cret"}, format="json")
    assert created.status_code == 201, created.json()
    assert api.delete(f"{V1}/request-groups/{created.json()['id']}/").status_code == 204
    response = api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "new-app", "cache_salt": "s3cret"}, format="json")
    assert response.status_code == 400, response.json()
    message = response.json()["cache_salt"][0]
    assert "deleted request group 'old-app'" in message and "cached prefixes" in message
    assert not RequestGroup.objects.exists()
    # Another tenant cannot take it either; a fresh generated salt still works.
    other = make_tenant("other")
    assert api.post(f"{V1}/request-groups/", {"tenant": other.pk, "name": "x", "cache_salt": "s3cret"}, format="json").status_code == 400
    assert api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "new-app"}, format="json").status_code == 201


def test_reserved_salt_is_audited_and_default_shared_salt_not_reserved(api, tenant):
    from tenants.models import ReservedSalt

    shared = make_group(tenant, "shared", cache_salt="")
    group = make_group(tenant, "app-b")
    assert api.delete(f"{V1}/request-groups/{shared.pk}/").status_code == 204
    assert api.delete(f"{V1}/request-groups/{group.pk}/").status_code == 204
    reserved = ReservedSalt.objects.get()
    assert reserved.cache_salt == group.cache_salt and reserved.group_name == "app-b" and reserved.tenant_id == "acme"
    entry = AuditEntry.objects.get(object_type="tenants.reservedsalt")
    assert entry.action == "create" and entry.actor_repr == "operator"
    assert api.post(f"{V1}/request-groups/", {"tenant": tenant.pk, "name": "again", "cache_salt": ""}, format="json").status_code == 201


@pytest.mark.parametrize(("field", "value", "limit"), [("num_layers", 2147483648, 4096), ("num_kv_heads", 4097, 4096), ("head_dim", 65536, 65535)])
def test_release_layout_bounds_same_on_every_database(api, served_model, field, value, limit):
    body = {"model": served_model.pk, "namespace": "big", **RELEASE_BODY, field: value}
    response = api.post(f"{V1}/releases/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()[field] == [f"Ensure this value is less than or equal to {limit}."]
    assert not Release.objects.exists()


@pytest.mark.parametrize(("field", "value", "limit"), [("tp_size", 40000, 4096), ("pp_size", 4097, 4096), ("tp_rank", 4096, 4095), ("dcp_rank", 70000, 4095)])
def test_assignment_parallel_bounds_same_on_every_database(api, release, node, field, value, limit):
    body = {"node": node.pk, "release": release.pk, "port": 8000, "role": "prefill", field: value}
    response = api.post(f"{V1}/assignments/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()[field] == [f"Ensure this value is less than or equal to {limit}."]
    assert not InstanceAssignment.objects.exists()


def test_schema_and_swagger_need_authentication(anon):
    assert anon.get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 401
    assert anon.get("/api/schema/swagger/").status_code in (401, 403)


def test_swagger_ui_references_no_external_host(client, operator):
    import re

    client.force_login(operator)
    response = client.get("/api/schema/swagger/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html and "drf_spectacular_sidecar" in html
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']|["'](https?://[^"']+)["']""", html)
    external = [u for pair in urls for u in pair if u.startswith(("http://", "https://", "//"))]
    assert external == [], external


@pytest.mark.parametrize("value", ["banana", "fp16", "FP8", ""])
def test_kv_dtype_restricted_to_engine_values(api, served_model, value):
    body = {"model": served_model.pk, "namespace": "ns", **RELEASE_BODY, "kv_dtype": value}
    response = api.post(f"{V1}/releases/", body, format="json")
    assert response.status_code == 400, response.content
    assert "kv_dtype" in response.json()
    assert not Release.objects.exists()


def test_kv_dtype_engine_value_accepted_and_copy_checked(api, served_model):
    body = {"model": served_model.pk, "namespace": "ns", **RELEASE_BODY, "kv_dtype": "fp8_e5m2"}
    response = api.post(f"{V1}/releases/", body, format="json")
    assert response.status_code == 201, response.json()
    copy = api.post(f"{V1}/releases/{response.json()['id']}/copy/", {"namespace": "ns-2", "kv_dtype": "banana"}, format="json")
    assert copy.status_code == 400 and "kv_dtype" in copy.json()
