"""The occupancy summed over nodes (``dashboard.telemetry.series``) and the chart windows that read it, against a
brute-force Python computation from the samples: random nodes, cache scopes, levels, late rows, agent restarts,
filters; the rollup's folds and retention; on the backend of the run (SQLite and PostgreSQL)."""
from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from agent.contract.scope import CacheScope
from dashboard.models import OccupancySample, ScopeSeries
from dashboard.telemetry import series as series_mod
from dashboard.telemetry.queries import (
    CHART_MAX_SERIES,
    EVICTION_CAUSES,
    WINDOW_TIERS,
    WINDOWS,
    OccupancyFilter,
    occupancy_series,
)
from dashboard.telemetry.rollup import rollup

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 30, 12, 0, 7, tzinfo=UTC)
SCOPES = (CacheScope("acme", "qwen3-8b", "prod", ""), CacheScope("acme", "qwen3-8b", "prod", "app-1"),
          CacheScope("acme", "llama-70b", "canary", ""), CacheScope("globex", "qwen3-8b", "prod", "app-1"))
NODES = ("node-a", "node-b", "node-c")
COUNTERS = ScopeSeries.COUNTERS
GAUGES = ScopeSeries.GAUGES  # bytes, orphaned_bytes, in_flight_requests: the column order of the brute force
FILTERS = (OccupancyFilter(), OccupancyFilter(tenant_id="acme"), OccupancyFilter(served_model_name="qwen3-8b"),
           OccupancyFilter(tenant_id="acme", served_model_name="qwen3-8b", namespace="prod"),
           OccupancyFilter(request_group="app-1"), OccupancyFilter(request_group=""),
           OccupancyFilter(tenant_ids=frozenset({"globex"})))


def _half_up(total: int, weight: int) -> int:
    return (2 * total + weight) // (2 * weight) if weight else 0


