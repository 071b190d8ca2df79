"""REST API: a Mooncake tenant_id is given to one tenant only, ever (``tenants.models.ReservedTenantId``).

The Store keys objects by the tenant_id string, and the registry keeps rows that outlive a tenant under it
(reserved namespaces and salts, telemetry): a new tenant under a deleted or renamed tenant's id would see them.
"""
from __future__ import annotations

import pytest

from tenants.models import ReservedNamespace, ReservedTenantId, Tenant
from tests.support.factories import grant_role, make_group, make_model, make_release, make_tenant
from tests.support.registry import token_client
from tests.support.telemetry import free_ports

pytestmark = pytest.mark.django_db
V1 = "/api/v1"


@pytest.fixture(autouse=True)
def _master_down(settings):
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1
    settings.KVPOOL_MASTER_SYNC = False


def _deleted_tenant(tenant_id: str = "acme") -> int:
    """A tenant that had a release (deleted: its namespace is reserved) and a request group (deleted: its salt is
    reserved), then was deleted itself; returns its primary key."""
    tenant = make_tenant(tenant_id)
    model = make_model(tenant)
    make_release(model, "old-ns").delete()
    model.delete()
    make_group(tenant, "gone", cache_salt="old-salt").delete()
    pk = tenant.pk
    tenant.delete()
    return pk


def _create(client, tenant_id: str):
    return client.post(f"{V1}/tenants/", {"tenant_id": tenant_id, "quota_bytes": "1GB", "confirm_overcommit": True},
                       format="json")


def test_a_deleted_tenants_id_is_refused_for_a_new_tenant(api, django_user_model):
    _deleted_tenant()
    assert ReservedNamespace.objects.filter(tenant_id="acme").exists()
    response = _create(api, "acme")
    assert response.status_code == 400, response.json()
    assert list(response.json()) == ["tenant_id"]
    assert "belonged to a tenant that was deleted or renamed" in response.json()["tenant_id"][0]
    assert "reserved forever" in response.json()["tenant_id"][0]
    assert not Tenant.objects.exists()
    assert _create(api, "acme-2").status_code == 201


def test_a_new_tenant_never_sees_what_an_old_one_left_under_its_id(api, django_user_model):
    """What base allowed: the new 'acme' read the deleted 'acme''s reserved namespaces."""
    _deleted_tenant()
    _create(api, "acme")
    new = Tenant.objects.filter(tenant_id="acme").first()
    if new is not None:  # the old behaviour: show what the new tenant's member would read
        member = grant_role(django_user_model.objects.create_user("member"), new, "viewer")
        listed = token_client(member).get(f"{V1}/reserved-namespaces/").json()["count"]
        assert listed == 0, "the new tenant reads the deleted tenant's reserved namespaces"
    assert new is None


def test_a_renamed_away_id_stays_with_its_tenant(api):
    tenant = make_tenant("acme")
    assert api.patch(f"{V1}/tenants/{tenant.pk}/", {"tenant_id": "acme-renamed", "confirm_overcommit": True},
                     format="json").status_code == 200
    response = _create(api, "acme")
    assert response.status_code == 400 and list(response.json()) == ["tenant_id"]
    other = make_tenant("other")
    response = api.patch(f"{V1}/tenants/{other.pk}/", {"tenant_id": "acme", "confirm_overcommit": True},
                         format="json")
    assert response.status_code == 400 and "reserved forever" in response.json()["tenant_id"][0]
    # the tenant that held it may take it back
    assert api.patch(f"{V1}/tenants/{tenant.pk}/", {"tenant_id": "acme", "confirm_overcommit": True},
                         format="json").status_code == 200
    assert set(ReservedTenantId.objects.values_list("tenant_id", "tenant_pk")) == {
        ("acme", tenant.pk), ("acme-renamed", tenant.pk), ("other", other.pk)}


def test_a_live_tenants_id_keeps_the_unique_message(api, tenant):
    response = _create(api, tenant.tenant_id)
    assert response.json() == {"tenant_id": ["A tenant with this tenant_id already exists."]}
