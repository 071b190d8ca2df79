"""dashboard.telemetry.rollup's SQL folds against a brute-force Python fold of random samples (several nodes and
cache scopes, raw keys repeated, late samples merged into existing buckets, samples arriving between chunks),
on the backend of the run (SQLite, or PostgreSQL with DATABASE_URL)."""
from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from dashboard.models import OccupancyCell, OccupancySample, ScopeSeries
from dashboard.telemetry import rollup as rollup_module
from dashboard.telemetry.rollup import floor_hour, floor_minute, rollup
from tests.support.messages import T0

pytestmark = pytest.mark.django_db
Level = OccupancySample.Level
GAUGES = OccupancySample.GAUGES
LARGEST = ("max_bytes", *OccupancySample.COUNTERS)
NODES = ("node-a", "node-b", "node-c")
SCOPES = (("acme", "qwen3-8b", "prod", ""), ("acme", "qwen3-8b", "prod", "app-1"),
          ("acme", "llama-70b", "canary", ""), ("globex", "qwen3-8b", "prod", "app-1"))


@pytest.fixture
def horizons(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 3600
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 4 * 3600
    settings.KVPOOL_RETENTION_SECONDS = 30 * 86400
    return settings


def _half_up(total: int, weight: int) -> int:
    return (2 * total + weight) // (2 * weight) if weight else 0


class Oracle:
    """Brute-force fold: rollup rows as dicts keyed by (level, bucket start, node, scope)."""

    def __init__(self):
        self.rows: dict[tuple, dict[str, int]] = {}

    def fold(self, samples: list[dict], target: int, floor) -> None:
        """Fold ``samples`` (dicts with ts, the key, values) into ``target`` rows: one merge per bucket."""
        groups: dict[tuple, list[dict]] = {}
        for sample in samples:
            key = (target, floor(sample["ts"]), *(sample[name] for name in OccupancySample.KEY))
            groups.setdefault(key, []).append(sample)
        for key, members in groups.items():
            existing = self.rows.get(key)
            if existing is not None:
                members = [*members, existing]
            weight = sum(m["samples"] for m in members)
            row = {name: _half_up(sum(m[name] * m["samples"] for m in members), weight) for name in GAUGES}
            row.update({name: max(m[name] for m in members) for name in LARGEST})
            row["samples"] = weight
            self.rows[key] = row

    def take(self, level: int, before) -> list[dict]:
        """Remove and return the ``level`` rows with bucket start before ``before`` (as samples)."""
        taken = []
        for key in [k for k in self.rows if k[0] == level and k[1] < before]:
            row = self.rows.pop(key)
            taken.append({"ts": key[1], **dict(zip(OccupancySample.KEY, key[2:])), **row})
        return taken


def _random_samples(rng: random.Random, start, seconds: int, count: int) -> list[dict]:
    samples = []
    for _ in range(count):
        node, scope = rng.choice(NODES), rng.choice(SCOPES)
        ts = start + timedelta(seconds=rng.randrange(seconds), microseconds=rng.choice((0, 250_000)))
        samples.append({"ts": ts, "node_name": node, **dict(zip(OccupancySample.KEY[1:], scope)),
                        **{name: rng.randrange(0, 10**12) for name in GAUGES},
                        **{name: rng.randrange(0, 10**9) for name in LARGEST}, "samples": 1})
    # a raw key repeated: two reports of a node with the same sent_at
    samples.append(dict(samples[0], bytes=samples[0]["bytes"] + 1))
    return samples


def _store(samples: list[dict]) -> None:
    OccupancySample.objects.bulk_create([OccupancySample(level=Level.RAW, **sample) for sample in samples])


def _database_rows() -> dict[tuple, dict[str, int]]:
    fields = ("level", "ts", *OccupancySample.KEY, *GAUGES, *LARGEST, "samples")
    return {(row["level"], row["ts"], *(row[name] for name in OccupancySample.KEY)):
            {name: row[name] for name in (*GAUGES, *LARGEST, "samples")}
            for row in OccupancySample.objects.filter(level__gt=Level.RAW).values(*fields)}


def test_folds_match_a_brute_force_fold(horizons, monkeypatch):
    monkeypatch.setattr(rollup_module, "MINUTE_CHUNK_SECONDS", 3600)  # one merge per hour bucket and run
    rng = random.Random(17)
    oracle = Oracle()
    first = _random_samples(rng, T0, 3 * 3600, 400)
    _store(first)
    now = T0 + timedelta(hours=3, minutes=30)
    counts = rollup(now=now)
    raw_cutoff = floor_minute(now - timedelta(hours=1))
    folded = [s for s in first if s["ts"] < raw_cutoff]
    assert counts["raw_folded"] == len(folded) > 0
    oracle.fold(folded, Level.MINUTE, floor_minute)
    assert _database_rows() == oracle.rows
    assert OccupancySample.objects.filter(level=Level.RAW).count() == len(first) - len(folded)

    # late samples for minutes already rolled up, and new ones
    late = _random_samples(rng, T0, 2 * 3600, 60)
    fresh = _random_samples(rng, T0 + timedelta(hours=3), 3600, 100)
    _store(late + fresh)
    now = T0 + timedelta(hours=5, minutes=30)
    counts = rollup(now=now)
    pending = [s for s in first if s["ts"] >= raw_cutoff] + late + fresh
    raw_cutoff = floor_minute(now - timedelta(hours=1))
    folded = [s for s in pending if s["ts"] < raw_cutoff]
    oracle.fold(folded, Level.MINUTE, floor_minute)
    minute_cutoff = floor_hour(now - timedelta(hours=4))
    oracle.fold(oracle.take(Level.MINUTE, minute_cutoff), Level.HOUR, floor_hour)
    assert counts["raw_folded"] == len(folded)
    assert counts["minute_folded"] > 0
    assert _database_rows() == oracle.rows
    assert OccupancySample.objects.filter(level=Level.HOUR).exists()

    # late samples for an hour already rolled up: raw -> minute on this run, minute -> hour (merged) on a later one
    later = _random_samples(rng, T0, 600, 20)
    _store(later)
    before = _database_rows()
    now = T0 + timedelta(hours=5, minutes=31)
    rollup(now=now)
    oracle.fold(later, Level.MINUTE, floor_minute)
    oracle.fold(oracle.take(Level.MINUTE, floor_hour(now - timedelta(hours=4))), Level.HOUR, floor_hour)
    after = _database_rows()
    assert after == oracle.rows
    merged = [key for key in before if key[0] == Level.HOUR and after[key]["samples"] > before[key]["samples"]]
    assert merged and all(key[1] == T0 for key in merged)


def test_chunked_minute_fold_keeps_samples_peaks_and_counters_exact(horizons):
    """With the default 10-minute chunks an hour row is merged six times: samples, peaks and counters exact,
    gauges within one unit of the exact weighted average."""
    rng = random.Random(3)
    samples = _random_samples(rng, T0, 3600, 300)
    _store(samples)
    rollup(now=T0 + timedelta(hours=6))
    exact = Oracle()
    exact.fold(samples, Level.HOUR, floor_hour)
    rows = _database_rows()
    assert rows.keys() == exact.rows.keys()
    for key, row in rows.items():
        want = exact.rows[key]
        assert {n: row[n] for n in (*LARGEST, "samples")} == {n: want[n] for n in (*LARGEST, "samples")}
        assert all(abs(row[name] - want[name]) <= 1 for name in GAUGES), (row, want)


def test_a_sample_arriving_between_chunks_is_neither_lost_nor_counted_twice(horizons, monkeypatch):
    rng = random.Random(5)
    samples = _random_samples(rng, T0, 3 * 60, 40)  # three minutes: three raw chunks
    _store(samples)
    arrivals = []
    fold_chunk = rollup_module._fold_chunk

    def fold_then_arrive(source, target, start, end):
        folded = fold_chunk(source, target, start, end)
        if source == Level.RAW and not arrivals:
            # one for the chunk just folded (waits for the next run), one for a chunk still to come
            arrivals.extend([dict(samples[0], ts=start + timedelta(seconds=5), bytes=7),
                             dict(samples[0], ts=T0 + timedelta(minutes=2, seconds=5), bytes=9)])
            _store(arrivals)
        return folded

    monkeypatch.setattr(rollup_module, "_fold_chunk", fold_then_arrive)
    now = T0 + timedelta(hours=2)
    assert rollup(now=now)["raw_folded"] == len(samples) + 1
    oracle = Oracle()
    oracle.fold([*samples, arrivals[1]], Level.MINUTE, floor_minute)
    assert _database_rows() == oracle.rows
    assert list(OccupancySample.objects.filter(level=Level.RAW).values_list("bytes", flat=True)) == [7]
    assert rollup(now=now)["raw_folded"] == 1
    oracle.fold([arrivals[0]], Level.MINUTE, floor_minute)
    assert _database_rows() == oracle.rows
    assert sum(row["samples"] for row in oracle.rows.values()) == len(samples) + 2


def test_rollup_keys_are_unique_and_raw_keys_may_repeat():
    row = {"ts": T0, "node_name": "node-a", "tenant_id": "acme"}
    OccupancySample.objects.bulk_create([OccupancySample(level=Level.RAW, **row) for _ in range(2)])
    OccupancySample.objects.create(level=Level.MINUTE, **row)
    with pytest.raises(IntegrityError), transaction.atomic():
        OccupancySample.objects.create(level=Level.MINUTE, **row)


def test_the_rollup_key_compares_bytes_on_postgresql():
    """Migration 0014: PostgreSQL's conflict key index compares its text columns byte by byte (SQLite always does),
    and the fold's merge still finds the row it conflicts with (a late sample merged, not a second row)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'dashboard_occ_rollup_key'")
            (definition,) = cursor.fetchone()
        assert definition.count('COLLATE "C"') == len(OccupancySample.KEY) and "WHERE (level > 0)" in definition
    row = {"node_name": "node-a", "tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "prod"}
    OccupancySample.objects.create(level=Level.MINUTE, ts=T0, bytes=100, samples=3, **row)
    OccupancySample.objects.create(level=Level.RAW, ts=T0 + timedelta(seconds=5), bytes=200, **row)
    rollup_module._fold_chunk(Level.RAW, Level.MINUTE, T0, T0 + timedelta(minutes=1))
    assert list(OccupancySample.objects.values_list("level", "bytes", "samples")) == [(Level.MINUTE, 125, 4)]


def test_retention_bounds_the_table(horizons):
    """Rows of every level older than the retention are gone after one run (folded up, then deleted); newer ones
    stay, at most one per level, bucket, node and scope."""
    rng = random.Random(9)
    old = _random_samples(rng, T0 - timedelta(days=40), 3600, 50)
    recent = _random_samples(rng, T0, 600, 50)
    _store(old + recent)
    counts = rollup(now=T0 + timedelta(days=1))
    assert counts["hour_deleted"] > 0
    assert not OccupancySample.objects.filter(ts__lt=T0).exists()
    assert OccupancySample.objects.filter(level=Level.HOUR).count() == len(
        {(s["node_name"], *(s[name] for name in OccupancySample.KEY[1:])) for s in recent})


def test_the_raw_fold_takes_the_series_cells_only_when_they_count_every_sample(horizons, monkeypatch):
    """The series' pass keeps per-node minute cells (PostgreSQL); the fold writes a minute's 1-minute rows from them
    when they count exactly its raw rows, and aggregates the raw rows of a minute that got a sample since; either
    way the rows equal the brute-force fold and the series counts every sample once."""
    rng = random.Random(11)
    start = floor_minute(T0)
    samples = _random_samples(rng, start, 3 * 60, 60)
    _store(samples)
    rollup(now=start + timedelta(minutes=3, seconds=40))  # sums the three minutes, folds nothing yet
    if connection.vendor == "postgresql":
        assert sorted(set(OccupancyCell.objects.values_list("minute", flat=True))) == [
            int(start.timestamp()) // 60 + n for n in range(3)]
    else:
        assert not OccupancyCell.objects.exists()
    late = dict(samples[1], ts=start + timedelta(minutes=1, seconds=15), bytes=5)  # for a minute already summed
    _store([late])
    taken: list[int | None] = []
    fold_from_cells = rollup_module._fold_from_cells

    def spy(cursor, params):
        taken.append(fold_from_cells(cursor, params))
        return taken[-1]

    monkeypatch.setattr(rollup_module, "_fold_from_cells", spy)
    assert rollup(now=start + timedelta(hours=1, minutes=5))["raw_folded"] == len(samples) + 1
    oracle = Oracle()
    oracle.fold([*samples, late], Level.MINUTE, floor_minute)
    assert _database_rows() == oracle.rows
    assert not OccupancyCell.objects.exists()
    if connection.vendor == "postgresql":  # minutes 0 and 2 from their cells, minute 1 from its raw rows
        assert taken[1] is None and [n for n in taken if n is not None] == [
            sum(1 for s in samples if floor_minute(s["ts"]) == start + timedelta(minutes=m)) for m in (0, 2)]
    else:
        assert taken == []
    summed = ScopeSeries.objects.filter(width=ScopeSeries.Width.MINUTE, request_group__isnull=False)
    assert sum(summed.values_list("samples", flat=True)) == len(samples) + 1
