"""REST API: the capacity gate on tenant quotas while the master cannot be reached (the capacity is unknown, so a
raise needs ``confirm_overcommit``; the known-capacity cases run against a real master in
``tests/dashboard/master/test_capacity_gate.py``), and the confirmed, audited delete of a release that reserves its
namespace."""
from __future__ import annotations

import pytest

from dashboard.master.capacity import CONFIRMATION_TYPE
from tenants.models import AuditEntry, Release, ReservedNamespace, Tenant
from tests.support.factories import make_assignment, make_node, make_release
from tests.support.telemetry import free_ports

pytestmark = pytest.mark.django_db
V1 = "/api/v1"
RELEASE_BODY = {"num_layers": 36, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "engine": "vllm",
                "engine_version": "0.33.0"}


@pytest.fixture(autouse=True)
def _master_down(settings):
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1
    settings.KVPOOL_MASTER_SYNC = False


# --- capacity unknown ------------------------------------------------------------------------------------------


def test_new_tenant_needs_confirmation_while_the_capacity_is_unknown(api):
    body = {"tenant_id": "huge", "quota_bytes": "9223372036854775807B"}
    response = api.post(f"{V1}/tenants/", body, format="json")
    assert response.status_code == 400 and list(response.json()) == ["confirm_overcommit"]
    message = response.json()["confirm_overcommit"][0]
    assert "mounted capacity is unknown (master metrics at http://127.0.0.1:" in message
    assert "confirm_overcommit=true" in message
    assert not Tenant.objects.exists() and not AuditEntry.objects.exists()
    response = api.post(f"{V1}/tenants/", {**body, "confirm_overcommit": True}, format="json")
    assert response.status_code == 201, response.json()
    assert "confirm_overcommit" not in response.json()
    assert response.json()["effective_quota_bytes"] is None and response.json()["charged_bytes"] is None
    entry = AuditEntry.objects.get(object_type=CONFIRMATION_TYPE)
    assert entry.actor_repr == "operator" and entry.object_id == str(response.json()["id"])
    assert entry.after["capacity_bytes"] is None and entry.after["needs_confirmation"] is True
    assert entry.request_id == AuditEntry.objects.get(object_type="tenants.tenant").request_id


def test_bad_input_is_named_before_the_capacity_question(api):
    response = api.post(f"{V1}/tenants/", {"tenant_id": "_x", "quota_bytes": "8XB"}, format="json")
    assert response.status_code == 400 and set(response.json()) == {"tenant_id", "quota_bytes"}
    response = api.post(f"{V1}/tenants/", {"tenant_id": "a", "quota_bytes": 1, "confirm_overcommit": "maybe"},
                        format="json")
    assert response.status_code == 400 and list(response.json()) == ["confirm_overcommit"]


def test_lowering_a_quota_or_editing_text_needs_no_confirmation(api, tenant):
    assert api.patch(f"{V1}/tenants/{tenant.pk}/", {"quota_bytes": "100GB"}, format="json").status_code == 200
    assert api.patch(f"{V1}/tenants/{tenant.pk}/", {"description": "x"}, format="json").status_code == 200
    response = api.patch(f"{V1}/tenants/{tenant.pk}/", {"quota_bytes": "300GB"}, format="json")
    assert response.status_code == 400 and "confirm_overcommit" in response.json()
    assert not AuditEntry.objects.filter(object_type=CONFIRMATION_TYPE).exists()


def test_quota_plan_says_the_capacity_is_unknown(api, tenant):
    plan = api.get(f"{V1}/tenants/quota-plan/").json()
    assert plan["capacity_bytes"] is None and "unavailable" in plan["capacity_error"]
    assert plan["tenants"] == [{"tenant_id": "acme", "requested_before_bytes": 200 << 30,
                                "requested_after_bytes": 200 << 30, "effective_before_bytes": None,
                                "effective_after_bytes": None, "changed": False, "lowered": False}]
    plan = api.get(f"{V1}/tenants/quota-plan/", {"tenant_id": "new", "quota_bytes": "1GB"}).json()
    assert plan["needs_confirmation"] and plan["requested_after_bytes"] == (200 << 30) + (1 << 30)
    response = api.get(f"{V1}/tenants/quota-plan/", {"tenant_id": "new", "quota_bytes": "1XB"})
    assert response.status_code == 400 and list(response.json()) == ["quota_bytes"]
    response = api.get(f"{V1}/tenants/quota-plan/", {"id": 999, "tenant_id": "x", "quota_bytes": "1GB"})
    assert response.status_code == 400 and list(response.json()) == ["id"]


# --- release delete --------------------------------------------------------------------------------------------


def test_release_delete_needs_the_typed_namespace_and_reserves_it(api, release):
    url = f"{V1}/releases/{release.pk}/"
    response = api.delete(url)
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert "Release 'production-2026-07' (warming)" in detail and "confirm_namespace=production-2026-07" in detail
    assert "reserves namespace 'production-2026-07'" in detail
    response = api.delete(url, {"confirm_namespace": "production"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["confirm_namespace"]
    assert Release.objects.filter(pk=release.pk).exists() and not ReservedNamespace.objects.exists()
    assert api.delete(f"{url}?confirm_namespace=production-2026-07").status_code == 204
    assert not Release.objects.filter(pk=release.pk).exists()
    reserved = api.get(f"{V1}/reserved-namespaces/").json()["results"]
    assert [(r["namespace"], r["reason"], r["release_state"], r["release_pk"]) for r in reserved] == [
        ("production-2026-07", "deleted", "warming", release.pk)]
    response = api.post(f"{V1}/releases/", {"model": release.model_id, "namespace": "production-2026-07",
                                            "weights_revision": "new-weights", **RELEASE_BODY}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["namespace"]
    assert "is reserved" in response.json()["namespace"][0]
    copy = api.post(f"{V1}/releases/", {"model": release.model_id, "namespace": "production-2026-08",
                                        **RELEASE_BODY}, format="json")
    assert copy.status_code == 201
    deleted = AuditEntry.objects.filter(object_type="tenants.release", action="delete")
    assert deleted.count() == 1 and deleted.get().actor_repr == "operator"
    assert AuditEntry.objects.get(object_type="tenants.reservednamespace").request_id == deleted.get().request_id


def test_release_delete_refusals_come_before_the_confirmation(api, release):
    make_assignment(make_node(), release)
    response = api.delete(f"{V1}/releases/{release.pk}/?confirm_namespace=production-2026-07")
    assert response.status_code == 409 and "still referenced by 1 instance" in response.json()["detail"]
    served = make_release(release.model, "served", state="serving")
    response = api.delete(f"{V1}/releases/{served.pk}/")
    assert response.status_code == 409 and "retire it instead" in response.json()["detail"]
    assert Release.objects.count() == 2 and not ReservedNamespace.objects.exists()


def test_copy_cannot_reuse_a_reserved_namespace(api, release):
    make_release(release.model, "canary").delete()
    response = api.post(f"{V1}/releases/{release.pk}/copy/", {"namespace": "canary"}, format="json")
    assert response.status_code == 400 and "is reserved" in response.json()["namespace"][0]
