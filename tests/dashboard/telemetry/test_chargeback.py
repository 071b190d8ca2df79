"""dashboard.telemetry.chargeback against a brute-force integral of the samples.

The samples are generated: several nodes and cache scopes, 1-hour, 1-minute and raw tiers one after the other (each
node's tiers end at a different time), irregular report intervals, gaps longer than the max gap, periods whose
boundaries cut samples. The brute force evaluates each node's scope as a function of time (the value of the
sample holding at ``t``: the newest at or before ``t`` while ``t`` is before the next sample and inside the
sample's hold) at the midpoint of every interval between two breakpoints, and sums. Then the real rollup folds raw
samples into minutes and hours: the integral stays what it was, up to the documented junction of the tiers.
"""
from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from dashboard.models import OccupancySample
from dashboard.telemetry.chargeback import GROUPINGS, chargeback, csv_text
from dashboard.telemetry.rollup import rollup

pytestmark = pytest.mark.django_db
Level = OccupancySample.Level
T0 = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
MAX_GAP = 60
HOLD = {Level.RAW: MAX_GAP, Level.MINUTE: 60, Level.HOUR: 3600}
NODES = ("node-a", "node-b", "node-c")
SCOPES = (("acme", "qwen3-8b", "prod-1", ""), ("acme", "qwen3-8b", "prod-1", "app-a"),
          ("acme", "qwen3-8b", "prod-2", "app-a"), ("acme", "llama", "canary", ""),
          ("beta", "qwen3-8b", "prod-1", ""), ("beta", "mistral", "main", "batch"))
KEY = ("tenant_id", "served_model_name", "namespace", "request_group")


def _generate(seed: int) -> list[OccupancySample]:
    """Rows of every node and (most) scopes: hour rows, then minute rows, then irregular raw samples (ms
    precision) with gaps, each tier of a node starting where its coarser tier ended (a different hour per node)."""
    rng = random.Random(seed)
    rows = []
    for n, node in enumerate(NODES):
        hours_end = T0 + timedelta(hours=2 + n)
        minutes_end = hours_end + timedelta(minutes=20 + 7 * n)
        for scope in SCOPES:
            if rng.random() < 0.2:
                continue  # this node never held that scope
            fields = dict(zip(KEY, scope))

            def add(level, ts, _fields=fields, _node=node):
                rows.append(OccupancySample(level=level, ts=ts, node_name=_node, bytes=rng.randrange(0, 1 << 34),
                                            samples=1 if level == Level.RAW else 6, **_fields))

            for hour in range(2 + n):
                if rng.random() < 0.85:
                    add(Level.HOUR, T0 + timedelta(hours=hour))
            for minute in range(20 + 7 * n):
                if rng.random() < 0.8:
                    add(Level.MINUTE, hours_end + timedelta(minutes=minute))
            at = minutes_end + timedelta(milliseconds=rng.randrange(0, 10_000))
            for _ in range(rng.randrange(40, 90)):
                add(Level.RAW, at)
                step = rng.randrange(70_000, 400_000) if rng.random() < 0.08 else rng.randrange(1_000, 25_000)
                at += timedelta(milliseconds=step)
    OccupancySample.objects.bulk_create(rows)
    return rows


def _brute_force(rows, start: datetime, end: datetime, group_by: str) -> dict[tuple, float]:
    """group key -> bytes × seconds over [start, end), by evaluating each node's scope at interval midpoints."""
    series: dict[tuple, list] = defaultdict(list)
    for row in rows:
        series[(row.node_name, *(getattr(row, name) for name in KEY))].append(row)
    totals: dict[tuple, float] = defaultdict(float)
    seen: set[tuple] = set()
    for (_node, *scope), items in series.items():
        items.sort(key=lambda row: (row.ts, row.level))
        holds = []  # (from, until, bytes)
        for index, row in enumerate(items):
            until = row.ts + timedelta(seconds=HOLD[row.level])
            if index + 1 < len(items):
                until = min(until, items[index + 1].ts)
            holds.append((row.ts, until, row.bytes))
        points = sorted({start, end, *(p for h in holds for p in h[:2] if start < p < end)})

        def value(t, _holds=holds):
            held = [size for since, until, size in _holds if since <= t < until]
            return held[-1] if held else None

        key = tuple(part for name, part in zip(KEY, scope) if name in GROUPINGS[group_by])
        for left, right in zip(points, points[1:]):
            held = value(left + (right - left) / 2)
            if held is not None:
                seen.add(key)
                totals[key] += held * (right - left).total_seconds()
    return {key: totals[key] for key in seen}


def _periods():
    yield "whole data", T0 - timedelta(hours=1), T0 + timedelta(hours=8)
    yield "cuts hour rows", T0 + timedelta(minutes=17, seconds=3), T0 + timedelta(hours=1, minutes=41)
    yield "across every tier junction", T0 + timedelta(hours=1, minutes=59, seconds=59.5), T0 + timedelta(hours=5)
    yield "inside raw samples", T0 + timedelta(hours=2, minutes=27, seconds=4.321), T0 + timedelta(hours=2,
                                                                                                     minutes=29)
    yield "before any sample", T0 - timedelta(hours=3), T0 - timedelta(hours=2)


