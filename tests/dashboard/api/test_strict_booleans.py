"""Booleans of request bodies are exactly JSON ``true``/``false``: ``"confirm_overcommit": "yes"`` (which DRF's
``BooleanField`` takes as true) is a 400 naming the field, and nothing is saved or audited."""
from __future__ import annotations

import pytest

from tenants.models import AuditEntry, Tenant

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", ["yes", "true", "True", 1, "1", "on", None])
def test_confirm_overcommit_takes_only_json_booleans(api, value):
    body = {"tenant_id": "acme", "quota_bytes": "1GB", "confirm_overcommit": value}
    response = api.post("/api/v1/tenants/", body, format="json")
    assert response.status_code == 400 and list(response.json()) == ["confirm_overcommit"], response.json()
    assert not Tenant.objects.exists() and not AuditEntry.objects.exists()
    if value is not None:
        assert response.json()["confirm_overcommit"] == [f"{value!r} is not a boolean: use true or false."]


def test_confirm_overcommit_true_confirms(api):
    body = {"tenant_id": "acme", "quota_bytes": "1GB", "confirm_overcommit": True}
    assert api.post("/api/v1/tenants/", body, format="json").status_code == 201


def test_push_force_takes_only_json_booleans(api, node):
    response = api.post(f"/api/v1/telemetry/nodes/{node.name}/push/", {"force": "yes"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["force"], response.json()
