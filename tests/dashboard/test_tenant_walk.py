"""Tenant isolation, walked: every URL of the REST API (router and telemetry routes) and every dashboard page, read
as a member of tenant A (viewer, operator, admin; not a platform admin), shows nothing of tenant B — no name, salt,
namespace, fingerprint or error text of B in any body (JSON, DRF's browsable HTML, OPTIONS), no id of a B object in
any list — and every write aimed at B is refused (403 or 404) and changes nothing.

Every name of tenant B contains ``MARK``; B also has telemetry (occupancy, engine facts, master quotas), audit
entries, a purge request, a reserved namespace and salt, a member, an API token, and shares its node with A (the
node's document, acks, error texts and refused messages name B).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from dashboard.api.names import KINDS as NAME_KINDS
from dashboard.api.urls import router
from dashboard.models import (
    ConfigAck,
    InstanceStats,
    MasterQuotaSample,
    MasterQuotaSync,
    MessageRejection,
    NodeState,
    OccupancySample,
)
from dashboard.views.edit import KINDS
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ReservedNamespace,
    ServedModel,
    Tenant,
    TenantMembership,
)
from tenants.services import validated_save
from tests.support.factories import (
    grant_role,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.registry import api_token, fast_password_hashing, fresh_throttles, token_client  # noqa: F401
from tests.support.ui import _isolated  # noqa: F401

pytestmark = pytest.mark.django_db

#: In every name, salt, description and error text of tenant B.
MARK = "bravo-secret"


@dataclass
class World:
    """Tenants A and B with one object of every kind each, B's secrets, and A's operator."""

    a: dict[type, Any] = field(default_factory=dict)
    b: dict[type, Any] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)
    node: Node | None = None
    a_instance: str = ""
    b_instance: str = ""
    b_token_key: str = ""


def _tenant(world: dict, name: str, port: int, node: Node, *, salt: str, prefix: str, gpu: str) -> None:
    tenant = make_tenant(f"{prefix}-t", "10GB", description=f"{prefix} description")
    model = make_model(tenant, f"{prefix}-model", f"org/{prefix}-weights", description=f"{prefix} model")
    release = make_release(model, f"{prefix}-ns", state="serving", description=f"{prefix} release")
    group = make_group(tenant, f"{prefix}-grp", cache_salt=salt, description=f"{prefix} group")
    assignment = make_assignment(node, release, port=port, gpu_ids=gpu)
    world.update({Tenant: tenant, ServedModel: model, Release: release, RequestGroup: group,
                  InstanceAssignment: assignment})


@pytest.fixture
def world(django_user_model, monkeypatch, settings) -> World:
    from dashboard.rollout import purge
    from dashboard.rollout.push import ensure_versions

    settings.KVPOOL_METRICS_TOKEN = "scrape-token"
    monkeypatch.setattr(purge.app, "send_task", lambda *args, **kwargs: None)
    w = World(node=make_node("node-shared", "10.0.0.5"))
    _tenant(w.a, "alpha", 8000, w.node, salt="alpha-salt-1", prefix="alpha", gpu="0")
    _tenant(w.b, "bravo", 8001, w.node, salt=f"{MARK}-salt-1", prefix=MARK, gpu="1")
    b_tenant, b_model = w.b[Tenant], w.b[ServedModel]
    # B's history: a renamed release (reserved namespace), a deleted group (reserved salt), a purged old release
    renamed = make_release(b_model, f"{MARK}-ns0", weights_revision="r0")
    renamed.namespace = f"{MARK}-ns9"
    validated_save(renamed)
    make_group(b_tenant, f"{MARK}-gone", cache_salt=f"{MARK}-oldsalt").delete()
    old = make_release(b_model, f"{MARK}-old", state="serving")
    old.state = "draining"
    validated_save(old)
    old.state = "retired"
    validated_save(old)
    purge.request_purge(old, confirm=old.namespace)
    # a platform admin's confirmed raise of A's quota while the master is unknown: its audited plan lists B (the
    # raise itself is not kept: A's quota stays 10GB for the tests below)
    from dashboard.master.capacity import PoolState, check_tenant_change, record_confirmation

    raised = Tenant.objects.get(pk=w.a[Tenant].pk)
    raised.quota_bytes *= 2
    plan = check_tenant_change(raised, confirmed=True, pool=PoolState(None, error="master unknown"))
    assert b_tenant.tenant_id in str(record_confirmation(w.a[Tenant], plan).after)
    # B's member and token
    bob = grant_role(django_user_model.objects.create_user(f"{MARK}-user", password="pw"), b_tenant, "admin")
    w.b[TenantMembership] = TenantMembership.objects.get(user=bob)
    from knox.models import AuthToken

    api_token(bob)
    w.b_token_key = AuthToken.objects.get(user=bob).token_key
    # telemetry of both tenants on the shared node
    now = timezone.now()
    ensure_versions([w.node])
    for side in (w.a, w.b):
        tenant, release, assignment = side[Tenant], side[Release], side[InstanceAssignment]
        OccupancySample.objects.create(ts=now - timedelta(seconds=30), node_name=w.node.name,
                                       tenant_id=tenant.tenant_id, served_model_name=release.model.served_model_name,
                                       namespace=release.namespace, request_group=side[RequestGroup].name,
                                       blocks=10, bytes=10 << 20)
        InstanceStats.objects.create(node_name=w.node.name, instance_id=str(assignment.pk), tenant_id=tenant.tenant_id,
                                     served_model_name=release.model.served_model_name, namespace=release.namespace,
                                     agent_started_at=now - timedelta(hours=1), reported_at=now,
                                     observed_since=now - timedelta(hours=1), blocks_seen=5, attributed=5,
                                     attributed_by_group={side[RequestGroup].name: 5},
                                     last_error=f"{tenant.tenant_id} last error")
        MasterQuotaSample.objects.create(ts=now, tenant_id=tenant.tenant_id, requested_quota_bytes=10 << 30,
                                         effective_quota_bytes=10 << 30, charged_bytes=1 << 20)
        MasterQuotaSync.objects.create(tenant_id=tenant.tenant_id, desired_quota_bytes=10 << 30,
                                       last_error=f"{tenant.tenant_id} sync error", last_error_at=now)
    w.a_instance, w.b_instance = str(w.a[InstanceAssignment].pk), str(w.b[InstanceAssignment].pk)
    NodeState.objects.update_or_create(node_name=w.node.name, defaults={
        "push_error": f"push failed for {MARK}-ns", "rejection_reason": "invalid",
        "rejection_error": f"{MARK}-ns refused", "rejected_version": 1, "rejected_at": now, "heartbeat_at": now})
    ConfigAck.objects.create(node_name=w.node.name, sequence=1, version=1, status="rejected", reason="invalid",
                             error=f"instance of {MARK}-ns: bad", sent_at=now)
    MessageRejection.objects.create(reason="bad_signature", node=w.node.name, count=1, last_at=now,
                                    last_error=f"{MARK} forged")
    w.a[TenantMembership] = None  # filled by the operator fixture
    w.a[Node] = w.b[Node] = w.node
    w.a[AuditEntry] = AuditEntry.objects.filter(tenant_pk=w.a[Tenant].pk).first()
    w.b[AuditEntry] = AuditEntry.objects.filter(tenant_pk=b_tenant.pk).first()
    w.b[ReservedNamespace] = ReservedNamespace.objects.get(tenant_id=b_tenant.tenant_id, namespace=f"{MARK}-ns0")
    w.secrets = {MARK, w.b[Release].fingerprint, old.fingerprint, renamed.fingerprint}
    return w


@pytest.fixture
def alice(world, django_user_model):
    """An operator of tenant A: a member, not a platform admin."""
    user = grant_role(django_user_model.objects.create_user("alice", password="alice-pw"), world.a[Tenant], "operator")
    world.a[TenantMembership] = TenantMembership.objects.get(user=user)
    return user


@pytest.fixture
def alice_api(alice):
    return token_client(alice)


@pytest.fixture
def alice_ui(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture(params=["viewer", "operator", "admin"])
def member(request, world, django_user_model):
    """A member of tenant A in each role (the walks run once per role)."""
    user = grant_role(django_user_model.objects.create_user("alice", password="alice-pw"), world.a[Tenant],
                      request.param)
    world.a[TenantMembership] = TenantMembership.objects.get(user=user)
    return user


@pytest.fixture
def member_api(member):
    return token_client(member)


@pytest.fixture
def member_ui(client, member):
    client.force_login(member)
    return client


def assert_clean(response, world: World, url: str) -> None:
    body = response.content.decode("utf-8", errors="replace")
    for secret in world.secrets:
        assert secret not in body, f"{url} ({response.status_code}) shows {secret!r}: {body[:2000]}"


def b_ids_in(response, world: World, model) -> set[int]:
    """Ids of B's objects of ``model`` among the objects of a JSON list or detail body."""
    if not response.get("Content-Type", "").startswith("application/json") or model not in world.b:
        return set()
    data = response.json()
    items = data.get("results", [data]) if isinstance(data, dict) else data
    b_pk = getattr(world.b[model], "pk", None)
    return {item["id"] for item in items if isinstance(item, dict) and item.get("id") == b_pk and model is not Node}


