"""A tenant member probing the lists of today's paginated pages and API ``?search=`` for another tenant's names: a
node shared with the other tenant (its instances and occupancy there), search words and sort keys that would only
match the other tenant's rows, counts and ``more`` flags. Nothing of the other tenant may show, in rows or counts."""
from __future__ import annotations

import pytest
from django.utils import timezone

from dashboard.models import OccupancySample
from tenants.choices import TenantRole
from tests.support.factories import (
    grant_role,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.registry import token_client

pytestmark = pytest.mark.django_db

SECRET = "zeta"  # in every name of the other tenant


@pytest.fixture
def shared_node(django_user_model):
    acme, rival = make_tenant("acme"), make_tenant(f"{SECRET}corp")
    node = make_node("node-shared")
    mine = make_release(make_model(acme), "acme-prod", state="serving")
    theirs = make_release(make_model(rival, f"{SECRET}-model", f"/models/{SECRET}"), f"{SECRET}-ns", state="serving")
    make_group(rival, f"{SECRET}-group", cache_salt=f"{SECRET}-salt")
    make_assignment(node, mine, port=8000, gpu_ids="0")
    for port in range(8001, 8004):
        make_assignment(node, theirs, port=port, gpu_ids=str(port - 8000))
    now = timezone.now()
    for tenant, model, namespace in (("acme", mine.model.served_model_name, "acme-prod"),
                                     (rival.tenant_id, f"{SECRET}-model", f"{SECRET}-ns")):
        OccupancySample.objects.create(ts=now, node_name="node-shared", tenant_id=tenant, served_model_name=model,
                                       namespace=namespace, request_group="", bytes=1 << 20)
    member = grant_role(django_user_model.objects.create_user("acme-viewer"), acme, TenantRole.VIEWER)
    return member, node


def test_api_search_names_and_counts_never_reach_the_other_tenant(shared_node):
    member, _node = shared_node
    api = token_client(member)
    for path in ("/api/v1/tenants/", "/api/v1/models/", "/api/v1/releases/", "/api/v1/request-groups/",
                 "/api/v1/assignments/", "/api/v1/telemetry/occupancy/", "/api/v1/telemetry/instances/",
                 "/api/v1/reserved-namespaces/", "/api/v1/audit/"):
        response = api.get(path, {"search": SECRET})
        assert response.status_code in (200, 404), (path, response.status_code)
        if response.status_code == 200:
            body = response.json()
            assert body.get("count", 0) == 0 and SECRET not in response.content.decode(), (path, body)
    for kind in ("tenants", "served-models", "namespaces", "request-groups"):
        for params in ({"q": SECRET[:1]}, {"q": ""}, {"tenant_id": f"{SECRET}corp"},
                       {"served_model_name": f"{SECRET}-model"}):
            body = api.get(f"/api/v1/names/{kind}/", params).json()
            assert SECRET not in str(body["results"]) and body["more"] is False, (kind, params, body)
    # the assignments list sorted by every offered key shows only the member's one instance on the shared node
    for ordering in ("port", "-port", "node__name", "release__namespace", "role", "created_at"):
        body = api.get("/api/v1/assignments/", {"ordering": ordering}).json()
        assert body["count"] == 1, (ordering, body)


def test_pages_lists_counts_and_sorts_never_reach_the_other_tenant(client, shared_node):
    member, node = shared_node
    client.force_login(member)
    pages = [("/registry/", {"q": SECRET}), ("/registry/", {"nodes_sort": "-instances"}),
             ("/registry/", {"tenants_sort": "-releases", "q": "acme"}),
             (f"/nodes/{node.pk}/", {"q": SECRET}), (f"/nodes/{node.pk}/", {"sort": "-tenant"}),
             (f"/nodes/{node.pk}/", {"sort": "-namespace", "page": "999999999999999999999"}),
             ("/", {}), ("/occupancy/", {"tenant_id": f"{SECRET}corp"})]
    for path, params in pages:
        response = client.get(path, params)
        assert response.status_code in (200, 400), (path, params, response.status_code)
        text = response.content.decode()
        names = [f"{SECRET}-ns", f"{SECRET}-model", f"{SECRET}-group", f"{SECRET}-salt"]
        if not params.get("tenant_id"):  # the occupancy filter echoes the tenant typed in
            names.append(f"{SECRET}corp")
        assert not [name for name in names if name in text], (path, params)
    # the node's instance count on the registry page is the member's own (1), not the node's (4)
    text = client.get("/registry/", {"q": "node-shared"}).content.decode()
    row = text[text.index("node-shared"):][:600]
    assert ">4<" not in row
