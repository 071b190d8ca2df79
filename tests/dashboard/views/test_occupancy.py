"""Occupancy series: bucketing over nodes, request groups and rollup levels; hit ratio; filters; the page and its
JSON endpoint show the same numbers."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from agent.contract.scope import CacheScope
from dashboard.models import OccupancySample
from dashboard.telemetry.queries import (
    WINDOWS,
    OccupancyFilter,
    _floor,
    current_occupancy,
    occupancy_series,
)
from dashboard.telemetry.series import summarize
from tests.support.rows import sample

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
Level = OccupancySample.Level


def at(seconds_ago: float) -> datetime:
    return NOW - timedelta(seconds=seconds_ago)


def test_nodes_are_averaged_within_a_bucket_then_summed():
    # 1h window -> 60 s buckets. node-a reports twice in the bucket [11:58, 11:59), node-b once.
    sample(ts=at(115), node="node-a", size=100)
    sample(ts=at(105), node="node-a", size=300)
    sample(ts=at(110), node="node-b", size=50)
    summarize(NOW)  # the 1h window reads the occupancy summed over nodes per minute
    series = occupancy_series("1h", now=NOW)
    assert series.bucket_seconds == 60 and len(series.series) == 1
    data = series.series[0].data
    index = series.buckets.index(datetime(2026, 11, 30, 11, 58, tzinfo=UTC))
    assert data[index] == 200 + 50
    assert [v for i, v in enumerate(data) if i != index] == [None] * (len(data) - 1)


def test_request_groups_add_up_and_a_filter_selects_one():
    sample(ts=at(30), group="app-a", size=1000)
    sample(ts=at(30), group="app-b", size=24)
    total = occupancy_series("15m", now=NOW).series[0]
    assert total.latest_bytes == 1024
    only_b = occupancy_series("15m", OccupancyFilter(request_group="app-b"), now=NOW).series[0]
    assert only_b.latest_bytes == 24


def test_one_series_per_namespace_sorted_with_labels():
    sample(ts=at(10), namespace="prod-2026-08", size=5)
    sample(ts=at(10), namespace="prod-2026-07", size=7)
    sample(ts=at(10), tenant_id="beta", model="llama", namespace="canary", size=9)
    series = occupancy_series("15m", now=NOW).series
    assert [s.label for s in series] == ["acme/qwen3-8b/prod-2026-07", "acme/qwen3-8b/prod-2026-08",
                                         "beta/llama/canary"]
    assert [s.latest_bytes for s in series] == [7, 5, 9]
    filtered = occupancy_series("15m", OccupancyFilter(tenant_id="acme", namespace="prod-2026-08"), now=NOW)
    assert [s.label for s in filtered.series] == ["acme/qwen3-8b/prod-2026-08"]


def test_rollup_levels_are_read_with_their_sample_weights():
    # a 1-minute row (average of 6 samples) and a raw row of the same minute weigh by samples
    minute = datetime(2026, 11, 30, 11, 50, tzinfo=UTC)
    sample(ts=minute, level=Level.MINUTE, size=1000, samples=6)
    sample(ts=minute + timedelta(seconds=55), size=4000)
    summarize(NOW)
    series = occupancy_series("1h", now=NOW)
    index = series.buckets.index(minute)
    assert series.series[0].data[index] == round((1000 * 6 + 4000) / 7)
    assert series.series[0].peak_bytes == series.series[0].data[index]
    # 15 minutes -> 30 s buckets from the samples: the minute row alone in its bucket, the raw one in the next
    samples = occupancy_series("15m", now=NOW)
    assert [value for value in samples.series[0].data if value is not None] == [1000, 4000]


def test_gaps_stay_empty_and_summary_numbers():
    sample(ts=at(600), size=100)
    sample(ts=at(60), size=300)
    s = occupancy_series("15m", now=NOW).series[0]
    present = [v for v in s.data if v is not None]
    assert present == [100, 300]
    assert (s.latest_bytes, s.peak_bytes, s.average_bytes) == (300, 300, 200)
    assert s.data.count(None) == len(s.data) - 2


def test_hit_ratio_counts_counter_increases_and_survives_an_agent_restart():
    sample(ts=at(300), hit_blocks=10, miss_blocks=10)
    sample(ts=at(200), hit_blocks=40, miss_blocks=20)  # +30 hits, +10 misses
    sample(ts=at(100), hit_blocks=5, miss_blocks=5)    # restart: counts from zero -> +5, +5
    s = occupancy_series("15m", now=NOW).series[0]
    assert (s.hit_blocks, s.miss_blocks) == (35, 15)
    assert s.hit_ratio == pytest.approx(0.7)


def test_no_lookups_means_no_ratio():
    sample(ts=at(10), size=1)
    assert occupancy_series("15m", now=NOW).series[0].hit_ratio is None


@pytest.mark.parametrize("window", list(WINDOWS))
def test_every_window_has_bounded_buckets(window):
    series = occupancy_series(window, now=NOW)
    assert 30 <= len(series.buckets) <= 130
    assert series.buckets[0] <= NOW - timedelta(seconds=WINDOWS[window][0])
    assert series.buckets[-1] <= NOW < series.buckets[-1] + timedelta(seconds=series.bucket_seconds)


def test_samples_outside_the_window_are_ignored():
    sample(ts=at(3600 * 2), size=99)
    assert occupancy_series("1h", now=NOW).series == []


def test_current_occupancy_takes_each_nodes_newest_sample():
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=50), node="node-a", size=10, in_flight_requests=3)
    sample(ts=now - timedelta(seconds=20), node="node-a", group="g1", size=30, in_flight_requests=1)
    sample(ts=now - timedelta(seconds=20), node="node-a", group="g2", size=5)
    sample(ts=now - timedelta(seconds=40), node="node-b", size=7)
    sample(ts=now - timedelta(hours=2), node="node-c", size=1000)  # too old
    entry = current_occupancy()[CacheScope("acme", "qwen3-8b", "production-2026-07")]
    assert entry.bytes == 30 + 5 + 7
    assert entry.by_node == {"node-a": 35, "node-b": 7}
    assert entry.in_flight_requests == 1


def test_json_endpoint_and_page_tables_agree(ui):
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=90), node="node-a", size=1 << 20, hit_blocks=1, miss_blocks=1)
    sample(ts=now - timedelta(seconds=30), node="node-a", size=3 << 20, hit_blocks=4, miss_blocks=2)
    sample(ts=now - timedelta(seconds=30), namespace="production-2026-08", size=1 << 10)
    response = ui.get(reverse("ui:occupancy-data"), {"window": "15m", "tenant_id": "acme"})
    assert response.status_code == 200
    payload = response.json()
    assert payload["window"] == "15m" and payload["bucket_seconds"] == 30
    assert payload["filters"] == {"tenant_id": "acme", "served_model_name": "", "namespace": "", "request_group": None}
    assert len(payload["labels"]) == len(payload["timestamps_ms"]) == len(payload["totals"])
    labels = [s["label"] for s in payload["series"]]
    assert labels == ["acme/qwen3-8b/production-2026-07", "acme/qwen3-8b/production-2026-08"]
    first = payload["series"][0]
    assert first["latest_bytes"] == 3 << 20 and first["hit_ratio"] == pytest.approx(3 / 4)
    page = ui.get(reverse("ui:occupancy"), {"window": "15m", "tenant_id": "acme"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-occupancy-url="/occupancy/data.json?window=15m&amp;tenant_id=acme"' in html
    for series in payload["series"]:
        for value in series["data"]:
            if value is not None:
                assert f'data-bytes="{value}"' in html
    assert f'data-bytes="{payload["series"][0]["peak_bytes"]}"' in html
    assert 'data-hit-ratio="0.75"' in html


def test_unknown_window_is_a_400_naming_the_field(ui):
    response = ui.get(reverse("ui:occupancy-data"), {"window": "2y"})
    assert response.status_code == 400
    assert "window" in response.json() and "15m" in response.json()["window"][0]
    page = ui.get(reverse("ui:occupancy"), {"window": "2y"})
    assert page.status_code == 400 and b"is not one of" in page.content


def test_filters_are_type_ahead_inputs_named_as_the_api(ui):
    """At fleet size the filters are free-text inputs (no drop-down of thousands of names) keeping the API's
    parameter names and the value in effect; each has a datalist the type-ahead endpoint fills."""
    from tests.support.factories import make_group, make_model, make_release, make_tenant

    tenant = make_tenant("acme")
    make_release(make_model(tenant), "prod-a")
    for index in range(30):
        make_group(tenant, f"app-{index:02d}")
    html = ui.get(reverse("ui:occupancy"), {"tenant_id": "acme", "namespace": "prod-a"}).content.decode()
    assert "<select id=\"f-tenant\"" not in html and "app-07" not in html  # no name list in the page
    assert 'name="tenant_id" value="acme"' in html and 'name="namespace" value="prod-a"' in html
    for kind, narrow in (("tenants", None), ("served-models", "tenant_id"), ("namespaces",
                                                                            "tenant_id served_model_name"),
                         ("request-groups", "tenant_id")):
        assert f'data-names-url="/api/v1/names/{kind}/"' in html
        if narrow:
            assert f'data-names-url="/api/v1/names/{kind}/" data-narrow="{narrow}"' in html
    assert ui.get("/api/v1/names/request-groups/", {"q": "app-0"}).json()["results"] == [
        f"app-{index:02d}" for index in range(10)]


def test_orphaned_bytes_are_the_newest_per_node_and_group_summed_and_shown(ui):
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=90), node="node-a", size=1 << 20, orphaned_bytes=4096)
    sample(ts=now - timedelta(seconds=30), node="node-a", size=1 << 20, orphaned_bytes=1024)
    sample(ts=now - timedelta(seconds=30), node="node-b", group="g1", size=1 << 20, orphaned_bytes=512)
    sample(ts=now - timedelta(seconds=30), namespace="production-2026-08", size=1 << 10)
    by_label = {s.label: s for s in occupancy_series("15m").series}
    assert by_label["acme/qwen3-8b/production-2026-07"].orphaned_bytes == 1024 + 512
    assert by_label["acme/qwen3-8b/production-2026-08"].orphaned_bytes == 0
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m"}).json()
    assert [s["orphaned_bytes"] for s in payload["series"]] == [1536, 0]
    html = ui.get(reverse("ui:occupancy"), {"window": "15m"}).content.decode()
    assert 'data-orphaned-bytes="1536"' in html and 'data-orphaned-bytes="0"' in html


def test_page_and_chart_data_take_the_apis_filter_names(ui, api):
    """``?tenant_id= &served_model_name= &namespace= &request_group=`` mean the same on the page, its chart data and
    ``GET /api/v1/telemetry/occupancy/``."""
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=30), group="app-a", size=1 << 20)
    sample(ts=now - timedelta(seconds=30), group="app-b", size=1 << 10)
    sample(ts=now - timedelta(seconds=30), namespace="production-2026-08", size=1 << 12)
    sample(ts=now - timedelta(seconds=30), tenant_id="beta", model="llama", namespace="canary", group="app-a",
           size=1 << 14)
    params = {"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "production-2026-07",
              "request_group": "app-a"}
    rows = api.get("/api/v1/telemetry/occupancy/", params).json()["results"]
    assert [row["bytes"] for row in rows] == [1 << 20]
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m", **params}).json()
    assert payload["filters"] == params
    assert [(s["label"], s["latest_bytes"]) for s in payload["series"]] == [
        ("acme/qwen3-8b/production-2026-07", 1 << 20)]
    html = ui.get(reverse("ui:occupancy"), {"window": "15m", **params}).content.decode()
    for name, value in params.items():
        assert f'name="{name}" value="{value}"' in html
    assert 'data-bytes="1024"' not in html and f'data-bytes="{1 << 20}"' in html


@pytest.mark.parametrize("name", ["ui:occupancy", "ui:occupancy-data"])
def test_former_parameter_names_redirect_to_the_apis(ui, name):
    response = ui.get(reverse(name), {"window": "6h", "tenant": "acme", "model": "qwen3-8b", "release": "v1",
                                      "group": "app-a"})
    assert response.status_code == 301
    assert response["Location"] == (f"{reverse(name)}?window=6h&tenant_id=acme&served_model_name=qwen3-8b"
                                    "&namespace=v1&request_group=app-a")
    both = ui.get(reverse(name), {"tenant": "old", "tenant_id": "new"})
    assert both.status_code == 301 and both["Location"] == f"{reverse(name)}?tenant_id=new"
    assert ui.get(reverse(name), {"tenant_id": "acme"}).status_code == 200


def test_hit_ratio_per_bucket_counts_the_increases_ending_in_it(ui):
    """Per release and over everything shown; a bucket without lookups has no ratio. The JSON and the page's table
    carry the same numbers."""
    sample(ts=at(300), hit_blocks=10, miss_blocks=10)                  # first row: no increase yet
    sample(ts=at(200), hit_blocks=40, miss_blocks=20)                  # +30 / +10 -> 0.75
    sample(ts=at(100), hit_blocks=41, miss_blocks=23)                  # +1 / +3 -> 0.25
    sample(ts=at(200), namespace="production-2026-08", hit_blocks=0, miss_blocks=0)
    sample(ts=at(100), namespace="production-2026-08", hit_blocks=3, miss_blocks=1)   # +3 / +1
    series = occupancy_series("15m", now=NOW)
    first, second = series.series
    index = {seconds: series.buckets.index(_floor(at(seconds), 30)) for seconds in (300, 200, 100)}
    assert first.hit_ratio_data[index[300]] is None
    assert first.hit_ratio_data[index[200]] == pytest.approx(0.75)
    assert first.hit_ratio_data[index[100]] == pytest.approx(0.25)
    assert second.hit_ratio_data[index[200]] is None and second.hit_ratio_data[index[100]] == pytest.approx(0.75)
    ratios = series.hit_ratios()
    assert ratios[index[100]] == pytest.approx((1 + 3) / (1 + 3 + 3 + 1))
    assert ratios[index[200]] == pytest.approx(0.75)
    assert sum(r is not None for r in ratios) == 2
    assert series.as_dict()["hit_ratios"] == ratios
    assert series.as_dict()["series"][0]["hit_ratio_data"] == first.hit_ratio_data


def test_hit_ratio_per_bucket_is_in_the_chart_data_and_the_table(ui):
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=200), size=1, hit_blocks=0, miss_blocks=0)
    sample(ts=now - timedelta(seconds=20), size=1, hit_blocks=3, miss_blocks=1)
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m"}).json()
    assert [r for r in payload["hit_ratios"] if r is not None] == [0.75]
    html = ui.get(reverse("ui:occupancy"), {"window": "15m"}).content.decode()
    table = html.split('id="occupancy-data"')[1]
    assert '<td class="num" data-hit-ratio="0.75">75%</td>' in table and 'data-hit-ratio="">–</td>' in table
    assert 'id="occupancy-chart-hits"' in html


# --- quota and budget lines -------------------------------------------------------------------------------------


def _lines(ui, **params) -> dict[str, dict]:
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m", **params}).json()
    return {line["kind"]: line for line in payload["quota_lines"]}


def test_one_tenant_gets_its_quota_and_effective_quota_lines(ui):
    from tests.support.factories import make_model, make_release, make_tenant
    from tests.support.rows import master_sample

    acme = make_tenant("acme", quota="64MB")
    make_release(make_model(acme), "production-2026-07", budget_bytes=16 << 20)
    make_release(make_model(acme, "llama"), "canary")
    make_tenant("beta", quota="8MB")
    sample(ts=datetime.now(UTC) - timedelta(seconds=30), size=1 << 20)
    sample(ts=datetime.now(UTC) - timedelta(seconds=30), model="llama", namespace="canary", size=1 << 20)
    sample(ts=datetime.now(UTC) - timedelta(seconds=30), tenant_id="beta", model="m", namespace="n", size=1)
    assert _lines(ui) == {}  # two tenants shown
    master_sample("acme", effective=32 << 20, charged=2 << 20, requested=64 << 20)
    lines = _lines(ui, tenant_id="acme")
    assert set(lines) == {"quota", "effective_quota"}  # two releases shown: no budget line
    assert lines["quota"] == {"kind": "quota", "label": "quota (registry) 64 MiB", "bytes": 64 << 20,
                              "implicit": False}
    assert lines["effective_quota"]["bytes"] == 32 << 20
    assert lines["effective_quota"]["label"] == "effective quota (master) 32 MiB"
    # One release shown (by the filter or as the only series): its own budget.
    lines = _lines(ui, tenant_id="acme", served_model_name="qwen3-8b")
    assert lines["budget"] == {"kind": "budget", "label": "budget of production-2026-07 16 MiB", "bytes": 16 << 20,
                               "implicit": False}
    html = ui.get(reverse("ui:occupancy"), {"window": "15m", "tenant_id": "acme", "served_model_name": "qwen3-8b"})
    items = html.content.decode().split('id="quota-lines"')[1].split("</ul>")[0]
    assert f'data-kind="budget" data-bytes="{16 << 20}">budget of production-2026-07 16 MiB' in items
    assert f'data-kind="quota" data-bytes="{64 << 20}"' in items


def test_a_release_without_a_budget_gets_the_implicit_one_the_agents_get(ui):
    from dashboard.master.room import current_pool_room, release_budgets
    from tests.support.factories import make_group, make_model, make_release, make_tenant

    acme = make_tenant("acme", quota="64MB")
    release = make_release(make_model(acme), "production-2026-07")
    make_group(acme, "gold", budget_bytes=16 << 20)
    expected = release_budgets(current_pool_room())[release.pk].budget_bytes
    assert expected == 48 << 20  # what the budgets leave of the requested quota (capacity unknown)
    lines = _lines(ui, tenant_id="acme", namespace="production-2026-07")  # no telemetry: the filter names it
    assert lines["budget"]["bytes"] == expected and lines["budget"]["implicit"] is True
    assert lines["budget"]["label"] == "implicit budget of production-2026-07 48 MiB"
    lines = _lines(ui, tenant_id="acme", request_group="gold")
    assert lines["request_group_budget"]["bytes"] == 16 << 20


def test_lines_are_only_for_tenants_the_viewer_may_see(client, django_user_model):
    from tests.support.factories import grant_role, make_model, make_release, make_tenant

    acme, beta = make_tenant("acme", quota="64MB"), make_tenant("beta", quota="8MB")
    make_release(make_model(beta), "secret", budget_bytes=1 << 20)
    sample(ts=datetime.now(UTC) - timedelta(seconds=30), tenant_id="beta", namespace="secret", size=1)
    user = grant_role(django_user_model.objects.create_user("alice", password="pw"), acme, "viewer")
    client.force_login(user)
    payload = client.get(reverse("ui:occupancy-data"), {"window": "15m", "tenant_id": "beta"}).json()
    assert payload["series"] == [] and payload["quota_lines"] == []
    payload = client.get(reverse("ui:occupancy-data"), {"window": "15m", "tenant_id": "acme"}).json()
    assert [line["bytes"] for line in payload["quota_lines"]] == [64 << 20]


def test_no_tenants_lines_over_a_chart_whose_other_series_sums_another_tenant(ui, client, django_user_model,
                                                                              monkeypatch):
    """The releases beyond the cap are summed in one series whose tenants the chart does not name: when the
    releases shown on their own are one tenant's but the sum may hold another's, that tenant's quota is no line of
    the chart (its stack is not that tenant's bytes); a viewer who sees one tenant only still gets its lines."""
    from dashboard.telemetry import queries
    from tests.support.factories import grant_role, make_model, make_release, make_tenant

    monkeypatch.setattr(queries, "CHART_MAX_SERIES", 2)
    acme, beta = make_tenant("acme", quota="64MB"), make_tenant("beta", quota="8MB")
    model = make_model(acme)
    for n, size in enumerate((900, 800, 700)):
        make_release(model, f"ns-{n}")
        sample(ts=datetime.now(UTC) - timedelta(seconds=30), namespace=f"ns-{n}", size=size)
    make_release(make_model(beta), "small")
    sample(ts=datetime.now(UTC) - timedelta(seconds=30), tenant_id="beta", namespace="small", size=1)
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m"}).json()
    assert [s["other"] for s in payload["series"]] == [0, 0, 2]  # acme's ns-2 and beta's small summed
    assert payload["quota_lines"] == []  # the stack holds two tenants' bytes
    html = ui.get(reverse("ui:occupancy"), {"window": "15m"}).content.decode()
    assert 'data-kind="quota"' not in html
    user = grant_role(django_user_model.objects.create_user("alice", password="pw"), acme, "viewer")
    client.force_login(user)
    payload = client.get(reverse("ui:occupancy-data"), {"window": "15m"}).json()
    assert [s["other"] for s in payload["series"]] == [0, 0, 1]  # acme's ns-2 only: beta is not hers
    assert [line["bytes"] for line in payload["quota_lines"]] == [64 << 20]