def _walk(patterns, prefix: str = "", namespace: str = "") -> Iterator[tuple[str, URLPattern, str]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern), ns)
        elif isinstance(entry, URLPattern) and entry.name:
            yield prefix + str(entry.pattern), entry, namespace


def routes() -> list[tuple[str, str, tuple[str, ...], dict]]:
    """(route text, URL name with namespace, path parameters, default kwargs) of every named route of the site."""
    found = []
    for text, entry, namespace in _walk(get_resolver().url_patterns):
        params = tuple(entry.pattern.regex.groupindex)
        if "format" in params:
            continue  # the router's ".json" twins of the same views
        found.append((text, f"{namespace}{entry.name}", params, entry.default_args))
    return found


#: API route name -> the model of its ``pk``.
API_MODELS = {basename: viewset.queryset.model for _prefix, viewset, basename in router.registry}
#: Page route name (``ui:...``) -> the model of its ``pk``.
PAGE_MODELS = {"tenant": Tenant, "model": ServedModel, "upgrade": ServedModel, "upgrade-start": ServedModel,
               "upgrade-shift": ServedModel, "upgrade-retire": ServedModel, "upgrade-abort": ServedModel,
               "release": Release, "release-config": Release, "instance-config": Release, "purge": Release,
               "node": Node, "request-group": RequestGroup}


