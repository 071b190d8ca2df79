"""bench/fleet.py without its services: the goals and the JSON line's keys, the percentiles, the options of both
modes, the reports it sends (accepted by the real ingest against the fleet's documents), the history rows it loads
(SQLite here: the set-based loader is PostgreSQL's, checked by ``python -m bench.fleet``), the chart filters."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from bench import fleet as bench
from bench.fleet_registry import build_fleet


def test_summary_has_every_required_key_and_judges_each_goal():
    result = bench.summary({"push_p99_s": 1.5, "push_ratio_p99": 3.0, "lost": 0, "duplicated": 2,
                            "chart_p99_ms": 300.0, "ingest_copy_ratio": 0.5})
    assert set(bench.REQUIRED_KEYS) <= set(result) and result["bench"] == "fleet"
    assert result["metrics_bytes"] is None  # not measured: present, null
    met = result["goals_met"]
    assert met["push_p99_s"] is True and met["push_ratio_p99"] is False
    assert met["lost"] is True and met["duplicated"] is False
    assert met["chart_p99_ms"] is True and met["ingest_copy_ratio"] is True  # bounds are inclusive where the issue says
    assert met["metrics_scrape_s"] is None
    assert result["goals"]["push_p99_s"] == "< 2"
    json.dumps(result)  # one JSON line


def test_p99_is_the_nearest_rank_in_milliseconds():
    assert bench.p99_ms([0.001 * i for i in range(1, 101)]) == 99.0
    assert bench.p99_ms([0.25]) == 250.0
    assert bench.p99_ms([0.01, 0.5, 0.02]) == 500.0


def test_quick_keeps_the_registry_and_shortens_the_phases():
    full, quick = bench.Options.for_mode(False), bench.Options.for_mode(True)
    shape = ("nodes", "tenants", "models", "releases", "scopes", "scopes_per_node")
    assert [getattr(quick, n) for n in shape] == [getattr(full, n) for n in shape] == [1000, 50, 200, 2000, 10000, 50]
    assert quick.push_rounds < full.push_rounds and quick.ingest_simulated_s < full.ingest_simulated_s
    assert quick.history_days < full.history_days == 7 and full.ingest_simulated_s == 3600
    assert quick.agent_processes >= 4 and quick.ingest_workers == 2


@pytest.fixture
def small_fleet(db):
    return build_fleet(nodes=4, tenants=2, models=2, releases=4, scopes=12, scopes_per_node=9)


def test_reports_are_accepted_by_the_real_ingest(small_fleet):
    from dashboard.models import OccupancySample
    from dashboard.rollout.push import ensure_versions
    from dashboard.telemetry.ingest import ingest
    from tenants.models import Node

    versions = ensure_versions(Node.objects.all())
    applied = {name: ensured.version.version for name, ensured in versions.items()}
    now = datetime.now(UTC)
    maker = bench.ReportMaker(small_fleet.scopes_by_node, small_fleet.secrets, applied, now - timedelta(hours=1))
    reports = [maker.report(node, 1, now - timedelta(seconds=5)) for node in small_fleet.node_names]
    result = ingest(reports)
    assert (result.reports, result.refused_scopes, result.invalid) == (4, 0, 0)
    assert result.samples == sum(len(s) for s in small_fleet.scopes_by_node.values())
    stored = set(OccupancySample.objects.values_list("node_name", "tenant_id", "served_model_name", "namespace",
                                                     "request_group"))
    assert stored == {(node, *scope) for node, scopes in small_fleet.scopes_by_node.items() for scope in scopes}


def test_chart_filters_name_one_tenant_model_release_and_group(small_fleet):
    filters = bench.chart_filters(small_fleet)
    assert list(filters) == ["tenant", "model", "release", "group", "everything"]
    tenant, model, namespace = small_fleet.releases[0]
    assert filters["release"] == {"tenant_id": tenant, "served_model_name": model, "namespace": namespace}
    assert (filters["group"]["tenant_id"], filters["group"]["request_group"]) in small_fleet.groups
    assert filters["everything"] == {}


def test_percentile_is_the_nearest_rank():
    from bench.push import percentile

    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50) == 5
    assert percentile([3, 1, 2], 100) == 3 and percentile([3, 1, 2], 0) == 1


def test_retained_bytes_follow_the_horizons(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 3600
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 2 * 86400
    settings.KVPOOL_RETENTION_SECONDS = 90 * 86400
    figures = bench.retained_bytes(100.0, 10)
    assert figures["db_bytes_per_day_hour_rows"] == 10 * 24 * 100
    assert figures["db_bytes_per_day_minute_rows"] == 10 * 1440 * 100
    rows = 10 * 8640 / 24 + 10 * 1440 * (2 - 1 / 24) + 10 * 24 * 88
    assert figures["db_bytes_retained_bound"] == round(rows * 100)
    settings.KVPOOL_RETENTION_SECONDS = 30 * 86400
    assert bench.retained_bytes(100.0, 10)["db_bytes_retained_bound"] < figures["db_bytes_retained_bound"]


def test_unknown_phases_are_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["--quick", "--phases", "push,charts"])
    assert info.value.code == 2
    assert "--phases: unknown charts" in capsys.readouterr().err


def test_goals_line_counts_only_what_was_measured():
    line = bench.goals_line({"push_p99_s": True, "lost": False, "chart_p99_ms": None})
    assert line == "goals: 1 of 2 measured met; missed: lost; not measured: chart_p99_ms"
