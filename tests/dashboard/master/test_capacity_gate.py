"""The capacity gate against a real ``mooncake_master`` with one 64 MiB segment mounted: the issue's
``9223372036854775807B`` tenant is refused unless confirmed (API, page, admin), the plan shown before saving
predicts exactly what the master then applies, small tenants added one by one warn once the pool is full, and a
stopped master makes the capacity unknown instead of guessed."""
from __future__ import annotations

import time

import pytest
from django.urls import reverse

from agent.datapath.store import open_store
from agent.sim.master import free_ports
from dashboard.master.capacity import CONFIRMATION_TYPE, read_pool
from dashboard.master.quota_sync import sync_quotas
from tenants.models import AuditEntry, Tenant
from tests.support.factories import make_tenant
from tests.support.registry import api, operator, superuser  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
MiB = 1 << 20
HUGE = "9223372036854775807B"


@pytest.fixture
def pool(mooncake_master_factory, settings, tmp_path):
    """A master holding acme (32 MiB) and globex (16 MiB) with 64 MiB mounted; the registry holds the same."""
    master = mooncake_master_factory({"acme": 32 * MiB, "globex": 16 * MiB})
    settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
    settings.KVPOOL_MASTER_SYNC = False  # synced explicitly below
    settings.KVPOOL_TENANT_QUOTAS_PATH = str(tmp_path / "tenant_quotas.yaml")
    make_tenant("acme", "32MB")
    make_tenant("globex", "16MB")
    client = open_store(master.endpoints(global_segment_size=64 * MiB), "acme")
    try:
        deadline = time.monotonic() + 10
        while read_pool().capacity_bytes != 64 * MiB:
            assert time.monotonic() < deadline, read_pool()
            time.sleep(0.1)
        yield master
    finally:
        client.close()


def effective(master) -> dict[str, int]:
    return {row["tenant_id"]: row["effective_quota_bytes"] for row in master.tenant_quotas()}


def test_huge_tenant_is_refused_unless_confirmed_and_the_plan_predicts_the_master(pool, api):  # noqa: F811
    assert effective(pool) == {"acme": 32 * MiB, "globex": 16 * MiB}
    response = api.post("/api/v1/tenants/", {"tenant_id": "huge", "quota_bytes": HUGE}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["confirm_overcommit"]
    message = response.json()["confirm_overcommit"][0]
    assert "above the 67108864 bytes (64 MiB) mounted in the pool" in message
    assert "tenant 'acme' from 32 MiB to 0 B, tenant 'globex' from 16 MiB to 0 B" in message
    assert not Tenant.objects.filter(tenant_id="huge").exists()
    plan = api.get("/api/v1/tenants/quota-plan/", {"tenant_id": "huge", "quota_bytes": HUGE}).json()
    assert plan["capacity_bytes"] == 64 * MiB and plan["needs_confirmation"]
    predicted = {row["tenant_id"]: row["effective_after_bytes"] for row in plan["tenants"]}
    assert predicted == {"acme": 0, "globex": 0, "huge": 64 * MiB}
    response = api.post("/api/v1/tenants/", {"tenant_id": "huge", "quota_bytes": HUGE, "confirm_overcommit": True},
                        format="json")
    assert response.status_code == 201
    entry = AuditEntry.objects.get(object_type=CONFIRMATION_TYPE)
    assert entry.actor_repr == "operator" and entry.after["capacity_bytes"] == 64 * MiB
    assert {row["tenant_id"]: row["effective_after_bytes"] for row in entry.after["tenants"]} == predicted
    sync_quotas()
    assert effective(pool) == predicted  # what the page and the API showed is what the master does


def test_small_tenants_warn_once_the_pool_is_full_and_lowering_is_free(pool, api):  # noqa: F811
    for tenant_id in ("t1", "t2"):  # 48 MiB + 2 * 8 MiB = 64 MiB: fits exactly
        assert api.post("/api/v1/tenants/", {"tenant_id": tenant_id, "quota_bytes": "8MB"},
                        format="json").status_code == 201
    response = api.post("/api/v1/tenants/", {"tenant_id": "t3", "quota_bytes": "1MB"}, format="json")
    assert response.status_code == 400
    assert "It lowers the effective quota of tenant 'acme'" in response.json()["confirm_overcommit"][0]
    acme = Tenant.objects.get(tenant_id="acme")
    assert api.patch(f"/api/v1/tenants/{acme.pk}/", {"quota_bytes": "31MB"}, format="json").status_code == 200
    assert api.post("/api/v1/tenants/", {"tenant_id": "t3", "quota_bytes": "1MB"}, format="json").status_code == 201
    sync_quotas()
    assert effective(pool) == {"acme": 31 * MiB, "globex": 16 * MiB, "t1": 8 * MiB, "t2": 8 * MiB, "t3": 1 * MiB}
    assert not AuditEntry.objects.filter(object_type=CONFIRMATION_TYPE).exists()


def test_page_and_admin_show_the_plan_and_refuse_the_same_way(pool, client, operator, superuser):  # noqa: F811
    client.force_login(operator)
    response = client.post(reverse("ui:tenant-new"), {"tenant_id": "huge", "quota_bytes": HUGE})
    assert response.status_code == 400
    table = response.content.decode().split('id="quota-plan-rows"')[1].split("</table>")[0]
    assert table.count('class="flag bad">lowered<') == 2 and 'data-bytes="67108864"' in table
    assert "64 MiB" in response.content.decode().split('id="quota-plan"')[1]
    client.force_login(superuser)
    add = reverse("admin:tenants_tenant_add")
    response = client.post(add, {"tenant_id": "huge", "quota_bytes": HUGE, "description": ""})
    assert response.status_code == 200  # the admin re-shows its form with the error
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["confirm_overcommit"] and "Overcommit" in errors["confirm_overcommit"][0]
    response = client.post(add, {"tenant_id": "huge", "quota_bytes": HUGE, "description": "",
                                 "confirm_overcommit": "on"})
    assert response.status_code == 302 and Tenant.objects.filter(tenant_id="huge").exists()
    assert AuditEntry.objects.get(object_type=CONFIRMATION_TYPE).actor_repr == superuser.username


def test_unreachable_master_makes_the_capacity_unknown(pool, api, settings):  # noqa: F811
    settings.KVPOOL_MASTER_ADMIN_URL = f"http://127.0.0.1:{free_ports(1)[0]}"  # nobody answers there
    pool_state = read_pool()
    assert pool_state.capacity_bytes is None and "unavailable" in pool_state.error
    response = api.post("/api/v1/tenants/", {"tenant_id": "t1", "quota_bytes": "1MB"}, format="json")
    assert response.status_code == 400 and "capacity is unknown" in response.json()["confirm_overcommit"][0]