def _model_of(name: str, defaults: dict):
    if name.startswith("ui:"):
        page = name[3:]
        if "kind" in defaults:
            return KINDS[defaults["kind"]].model
        return PAGE_MODELS[page]
    return API_MODELS.get(name.rsplit("-", 1)[0])


def urls_for(world: World, side: str) -> list[tuple[str, Any]]:
    """Every site URL with its path parameters filled from ``side`` ("a" or "b"): ``(url, model)``; routes whose
    object ``side`` lacks are left out."""
    objects = world.a if side == "a" else world.b
    out = []
    for text, name, params, defaults in routes():
        if name.startswith("admin:") or not params and side == "b":
            continue
        kwargs: dict[str, Any] = {}
        model = None
        if "pk" in params:
            model = _model_of(name, defaults)
            if objects.get(model) is None:
                continue
            kwargs["pk"] = objects[model].pk
        if "assignment_pk" in params:
            kwargs["assignment_pk"] = objects[InstanceAssignment].pk
        if "name" in params:
            kwargs["name"] = world.node.name
        if "instance_id" in params:
            kwargs["instance_id"] = world.a_instance if side == "a" else world.b_instance
        if "token_key" in params:
            kwargs["token_key"] = world.b_token_key
        if {"uidb64", "token"} & set(params):
            continue  # password reset links: no mail in this walk
        if "key" in params:
            kwargs["key"] = "blocks_registered"  # one check's own page (platform only)
        if "kind" in params:  # the type-ahead of every kind of name: one list for both tenants, walked as A's
            if side == "b":
                continue
            for kind in NAME_KINDS:
                out.append((reverse(name, kwargs={**kwargs, "kind": kind}), None))
            continue
        if set(params) - set(kwargs):
            raise AssertionError(f"the walk does not know how to fill {name} ({text}): add it")
        if side == "b" and (model is Node or "pk" not in params and "instance_id" not in params
                            and "token_key" not in params):
            continue  # the shared node (and lists) are the same URL for both tenants: walked as A's
        out.append((reverse(name, kwargs=kwargs), model))
    return out