def _floor(ts: datetime, seconds: int) -> datetime:
    epoch = int(ts.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _brute_minutes(rows: list[OccupancySample], start: datetime, end: datetime) -> dict:
    """(width, ts, scope) -> column values: the 1-minute rows of [start, end) by the documented rules (per node,
    scope and minute each counter's largest value, its increase from the node's previous minute's largest, or
    within the minute when there is none)."""
    cells: dict = {}
    for row in rows:
        scope = CacheScope(row.tenant_id, row.served_model_name, row.namespace, row.request_group)
        cell = cells.setdefault((row.node_name, scope, int(row.ts.timestamp()) // 60), {
            "totals": [0] * len(GAUGES), "weight": 0, "high": [None] * len(COUNTERS), "low": [None] * len(COUNTERS)})
        weight = max(row.samples, 1)
        for n, name in enumerate(GAUGES):
            cell["totals"][n] += getattr(row, name) * weight
        cell["weight"] += weight
        for n, name in enumerate(COUNTERS):
            value = getattr(row, name)
            cell["high"][n] = value if cell["high"][n] is None else max(cell["high"][n], value)
            cell["low"][n] = value if cell["low"][n] is None else min(cell["low"][n], value)
    out: dict = {}
    for (node, scope, minute), cell in cells.items():
        ts = datetime.fromtimestamp(minute * 60, tz=UTC)
        if not start <= ts < end:
            continue
        previous = cells.get((node, scope, minute - 1))
        increases = [high - (low if previous is None else 0 if high < previous["high"][n] else previous["high"][n])
                     for n, (high, low) in enumerate(zip(cell["high"], cell["low"], strict=True))]
        for key in ((60, ts, scope), (60, ts, scope.release_scope())):
            values = out.setdefault(key, [0] * (len(GAUGES) + len(COUNTERS) + 1))
            for n, total in enumerate(cell["totals"]):
                values[n] += _half_up(total, cell["weight"])
            for n, increase in enumerate(increases):
                values[len(GAUGES) + n] += increase
            values[-1] += cell["weight"]
    return out


def _brute_coarser(finer: dict, width: int, end: datetime) -> dict:
    """The ``width`` rows (complete buckets only: ending at or before ``end``) of the finer tier's rows."""
    groups: dict = defaultdict(list)
    for (_w, ts, scope), values in finer.items():
        bucket = _floor(ts, width)
        if bucket + timedelta(seconds=width) <= end:
            groups[(width, bucket, scope)].append((ts, values))
    return {key: [*(_half_up(sum(v[n] for _, v in members), len(members)) for n in range(len(GAUGES))),
                  *(sum(v[n] for _, v in members) for n in range(len(GAUGES), len(GAUGES) + len(COUNTERS) + 1))]
            for key, members in groups.items()}


def _stored() -> dict:
    return {(row.width, row.ts, CacheScope(row.tenant_id, row.served_model_name, row.namespace, row.request_group)):
            [*(getattr(row, name) for name in (*GAUGES, *COUNTERS, "samples"))]
            for row in ScopeSeries.objects.all()}


def _random_rows(rng: random.Random, start: datetime, end: datetime, count: int, *, restarts: bool = True,
                 levels=(OccupancySample.Level.RAW,), samples=(0, 1, 6)) -> list[OccupancySample]:
    rows = []
    counters: dict = {}
    span = int((end - start).total_seconds())
    times = sorted(start + timedelta(seconds=rng.randrange(span), microseconds=rng.randrange(10**6))
                   for _ in range(count))
    for ts in times:
        node, scope = rng.choice(NODES), rng.choice(SCOPES)
        value = counters.get((node, scope), 0)
        value = rng.randrange(0, 50) if restarts and rng.random() < 0.1 else value + rng.randrange(0, 1000)
        counters[(node, scope)] = value
        rows.append(OccupancySample(
            level=rng.choice(levels), ts=ts, node_name=node, **scope._asdict(), bytes=rng.randrange(10**12),
            samples=rng.choice(samples), in_flight_requests=rng.randrange(9), orphaned_bytes=rng.randrange(10**6),
            **{name: value + n for n, name in enumerate(COUNTERS)}))
    return rows


def _chart_brute_force(tiers: dict, window: str, filters: OccupancyFilter) -> dict:
    """release -> (data, per-counter per-bucket increases, in-flight, orphaned) from the tier's rows."""
    length, width = WINDOWS[window]
    start = _floor(NOW - timedelta(seconds=length), width)
    count = int((NOW - start).total_seconds() // width) + 1
    cells: dict = defaultdict(list)
    for (tier, ts, scope), values in tiers.items():
        if tier != WINDOW_TIERS[window] or not start <= ts <= NOW:
            continue
        if (scope.request_group is None) != (filters.request_group is None) or (
                filters.request_group is not None and scope.request_group != filters.request_group):
            continue
        if any(getattr(filters, name) and getattr(scope, name) != getattr(filters, name)
               for name in ("tenant_id", "served_model_name", "namespace")):
            continue
        if filters.tenant_ids is not None and scope.tenant_id not in filters.tenant_ids:
            continue
        release = scope.release_scope()
        index = min(int((ts - start).total_seconds()) // width, count - 1)
        cells[(release, index)].append(values)
    out: dict = {}
    for release in {release for release, _ in cells}:
        data: list = [None] * count
        columns = [[0] * count for _ in COUNTERS]
        for index in range(count):
            members = cells.get((release, index))
            if members:
                data[index] = _half_up(sum(m[0] for m in members), len(members))
                for n in range(len(COUNTERS)):
                    columns[n][index] = sum(m[len(GAUGES) + n] for m in members)
                newest = members  # in-flight and orphaned: their mean in the newest bucket
        out[release] = (data, columns, _half_up(sum(m[2] for m in newest), len(newest)),
                        _half_up(sum(m[1] for m in newest), len(newest)))
    return out


def _capped_brute_force(tiers: dict, window: str, filters: OccupancyFilter, cap: int) -> dict:
    """``_chart_brute_force`` with at most ``cap`` releases (most bytes summed over the window's buckets; ties by
    name), the rest summed per bucket under the blank key (in-flight and orphaned of their newest bucket)."""
    full = _chart_brute_force(tiers, window, filters)
    if len(full) <= cap:
        return full
    ranked = sorted(full, key=lambda key: (-sum(v for v in full[key][0] if v is not None), tuple(key)))
    kept, rest = ranked[:cap], ranked[cap:]
    count = len(full[kept[0]][0])
    data: list = [None] * count
    columns = [[0] * count for _ in COUNTERS]
    for key in rest:
        for index, value in enumerate(full[key][0]):
            if value is not None:
                data[index] = (data[index] or 0) + value
        for n, column in enumerate(full[key][1]):
            for index, value in enumerate(column):
                columns[n][index] += value
    # the newest bucket holding one of the rest: the rest's in-flight and orphaned values in it, summed
    newest = max(index for index, value in enumerate(data) if value is not None)
    in_flight = sum(full[key][2] for key in rest if full[key][0][newest] is not None)
    orphaned = sum(full[key][3] for key in rest if full[key][0][newest] is not None)
    return {**{key: full[key] for key in kept},
            CacheScope("", "", ""): (data, columns, in_flight, orphaned)}


def _chart(window: str, filters: OccupancyFilter) -> dict:
    result = occupancy_series(window, filters, now=NOW)
    return {s.key: (s.data, [s.hit_blocks_data, s.miss_blocks_data,
                             *(s.evicted_blocks_data[cause] for cause in EVICTION_CAUSES)],
                    s.in_flight_requests, s.orphaned_bytes) for s in result.series}


def test_summarize_and_charts_match_a_brute_force(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 3 * 3600  # the 1-minute tier is kept 4 h: from 09:00 on
    rng = random.Random(17)
    rows = _random_rows(rng, NOW - timedelta(hours=3, minutes=10), NOW, 1500,
                        levels=(OccupancySample.Level.RAW, OccupancySample.Level.MINUTE))
    OccupancySample.objects.bulk_create(rows)
    rows = list(OccupancySample.objects.all())
    written = series_mod.summarize(NOW)
    start, end = datetime(2026, 11, 30, 8, 5, tzinfo=UTC), datetime(2026, 11, 30, 11, 59, tzinfo=UTC)
    assert written == (start, end)
    want = tier = _brute_minutes(rows, start, end)
    for width in (300, 900, 3600, 7200, 21600):  # each tier from the one before
        tier = _brute_coarser(tier, width, end)
        want = {**want, **tier}
    assert {key[1] for key in want if key[0] == 7200} == {datetime(2026, 11, 30, 8, tzinfo=UTC)}  # 10:00 is not done
    assert not any(key[0] == 21600 for key in want)
    assert _stored() == want
    # nothing new: a second run writes nothing and changes nothing
    assert series_mod.summarize(NOW + timedelta(seconds=20)) is None
    assert _stored() == want
    for window in ("1h", "6h", "24h", "7d"):
        for filters in FILTERS:
            expected = _chart_brute_force(want, window, filters)
            assert expected or filters.request_group == "" and window == "1h", (window, filters)
            assert _chart(window, filters) == expected, (window, filters)


@pytest.mark.parametrize("cap", [1, 2])
def test_a_capped_chart_matches_a_brute_force(settings, monkeypatch, cap):
    """The releases beyond the cap (``CHART_MAX_SERIES``) summed per bucket into one series, for every filter and
    window of the series: the same numbers as the brute force ranks and sums them."""
    from dashboard.telemetry import queries

    monkeypatch.setattr(queries, "CHART_MAX_SERIES", cap)
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 3 * 3600
    rng = random.Random(29)
    OccupancySample.objects.bulk_create(_random_rows(rng, NOW - timedelta(hours=3, minutes=10), NOW, 1500,
                                                     levels=(OccupancySample.Level.RAW,)))
    series_mod.summarize(NOW)
    want = _stored()
    capped = 0
    for window in ("1h", "6h", "24h"):
        for filters in FILTERS:
            expected = _capped_brute_force(want, window, filters, cap)
            capped += CacheScope("", "", "") in expected
            assert _chart(window, filters) == expected, (window, filters)
    assert capped >= 3  # the filters of more releases than the cap


def test_counters_count_increases_not_totals():
    """Two nodes' cumulative counters over three minutes, one agent restarting: the series counts what was added."""
    start = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    scope = SCOPES[0]
    samples = []
    for node, values in (("node-a", (100, 110, 130, 160)), ("node-b", (5000, 5007, 3, 10))):  # b restarts
        for n, value in enumerate(values):
            samples.append(OccupancySample(ts=start + timedelta(seconds=30 * n), node_name=node, **scope._asdict(),
                                           bytes=1000 * (n + 1), hit_blocks=value))
    OccupancySample.objects.bulk_create(samples)
    series_mod._write(ScopeSeries.Width.MINUTE, start, start + timedelta(minutes=2))
    rows = {(row.ts.minute, row.request_group): row for row in ScopeSeries.objects.all()}
    # minute 0: a +10, b +7; minute 1: a +20 +30, b restarted at 3 (counts 3) then +7
    assert [rows[(0, "")].hit_blocks, rows[(1, "")].hit_blocks] == [17, 60]
    assert rows[(0, None)].hit_blocks == 17
    # bytes: each node's mean in the minute (1000, 2000 -> 1500; 3000, 4000 -> 3500), summed over nodes
    assert [rows[(0, "")].bytes, rows[(1, "")].bytes] == [3000, 7000]


def test_an_agent_restart_within_a_minute_counts_from_zero_in_the_next_minute():
    """Counters per node and minute are their largest value (what the fold keeps): a restart inside a minute counts
    that minute's increase up to its largest value and the rest, from zero, in the next minute; nothing is lost or
    counted twice over the two."""
    start = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    scope = SCOPES[0]
    OccupancySample.objects.bulk_create([
        OccupancySample(ts=start + timedelta(seconds=seconds), node_name="node-a", **scope._asdict(), hit_blocks=value)
        for seconds, value in ((0, 100), (60, 110), (70, 120), (80, 5), (90, 10), (120, 15))])
    series_mod._write(ScopeSeries.Width.MINUTE, start, start + timedelta(minutes=3))
    hits = {row.ts.minute: row.hit_blocks for row in ScopeSeries.objects.filter(request_group="")}
    # minute 0: the node's first, one sample: 0; minute 1: 120 - 100 (the restart to 5, then 10, not seen);
    # minute 2: 15 < 120, a restart: 15 from zero (the 5 and 10 of minute 1 with it)
    assert hits == {0: 0, 1: 20, 2: 15}
    assert sum(hits.values()) == (110 - 100) + (120 - 110) + 5 + (10 - 5) + (15 - 10)  # as consecutive samples say


def test_rollup_keeps_the_series_of_the_samples_it_folds(settings):
    """Runs of the rollup three minutes apart, late samples arriving for minutes already summed (and folded): once
    folded, the series equals a brute force over the samples left; retention drops each tier's old rows."""
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 600  # 1-minute series kept 70 min
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 4 * 3600
    settings.KVPOOL_RETENTION_SECONDS = 30 * 86400
    rng = random.Random(3)
    begin = NOW - timedelta(minutes=90)
    rows = []  # every node reports each scope every 10 s, as agents do (raw rows as ingest stores them)
    for node in NODES:
        for scope in SCOPES:
            value = rng.randrange(1000)
            for step in range(90 * 6):
                value += rng.randrange(0, 100)
                rows.append(OccupancySample(
                    ts=begin + timedelta(seconds=10 * step, microseconds=rng.randrange(10**6)), node_name=node,
                    **scope._asdict(), bytes=rng.randrange(10**12), in_flight_requests=rng.randrange(9),
                    orphaned_bytes=rng.randrange(10**6), **{name: value + n for n, name in enumerate(COUNTERS)}))
    late = [row for row in rows if rng.random() < 0.1]
    on_time = [row for row in rows if row not in late]
    for step in range(0, 91, 3):
        clock = begin + timedelta(minutes=step)
        OccupancySample.objects.bulk_create([row for row in on_time if clock - timedelta(minutes=3) <= row.ts < clock])
        if step % 15 == 0:  # late ones: up to 15 minutes behind
            OccupancySample.objects.bulk_create(
                [row for row in late if clock - timedelta(minutes=15) <= row.ts < clock])
        rollup(clock)
    # an old 1-minute series row and an old 5-minute one: past their retention
    stale = ScopeSeries.objects.create(width=60, ts=NOW - timedelta(hours=3), tenant_id="acme")
    kept = ScopeSeries.objects.create(width=300, ts=NOW - timedelta(hours=3), tenant_id="acme")
    counts = rollup(NOW)
    assert counts["series_deleted"] >= 1
    assert not ScopeSeries.objects.filter(id=stale.id).exists() and ScopeSeries.objects.filter(id=kept.id).exists()
    kept.delete()
    samples = list(OccupancySample.objects.all())
    folded_until = _floor(NOW - timedelta(seconds=600), 60)
    oldest = datetime(2026, 11, 30, 10, 51, tzinfo=UTC)  # the oldest 1-minute row kept (NOW - 70 min)
    minutes = _brute_minutes(samples, oldest, folded_until)
    stored = _stored()
    got_minutes = {key: value for key, value in stored.items() if key[0] == 60 and oldest <= key[1] < folded_until}
    assert got_minutes == minutes
    assert any(level == OccupancySample.Level.MINUTE for level in OccupancySample.objects.values_list(
        "level", flat=True))
    first_five = datetime(2026, 11, 30, 10, 55, tzinfo=UTC)
    fives = {key: value for key, value in _brute_coarser(minutes, 300, folded_until).items() if key[1] >= first_five}
    assert {key: value for key, value in stored.items() if key[0] == 300 and first_five <= key[1]
            and key[1] + timedelta(seconds=300) <= folded_until} == fives
    hours = {key: value for key, value in stored.items() if key[0] == 3600}
    assert {key[1] for key in hours} == {datetime(2026, 11, 30, 10, tzinfo=UTC)}  # 11:00 is not complete yet
    watermark = datetime(2026, 11, 30, 11, 59, tzinfo=UTC)
    for width, finer in ((900, 300), (3600, 900)):
        assert {key: value for key, value in stored.items() if key[0] == width and key[1] >= first_five} == {
            key: value for key, value in _brute_coarser(
                {key: value for key, value in stored.items() if key[0] == finer}, width, watermark).items()
            if key[1] >= first_five}


@pytest.mark.parametrize("window", ["15m", "1h"])
def test_a_chart_keeps_the_releases_with_most_bytes_and_sums_the_others(window):
    """CHART_MAX_SERIES + 5 releases: the cap's releases (most bytes over the window) are series of their own, the 5
    smallest one more series, summed; the samples' window (15m) and the series' (1h) rank alike."""
    minute = datetime(2026, 11, 30, 11, 50, tzinfo=UTC)
    sizes = {f"ns-{n:02d}": 1000 + 37 * ((n * 11) % (CHART_MAX_SERIES + 5)) for n in range(CHART_MAX_SERIES + 5)}
    OccupancySample.objects.bulk_create(
        OccupancySample(ts=minute + timedelta(seconds=12 + 10 * k), node_name=node, tenant_id="acme",
                        served_model_name="m", namespace=namespace, bytes=size + k, hit_blocks=10 * k)
        for namespace, size in sizes.items() for node in ("node-a", "node-b") for k in range(2))
    series_mod.summarize(NOW)
    result = occupancy_series(window, now=NOW)
    by_size = sorted(sizes, key=lambda namespace: (-sizes[namespace], namespace))
    kept, rest = sorted(by_size[:CHART_MAX_SERIES]), by_size[CHART_MAX_SERIES:]
    assert [s.key.namespace for s in result.series[:-1]] == kept
    other = result.series[-1]
    assert other.other == 5 and other.label == "(other: 5 releases)" and other.as_dict()["other"] == 5
    assert [s.other for s in result.series[:-1]] == [0] * CHART_MAX_SERIES
    # per release and bucket (both samples of a node in one bucket): two nodes' averages, summed; the rest summed
    each = {namespace: 2 * (sizes[namespace] + 1) for namespace in sizes}  # (size + size + 1) / 2 rounded up, twice
    present = [value for value in other.data if value is not None]
    assert present == [sum(each[namespace] for namespace in rest)]
    assert other.hit_blocks == 5 * 2 * 10  # each release: two nodes' increase of 10
    assert sum(s.latest_bytes for s in result.series) == sum(each.values())


@pytest.mark.parametrize("window", ["15m", "1h"])
@pytest.mark.parametrize("smallest_first", [True, False])
def test_the_other_series_counts_every_release_it_sums_in_whichever_bucket(window, smallest_first, monkeypatch):
    """The releases beyond the cap each in another bucket: ``other`` is how many are summed in the whole window,
    not in one bucket (the tier statement ranks per window, each bucket's sum holds only the releases of it)."""
    from dashboard.telemetry import queries

    monkeypatch.setattr(queries, "CHART_MAX_SERIES", 1)
    first, second = datetime(2026, 11, 30, 11, 50, tzinfo=UTC), datetime(2026, 11, 30, 11, 52, tzinfo=UTC)
    placed = {"big": (first, second), "mid": (second,) if smallest_first else (first,),
              "small": (first,) if smallest_first else (second,)}
    sizes = {"big": 9000, "mid": 500, "small": 100}
    OccupancySample.objects.bulk_create(
        OccupancySample(ts=minute + timedelta(seconds=12), node_name="node-a", tenant_id="acme",
                        served_model_name="m", namespace=namespace, bytes=sizes[namespace])
        for namespace, minutes in placed.items() for minute in minutes)
    series_mod.summarize(NOW)
    result = occupancy_series(window, now=NOW)
    assert [s.key.namespace for s in result.series[:-1]] == ["big"]
    other = result.series[-1]
    assert other.other == 2 and other.label == "(other: 2 releases)"
    assert sorted(value for value in other.data if value is not None) == [100, 500]
