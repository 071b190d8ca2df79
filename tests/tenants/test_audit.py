"""Audit log: every create/update/delete with actor, request id, before/after; secrets never recorded."""
from __future__ import annotations

import json

import pytest

from tenants.audit import audit_context
from tenants.models import AuditEntry
from tenants.services import validated_save
from tests.support.factories import make_node, make_tenant

pytestmark = pytest.mark.django_db
V1 = "/api/v1"


@pytest.fixture(autouse=True)
def _master_unreachable(settings):
    """No master answers: the pool's capacity is unknown, so raising a quota needs ``confirm_overcommit``."""
    from agent.sim.master import free_ports

    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1


def test_api_changes_are_attributed_to_the_token_user(api):
    # confirm_overcommit: no master answers here, so every raise of a quota needs the confirmation
    response = api.post(f"{V1}/tenants/", {"tenant_id": "acme", "quota_bytes": "8MB", "confirm_overcommit": True},
                        format="json", HTTP_X_REQUEST_ID="req-42")
    assert response["X-Request-ID"] == "req-42"
    tenant_pk = response.json()["id"]
    api.patch(f"{V1}/tenants/{tenant_pk}/", {"quota_bytes": "16MB", "confirm_overcommit": True}, format="json")
    api.patch(f"{V1}/tenants/{tenant_pk}/", {"quota_bytes": "16MB"}, format="json")  # no change: no entry
    api.delete(f"{V1}/tenants/{tenant_pk}/")
    entries = list(AuditEntry.objects.filter(object_type="tenants.tenant").order_by("id"))
    assert [e.action for e in entries] == ["create", "update", "delete"]
    create, update, delete = entries
    assert {e.actor_repr for e in entries} == {"operator"} and all(e.actor.username == "operator" for e in entries)
    assert create.request_id == "req-42" and create.before is None and create.after["quota_bytes"] == 8 << 20
    assert update.changed_fields() == ["quota_bytes", "updated_at"]
    assert (update.before["quota_bytes"], update.after["quota_bytes"]) == (8 << 20, 16 << 20)
    assert delete.after is None and delete.before["tenant_id"] == "acme" and delete.object_id == str(tenant_pk)
    assert len({e.request_id for e in entries}) == 3


def test_generated_request_id_when_header_missing_or_malformed(api):
    response = api.post(f"{V1}/tenants/", {"tenant_id": "a", "quota_bytes": 1, "confirm_overcommit": True},
                        format="json", HTTP_X_REQUEST_ID="bad id!")
    entry = AuditEntry.objects.get(object_type="tenants.tenant")
    assert response["X-Request-ID"] == entry.request_id != "bad id!" and len(entry.request_id) == 32


def test_audit_api_is_read_only_and_filterable(api, tenant):
    make_node()
    data = api.get(f"{V1}/audit/?object_type=tenants.node").json()
    assert data["count"] == 1 and data["results"][0]["action"] == "create" and data["results"][0]["actor_repr"] == "system"
    assert api.get(f"{V1}/audit/?action=create").json()["count"] == 2
    assert api.post(f"{V1}/audit/", {}, format="json").status_code == 405
    assert api.delete(f"{V1}/audit/{data['results'][0]['id']}/").status_code == 405


def test_agent_and_task_context(tenant):
    with audit_context("agent:node-a", request_id="task-7"):
        tenant.description = "touched by an agent"
        validated_save(tenant)
    entry = AuditEntry.objects.filter(action="update").get()
    assert (entry.actor, entry.actor_repr, entry.request_id) == (None, "agent:node-a", "task-7")


def test_secrets_are_redacted(admin_api):
    node = make_node()
    admin_api.post(f"{V1}/nodes/{node.pk}/secret/")
    node.refresh_from_db()
    entries = AuditEntry.objects.filter(object_type="tenants.node").order_by("id")
    assert [e.action for e in entries] == ["create", "update"]
    assert entries[0].after["signing_secret"] == "<redacted>"
    assert entries[1].before["signing_secret"] == "<redacted>" and entries[1].after["signing_secret"] == "<redacted, changed>"
    dumped = json.dumps([[e.before, e.after] for e in entries])
    assert node.signing_secret not in dumped


def test_refused_change_writes_no_entry(api, tenant):
    count = AuditEntry.objects.count()
    assert api.patch(f"{V1}/tenants/{tenant.pk}/", {"tenant_id": "_bad"}, format="json").status_code == 400
    assert AuditEntry.objects.count() == count


def test_every_registry_model_is_audited(release):
    from tenants.models import InstanceAssignment, RequestGroup
    from tests.support.factories import make_assignment, make_group

    make_group(release.model.tenant)
    make_assignment(make_node("node-z"), release)
    types = set(AuditEntry.objects.values_list("object_type", flat=True))
    assert types == {
        "tenants.tenant", "tenants.servedmodel", "tenants.release", "tenants.requestgroup", "tenants.node",
        "tenants.instanceassignment",
    }  # fmt: skip
    assert RequestGroup.objects.count() == InstanceAssignment.objects.count() == 1


def test_anonymous_request_context(rf):
    from tenants.audit import AuditContext

    request = rf.get("/")
    from django.contrib.auth.models import AnonymousUser

    request.user = AnonymousUser()
    assert AuditContext(request_id="r", request=request).resolve_actor() == (None, "anonymous")
    make_tenant("plain")
    assert AuditEntry.objects.get().actor_repr == "system"
