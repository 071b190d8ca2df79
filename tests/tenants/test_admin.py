"""Django admin: every model registered, pages render, forms apply the same rules and messages."""
from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from tenants.models import Release, Tenant
from tests.support.factories import (
    grant_role,
    make_assignment,
    make_group,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _master_unreachable(settings):
    """No master answers: the pool's capacity is unknown, so raising a quota needs ``confirm_overcommit``."""
    from agent.sim.master import free_ports

    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"
    settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = 1


def test_every_registry_model_is_registered():
    for model in apps.get_app_config("tenants").get_models():
        assert model in admin.site._registry, model


#: Append-only records: their admin pages show rows and never add, change or delete them.
READ_ONLY = ("auditentry", "reservedsalt", "reservednamespace", "reservedtenantid", "reservedengineuser")


@pytest.fixture
def admin_client_(client, superuser):
    client.force_login(superuser)
    return client


def test_every_admin_page_renders(admin_client_, release, django_user_model):
    grant_role(django_user_model.objects.create_user("member"), release.model.tenant, "viewer")  # a membership
    make_group(release.model.tenant)
    make_group(release.model.tenant, "deleted-app").delete()  # leaves a ReservedSalt row
    make_release(release.model, "deleted-release").delete()  # leaves a ReservedNamespace row
    make_assignment(make_node(), release)
    make_tenant("engines", engine_user="svc-engines")  # a ReservedEngineUser row
    for model in apps.get_app_config("tenants").get_models():
        info = (model._meta.app_label, model._meta.model_name)
        assert admin_client_.get(reverse("admin:{}_{}_changelist".format(*info))).status_code == 200
        obj = model.objects.first()
        assert admin_client_.get(reverse("admin:{}_{}_change".format(*info), args=[obj.pk])).status_code == 200
        add = admin_client_.get(reverse("admin:{}_{}_add".format(*info)))
        assert add.status_code == (403 if model._meta.model_name in READ_ONLY else 200)


def test_admin_form_uses_model_rules(admin_client_):
    url = reverse("admin:tenants_tenant_add")
    response = admin_client_.post(url, {"tenant_id": "_x", "quota_bytes": "8mb"})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["tenant_id"] == ["tenant_id must not start with '_' (Mooncake reserves those names)."]
    assert errors["quota_bytes"][0].startswith("'8mb' has the unit 'mb'")
    response = admin_client_.post(url, {"tenant_id": "acme", "quota_bytes": "8MB", "description": ""})
    assert response.status_code == 200  # no master answers: the capacity is unknown, a raise needs confirming
    assert list(response.context["adminform"].form.errors) == ["confirm_overcommit"]
    response = admin_client_.post(url, {"tenant_id": "acme", "quota_bytes": "8MB", "description": "",
                                        "confirm_overcommit": "on"})
    assert response.status_code == 302
    assert Tenant.objects.get().quota_bytes == 8 << 20


def test_admin_cannot_delete_served_release(admin_client_, release):
    release.state = "serving"
    release.save()
    canary = make_release(release.model, "canary")
    url = reverse("admin:tenants_release_changelist")
    both = {"action": "delete_selected", "_selected_action": [release.pk, canary.pk], "post": "yes"}
    assert admin_client_.post(url, both).status_code == 403
    assert Release.objects.count() == 2
    admin_client_.post(url, {"action": "delete_selected", "_selected_action": [canary.pk], "post": "yes"})
    assert list(Release.objects.values_list("namespace", flat=True)) == ["production-2026-07"]
    assert admin_client_.get(reverse("admin:tenants_release_delete", args=[release.pk])).status_code == 403


def test_the_admin_is_for_platform_admins(client, django_user_model, release):
    """A staff user who is a member of a tenant, not a platform admin, gets no admin page (it lists every tenant)."""
    staff = grant_role(django_user_model.objects.create_user("staffer", password="pw", is_staff=True),
                       release.model.tenant, "admin")
    client.force_login(staff)
    for url in (reverse("admin:index"), reverse("admin:tenants_requestgroup_changelist")):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
