"""Write permissions of the REST API for platform admins (the fixtures' users; tenant members:
test_tenant_access.py): reads of every tenant, writes with the Django model permission (add/change/delete_<model>),
superusers have all; a refused write changes nothing and writes no audit entry."""
from __future__ import annotations

import pytest

from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tests.dashboard.api.test_api import RELEASE_BODY
from tests.support.factories import (
    PLATFORM_ADMIN,
    RegistryObjects,
    grant,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.registry import token_client

pytestmark = pytest.mark.django_db
V1 = "/api/v1"
MODELS = {"tenants": Tenant, "models": ServedModel, "releases": Release, "request-groups": RequestGroup,
          "nodes": Node, "assignments": InstanceAssignment}


@pytest.fixture
def registry() -> RegistryObjects:
    """One object of every kind (``registry.of(resource)``)."""
    tenant = make_tenant()
    model = make_model(tenant)
    release = make_release(model)
    node = make_node()
    return RegistryObjects(tenant=tenant, model=model, release=release, request_group=make_group(tenant),
                           node=node, assignment=make_assignment(node, release))


def _create_body(resource: str, registry: RegistryObjects) -> dict:
    tenant, model, release = registry.tenant, registry.model, registry.release
    return {
        "tenants": {"tenant_id": "beta", "quota_bytes": "1GB", "confirm_overcommit": True},  # no master answers
        "models": {"tenant": tenant.pk, "served_model_name": "other", "model_path": "x/Other"},
        "releases": {"model": model.pk, "namespace": "prod-2", **RELEASE_BODY},
        "request-groups": {"tenant": tenant.pk, "name": "app-b"},
        "nodes": {"name": "node-b", "hostname": "10.0.0.2"},
        "assignments": {"node": registry.node.pk, "release": release.pk, "port": 8001},
    }[resource]


@pytest.mark.parametrize("resource", list(MODELS))
def test_reads_need_no_permission(viewer_api, registry, resource):
    assert viewer_api.get(f"{V1}/{resource}/").json()["count"] == 1
    assert viewer_api.get(f"{V1}/{resource}/{registry.of(resource).pk}/").status_code == 200


def test_read_only_sub_resources_need_no_permission(viewer_api, registry):
    assert viewer_api.get(f"{V1}/releases/{registry.release.pk}/config/").status_code == 200
    assert viewer_api.get(f"{V1}/tenants/master-config/").status_code == 200
    assert viewer_api.get(f"{V1}/audit/").json()["count"] > 0
    assert viewer_api.options(f"{V1}/tenants/").status_code == 200


@pytest.mark.parametrize("resource", list(MODELS))
def test_writes_without_permission_are_403_and_change_nothing(viewer_api, registry, resource):
    model = MODELS[resource]
    codename = model._meta.model_name
    obj = registry.of(resource)
    entries, count, stored = AuditEntry.objects.count(), model.objects.count(), model.objects.get(pk=obj.pk)
    refused = viewer_api.post(f"{V1}/{resource}/", _create_body(resource, registry), format="json")
    assert refused.status_code == 403
    assert f"tenants.add_{codename}" in refused.json()["detail"]
    patched = viewer_api.patch(f"{V1}/{resource}/{obj.pk}/", {"description": "x"}, format="json")
    assert patched.status_code == 403 and f"tenants.change_{codename}" in patched.json()["detail"]
    assert viewer_api.put(f"{V1}/{resource}/{obj.pk}/", {}, format="json").status_code == 403
    deleted = viewer_api.delete(f"{V1}/{resource}/{obj.pk}/")
    assert deleted.status_code == 403 and f"tenants.delete_{codename}" in deleted.json()["detail"]
    assert model.objects.count() == count and AuditEntry.objects.count() == entries
    assert model.objects.get(pk=obj.pk).updated_at == stored.updated_at


@pytest.mark.parametrize("resource", list(MODELS))
def test_each_model_permission_allows_exactly_its_write(viewer, viewer_api, registry, resource):
    codename = MODELS[resource]._meta.model_name
    obj = registry.of(resource)
    grant(viewer, f"tenants.add_{codename}")
    assert viewer_api.post(f"{V1}/{resource}/", _create_body(resource, registry), format="json").status_code == 201
    assert viewer_api.patch(f"{V1}/{resource}/{obj.pk}/", {}, format="json").status_code == 403
    grant(viewer, f"tenants.change_{codename}")
    assert viewer_api.patch(f"{V1}/{resource}/{obj.pk}/", {}, format="json").status_code == 200
    assert viewer_api.delete(f"{V1}/{resource}/{obj.pk}/").status_code == 403
    grant(viewer, f"tenants.delete_{codename}")
    assert viewer_api.delete(f"{V1}/{resource}/{obj.pk}/").status_code in (204, 409)


def test_release_copy_needs_add_release(viewer, viewer_api, registry):
    url = f"{V1}/releases/{registry.release.pk}/copy/"
    assert viewer_api.post(url, {"namespace": "prod-2"}, format="json").status_code == 403
    assert not Release.objects.filter(namespace="prod-2").exists()
    grant(viewer, "tenants.add_release")
    assert viewer_api.post(url, {"namespace": "prod-2"}, format="json").status_code == 201


def test_superuser_has_every_permission(admin_api, registry):
    created = admin_api.post(f"{V1}/tenants/", {"tenant_id": "beta", "quota_bytes": "1GB", "confirm_overcommit": True},
                             format="json")
    assert created.status_code == 201
    assert admin_api.patch(f"{V1}/nodes/{registry.node.pk}/", {"hostname": "h"}, format="json").status_code == 200


def test_audit_log_stays_read_only_even_for_superusers(admin_api):
    assert admin_api.post(f"{V1}/audit/", {}, format="json").status_code == 405


def _staff(django_user_model, *perms: str):
    """A token client of a staff user who is a platform admin, with ``perms``."""
    user = grant(django_user_model.objects.create_user("staff", password="pw", is_staff=True), PLATFORM_ADMIN, *perms)
    return token_client(user)


def test_a_staff_user_who_is_no_platform_admin_gets_no_secret(django_user_model, registry):
    from tests.support.factories import grant_role

    user = grant_role(django_user_model.objects.create_user("tenant-staff", password="pw", is_staff=True),
                      registry.tenant, "admin")
    client = token_client(user)
    node = registry.node
    for response in (client.get(f"{V1}/nodes/{node.pk}/secret/"), client.post(f"{V1}/nodes/{node.pk}/secret/")):
        assert response.status_code == 403 and "platform admin" in response.json()["detail"]
        assert node.signing_secret not in response.content.decode()
    assert Node.objects.get(pk=node.pk).signing_secret == node.signing_secret


def test_secret_rotation_needs_staff_and_change_node(django_user_model, registry):
    node = registry.node
    secret = node.signing_secret
    staff = _staff(django_user_model)
    assert staff.get(f"{V1}/nodes/{node.pk}/secret/").json()["signing_secret"] == secret  # reading: staff is enough
    refused = staff.post(f"{V1}/nodes/{node.pk}/secret/")
    assert refused.status_code == 403 and "tenants.change_node" in refused.json()["detail"]
    assert Node.objects.get(pk=node.pk).signing_secret == secret
    grant(django_user_model.objects.get(username="staff"), "tenants.change_node")
    rotated = staff.post(f"{V1}/nodes/{node.pk}/secret/")
    assert rotated.status_code == 200
    assert rotated.json()["signing_secret"] == Node.objects.get(pk=node.pk).signing_secret != secret


def test_change_node_without_staff_gets_no_secret(viewer, viewer_api, registry):
    node = registry.node
    grant(viewer, "tenants.change_node")
    for response in (viewer_api.get(f"{V1}/nodes/{node.pk}/secret/"), viewer_api.post(f"{V1}/nodes/{node.pk}/secret/")):
        assert response.status_code == 403 and "staff" in response.json()["detail"]
    assert Node.objects.get(pk=node.pk).signing_secret == node.signing_secret