def test_the_walk_covers_every_route(world, alice):
    names = {name for _text, name, _params, _defaults in routes() if not name.startswith("admin:")}
    walked = {url for url, _model in urls_for(world, "a")}
    assert len(walked) >= len(names) - 4  # the password reset confirmation routes are left out
    assert {"/api/v1/tenants/", "/api/v1/request-groups/", "/api/v1/audit/", "/api/v1/telemetry/occupancy/",
            "/api/v1/telemetry/instances/", "/api/v1/memberships/", "/", "/audit/", "/occupancy/data.json",
            "/checks/data.json", "/chargeback/", "/api/v1/telemetry/chargeback/",
            "/api/v1/telemetry/chargeback.csv"} <= walked


def test_tenant_a_member_reads_nothing_of_tenant_b(world, member, member_api, member_ui):
    alice_api, alice_ui, role = member_api, member_ui, alice_role(member)
    seen_ok = 0
    for url, model in urls_for(world, "a"):
        client = alice_api if url.startswith("/api/") else alice_ui
        response = client.get(url)
        assert response.status_code < 500, url
        assert_clean(response, world, url)
        assert not b_ids_in(response, world, model), url
        seen_ok += response.status_code == 200
        if url.startswith("/api/") and role == "operator":  # DRF's browsable API (its forms list related objects
            # and filter choices) and OPTIONS, once
            browsable = alice_ui.get(url, HTTP_ACCEPT="text/html")
            assert browsable.status_code < 500, url
            assert_clean(browsable, world, f"{url} (browsable)")
            options = alice_api.options(url)
            assert options.status_code < 500, f"OPTIONS {url}"
            assert_clean(options, world, f"OPTIONS {url}")
    for url, _model in urls_for(world, "b"):
        client = alice_api if url.startswith("/api/") else alice_ui
        response = client.get(url)
        assert response.status_code in (403, 404, 405), (url, response.status_code)
        assert_clean(response, world, url)
    assert seen_ok > 40
    # what A's operator does see of A: the pages and lists are not empty
    assert alice_api.get("/api/v1/request-groups/").json()["count"] == 1
    assert alice_api.get("/api/v1/telemetry/instances/").json()["count"] == 1
    assert alice_api.get("/api/v1/assignments/").json()["count"] == 1
    chargeback = alice_api.get("/api/v1/telemetry/chargeback/?group_by=scope").json()
    assert [row["namespace"] for row in chargeback["rows"]] == ["alpha-ns"] and chargeback["total_byte_hours"] > 0
    assert "alpha-ns" in alice_api.get("/api/v1/telemetry/chargeback.csv?group_by=release").content.decode()
    node_page = alice_ui.get(reverse("ui:node", args=[world.node.pk])).content.decode()
    assert "alpha-ns" in node_page
    document = alice_api.get(f"/api/v1/telemetry/nodes/{world.node.name}/").json()["document"]
    assert [spec["namespace"] for spec in document["instances"]] == ["alpha-ns"]
    audit = alice_api.get("/api/v1/audit/").json()
    assert audit["count"] > 0 and {entry["object_repr"] for entry in audit["results"]} >= {"alpha-ns", "alpha-t"}
    # a confirmed overcommit lists every tenant's quota: platform admins only, even when it raised A's quota
    assert alice_api.get("/api/v1/audit/?object_type=dashboard.quotaconfirmation").json()["count"] == 0
    assert alice_ui.get("/metrics").status_code == 401  # platform scraping only (bearer token)


def alice_role(user) -> str:
    return TenantMembership.objects.get(user=user).role


def _snapshot(world: World) -> tuple:
    rows = []
    for model in (Tenant, ServedModel, Release, RequestGroup, InstanceAssignment, TenantMembership):
        rows.append(sorted((obj.pk, obj.updated_at) for obj in model.objects.all()))
    return (*rows, AuditEntry.objects.count(), Node.objects.get().signing_secret)


