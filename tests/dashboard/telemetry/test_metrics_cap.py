"""The /metrics series cap (KVPOOL_METRICS_MAX_SERIES): top N entities per family, the rest in one (other) row."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboard.models import InstanceStats, MessageRejection, NodeState, OccupancySample, Report
from dashboard.telemetry.metrics import render
from dashboard.telemetry.series_cap import OTHER, split
from tests.support.factories import make_tenant
from tests.support.messages import register

pytestmark = pytest.mark.django_db

SCOPE = ("tenant_id", "served_model_name", "namespace", "request_group")
OTHER_SCOPE = dict.fromkeys(SCOPE, OTHER)


def samples() -> dict[str, dict[tuple, float]]:
    """Sample name -> {sorted label items: value} of a fresh scrape."""
    series: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return series


def key(**labels: str) -> tuple:
    return tuple(sorted(labels.items()))


def scope(tenant: str, group: str) -> dict[str, str]:
    return {"tenant_id": tenant, "served_model_name": "qwen3-8b", "namespace": "prod", "request_group": group}


def store_report(node: str, sequence: int, at, rows: list[tuple[dict[str, str], int]]) -> None:
    """A report receipt of ``node`` sent ``at`` with raw samples ``(scope labels, bytes)``: blocks = bytes // 10,
    puts = bytes // 100, hit_blocks = 1, miss_blocks = 3, store_evicted_blocks = 2."""
    Report.objects.create(node_name=node, sequence=sequence, sent_at=at, started_at=at - timedelta(hours=1),
                          received_at=at)
    OccupancySample.objects.bulk_create([
        OccupancySample(level=OccupancySample.Level.RAW, ts=at, node_name=node, bytes=size, blocks=size // 10,
                        puts=size // 100, hit_blocks=1, miss_blocks=3, store_evicted_blocks=2, **labels)
        for labels, size in rows])


@pytest.fixture
def ten_scopes(settings):
    """10 cache scopes of tenants acme and beta over two nodes' newest reports; bytes per scope: g0 1000 ... g9 100
    (g5 of beta and g6 of acme tie at 550); node-a's older report in the window must not count."""
    settings.KVPOOL_METRICS_WINDOW_SECONDS = 120
    make_tenant("acme")
    make_tenant("beta")
    now = timezone.now()
    sizes = {f"g{i}": size for i, size in enumerate((1000, 900, 800, 700, 600, 550, 550, 300, 200, 100))}
    tenant = {group: "acme" if int(group[1]) % 2 == 0 else "beta" for group in sizes}
    store_report("node-a", 1, now - timedelta(seconds=30), [(scope(tenant[g], g), 10**6) for g in sizes])
    store_report("node-a", 2, now - timedelta(seconds=5),
                 [(scope(tenant[g], g), size - 50) for g, size in sizes.items()])
    store_report("node-b", 1, now - timedelta(seconds=6), [(scope(tenant[g], g), 50) for g in sizes])
    return {g: (scope(tenant[g], g), size) for g, size in sizes.items()}


def test_cap_keeps_the_top_scopes_by_bytes_and_sums_the_rest_exactly_into_other(ten_scopes, settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 3
    series = samples()
    occupancy = series["kvpool_cache_scope_occupancy_bytes"]
    kept = {key(**ten_scopes[g][0]): float(ten_scopes[g][1]) for g in ("g0", "g1", "g2")}
    assert occupancy == {**kept, key(**OTHER_SCOPE): float(700 + 600 + 550 + 550 + 300 + 200 + 100)}
    folded = [size for g, (_, size) in ten_scopes.items() if g not in ("g0", "g1", "g2")]
    assert series["kvpool_cache_scope_occupancy_blocks"][key(**OTHER_SCOPE)] == sum(
        (size - 50) // 10 + 5 for size in folded)
    assert series["kvpool_cache_scope_puts_total"][key(**OTHER_SCOPE)] == sum((size - 50) // 100 for size in folded)
    assert series["kvpool_cache_scope_hit_ratio"][key(**OTHER_SCOPE)] == 0.25  # (7 * 2 hits) / (7 * 8 lookups)
    assert series["kvpool_cache_scope_evicted_blocks_by_cause_total"][key(**OTHER_SCOPE, cause="store")] == 7 * 2 * 2
    # the same scopes in every scope family, the series of a family at most cap + 1
    for name in ("kvpool_cache_scope_orphaned_bytes", "kvpool_cache_scope_in_flight_requests",
                 "kvpool_cache_scope_hit_blocks_total", "kvpool_cache_scope_hit_ratio"):
        assert set(series[name]) == set(occupancy), name
    dropped = series["kvpool_metrics_series_dropped"]
    assert dropped[key(family="kvpool_cache_scope_occupancy_bytes")] == 7
    assert dropped[key(family="kvpool_cache_scope_puts_total")] == 7
    assert dropped[key(family="kvpool_cache_scope_evicted_blocks_by_cause_total")] == 7 * 3
    # per-tenant families stay exact: every scope of the tenant
    tenants = series["kvpool_tenant_occupancy_bytes"]
    assert tenants[key(tenant_id="acme")] == sum(size for g, (labels, size) in ten_scopes.items()
                                                 if labels["tenant_id"] == "acme")
    assert sum(occupancy.values()) == sum(tenants.values())


def test_cap_zero_exports_every_scope_and_drops_none(ten_scopes, settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 0
    series = samples()
    assert series["kvpool_cache_scope_occupancy_bytes"] == {key(**labels): float(size)
                                                            for labels, size in ten_scopes.values()}
    assert set(series["kvpool_metrics_series_dropped"].values()) == {0.0}
    settings.KVPOOL_METRICS_MAX_SERIES = 10  # all fit: no (other) row either
    assert key(**OTHER_SCOPE) not in samples()["kvpool_cache_scope_occupancy_bytes"]


def test_ties_at_the_cut_are_broken_by_the_scope_labels(ten_scopes, settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 6  # g5 (beta) and g6 (acme) both hold 550 bytes: acme's sorts first
    first = samples()["kvpool_cache_scope_occupancy_bytes"]
    assert key(**ten_scopes["g6"][0]) in first and key(**ten_scopes["g5"][0]) not in first
    assert first[key(**OTHER_SCOPE)] == 550 + 300 + 200 + 100
    assert samples()["kvpool_cache_scope_occupancy_bytes"] == first


def test_a_deleted_tenants_scopes_are_in_no_row(ten_scopes, settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 3
    from tenants.models import Tenant

    Tenant.objects.filter(tenant_id="beta").delete()
    occupancy = samples()["kvpool_cache_scope_occupancy_bytes"]
    assert occupancy[key(**OTHER_SCOPE)] == 550 + 200  # acme keeps g0, g2, g4; g6 and g8 fold
    assert all(dict(labels)["tenant_id"] != "beta" for labels in occupancy)


def stats(node: str, instance: str, **counters: int) -> InstanceStats:
    now = timezone.now()
    return InstanceStats(node_name=node, instance_id=instance, tenant_id="acme", served_model_name="qwen3-8b",
                         namespace="prod", agent_started_at=now - timedelta(hours=1), reported_at=now,
                         observed_since=now - timedelta(hours=1), last_event_at=now, **counters)


def test_engine_instances_in_trouble_rank_first_and_the_rest_sum_into_other(settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 2
    make_tenant("acme")
    InstanceStats.objects.bulk_create([
        stats("node-a", "1", attributed=500, messages=10, external_prefix_cache_queries=100,
              external_prefix_cache_hits=50),
        stats("node-a", "2", attributed=400, messages=20, external_prefix_cache_queries=100,
              external_prefix_cache_hits=10, events_status="refused"),
        stats("node-b", "1", attributed=300, messages=30, pending=4),
        stats("node-b", "2", attributed=1, hash_mismatch=2, messages=40),  # least active, but in trouble
    ])
    series = samples()
    blocks = series["kvpool_engine_store_blocks_total"]
    labels = {"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "prod"}
    other = dict.fromkeys(("tenant_id", "served_model_name", "namespace", "instance_id", "node"), OTHER)
    # node-b/2 (hash mismatch) and node-a/2 (untrusted socket) are in trouble; node-a/1 and node-b/1 fold
    assert blocks[key(**labels, instance_id="2", node="node-b", outcome="hash_mismatch")] == 2
    assert blocks[key(**labels, instance_id="2", node="node-a", outcome="attributed")] == 400
    assert blocks[key(**other, outcome="attributed")] == 800
    assert len(blocks) == 3 * 6
    assert series["kvpool_engine_kv_event_messages_total"][key(**other)] == 40
    assert series["kvpool_engine_external_hit_ratio"][key(**other)] == 0.5  # 50 / 100 summed tokens
    assert series["kvpool_engine_store_writes_pending_blocks"][key(**other)] == 4
    assert series["kvpool_engine_events_untrusted"][key(**other, status=OTHER)] == 0
    assert key(**other) not in series["kvpool_engine_last_event_age_seconds"]  # ages do not add up
    dropped = series["kvpool_metrics_series_dropped"]
    assert dropped[key(family="kvpool_engine_store_blocks_total")] == 2 * 6
    assert dropped[key(family="kvpool_engine_last_event_age_seconds")] == 2


def test_nodes_in_trouble_rank_first_and_the_flags_of_the_rest_sum_into_other(settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 1
    register("node-a", "node-b", "node-c")
    now = timezone.now()
    NodeState.objects.bulk_create([
        NodeState(node_name="node-a", desired_version=2, acked_version=1, heartbeat_at=now, outbox_pending=3),
        NodeState(node_name="node-b", desired_version=3, acked_version=2, heartbeat_at=now - timedelta(hours=1),
                  outbox_pending=4),  # silent and behind: the most trouble
        NodeState(node_name="node-c", desired_version=2, acked_version=2, heartbeat_at=now, outbox_pending=5),
    ])
    MessageRejection.objects.create(reason="bad_signature", node="node-c", count=7)
    MessageRejection.objects.create(reason="duplicate", node="node-a", count=2)  # duplicates are no trouble
    series = samples()
    assert series["kvpool_node_silent"] == {key(node="node-b"): 1, key(node=OTHER): 0}
    assert series["kvpool_node_behind"] == {key(node="node-b"): 1, key(node=OTHER): 1}  # node-a is behind too
    assert series["kvpool_node_outbox_pending"][key(node=OTHER)] == 3 + 5
    assert set(series["kvpool_node_config_desired_version"]) == {key(node="node-b")}  # versions do not add up
    rejected = series["kvpool_agent_messages_rejected_total"]
    assert rejected[key(reason="bad_signature", node=OTHER)] == 7 and rejected[key(reason="duplicate", node=OTHER)] == 2
    assert rejected[key(reason="bad_signature", node="")] == 0  # messages naming no node are never folded
    dropped = series["kvpool_metrics_series_dropped"]
    assert dropped[key(family="kvpool_node_silent")] == 2
    assert dropped[key(family="kvpool_agent_messages_rejected_total")] == 2


def test_split_keeps_the_first_entities_in_rank_order():
    assert split([3, 2, 1], 2).kept == [3, 2] and split([3, 2, 1], 2).folded == [1]
    assert split([3, 2, 1], 0).folded == [] and split([3, 2, 1], 3).folded == []


def test_a_nodes_older_report_sent_at_another_nodes_newest_time_does_not_count(settings):
    settings.KVPOOL_METRICS_MAX_SERIES = 0
    make_tenant("acme")
    now = timezone.now()
    older, newer = now - timedelta(seconds=20), now - timedelta(seconds=10)
    store_report("node-a", 1, older, [(scope("acme", "g0"), 1000)])  # node-b's newest report has this time
    store_report("node-a", 2, newer, [(scope("acme", "g0"), 300)])
    store_report("node-b", 1, older, [(scope("acme", "g0"), 20)])
    assert samples()["kvpool_cache_scope_occupancy_bytes"] == {key(**scope("acme", "g0")): 320}


def test_render_writes_what_generate_latest_writes(ten_scopes, settings):
    from prometheus_client import CollectorRegistry, generate_latest

    from dashboard.telemetry.metrics import KVPoolCollector

    settings.KVPOOL_METRICS_MAX_SERIES = 3
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KVPoolCollector())
    assert render() == generate_latest(registry)


def test_refusals_anyone_can_cause_in_a_nodes_name_do_not_outrank_a_silent_node(settings):
    """Unsigned or badly signed messages may name any registered node (a forger needs no secret): refusals count
    one point of trouble at most, and only while recent, so they cannot push a node that is really silent and behind
    out of its own series (and its KvpoolNodeSilent alert) at the cap."""
    settings.KVPOOL_METRICS_MAX_SERIES = 1
    register("aaa-named", "aaa-long-ago", "zzz-silent")
    now = timezone.now()
    NodeState.objects.bulk_create([
        NodeState(node_name="aaa-named", desired_version=2, acked_version=2, heartbeat_at=now),
        NodeState(node_name="aaa-long-ago", desired_version=2, acked_version=2, heartbeat_at=now),
        NodeState(node_name="zzz-silent", desired_version=3, acked_version=2, heartbeat_at=now - timedelta(hours=1)),
    ])
    for reason in ("unsigned", "bad_signature", "wrong_node"):  # all forged in aaa-named's name, just now
        MessageRejection.objects.create(reason=reason, node="aaa-named", count=1, last_at=now)
        MessageRejection.objects.create(reason=reason, node="aaa-long-ago", count=1,
                                        last_at=now - timedelta(days=30))
    series = samples()
    assert series["kvpool_node_silent"] == {key(node="zzz-silent"): 1, key(node=OTHER): 0}
