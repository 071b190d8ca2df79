"""dashboard.master.quota_sync against a real mooncake_master: client errors, quota sync, pending deletes."""
from __future__ import annotations

import pytest

from dashboard.master.quota_sync import (
    MasterAdminClient,
    MasterAdminError,
    MasterUnavailable,
    delete_tenant,
    sample_quotas,
    sync_quotas,
)
from dashboard.models import MasterQuotaSample, MasterQuotaSync
from tenants.models import Tenant
from tests.support.factories import make_tenant
from tests.support.telemetry import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def admin(master, settings, tmp_path):
    settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
    settings.KVPOOL_TENANT_QUOTAS_PATH = str(tmp_path / "tenant_quotas.yaml")
    return MasterAdminClient(master.admin_url)


def test_client_round_trip_and_errors(admin):
    snapshot = admin.put_quota("t-1", 8 << 20)
    assert (snapshot.tenant_id, snapshot.requested_quota_bytes, snapshot.has_explicit_policy) == ("t-1", 8 << 20, True)
    assert admin.get_quota("t-1") == snapshot
    assert [s.tenant_id for s in admin.list_quotas()] == ["t-1"]
    assert admin.get_quota("nobody") is None
    with pytest.raises(MasterAdminError) as info:
        admin.put_quota("t-1", 0)
    assert info.value.code == -600 and info.value.status == 400
    assert admin.delete_quota("t-1") is True
    assert admin.delete_quota("t-1") is False


def test_unreachable_master_is_a_clear_error():
    client = MasterAdminClient(f"http://127.0.0.1:{free_ports(1)[0]}", timeout=1)
    with pytest.raises(MasterUnavailable, match="unreachable"):
        client.list_quotas()


def test_sync_puts_changed_quotas_deletes_removed_tenants_and_writes_the_policy(admin, settings):
    make_tenant("acme", quota="64MB")
    make_tenant("beta", quota="1GB")
    admin.put_quota("foreign", 1 << 20)  # configured outside the registry: left alone
    assert sync_quotas() == {"put": 2, "deleted": 0, "unchanged": 0, "errors": 0}
    assert {s.tenant_id: s.requested_quota_bytes for s in admin.list_quotas()} == {
        "acme": 64 << 20, "beta": 1 << 30, "foreign": 1 << 20}
    with open(settings.KVPOOL_TENANT_QUOTAS_PATH) as handle:
        policy = handle.read()
    assert "name: acme" in policy and "quota: 64MB" in policy and "foreign" not in policy
    Tenant.objects.filter(tenant_id="beta").update(quota_bytes=2 << 30)  # no signal: the periodic sync fixes it
    assert sync_quotas()["put"] == 1
    assert admin.get_quota("beta").requested_quota_bytes == 2 << 30
    assert sample_quotas(admin) == 3
    assert MasterQuotaSample.objects.get(tenant_id="acme").requested_quota_bytes == 64 << 20


def test_delete_with_master_down_is_deferred_then_completed(admin, settings, master):
    tenant = make_tenant("gone", quota="64MB")
    sync_quotas()
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    tenant.delete()  # the pre_delete receiver cannot reach the master: the delete goes ahead, marked pending
    sync = MasterQuotaSync.objects.get(tenant_id="gone")
    assert sync.pending_delete and "unreachable" in sync.last_error
    settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
    assert sync_quotas()["deleted"] == 1
    assert admin.get_quota("gone") is None
    assert not MasterQuotaSync.objects.filter(tenant_id="gone").exists()


def test_delete_of_unknown_tenant_is_fine(admin):
    assert delete_tenant("never-synced", admin) is True