def test_writes_aimed_at_tenant_b_are_refused_and_change_nothing(world, member, member_api, member_ui):
    alice, alice_api, alice_ui = member, member_api, member_ui
    before = _snapshot(world)
    b = world.b
    for url, _model in urls_for(world, "b"):
        client = alice_api if url.startswith("/api/") else alice_ui
        for method in ("post", "put", "patch", "delete"):
            if url.startswith("/api/"):
                response = getattr(client, method)(url, {"description": "x"}, format="json")
            else:
                response = getattr(client, method)(url, {"description": "x", "confirm": "on"})
            assert response.status_code in (403, 404, 405), (method, url, response.status_code)
            assert_clean(response, world, url)
    # creating in B or pointing A's objects at B: B's ids "do not exist"
    for resource, body in (
        ("models", {"tenant": b[Tenant].pk, "served_model_name": "x", "model_path": "x/X"}),
        ("request-groups", {"tenant": b[Tenant].pk, "name": "x"}),
        ("releases", {"model": b[ServedModel].pk, "namespace": "x", "num_layers": 1, "num_kv_heads": 1,
                      "head_dim": 1, "block_size": 16, "engine": "vllm", "engine_version": "0.33.0"}),
        ("assignments", {"release": b[Release].pk, "node": world.node.pk, "port": 8100}),
        ("memberships", {"tenant": b[Tenant].pk, "user": alice.pk, "role": "admin"}),
        ("tenants", {"tenant_id": "x", "quota_bytes": "1GB"}),
        ("nodes", {"name": "x", "hostname": "10.0.0.9"}),
    ):
        response = alice_api.post(f"/api/v1/{resource}/", body, format="json")
        assert response.status_code in (400, 403), (resource, response.status_code, response.content)
        assert_clean(response, world, resource)
    moved = alice_api.patch(f"/api/v1/models/{world.a[ServedModel].pk}/", {"tenant": b[Tenant].pk}, format="json")
    assert moved.status_code == 403 if alice_role(alice) == "viewer" else moved.status_code == 400
    assert moved.status_code == 403 or "tenant" in moved.json()
    assert alice_api.post(f"/api/v1/telemetry/nodes/{world.node.name}/push/", {}, format="json").status_code == 403
    assert alice_api.post(f"/api/v1/nodes/{world.node.pk}/secret/").status_code == 403
    assert alice_api.delete(f"/api/v1/tokens/{world.b_token_key}/").status_code == 404
    # pages: creating in B through a form (B's ids are not among the choices)
    response = alice_ui.post(reverse("ui:model-new"), {"tenant": b[Tenant].pk, "served_model_name": "x",
                                                       "model_path": "x/X"})
    if alice_role(alice) == "viewer":
        assert response.status_code == 403
    else:
        assert response.status_code == 400 and "tenant" in response.context["form"].errors
    assert_clean(response, world, "ui:model-new")
    assert _snapshot(world) == before
    from knox.models import AuthToken

    assert AuthToken.objects.filter(token_key=world.b_token_key).exists()


def test_tenant_a_operator_writes_tenant_a(world, alice, alice_api, alice_ui):
    a = world.a
    changed = alice_api.patch(f"/api/v1/models/{a[ServedModel].pk}/", {"description": "d"}, format="json")
    assert changed.status_code == 200
    created = alice_api.post("/api/v1/request-groups/", {"tenant": a[Tenant].pk, "name": "alpha-two"}, format="json")
    assert created.status_code == 201
    entry = AuditEntry.objects.get(object_type="tenants.requestgroup", object_id=str(created.json()["id"]))
    assert entry.tenant_pk == a[Tenant].pk and entry.actor_repr == "alice"
    # an operator does not delete releases (admin) nor change the tenant (admin) nor create tenants (platform)
    deleted = alice_api.delete(f"/api/v1/releases/{a[Release].pk}/")
    assert deleted.status_code == 403
    assert "tenants.delete_release" in deleted.json()["detail"]
    assert alice_api.patch(f"/api/v1/tenants/{a[Tenant].pk}/", {"description": "d"}, format="json").status_code == 403
    page = alice_ui.get(reverse("ui:release", args=[a[Release].pk])).content.decode()
    assert reverse("ui:release-edit", args=[a[Release].pk]) in page
    assert reverse("ui:release-delete", args=[a[Release].pk]) not in page