@pytest.mark.parametrize("group_by", list(GROUPINGS))
def test_integral_matches_the_brute_force(group_by):
    rows = _generate(seed=19)
    assert {row.level for row in rows} == set(Level.values)
    for label, start, end in _periods():
        report = chargeback(OccupancySample.objects.all(), start, end, group_by, max_gap=MAX_GAP)
        expected = _brute_force(rows, start, end, group_by)
        got = {tuple(row.key[name] for name in GROUPINGS[group_by]): row.byte_seconds for row in report.rows}
        assert got.keys() == expected.keys(), label
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-3), (label, key)
        assert [row.byte_seconds for row in report.rows] == sorted(got.values(), reverse=True)
    whole = chargeback(OccupancySample.objects.all(), T0, T0 + timedelta(hours=8), group_by, max_gap=MAX_GAP)
    assert whole.total_byte_hours > 0


def test_filters_and_scoping_narrow_the_samples_before_integrating():
    rows = _generate(seed=7)
    start, end = T0 + timedelta(minutes=30), T0 + timedelta(hours=6)
    beta = [row for row in rows if row.tenant_id == "beta"]
    report = chargeback(OccupancySample.objects.filter(tenant_id="beta"), start, end, "release", max_gap=MAX_GAP)
    expected = _brute_force(beta, start, end, "release")
    assert {tuple(row.key.values()): row.byte_seconds for row in report.rows} == pytest.approx(expected, rel=1e-9)
    assert {row.key["tenant_id"] for row in report.rows} == {"beta"}


def test_gap_longer_than_the_max_gap_counts_as_absent():
    base = dict(node_name="node-a", tenant_id="acme", served_model_name="m", namespace="ns")
    OccupancySample.objects.create(ts=T0, bytes=1000, **base)
    OccupancySample.objects.create(ts=T0 + timedelta(seconds=10), bytes=2000, **base)
    OccupancySample.objects.create(ts=T0 + timedelta(seconds=500), bytes=4000, **base)  # 490 s later
    report = chargeback(OccupancySample.objects.all(), T0, T0 + timedelta(seconds=520), max_gap=60)
    assert report.rows[0].byte_seconds == pytest.approx(1000 * 10 + 2000 * 60 + 4000 * 20)


def test_two_nodes_add_up_and_a_zero_scope_stays_listed():
    for node, size in (("node-a", 1 << 30), ("node-b", 1 << 30)):
        for minute in range(60):
            OccupancySample.objects.create(level=Level.MINUTE, ts=T0 + timedelta(minutes=minute), node_name=node,
                                           tenant_id="acme", served_model_name="m", namespace="ns", bytes=size)
    OccupancySample.objects.create(ts=T0, node_name="node-a", tenant_id="idle", served_model_name="m",
                                   namespace="ns", bytes=0)
    report = chargeback(OccupancySample.objects.all(), T0, T0 + timedelta(hours=2), capacity_bytes=8 << 30)
    assert [(row.key, row.gib_hours) for row in report.rows] == [({"tenant_id": "acme"}, 2.0),
                                                                 ({"tenant_id": "idle"}, 0.0)]
    assert report.capacity_byte_hours == 16 * 2**30
    assert report.share(report.rows[0].byte_hours) == pytest.approx(2 / 16)
    assert report.average_bytes(report.rows[0].byte_hours) == pytest.approx(1 << 30)
    lines = csv_text(report).splitlines()
    assert lines[0] == ("period_start,period_end,tenant_id,byte_hours (B·h),gib_hours (GiB·h),average_bytes (B),"
                        "capacity_share (fraction)")
    assert lines[1].split(",")[2:] == ["acme", repr(2.0 * 2**30), "2.0", repr(float(1 << 30)), "0.125"]
    assert lines[2].split(",")[2:] == ["idle", "0.0", "0.0", "0.0", "0.0"]


def test_unknown_grouping_and_empty_period_are_refused():
    with pytest.raises(ValueError, match="group_by"):
        chargeback(OccupancySample.objects.all(), T0, T0 + timedelta(hours=1), "node")
    with pytest.raises(ValueError, match="end must be after start"):
        chargeback(OccupancySample.objects.all(), T0, T0)


def test_rolling_up_keeps_the_integral(settings):
    """Regular raw reports every 10 s, 3 s after each 10 s mark, for 3 hours on two nodes; the real rollup folds
    them into hours, minutes and recent raw rows. Over a period starting at an hour (a rollup row cannot say
    where in its bucket the bytes were) the integral changes by at most 3 s of one sample per node at the start and
    at each tier junction (the coarser row ends at its bucket end, the finer data starts at its first sample)."""
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 600
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 3600
    rng = random.Random(5)
    rows = []
    for node in ("node-a", "node-b"):
        for i in range(3 * 360):
            rows.append(OccupancySample(ts=T0 + timedelta(seconds=3 + 10 * i), node_name=node, tenant_id="acme",
                                        served_model_name="m", namespace="ns", bytes=rng.randrange(1 << 20, 1 << 30)))
    OccupancySample.objects.bulk_create(rows)
    start, end = T0 + timedelta(hours=1), T0 + timedelta(hours=2, minutes=58)
    before = chargeback(OccupancySample.objects.all(), start, end, max_gap=MAX_GAP).rows[0].byte_seconds
    counts = rollup(now=T0 + timedelta(hours=3))
    assert counts["raw_folded"] > 0 and counts["minute_folded"] > 0
    assert set(OccupancySample.objects.values_list("level", flat=True)) == set(Level.values)
    after = chargeback(OccupancySample.objects.all(), start, end, max_gap=MAX_GAP).rows[0].byte_seconds
    assert abs(after - before) <= 2 * 3 * 3 * (1 << 30)  # nodes × (start + 2 junctions) × 3 s × the largest sample
    assert abs(after - before) / before < 1e-3
