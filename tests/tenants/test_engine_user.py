"""``Tenant.engine_user``: the node account a tenant's engine instances run as (README "Users and permissions on a
node"), rendered into every launch (``LaunchSpec.user``); two tenants never share one."""
from __future__ import annotations

import pytest

from tenants.models import Tenant
from tenants.rendering import RenderTarget, render_assignment
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
    refused,
    refused_save,
)

pytestmark = pytest.mark.django_db

ENDPOINTS = RenderTarget(master_server_address="127.0.0.1:50051", metadata_server="http://127.0.0.1:8080/metadata")


def test_the_default_account_is_per_tenant_and_an_own_one_is_rendered():
    acme, other = make_tenant("acme"), make_tenant("other", engine_user="svc-other")
    assert acme.engine_account == f"kvpool-t{acme.pk}" and other.engine_account == "svc-other"
    node = make_node()
    for tenant, port in ((acme, 8000), (other, 8001)):
        release = make_release(make_model(tenant, "m"))
        launch = render_assignment(make_assignment(node, release, port=port, gpu_ids=str(port - 8000)),
                                   ENDPOINTS).launch_spec()
        assert launch.user == tenant.engine_account


@pytest.mark.parametrize("value", ["Root", "has space", "x" * 33, "-dash", "a/b", "root", "kvpool-t12"])
def test_bad_or_reserved_names_are_refused(value):
    assert "engine_user" in refused(Tenant(tenant_id="t", quota_bytes=1 << 30, engine_user=value))


def test_two_tenants_cannot_share_an_account_and_the_message_names_no_one():
    make_tenant("acme", engine_user="svc-engines")
    errors = refused_save(Tenant(tenant_id="other", quota_bytes=1 << 30, engine_user="svc-engines"))
    assert errors == {"engine_user": ["engine_user 'svc-engines' is not available."]}
    make_tenant("third")  # blank is not a shared name
    make_tenant("fourth")


# --- security review F1: who may set engine_user, and which names it may take -------------------------------------

def _tenant_admin(django_user_model, tenant, name="ada"):
    from tests.support.factories import grant_role
    from tests.support.registry import token_client

    return token_client(grant_role(django_user_model.objects.create_user(name, password="pw"), tenant, "admin"))


def test_a_tenant_admin_cannot_set_the_engine_user_api_nor_page(django_user_model):
    """Before: a tenant admin's PATCH set engine_user to any name (its engines then ran as that account)."""
    from django.test import Client
    from django.urls import reverse

    acme = make_tenant("acme")
    client = _tenant_admin(django_user_model, acme)
    for name in ("svc-acme", "kvpool", "redis", "nobody"):
        refused_patch = client.patch(f"/api/v1/tenants/{acme.pk}/", {"engine_user": name}, format="json")
        assert refused_patch.status_code in (400, 403), name
        assert "engine_user" in str(refused_patch.json()), name
    assert Tenant.objects.get(pk=acme.pk).engine_user == ""
    # the same value as stored is no change
    assert client.patch(f"/api/v1/tenants/{acme.pk}/", {"engine_user": "", "description": "d"},
                        format="json").status_code == 200
    # the page: the field is shown disabled, a posted value is ignored
    browser = Client()
    browser.force_login(django_user_model.objects.get(username="ada"))
    url = reverse("ui:tenant-edit", args=[acme.pk])
    page = browser.get(url).content.decode()
    assert 'name="engine_user"' in page and "Only a platform admin may change it." in page
    browser.post(url, {"tenant_id": "acme", "quota_bytes": "200GB", "engine_user": "svc-acme", "description": "p"})
    stored = Tenant.objects.get(pk=acme.pk)
    assert stored.engine_user == "" and stored.description == "p"


