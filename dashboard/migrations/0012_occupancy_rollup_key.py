"""The rollups' conflict key: one 1-minute / 1-hour ``OccupancySample`` row per (level, bucket, node, cache scope).

Rollup rows that two concurrent runs of the former Python fold wrote for the same key are merged first (gauges
averaged by ``samples``, peak and counters the largest, samples summed), so the unique index can be built.
"""

from django.db import migrations, models
from django.db.models import Count

KEY = ("level", "ts", "node_name", "tenant_id", "served_model_name", "namespace", "request_group")
GAUGES = ("blocks", "bytes", "orphaned_bytes", "in_flight_requests")
LARGEST = ("max_bytes", "puts", "gets", "hit_blocks", "miss_blocks", "evicted_blocks", "store_evicted_blocks",
           "budget_evicted_blocks", "orphan_removed_blocks")


def merge_duplicate_rollups(apps, schema_editor):
    sample = apps.get_model("dashboard", "OccupancySample")
    duplicates = (sample.objects.filter(level__gt=0).values(*KEY).annotate(rows=Count("id")).filter(rows__gt=1)
                  .values_list(*KEY))
    for key in duplicates.iterator():
        rows = list(sample.objects.filter(**dict(zip(KEY, key))).order_by("id"))
        keep, weight = rows[0], sum(row.samples for row in rows)
        for name in GAUGES:
            total = sum(getattr(row, name) * row.samples for row in rows)
            setattr(keep, name, (2 * total + weight) // (2 * weight) if weight else 0)
        for name in LARGEST:
            setattr(keep, name, max(getattr(row, name) for row in rows))
        keep.samples = weight
        keep.save()
        sample.objects.filter(id__in=[row.id for row in rows[1:]]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0011_occupancy_eviction_causes'),
    ]

    operations = [
        migrations.RunPython(merge_duplicate_rollups, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='occupancysample',
            constraint=models.UniqueConstraint(condition=models.Q(('level__gt', 0)), fields=('level', 'ts', 'node_name', 'tenant_id', 'served_model_name', 'namespace', 'request_group'), name='dashboard_occ_rollup_key'),
        ),
    ]
