"""Evictions by cause per cache scope on the dashboard: stored from the reports (``OccupancySample``
``store_evicted_blocks`` / ``budget_evicted_blocks`` / ``orphan_removed_blocks``), kept by the rollups, in the
occupancy API, in ``/metrics`` (``kvpool_cache_scope_evicted_blocks_by_cause_total{cause}``) and on the occupancy
page's chart data and table (per bucket: the counters' increases)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from agent.contract.messages import Report, ScopeOccupancy
from dashboard.models import OccupancySample
from dashboard.telemetry.ingest import ingest
from dashboard.telemetry.queries import EVICTION_CAUSES, _floor, occupancy_series
from dashboard.telemetry.rollup import rollup
from tests.support.messages import T0, register, sent
from tests.support.rows import sample

pytestmark = pytest.mark.django_db
CAUSES = {"store_evicted_blocks": 5, "budget_evicted_blocks": 3, "orphan_removed_blocks": 2}


def _report(sequence: int, at: datetime, scale: int = 1, **fields) -> dict:
    counters = {name: value * scale for name, value in CAUSES.items()} | fields
    return sent(Report(
        node="node-a", sequence=sequence, sent_at=at, started_at=T0 - timedelta(hours=1), applied_version=1,
        scopes=[ScopeOccupancy(tenant_id="acme", served_model_name="qwen3-8b", namespace="prod-2026-07",
                               request_group="g0", blocks=4, bytes=4096, evicted_blocks=sum(counters.values()),
                               **counters)],
    ).to_wire())


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a")


def test_ingest_stores_the_causes_and_an_older_agents_row_reads_zero():
    ingest([_report(1, T0)])
    row = OccupancySample.objects.get()
    assert (row.store_evicted_blocks, row.budget_evicted_blocks, row.orphan_removed_blocks, row.evicted_blocks) == (
        5, 3, 2, 10)
    old = _report(2, T0 + timedelta(seconds=10))
    for name in CAUSES:
        del old["scopes"][0][name]
    old["scopes"][0]["evicted_blocks"] = 12
    ingest([sent(old)])
    newest = OccupancySample.objects.get(ts=T0 + timedelta(seconds=10))
    assert (newest.store_evicted_blocks, newest.evicted_blocks) == (0, 12)


def test_rollups_keep_the_last_value_of_each_cause(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 60
    ingest([_report(i + 1, T0 + timedelta(seconds=10 * i), scale=i + 1) for i in range(3)])
    rollup(now=T0 + timedelta(hours=1))
    row = OccupancySample.objects.get(level=OccupancySample.Level.MINUTE)
    assert (row.store_evicted_blocks, row.budget_evicted_blocks, row.orphan_removed_blocks) == (15, 9, 6)


def test_metrics_and_the_api_carry_the_causes(client, settings, django_user_model):
    from tests.support.factories import PLATFORM_ADMIN, grant, make_tenant
    from tests.support.registry import token_client

    make_tenant("acme")
    settings.KVPOOL_METRICS_WINDOW_SECONDS = 120
    ingest([_report(1, timezone.now() - timedelta(seconds=5))])
    text = client.get("/metrics").content.decode()
    scope = 'namespace="prod-2026-07",request_group="g0",served_model_name="qwen3-8b",tenant_id="acme"'
    for cause, value in (("store", 5), ("budget", 3), ("orphan", 2)):
        assert f'kvpool_cache_scope_evicted_blocks_by_cause_total{{cause="{cause}",{scope}}} {value}.0' in text
    assert f"kvpool_cache_scope_evicted_blocks_total{{{scope}}} 10.0" in text  # the family as it was
    assert "kvpool_cache_scope_store_evicted_blocks_total" not in text
    api = token_client(grant(django_user_model.objects.create_user("viewer", password="pw"), PLATFORM_ADMIN))
    [row] = api.get("/api/v1/telemetry/occupancy/").json()["results"]
    assert {name: row[name] for name in CAUSES} == CAUSES and row["evicted_blocks"] == 10


def test_evictions_per_bucket_count_the_increases_by_cause(ui):
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    sample(ts=now - timedelta(seconds=300), store_evicted_blocks=10, budget_evicted_blocks=1)
    sample(ts=now - timedelta(seconds=200), store_evicted_blocks=14, budget_evicted_blocks=1, orphan_removed_blocks=2)
    sample(ts=now - timedelta(seconds=100), store_evicted_blocks=3, budget_evicted_blocks=2)  # the agent restarted
    sample(ts=now - timedelta(seconds=100), namespace="production-2026-08", store_evicted_blocks=1)
    series = occupancy_series("15m", now=now)
    first = series.series[0]
    index = {s: series.buckets.index(_floor(now - timedelta(seconds=s), 30)) for s in (300, 200, 100)}
    assert first.evicted_blocks == {"store": 4 + 3, "budget": 0 + 1, "orphan": 2 + 0}
    assert first.evicted_blocks_data["store"][index[200]] == 4 and first.evicted_blocks_data["store"][index[100]] == 3
    evictions = series.as_dict()["evictions"]
    assert list(evictions) == list(EVICTION_CAUSES) == ["store", "budget", "orphan"]
    assert evictions["store"][index[100]] == 3 and evictions["orphan"][index[200]] == 2
    assert sum(evictions["store"]) == 7                                       # a first row only starts a counter


def test_the_page_has_the_evictions_chart_and_the_table_the_numbers(ui):
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=200), size=1)
    sample(ts=now - timedelta(seconds=20), size=1, store_evicted_blocks=6, budget_evicted_blocks=2,
           orphan_removed_blocks=1)
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m"}).json()
    assert {cause: sum(values) for cause, values in payload["evictions"].items()} == {
        "store": 6, "budget": 2, "orphan": 1}
    html = ui.get(reverse("ui:occupancy"), {"window": "15m"}).content.decode()
    assert 'id="occupancy-chart-evictions"' in html
    assert 'data-evicted-store="6" data-evicted-budget="2" data-evicted-orphan="1">6 / 2 / 1</td>' in html
