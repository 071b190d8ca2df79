"""``/metrics`` shows the room under the master's eviction points, the budgets' excess over them and each live
release's budget, explicit or implicit (issue 18 item 4)."""
from __future__ import annotations

import pytest
from django.utils import timezone

from agent.sim.master import sample_values
from dashboard.models import MasterHealth
from tests.support.factories import make_model, make_release, make_tenant
from tests.support.rows import master_sample

pytestmark = pytest.mark.django_db
MiB = 1 << 20


def metrics(client) -> dict[str, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return sample_values(response.content.decode())


def test_room_and_budget_excess_per_tenant(client, settings):
    settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO = 0.9
    acme, globex = make_tenant("acme", quota=50 * MiB), make_tenant("globex", quota=50 * MiB)
    make_release(make_model(acme, "chat", "/m"), "v1", budget_bytes=50 * MiB)
    make_release(make_model(globex, "chat", "/m"), "g1", state="serving")
    own = 'kvpool_release_budget_bytes{implicit="0",namespace="v1",served_model_name="chat",tenant_id="acme"}'
    implicit = 'kvpool_release_budget_bytes{implicit="1",namespace="g1",served_model_name="chat",tenant_id="globex"}'
    values = metrics(client)  # capacity unknown: the requested quota is the eviction point
    assert values['kvpool_tenant_eviction_point_bytes{tenant_id="acme"}'] == 50 * MiB
    assert values["kvpool_budgets_fit"] == 1 and not any("watermark_share_bytes{" in name for name in values)
    assert values[implicit] == 50 * MiB and values[own] == 50 * MiB
    MasterHealth.objects.create(pk=1, up=True, checked_at=timezone.now(), capacity_bytes=100 * MiB, key_count=0)
    master_sample("acme", effective=50 * MiB, charged=30 * MiB)
    values = metrics(client)
    assert values["kvpool_pool_watermark_bytes"] == 90 * MiB
    assert values['kvpool_tenant_watermark_share_bytes{tenant_id="acme"}'] == 45 * MiB
    assert values['kvpool_tenant_eviction_point_bytes{tenant_id="globex"}'] == 45 * MiB
    assert values['kvpool_tenant_quota_room_bytes{tenant_id="acme"}'] == 20 * MiB
    assert values['kvpool_tenant_watermark_room_bytes{tenant_id="acme"}'] == 15 * MiB
    assert values['kvpool_tenant_budget_excess_bytes{limit="effective_quota",tenant_id="acme"}'] == 0
    assert values['kvpool_tenant_budget_excess_bytes{limit="watermark_share",tenant_id="acme"}'] == 5 * MiB
    assert values["kvpool_pool_budget_excess_bytes"] == 5 * MiB and values["kvpool_budgets_fit"] == 0
    assert values[own] == 50 * MiB and values[implicit] == 45 * MiB
