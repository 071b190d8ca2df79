"""Roll occupancy samples up (raw ~10 s → 1 minute → 1 hour) and apply retention.

A raw row older than ``KVPOOL_ROLLUP_RAW_AFTER_SECONDS`` is folded into the 1-minute row of its node,
namespace key and minute; a 1-minute row older than ``KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS`` into the 1-hour row.
Folding: gauges become the average weighted by ``samples``, ``max_bytes`` the peak, counters (cumulative since
the agent started) the largest value, ``samples`` the sum. Only buckets entirely older than the cutoff are
folded, and source rows are read and deleted by id in chunks inside one transaction per chunk, so a sample
that arrives while a rollup runs is never lost; a late sample for a bucket already rolled up is merged into
the existing row on the next run. Retention then deletes 1-hour rows older than ``KVPOOL_RETENTION_SECONDS``,
master quota samples older than ``KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS``, report receipts and acks older than
the 1-minute horizon (a duplicate delivered later than that would be stored again), engine facts
(``InstanceStats``) no report refreshed within that horizon, and config versions older than the retention except
each node's newest.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from dashboard.models import (
    ConfigAck,
    ConfigVersion,
    InstanceStats,
    MasterQuotaSample,
    OccupancySample,
    Report,
)

log = logging.getLogger("kvpool.dashboard.rollup")

CHUNK = 5000
Level = OccupancySample.Level
_FIELDS = ("id", "ts", *OccupancySample.KEY, *OccupancySample.GAUGES, "max_bytes", *OccupancySample.COUNTERS,
           "samples")


def floor_minute(ts: datetime) -> datetime:
    """Start of the UTC minute containing ``ts``."""
    return ts.replace(second=0, microsecond=0)


def floor_hour(ts: datetime) -> datetime:
    """Start of the UTC hour containing ``ts``."""
    return ts.replace(minute=0, second=0, microsecond=0)


@dataclass
class _Bucket:
    """Running fold of rows: weighted gauge sums, peak bytes, largest counters, total samples."""

    samples: int = 0
    max_bytes: int = 0
    gauge_sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OccupancySample.GAUGES, 0))
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OccupancySample.COUNTERS, 0))

    def add(self, row: dict[str, Any]) -> None:
        """Fold one row (a dict with the sample fields; gauges are averages over ``row["samples"]``)."""
        weight = row["samples"]
        for name in OccupancySample.GAUGES:
            self.gauge_sums[name] += row[name] * weight
        for name in OccupancySample.COUNTERS:
            self.counters[name] = max(self.counters[name], row[name])
        self.max_bytes = max(self.max_bytes, row["max_bytes"])
        self.samples += weight

    def assign_to(self, row: OccupancySample) -> None:
        """Write the fold into ``row`` (gauges rounded to whole units)."""
        for name in OccupancySample.GAUGES:
            setattr(row, name, round(self.gauge_sums[name] / self.samples))
        for name in OccupancySample.COUNTERS:
            setattr(row, name, self.counters[name])
        row.max_bytes = self.max_bytes
        row.samples = self.samples


_VALUE_FIELDS = (*OccupancySample.GAUGES, "max_bytes", *OccupancySample.COUNTERS, "samples")


def _fold(source: int, target: int, cutoff: datetime, floor) -> int:
    """Fold rows of level ``source`` older than ``cutoff`` into level ``target``; returns rows folded."""
    folded = 0
    while True:
        with transaction.atomic():
            rows = list(OccupancySample.objects.filter(level=source, ts__lt=cutoff).order_by("id")
                        .values(*_FIELDS)[:CHUNK])
            if not rows:
                return folded
            buckets: dict[tuple, _Bucket] = {}
            for row in rows:
                key = (floor(row["ts"]), *(row[name] for name in OccupancySample.KEY))
                buckets.setdefault(key, _Bucket()).add(row)
            _merge_into(target, buckets)
            OccupancySample.objects.filter(id__in=[row["id"] for row in rows]).delete()
            folded += len(rows)


def _merge_into(level: int, buckets: dict[tuple, _Bucket]) -> None:
    """Create or update the ``level`` rows of ``buckets`` (key = (bucket start, *KEY)), merging late rows."""
    starts = [key[0] for key in buckets]
    existing = {
        (row.ts, *(getattr(row, name) for name in OccupancySample.KEY)): row
        for row in OccupancySample.objects.select_for_update().filter(
            level=level, ts__gte=min(starts), ts__lte=max(starts))
    }
    created, updated = [], []
    for key, bucket in buckets.items():
        row = existing.get(key)
        if row is None:
            row = OccupancySample(level=level, ts=key[0], **dict(zip(OccupancySample.KEY, key[1:])))
            created.append(row)
        else:
            bucket.add({name: getattr(row, name) for name in _VALUE_FIELDS})
            updated.append(row)
        bucket.assign_to(row)
    OccupancySample.objects.bulk_create(created, batch_size=2000)
    if updated:
        OccupancySample.objects.bulk_update(updated, list(_VALUE_FIELDS), batch_size=500)


def rollup(now: datetime | None = None) -> dict[str, int]:
    """Run both folds and the retention; returns counts per step (JSON-ready)."""
    now = now or timezone.now()
    raw_cutoff = floor_minute(now - timedelta(seconds=settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS))
    minute_cutoff = floor_hour(now - timedelta(seconds=settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS))
    retention_cutoff = now - timedelta(seconds=settings.KVPOOL_RETENTION_SECONDS)
    counts = {
        "raw_folded": _fold(Level.RAW, Level.MINUTE, raw_cutoff, floor_minute),
        "minute_folded": _fold(Level.MINUTE, Level.HOUR, minute_cutoff, floor_hour),
    }
    counts["hour_deleted"] = OccupancySample.objects.filter(level=Level.HOUR, ts__lt=retention_cutoff).delete()[0]
    counts["receipts_deleted"] = Report.objects.filter(sent_at__lt=minute_cutoff).delete()[0]
    counts["acks_deleted"] = ConfigAck.objects.filter(sent_at__lt=minute_cutoff).delete()[0]
    # engine facts no report refreshed since the receipts of that time went (the instance or its agent is gone)
    counts["instance_stats_deleted"] = InstanceStats.objects.filter(reported_at__lt=minute_cutoff).delete()[0]
    counts["master_samples_deleted"] = MasterQuotaSample.objects.filter(
        ts__lt=now - timedelta(seconds=settings.KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS)).delete()[0]
    newest = ConfigVersion.objects.values("node_name").annotate(newest=Max("version"))
    keep = {(row["node_name"], row["newest"]) for row in newest}
    old = ConfigVersion.objects.filter(created_at__lt=retention_cutoff).values_list("id", "node_name", "version")
    doomed = [pk for pk, node, version in old if (node, version) not in keep]
    counts["config_versions_deleted"] = ConfigVersion.objects.filter(id__in=doomed).delete()[0] if doomed else 0
    if any(counts.values()):
        log.info("rollup: %s", counts)
    return counts
