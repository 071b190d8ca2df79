"""``LatestSample`` (the newest raw sample of each node and cache scope, kept by a trigger on sample inserts) and the
current occupancy read from it (``current_occupancy``, ``tenant_bytes_now``), against a brute force over the raw
samples (the computation they replaced): random nodes, scopes, times, batches inserted out of order, rollup rows,
request groups and releases a node stopped reporting; the real ingest path (PostgreSQL: ``COPY``); the rollup's
retention. On the backend of the run (SQLite and PostgreSQL)."""
from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from agent.contract.scope import CacheScope
from dashboard.models import LatestSample, OccupancySample
from dashboard.telemetry.ingest import ingest
from dashboard.telemetry.queries import OccupancyFilter, current_occupancy, tenant_bytes, tenant_bytes_now
from dashboard.telemetry.rollup import rollup
from tests.support.messages import T0, register, report

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 30, 12, 0, 7, tzinfo=UTC)
NODES = ("node-a", "node-b", "node-c", "node-d")
SCOPES = (CacheScope("acme", "qwen3-8b", "prod", ""), CacheScope("acme", "qwen3-8b", "prod", "app-1"),
          CacheScope("acme", "llama-70b", "canary", "app-2"), CacheScope("globex", "qwen3-8b", "prod", "app-1"),
          CacheScope("globex", "m", "ns", ""))
Level = OccupancySample.Level


def _random_samples(rng: random.Random) -> list[OccupancySample]:
    """Every node reports a random subset of the scopes every 10 s over the last 25 minutes, with gaps (a release
    or a request group it stopped reporting), plus rollup rows (newer than any raw one: not a raw sample)."""
    rows = []
    for node in NODES:
        for scope in SCOPES:
            if rng.random() < 0.2:
                continue
            stop = rng.randrange(0, 150)  # the last report of this pair: up to 25 minutes ago
            for step in range(stop, 150, rng.choice((1, 3))):
                rows.append(OccupancySample(
                    level=Level.RAW, ts=NOW - timedelta(seconds=10 * step), node_name=node, **scope._asdict(),
                    bytes=rng.randrange(1 << 30), blocks=rng.randrange(1000), in_flight_requests=rng.randrange(5),
                    hit_blocks=rng.randrange(10**6), miss_blocks=rng.randrange(10**6)))
            rows.append(OccupancySample(level=Level.MINUTE, ts=NOW, node_name=node, **scope._asdict(), bytes=7,
                                        samples=6))
    rng.shuffle(rows)
    return rows


def _insert(rows: list[OccupancySample], rng: random.Random) -> None:
    """In random batches, so older samples arrive after newer ones (late or re-delivered reports)."""
    while rows:
        size = rng.randrange(1, 60)
        OccupancySample.objects.bulk_create(rows[:size])
        rows = rows[size:]


def _brute_latest() -> dict:
    newest: dict = {}
    for row in OccupancySample.objects.filter(level=Level.RAW):
        key = (row.node_name, row.tenant_id, row.served_model_name, row.namespace, row.request_group)
        if key not in newest or row.ts > newest[key][0]:
            newest[key] = (row.ts, row.blocks, row.bytes, row.in_flight_requests, row.hit_blocks, row.miss_blocks)
    return newest


def _brute_current(filters: OccupancyFilter, now: datetime, max_age: int, node: str | None) -> dict:
    """The replaced computation: each node's newest raw sample of each release in the window, every request group's
    row at that time, summed per release."""
    rows = filters.apply(OccupancySample.objects.filter(level=Level.RAW, ts__gte=now - timedelta(seconds=max_age),
                                                        ts__lte=now))
    if node is not None:
        rows = rows.filter(node_name=node)
    rows = list(rows)
    newest: dict = {}
    for row in rows:
        key = (row.node_name, row.tenant_id, row.served_model_name, row.namespace)
        newest[key] = max(newest.get(key, row.ts), row.ts)
    out: dict = defaultdict(lambda: [0, 0, 0, 0, 0, None, defaultdict(int), defaultdict(int)])
    for row in rows:
        if newest[(row.node_name, row.tenant_id, row.served_model_name, row.namespace)] != row.ts:
            continue
        entry = out[CacheScope(row.tenant_id, row.served_model_name, row.namespace)]
        for n, value in enumerate((row.bytes, row.blocks, row.in_flight_requests, row.hit_blocks, row.miss_blocks)):
            entry[n] += value
        entry[5] = row.ts if entry[5] is None else max(entry[5], row.ts)
        entry[6][row.node_name] += row.bytes
        entry[7][row.request_group] += row.bytes
    return {key: (*entry[:6], dict(entry[6]), dict(entry[7])) for key, entry in out.items()}


def _got(occupancy: dict) -> dict:
    return {key: (e.bytes, e.blocks, e.in_flight_requests, e.hit_blocks, e.miss_blocks, e.newest, e.by_node,
                  e.by_group) for key, e in occupancy.items()}


