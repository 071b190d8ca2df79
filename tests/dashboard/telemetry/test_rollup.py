"""dashboard.telemetry.rollup: raw → 1 min → 1 h folding, late samples, retention."""
from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.models import ConfigVersion, MasterQuotaSample, OccupancySample, Report
from dashboard.telemetry.ingest import ingest
from dashboard.telemetry.rollup import rollup
from tests.support.messages import T0, register, report

pytestmark = pytest.mark.django_db
Level = OccupancySample.Level


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a")


@pytest.fixture
def horizons(settings):
    settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS = 3600
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 2 * 86400
    settings.KVPOOL_RETENTION_SECONDS = 30 * 86400
    settings.KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS = 86400
    return settings


def _reports(start, count, *, step=10, first_sequence=1, bytes_fn=lambda i: 1000 * (i + 1)):
    return [report(sequence=first_sequence + i, at=start + timedelta(seconds=step * i), scopes=1,
                   bytes_per_scope=bytes_fn(i), hits=i, misses=1) for i in range(count)]


def test_raw_samples_fold_into_minutes_with_average_peak_and_last_counter(horizons):
    ingest(_reports(T0, 6))  # 12:00:00 .. 12:00:50, bytes 1000..6000, hits 0..5
    ingest(_reports(T0 + timedelta(minutes=1), 2, first_sequence=7))
    counts = rollup(now=T0 + timedelta(hours=2))
    assert counts["raw_folded"] == 8
    rows = list(OccupancySample.objects.filter(level=Level.MINUTE).order_by("ts"))
    assert [r.ts for r in rows] == [T0, T0 + timedelta(minutes=1)]
    first = rows[0]
    assert (first.samples, first.bytes, first.max_bytes, first.hit_blocks) == (6, 3500, 6000, 5)
    assert not OccupancySample.objects.filter(level=Level.RAW).exists()


def test_recent_samples_stay_raw(horizons):
    ingest(_reports(T0, 3))
    assert rollup(now=T0 + timedelta(minutes=30))["raw_folded"] == 0
    assert OccupancySample.objects.filter(level=Level.RAW).count() == 3


def test_late_sample_merges_into_the_existing_minute(horizons):
    ingest(_reports(T0, 2, bytes_fn=lambda i: 1000))
    rollup(now=T0 + timedelta(hours=2))
    ingest([report(sequence=50, at=T0 + timedelta(seconds=30), scopes=1, bytes_per_scope=4000)])
    rollup(now=T0 + timedelta(hours=2))
    row = OccupancySample.objects.get(level=Level.MINUTE)
    assert (row.samples, row.bytes, row.max_bytes) == (3, 2000, 4000)


def test_minutes_fold_into_hours_and_hours_expire(horizons):
    ingest(_reports(T0, 3, step=600))  # 12:00, 12:10, 12:20 -> three minute rows, one hour row
    rollup(now=T0 + timedelta(hours=2))
    assert OccupancySample.objects.filter(level=Level.MINUTE).count() == 3
    counts = rollup(now=T0 + timedelta(days=3))
    assert counts["minute_folded"] == 3
    hour = OccupancySample.objects.get(level=Level.HOUR)
    assert (hour.ts, hour.samples, hour.bytes) == (T0, 3, 2000)
    assert Report.objects.count() == 0  # receipts older than the minute horizon are gone
    assert rollup(now=T0 + timedelta(days=31))["hour_deleted"] == 1


def test_retention_of_master_samples_and_old_config_versions(horizons):
    MasterQuotaSample.objects.create(ts=T0, tenant_id="acme")
    for version in (2, 3):  # version 1 is the document register() stored
        ConfigVersion.objects.create(node_name="node-a", version=version, digest="d", content_digest="c",
                                     document={})
    ConfigVersion.objects.update(created_at=T0)
    counts = rollup(now=T0 + timedelta(days=40))
    assert counts["master_samples_deleted"] == 1
    assert list(ConfigVersion.objects.values_list("version", flat=True)) == [3]
