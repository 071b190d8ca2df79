"""The tenant rules of ``tenants.access``: roles, platform admins, the permission backend, the scoping helper."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ImproperlyConfigured

from tenants.access import ROLE_PERMISSIONS, is_platform_admin, scope, tenant_pk_of, visible_tenant_ids
from tenants.choices import TenantRole
from tenants.models import AuditEntry, Release, RequestGroup, Tenant, TenantMembership
from tests.support.factories import PLATFORM_ADMIN, grant, grant_role, make_group, make_model, make_release, make_tenant

pytestmark = pytest.mark.django_db


def test_each_role_grants_what_the_one_before_it_does():
    viewer, operator, admin = (ROLE_PERMISSIONS[role] for role in TenantRole)
    assert viewer < operator < admin
    assert all(perm.startswith("tenants.view_") for perm in viewer)
    assert "tenants.delete_release" in admin and "tenants.delete_release" not in operator
    for role in TenantRole:  # never a platform matter
        assert not ROLE_PERMISSIONS[role] & {"tenants.add_tenant", "tenants.delete_tenant", "tenants.add_node",
                                             "tenants.change_node", "tenants.delete_node", PLATFORM_ADMIN,
                                             "tenants.add_tenantmembership"}


def test_a_role_applies_in_its_tenant_only(django_user_model):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    mine, theirs = make_release(make_model(acme)), make_release(make_model(globex))
    user = grant_role(django_user_model.objects.create_user("u"), acme, "operator")
    assert user.has_perm("tenants.change_release", mine) and not user.has_perm("tenants.change_release", theirs)
    assert user.has_perm("tenants.change_release")  # somewhere: what a page may offer
    assert not user.has_perm("tenants.delete_release", mine)
    assert not user.has_perm("tenants.change_node")
    assert list(scope(Release.objects.all(), user)) == [mine]
    assert visible_tenant_ids(user) == frozenset({"acme"})


def test_model_permissions_of_a_member_do_not_reach_other_tenants(django_user_model):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    theirs = make_group(globex)
    user = grant(grant_role(django_user_model.objects.create_user("u"), acme, "viewer"),
                 "tenants.change_requestgroup", "tenants.delete_tenant")
    assert not user.has_perm("tenants.change_requestgroup", theirs)
    assert not user.has_perm("tenants.delete_tenant", acme)
    assert list(scope(RequestGroup.objects.all(), user)) == []


def test_platform_admins_by_permission_or_group(django_user_model):
    make_tenant("acme")
    user = django_user_model.objects.create_user("p")
    assert not is_platform_admin(user) and scope(Tenant.objects.all(), user).count() == 0
    group = Group.objects.create(name="platform")
    group.permissions.add(Permission.objects.get(codename="platform_admin"))
    user.groups.add(group)
    user = django_user_model.objects.get(pk=user.pk)
    assert is_platform_admin(user) and scope(Tenant.objects.all(), user).count() == 1
    assert visible_tenant_ids(user) is None
    assert not user.has_perm("tenants.change_tenant", Tenant.objects.get())  # writes: model permissions
    user.is_active = False
    assert not is_platform_admin(user) and scope(Tenant.objects.all(), user).count() == 0


def test_scope_refuses_a_model_it_does_not_know():
    with pytest.raises(ImproperlyConfigured, match="contenttypes.contenttype"):
        from django.contrib.contenttypes.models import ContentType

        scope(ContentType.objects.all(), None)


def test_every_audited_object_records_its_tenant(django_user_model):
    tenant = make_tenant("acme")
    release = make_release(make_model(tenant))
    grant_role(django_user_model.objects.create_user("u"), tenant, "viewer")
    assert tenant_pk_of(release) == tenant.pk
    kinds = dict(AuditEntry.objects.values_list("object_type", "tenant_pk"))
    assert kinds == {"tenants.tenant": tenant.pk, "tenants.servedmodel": tenant.pk, "tenants.release": tenant.pk,
                     "tenants.tenantmembership": tenant.pk}
    assert TenantMembership.objects.get().role == "viewer"
