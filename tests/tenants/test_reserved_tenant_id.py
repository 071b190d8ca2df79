"""A tenant_id is given to one tenant only, ever (``ReservedTenantId``): every write path, races, migration 0011."""
from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import ValidationError

from dashboard.models import MasterQuotaSync
from tenants.models import ReservedSalt, ReservedTenantId, Tenant
from tests.support.factories import make_group, make_model, make_release, make_tenant, refused

pytestmark = pytest.mark.django_db


def test_every_tenant_id_a_tenant_takes_is_recorded(tenant):
    assert list(ReservedTenantId.objects.values_list("tenant_id", "tenant_pk")) == [("acme", tenant.pk)]
    tenant.tenant_id = "acme-2"
    tenant.save()
    assert set(ReservedTenantId.objects.values_list("tenant_id", "tenant_pk")) == {
        ("acme", tenant.pk), ("acme-2", tenant.pk)}
    tenant.delete()
    assert ReservedTenantId.objects.count() == 2


def test_model_rules_refuse_a_deleted_tenants_id(tenant):
    tenant.delete()
    errors = refused(Tenant(tenant_id="acme", quota_bytes=1 << 30))
    assert list(errors) == ["tenant_id"] and "Tenant ids stay reserved forever" in errors["tenant_id"][0]


def test_a_write_past_the_model_rules_is_rolled_back(tenant):
    """``objects.create`` skips ``full_clean``: ``save`` itself refuses, and writes nothing."""
    tenant.delete()
    with pytest.raises(ValidationError):
        Tenant.objects.create(tenant_id="acme", quota_bytes=1 << 30)
    assert not Tenant.objects.exists()


# --- migration 0011 ---------------------------------------------------------------------------------------------

MIGRATION = importlib.import_module("tenants.migrations.0011_reserved_tenant_id")


def test_migration_reserves_every_id_the_history_shows():
    live = make_tenant("live")
    renamed = make_tenant("first-name")
    renamed.tenant_id = "second-name"
    renamed.save()
    gone = make_tenant("gone")
    model = make_model(gone)
    make_release(model, "old-ns").delete()
    model.delete()
    gone_pk = gone.pk
    gone.delete()
    ReservedSalt.objects.create(cache_salt="s", group_name="g", tenant_id="salt-only")
    MasterQuotaSync.objects.create(tenant_id="quota-only", desired_quota_bytes=1)
    ReservedTenantId.objects.all().delete()  # as before the migration
    MIGRATION.seed(django_apps, None)
    assert set(ReservedTenantId.objects.values_list("tenant_id", "tenant_pk")) == {
        ("live", live.pk), ("first-name", renamed.pk), ("second-name", renamed.pk), ("gone", gone_pk),
        ("salt-only", None), ("quota-only", None)}
    assert "gone" in refused(Tenant(tenant_id="gone", quota_bytes=1))["tenant_id"][0]
    assert "quota-only" in refused(Tenant(tenant_id="quota-only", quota_bytes=1))["tenant_id"][0]
    renamed.tenant_id = "first-name"
    renamed.full_clean()  # its own old id


def test_migration_keeps_a_current_holder_of_a_reused_id(tenant):
    """An id base let a second tenant take: the current tenant keeps it."""
    make_group(tenant, "gone", cache_salt="old").delete()
    ReservedTenantId.objects.all().delete()
    MIGRATION.seed(django_apps, None)
    assert list(ReservedTenantId.objects.values_list("tenant_id", "tenant_pk")) == [("acme", tenant.pk)]
