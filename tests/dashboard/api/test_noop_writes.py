"""A write that changes nothing — the same values, or only read-only fields (ignored, as DRF does) — saves
nothing: ``updated_at`` stays, no audit entry, no config push scheduled."""
from __future__ import annotations

import pytest

from dashboard.api import views
from tenants.models import AuditEntry
from tenants.services import validated_save
from tests.dashboard.api.test_permissions import MODELS
from tests.support.factories import (
    RegistryObjects,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db
V1 = "/api/v1"
VIEWSETS = {"tenants": views.TenantViewSet, "models": views.ServedModelViewSet, "releases": views.ReleaseViewSet,
            "request-groups": views.RequestGroupViewSet, "nodes": views.NodeViewSet,
            "assignments": views.InstanceAssignmentViewSet}


@pytest.fixture
def registry() -> RegistryObjects:
    tenant = make_tenant()
    model = make_model(tenant)
    release = make_release(model, budget_bytes=1 << 30, weights_revision="r1")
    node = make_node()
    return RegistryObjects(
        tenant=tenant, model=model, release=release, request_group=make_group(tenant, budget_bytes=1 << 20),
        node=node, assignment=make_assignment(node, release, role="prefill", bootstrap_port=8998, gpu_ids="0,1"))


def _read_only(resource: str, representation: dict) -> dict:
    """Other values for every read-only field of ``resource``'s serializer (``id``, timestamps, computed ones)."""
    serializer = VIEWSETS[resource].serializer_class()
    return {name: representation["id"] + 1000 if name == "id" else "changed-by-client"
            for name, field in serializer.fields.items() if field.read_only}


@pytest.mark.parametrize("resource", list(MODELS))
@pytest.mark.parametrize("body", ["same values", "read-only fields"])
def test_write_that_changes_nothing_saves_nothing(api, registry, resource, body, django_capture_on_commit_callbacks):
    url = f"{V1}/{resource}/{registry.of(resource).pk}/"
    before = api.get(url).json()
    entries = AuditEntry.objects.count()
    data = before if body == "same values" else _read_only(resource, before)
    with django_capture_on_commit_callbacks() as callbacks:
        patched = api.patch(url, data, format="json")
        put = api.put(url, before, format="json")
    assert patched.status_code == 200 and put.status_code == 200, (patched.json(), put.json())
    assert patched.json() == before and put.json() == before
    assert api.get(url).json()["updated_at"] == before["updated_at"]
    assert AuditEntry.objects.count() == entries
    assert callbacks == []  # no config push, no master quota sync


def test_a_real_change_still_saves_and_is_audited(api, registry):
    url = f"{V1}/nodes/{registry.node.pk}/"
    before = api.get(url).json()
    after = api.patch(url, {"hostname": "10.0.0.9", "queue_name": "ignored"}, format="json").json()
    assert after["hostname"] == "10.0.0.9" and after["queue_name"] == "agent.node-a"
    assert after["updated_at"] > before["updated_at"]
    assert AuditEntry.objects.filter(object_type="tenants.node", action="update").count() == 1


def test_validated_save_of_an_unchanged_object_is_a_no_op(registry):
    release = registry.release
    release.refresh_from_db()
    stamp = release.updated_at
    assert validated_save(release) is release
    release.refresh_from_db()
    assert release.updated_at == stamp and not AuditEntry.objects.filter(action="update").exists()
    release.description = "changed"
    validated_save(release)
    release.refresh_from_db()
    assert release.updated_at > stamp and AuditEntry.objects.filter(action="update").count() == 1
