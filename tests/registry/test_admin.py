"""Django admin: every model registered, pages render, forms apply the same rules and messages."""
from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from tenants.models import Release, Tenant
from tests.registry.factories import (
    make_assignment,
    make_group,
    make_node,
    make_release,
)

pytestmark = pytest.mark.django_db


def test_every_registry_model_is_registered():
    for model in apps.get_app_config("tenants").get_models():
        assert model in admin.site._registry, model


@pytest.fixture
def admin_client_(client, superuser):
    client.force_login(superuser)
    return client


def test_every_admin_page_renders(admin_client_, release):
    make_group(release.model.tenant)
    make_group(release.model.tenant, "deleted-app").delete()  # leaves a ReservedSalt row
    make_assignment(make_node(), release)
    for model in apps.get_app_config("tenants").get_models():
        info = (model._meta.app_label, model._meta.model_name)
        assert admin_client_.get(reverse("admin:{}_{}_changelist".format(*info))).status_code == 200
        obj = model.objects.first()
        assert admin_client_.get(reverse("admin:{}_{}_change".format(*info), args=[obj.pk])).status_code == 200
        add = admin_client_.get(reverse("admin:{}_{}_add".format(*info)))
        assert add.status_code == (403 if model._meta.model_name in ("auditentry", "reservedsalt") else 200)


def test_admin_form_uses_model_rules(admin_client_):
    url = reverse("admin:tenants_tenant_add")
    response = admin_client_.post(url, {"tenant_id": "_x", "quota_bytes": "8mb"})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["tenant_id"] == ["tenant_id must not start with '_' (Mooncake reserves those names)."]
    assert errors["quota_bytes"][0].startswith("'8mb' has the unit 'mb'")
    response = admin_client_.post(url, {"tenant_id": "acme", "quota_bytes": "8MB", "description": ""})
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