def test_viewer_role_reads_but_writes_nothing(world, django_user_model):
    viewer = grant_role(django_user_model.objects.create_user("val", password="pw"), world.a[Tenant], "viewer")
    client = token_client(viewer)
    assert client.get(f"/api/v1/models/{world.a[ServedModel].pk}/").status_code == 200
    refused = client.patch(f"/api/v1/models/{world.a[ServedModel].pk}/", {"description": "d"}, format="json")
    assert refused.status_code == 403 and "tenants.change_servedmodel" in refused.json()["detail"]
    refused = client.post("/api/v1/request-groups/", {"tenant": world.a[Tenant].pk, "name": "g"}, format="json")
    assert refused.status_code == 403 and "tenants.add_requestgroup" in refused.json()["detail"]


def test_tenant_admin_changes_the_description_not_the_quota(world, django_user_model):
    admin = grant_role(django_user_model.objects.create_user("ada", password="pw"), world.a[Tenant], "admin")
    client = token_client(admin)
    url = f"/api/v1/tenants/{world.a[Tenant].pk}/"
    assert client.patch(url, {"description": "ours"}, format="json").status_code == 200
    for body in ({"quota_bytes": "20GB"}, {"tenant_id": "alpha-2"}):
        refused = client.patch(url, body, format="json")
        assert refused.status_code == 403 and "platform admin" in refused.json()["detail"]
    assert Tenant.objects.get(pk=world.a[Tenant].pk).quota_bytes == 10 << 30
    assert client.delete(url).status_code == 403
    assert client.get("/api/v1/tenants/quota-plan/").status_code == 403
    assert client.get("/api/v1/tenants/master-config/").status_code == 403
    # the page: quota and tenant_id disabled (a posted value is ignored), no pool plan naming other tenants
    ui = django_user_model.objects.get(username="ada")
    from django.test import Client

    browser = Client()
    browser.force_login(ui)
    form_page = browser.get(reverse("ui:tenant-edit", args=[world.a[Tenant].pk]))
    assert form_page.status_code == 200 and 'id="quota-plan"' not in form_page.content.decode()
    assert_clean(form_page, world, "tenant-edit")
    browser.post(reverse("ui:tenant-edit", args=[world.a[Tenant].pk]),
                 {"tenant_id": "alpha-t", "quota_bytes": "99GB", "description": "page"})
    stored = Tenant.objects.get(pk=world.a[Tenant].pk)
    assert stored.quota_bytes == 10 << 30 and stored.description == "page"


def test_a_user_without_membership_sees_no_tenant(world, django_user_model):
    nobody = django_user_model.objects.create_user("nobody", password="pw")
    client = token_client(nobody)
    for resource in ("tenants", "models", "releases", "request-groups", "assignments", "audit",
                     "telemetry/occupancy", "telemetry/instances", "telemetry/master/samples"):
        assert client.get(f"/api/v1/{resource}/").json()["count"] == 0, resource
    assert client.get("/api/v1/telemetry/master/").json() == []
    assert client.get("/api/v1/nodes/").json()["count"] == 1  # nodes are seen by everyone (no tenant content)


def test_audit_entries_written_before_memberships_get_their_tenant(world):
    """Migration 0008 fills tenant_pk of existing entries from their snapshots."""
    import importlib

    from django.apps import apps

    migration = importlib.import_module("tenants.migrations.0008_tenant_access")
    AuditEntry.objects.update(tenant_pk=None)
    migration.tenant_of_entries(apps, None)
    b_pk = world.b[Tenant].pk
    kinds = set(AuditEntry.objects.filter(tenant_pk=b_pk).values_list("object_type", flat=True))
    assert {"tenants.tenant", "tenants.servedmodel", "tenants.release", "tenants.requestgroup",
            "tenants.instanceassignment", "tenants.reservedsalt", "tenants.reservednamespace",
            "dashboard.purgerequest"} <= kinds
    assert not AuditEntry.objects.filter(object_type="tenants.node").exclude(tenant_pk=None).exists()


def test_json_bodies_parse(world, alice_api):
    """The walk's id check reads JSON bodies: the API answers JSON (a sanity check of the check itself)."""
    response = alice_api.get("/api/v1/request-groups/")
    assert json.loads(response.content)["results"][0]["id"] == world.a[RequestGroup].pk
    assert re.fullmatch(r"[0-9a-f]{15}", world.b_token_key)