def test_a_platform_admin_sets_the_engine_user_and_it_is_audited(admin_api):
    from tenants.models import AuditEntry

    acme = make_tenant("acme")
    assert admin_api.patch(f"/api/v1/tenants/{acme.pk}/", {"engine_user": "svc-acme"},
                           format="json").status_code == 200
    entry = AuditEntry.objects.filter(object_type="tenants.tenant", object_id=str(acme.pk)).latest("pk")
    assert entry.before["engine_user"] == "" and entry.after["engine_user"] == "svc-acme"


def test_an_engine_user_once_given_is_never_given_to_another_tenant(admin_api):
    """Before: after globex moved from team2 to team2b, acme could take team2 while globex's engines still ran as
    it. The refusal names nothing of globex; globex may take its own old name back."""
    acme, globex = make_tenant("acme"), make_tenant("globex", engine_user="team2")
    globex.engine_user = "team2b"
    validated_save_ok(globex)
    for action in ("update", "create"):
        if action == "update":
            answer = admin_api.patch(f"/api/v1/tenants/{acme.pk}/", {"engine_user": "team2"}, format="json")
        else:
            answer = admin_api.post("/api/v1/tenants/", {"tenant_id": "initech", "quota_bytes": "1GB",
                                                         "engine_user": "team2", "confirm_overcommit": True},
                                    format="json")
        assert answer.status_code == 400, action
        assert answer.json() == {"engine_user": ["engine_user 'team2' is not available."]}, action
        assert "globex" not in answer.content.decode()
    globex.delete()  # deleting the tenant does not free its names either
    assert refused_save(Tenant(tenant_id="third", quota_bytes=1 << 30, engine_user="team2b")) == {
        "engine_user": ["engine_user 'team2b' is not available."]}


def test_an_engine_user_may_be_taken_back_by_its_own_tenant():
    globex = make_tenant("globex", engine_user="team2")
    globex.engine_user = "team2b"
    validated_save_ok(globex)
    globex.engine_user = "team2"
    validated_save_ok(globex)
    assert Tenant.objects.get(pk=globex.pk).engine_user == "team2"


@pytest.mark.parametrize("name", ["kvpool", "kvpool-master", "kvpool-engine-unassigned", "nobody"])
def test_control_plane_and_system_account_names_are_refused(name):
    errors = refused(Tenant(tenant_id="t", quota_bytes=1 << 30, engine_user=name))
    assert errors["engine_user"] == [f"engine_user '{name}' is not available: it is an account of the control plane "
                                     "or of the system (KVPOOL_RESERVED_ACCOUNTS)."]


def test_the_reserved_account_names_are_a_setting(settings):
    settings.KVPOOL_RESERVED_ACCOUNTS = ["svc-platform"]
    assert "engine_user" in refused(Tenant(tenant_id="t", quota_bytes=1 << 30, engine_user="svc-platform"))
    assert "engine_user" in refused(Tenant(tenant_id="t", quota_bytes=1 << 30, engine_user="root"))  # always
    make_tenant("t", engine_user="nobody")  # no longer in the setting


def validated_save_ok(obj):
    from tenants.services import validated_save

    return validated_save(obj)


def test_migration_0014_reserves_every_engine_user_the_history_shows():
    import importlib

    from django.apps import apps as django_apps

    from tenants.models import ReservedEngineUser

    migration = importlib.import_module("tenants.migrations.0014_reserved_engine_user")
    live = make_tenant("live", engine_user="svc-live")
    moved = make_tenant("moved", engine_user="team2")
    moved.engine_user = "team2b"
    validated_save_ok(moved)
    gone = make_tenant("gone", engine_user="svc-gone")
    gone_pk = gone.pk
    gone.delete()
    make_tenant("plain")  # blank: nothing reserved
    ReservedEngineUser.objects.all().delete()  # as before the migration
    migration.seed(django_apps, None)
    assert set(ReservedEngineUser.objects.values_list("engine_user", "tenant_pk")) == {
        ("svc-live", live.pk), ("team2", moved.pk), ("team2b", moved.pk), ("svc-gone", gone_pk)}
