"""Lists at fleet size, with small numbers: ``?search=`` on every registry list, a stable order across pages, and
the type-ahead of names (``/api/v1/names/<kind>/``) scoped to the user's tenants."""
from __future__ import annotations

import pytest

from tenants.choices import TenantRole
from tests.support.factories import grant_role, make_group, make_model, make_node, make_release, make_tenant
from tests.support.registry import token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_tenants():
    acme, beta = make_tenant("acme"), make_tenant("beta")
    for tenant in (acme, beta):
        model = make_model(tenant)
        for index in range(3):
            make_release(model, f"{tenant.tenant_id}-prod-{index}", state="serving")
        for index in range(4):
            make_group(tenant, f"{tenant.tenant_id}-app-{index}")
    for index in range(5):
        make_node(f"node-{index:02d}", hostname=f"10.0.0.{index + 1}")
    return acme, beta


@pytest.mark.parametrize(("path", "search", "field", "expected"), [
    ("/api/v1/tenants/", "bet", "tenant_id", ["beta"]),
    ("/api/v1/releases/", "acme prod-1", "namespace", ["acme-prod-1"]),
    ("/api/v1/request-groups/", "app-3", "name", ["acme-app-3", "beta-app-3"]),
    ("/api/v1/nodes/", "10.0.0.4", "name", ["node-03"]),
    ("/api/v1/assignments/", "nothing-matches", "id", []),
    ("/api/v1/models/", "beta", "tenant", None),
])
def test_every_registry_list_searches_its_fields(api, two_tenants, path, search, field, expected):
    response = api.get(path, {"search": search})
    assert response.status_code == 200, response.content
    rows = response.json()["results"]
    if expected is None:
        assert len(rows) == 1 and rows[0]["tenant"] == two_tenants[1].pk
    else:
        assert [row[field] for row in rows] == expected


def test_search_is_bounded_and_named_in_the_error(api, two_tenants):
    response = api.get("/api/v1/releases/", {"search": "x" * 201})
    assert response.status_code == 400 and "search" in response.json()
    response = api.get("/api/v1/releases/", {"search": " ".join("abcdefghi")})
    assert response.status_code == 400 and "9 given" in response.json()["search"][0]


def test_pages_of_a_list_sorted_by_a_column_with_ties_neither_repeat_nor_skip(api, two_tenants):
    seen = []
    for offset in range(0, 6, 2):
        rows = api.get("/api/v1/releases/", {"ordering": "state", "limit": 2, "offset": offset}).json()["results"]
        seen += [row["id"] for row in rows]
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 6


def test_names_type_ahead_returns_the_first_names_of_a_prefix(api, two_tenants):
    response = api.get("/api/v1/names/request-groups/", {"q": "ACME-app", "limit": 2})
    assert response.status_code == 200
    assert response.json() == {"kind": "request-groups", "results": ["acme-app-0", "acme-app-1"], "more": True}
    names = api.get("/api/v1/names/namespaces/", {"tenant_id": "beta"}).json()
    assert names["results"] == ["beta-prod-0", "beta-prod-1", "beta-prod-2"] and names["more"] is False
    # served model names are distinct across tenants
    assert api.get("/api/v1/names/served-models/").json()["results"] == ["qwen3-8b"]
    assert api.get("/api/v1/names/nodes/", {"q": "node-0"}).json()["results"] == [f"node-{i:02d}" for i in range(5)]


def test_a_tenant_member_never_gets_another_tenants_names(two_tenants, django_user_model):
    acme, _beta = two_tenants
    member = grant_role(django_user_model.objects.create_user("acme-viewer"), acme, TenantRole.VIEWER)
    client = token_client(member)
    for kind in ("tenants", "served-models", "namespaces", "request-groups"):
        body = client.get(f"/api/v1/names/{kind}/", {"limit": 100}).json()
        assert body["results"] and not any("beta" in name for name in body["results"]), (kind, body)
    assert client.get("/api/v1/names/request-groups/", {"q": "beta"}).json()["results"] == []
    assert client.get("/api/v1/names/namespaces/", {"tenant_id": "beta"}).json()["results"] == []
    assert client.get("/api/v1/names/nodes/").json()["results"]  # nodes are every user's to see


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": "0"}, "limit"), ({"limit": "abc"}, "limit"), ({"q": "x" * 256}, "q"),
    ({"tenant_id": "t" * 300}, "tenant_id"),
])
def test_names_type_ahead_refuses_bad_parameters_naming_them(api, params, field):
    response = api.get("/api/v1/names/tenants/", params)
    assert response.status_code == 400 and field in response.json()


def test_names_type_ahead_kinds_and_login(api, anon):
    response = api.get("/api/v1/names/users/")
    assert response.status_code == 404 and "tenants, served-models" in response.json()["detail"]
    assert api.get("/api/v1/names/tenants/", {"limit": "5000"}).status_code == 200  # capped, not refused
    assert anon.get("/api/v1/names/tenants/").status_code == 401


def test_the_schema_documents_search_and_the_type_ahead(api):
    schema = api.get("/api/schema/", {"format": "json"}).json()
    releases = schema["paths"]["/api/v1/releases/"]["get"]["parameters"]
    assert {"search", "ordering", "limit", "offset"} <= {p["name"] for p in releases}
    names = schema["paths"]["/api/v1/names/{kind}/"]["get"]["parameters"]
    assert {"q", "limit", "tenant_id", "served_model_name", "kind"} <= {p["name"] for p in names}