@pytest.mark.parametrize("seed", [1, 2])
def test_the_newest_sample_per_pair_and_the_current_occupancy_match_a_brute_force(seed):
    rng = random.Random(seed)
    _insert(_random_samples(rng), rng)
    stored = {(r.node_name, r.tenant_id, r.served_model_name, r.namespace, r.request_group):
              (r.ts, r.blocks, r.bytes, r.in_flight_requests, r.hit_blocks, r.miss_blocks)
              for r in LatestSample.objects.all()}
    assert stored == _brute_latest()
    filters = (OccupancyFilter(), OccupancyFilter(tenant_id="acme"), OccupancyFilter(served_model_name="qwen3-8b"),
               OccupancyFilter(tenant_id="acme", served_model_name="qwen3-8b", namespace="prod"),
               OccupancyFilter(tenant_ids=frozenset({"globex"})), OccupancyFilter(tenant_ids=frozenset()))
    checked = 0
    for max_age in (60, 300, 15 * 60):
        for now in (NOW, NOW + timedelta(minutes=3)):  # no sample is dated after now (ingest's clock)
            for flt in filters:
                for node in (None, "node-b"):
                    want = _brute_current(flt, now, max_age, node)
                    assert _got(current_occupancy(flt, now=now, max_age_seconds=max_age, node_name=node)) == want
                    checked += bool(want)
            assert tenant_bytes_now(now=now, max_age_seconds=max_age) == tenant_bytes(
                current_occupancy(now=now, max_age_seconds=max_age))
            assert tenant_bytes_now(now=now, max_age_seconds=max_age) == {
                tenant: total for tenant, total in
                ((t, sum(v[0] for k, v in _brute_current(OccupancyFilter(), now, max_age, None).items()
                         if k.tenant_id == t)) for t in ("acme", "globex")) if total}
    assert checked > 20  # most combinations see samples


def test_a_request_group_the_node_stopped_reporting_is_not_current():
    """The node's newest report of the release no longer carries the group: its older row is not counted (as the
    raw samples' computation did), though it is the group's newest sample."""
    base = {"node_name": "node-a", "tenant_id": "acme", "served_model_name": "m", "namespace": "prod"}
    OccupancySample.objects.bulk_create([
        OccupancySample(ts=NOW - timedelta(seconds=20), request_group="gone", bytes=5, **base),
        OccupancySample(ts=NOW - timedelta(seconds=20), request_group="kept", bytes=7, **base),
        OccupancySample(ts=NOW - timedelta(seconds=10), request_group="kept", bytes=11, **base)])
    OccupancySample.objects.create(ts=NOW - timedelta(seconds=30), request_group="kept", bytes=999, **base)  # late
    assert LatestSample.objects.get(request_group="kept").bytes == 11
    entry = current_occupancy(now=NOW)[CacheScope("acme", "m", "prod")]
    assert (entry.bytes, entry.by_group) == (11, {"kept": 11})
    assert tenant_bytes_now(now=NOW) == {"acme": 11}


def test_ingest_keeps_the_newest_sample_of_each_pair():
    """Through the real ingest path (PostgreSQL: one COPY; the trigger runs once for it): a report, a newer one and
    a re-delivered older one."""
    register("node-a")
    ingest([report(sequence=1, at=T0, bytes_per_scope=4096), report(sequence=2, at=T0 + timedelta(seconds=10),
                                                                   bytes_per_scope=8192)])
    ingest([report(sequence=3, at=T0 - timedelta(seconds=10), bytes_per_scope=1024)])  # older, arriving late
    rows = sorted(LatestSample.objects.values_list("request_group", "ts", "bytes"))
    assert rows == [("g0", T0 + timedelta(seconds=10), 8192), ("g1", T0 + timedelta(seconds=10), 8192)]


def test_the_rollup_deletes_pairs_past_the_raw_horizon(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 600
    base = {"tenant_id": "acme", "served_model_name": "m", "namespace": "prod", "request_group": ""}
    OccupancySample.objects.bulk_create([
        OccupancySample(ts=NOW - timedelta(minutes=30), node_name="silent", bytes=1, **base),
        OccupancySample(ts=NOW - timedelta(minutes=30), node_name="alive", bytes=1, **base),
        OccupancySample(ts=NOW - timedelta(minutes=1), node_name="alive", bytes=2, **base)])
    counts = rollup(NOW)
    assert counts["latest_deleted"] == 1
    assert list(LatestSample.objects.values_list("node_name", "bytes")) == [("alive", 2)]


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_the_table_from_the_samples_stored_and_reverts():
    """Unapplied, the table and its trigger are gone (samples insert as before); applied again, it holds the newest
    raw sample of each pair already stored, and the trigger keeps it."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("dashboard", "0015_occupancy_cell")])
    try:
        base = {"tenant_id": "acme", "served_model_name": "m", "namespace": "prod", "request_group": ""}
        OccupancySample.objects.bulk_create([
            OccupancySample(ts=NOW - timedelta(seconds=20), node_name="node-a", bytes=1, **base),
            OccupancySample(ts=NOW - timedelta(seconds=10), node_name="node-a", bytes=2, **base),
            OccupancySample(ts=NOW - timedelta(seconds=30), node_name="node-b", bytes=3, **base),
            OccupancySample(level=Level.MINUTE, ts=NOW, node_name="node-b", bytes=4, samples=6, **base)])
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate([("dashboard", "0016_latest_sample")])
    assert sorted(LatestSample.objects.values_list("node_name", "bytes")) == [("node-a", 2), ("node-b", 3)]
    OccupancySample.objects.create(ts=NOW, node_name="node-b", bytes=5, **base)
    assert sorted(LatestSample.objects.values_list("node_name", "bytes")) == [("node-a", 2), ("node-b", 5)]
