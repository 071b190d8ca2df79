"""Django admin: deleting a release (one or several) warns, reserves each namespace, and the admin refuses a new
release on a reserved namespace; reserved namespaces are read only there."""
from __future__ import annotations

import pytest
from django.urls import reverse

from tenants.models import Release, ReservedNamespace
from tests.support.factories import RELEASE_DEFAULTS, make_release

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(client, superuser):
    client.force_login(superuser)
    return client


def test_admin_delete_warns_and_reserves(admin_client_, served_model):
    one, two = make_release(served_model, "canary-a"), make_release(served_model, "canary-b")
    url = reverse("admin:tenants_release_delete", args=[one.pk])
    assert "reserves the namespace for good" in admin_client_.get(url).content.decode()
    assert admin_client_.post(url, {"post": "yes"}).status_code == 302
    changelist = reverse("admin:tenants_release_changelist")
    bulk = {"action": "delete_selected", "_selected_action": [two.pk]}
    assert "reserves each namespace for good" in admin_client_.post(changelist, bulk).content.decode()
    admin_client_.post(changelist, {**bulk, "post": "yes"})
    assert not Release.objects.exists()
    assert sorted(ReservedNamespace.objects.values_list("namespace", flat=True)) == ["canary-a", "canary-b"]
    data = {"model": served_model.pk, "namespace": "canary-a", "state": "warming", "kv_dtype": "auto",
            "hash_algo": "sha256", "hash_seed": "1", "adapters": "[]", **RELEASE_DEFAULTS}
    response = admin_client_.post(reverse("admin:tenants_release_add"), data)
    assert response.status_code == 200
    assert "is reserved" in response.context["adminform"].form.errors["namespace"][0]
    reservation = ReservedNamespace.objects.first()
    change = reverse("admin:tenants_reservednamespace_change", args=[reservation.pk])
    assert admin_client_.get(change).status_code == 200
    assert admin_client_.get(reverse("admin:tenants_reservednamespace_add")).status_code == 403
    assert admin_client_.post(reverse("admin:tenants_reservednamespace_delete", args=[reservation.pk]),
                              {"post": "yes"}).status_code == 403
