"""occupancy_series (aggregated in SQL) against a brute-force Python fold of random rows: several nodes, cache
scopes and levels, agent restarts (counters going down), filters; on the backend of the run. The windows read from
every node's samples (15 minutes); those read from the occupancy summed over nodes: ``tests/dashboard/telemetry/
test_series.py``."""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from agent.contract.scope import CacheScope
from dashboard.models import OccupancySample
from dashboard.telemetry.queries import (
    _CAUSE_COUNTERS,
    EVICTION_CAUSES,
    WINDOW_TIERS,
    WINDOWS,
    OccupancyFilter,
    occupancy_series,
)

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 30, 12, 0, 7, tzinfo=UTC)
SCOPES = (CacheScope("acme", "qwen3-8b", "prod", ""), CacheScope("acme", "qwen3-8b", "prod", "app-1"),
          CacheScope("acme", "llama-70b", "canary", ""), CacheScope("globex", "qwen3-8b", "prod", "app-1"))
COUNTERS = ("hit_blocks", "miss_blocks", *_CAUSE_COUNTERS)


def _brute_force(rows: list[OccupancySample], window_start: datetime, width: int, count: int, keep) -> dict:
    """release -> (data, per-counter per-bucket increases, in-flight, orphaned), the documented semantics."""
    cells: dict = {}
    previous: dict = {}
    last: dict = {}
    increases: dict = {}
    for row in sorted(rows, key=lambda r: (r.ts, r.id)):
        scope = CacheScope(row.tenant_id, row.served_model_name, row.namespace, row.request_group)
        if not keep(scope):
            continue
        release = scope.release_scope()
        index = min(int((row.ts - window_start).total_seconds() // width), count - 1)
        weight = max(row.samples, 1)
        cell = cells.setdefault((index, row.node_name, scope), [0, 0])
        cell[0] += row.bytes * weight
        cell[1] += weight
        columns = increases.setdefault(release, [[0] * count for _ in COUNTERS])
        before = previous.get((row.node_name, scope))
        values = [getattr(row, name) for name in COUNTERS]
        if before is not None:
            for column, value, was in zip(columns, values, before, strict=True):
                column[index] += value - was if value >= was else value
        previous[(row.node_name, scope)] = values
        last[(row.node_name, scope)] = (row.in_flight_requests, row.orphaned_bytes)
    data: dict = {}
    for (index, _node, scope), (total, weight) in cells.items():
        values = data.setdefault(scope.release_scope(), [None] * count)
        values[index] = (values[index] or 0) + (2 * total + weight) // (2 * weight)
    return {release: (values, increases[release],
                      sum(v[0] for (_n, s), v in last.items() if s.release_scope() == release),
                      sum(v[1] for (_n, s), v in last.items() if s.release_scope() == release))
            for release, values in data.items()}


@pytest.mark.parametrize("window", [window for window, tier in WINDOW_TIERS.items() if tier is None])
def test_series_match_a_brute_force_fold(window):
    rng = random.Random(window)
    length = WINDOWS[window][0]
    rows = []
    counters: dict = {}
    for _ in range(300):
        node, scope = rng.choice(("node-a", "node-b")), rng.choice(SCOPES)
        level = rng.choice(OccupancySample.Level.values)
        value = counters.get((node, scope), 0)
        value = rng.randrange(0, 50) if rng.random() < 0.1 else value + rng.randrange(0, 1000)  # restart or not
        counters[(node, scope)] = value
        rows.append(OccupancySample(
            level=level,
            ts=NOW - timedelta(seconds=rng.randrange(-60, length + 600), microseconds=rng.randrange(10**6)),
            node_name=node, **scope._asdict(), bytes=rng.randrange(10**12), samples=rng.choice((0, 1, 6, 60)),
            in_flight_requests=rng.randrange(9), orphaned_bytes=rng.randrange(10**6),
            **{name: value + n for n, name in enumerate(COUNTERS)}))
    OccupancySample.objects.bulk_create(rows)
    rows = list(OccupancySample.objects.all())
    for filters in (OccupancyFilter(), OccupancyFilter(tenant_id="acme"), OccupancyFilter(served_model_name="qwen3-8b"),
                    OccupancyFilter(request_group="app-1"), OccupancyFilter(tenant_ids=frozenset({"globex"}))):
        series = occupancy_series(window, filters, now=NOW)
        in_window = [row for row in rows if series.start <= row.ts <= series.end]

        def keep(scope, filters=filters):
            return all(not getattr(filters, name) or getattr(scope, name) == getattr(filters, name)
                       for name in ("tenant_id", "served_model_name", "namespace")) and (
                filters.request_group is None or scope.request_group == filters.request_group) and (
                filters.tenant_ids is None or scope.tenant_id in filters.tenant_ids)

        want = _brute_force(in_window, series.start, series.bucket_seconds, len(series.buckets), keep)
        assert want, filters
        got = {s.key: (s.data, [s.hit_blocks_data, s.miss_blocks_data,
                                *(s.evicted_blocks_data[cause] for cause in EVICTION_CAUSES)],
                       s.in_flight_requests, s.orphaned_bytes) for s in series.series}
        assert got == want, filters
        assert [s.key for s in series.series] == sorted(want)
