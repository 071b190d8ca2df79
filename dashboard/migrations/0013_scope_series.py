"""The occupancy summed over nodes per cache scope and release (``ScopeSeries``, ``dashboard.telemetry.series``):
the chart's source for windows of an hour and longer. Empty at first: the rollup writes it from the samples of the
1-minute tier's retention on (raw horizon + 1 hour), so a 7-day chart fills in over the days after the upgrade.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0012_occupancy_rollup_key'),
    ]

    operations = [
        migrations.CreateModel(
            name='ScopeSeries',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('width', models.PositiveIntegerField(choices=[(60, '1 minute'), (300, '5 minutes'), (900, '15 minutes'), (3600, '1 hour'), (7200, '2 hours'), (21600, '6 hours')])),
                ('ts', models.DateTimeField()),
                ('tenant_id', models.CharField(max_length=128)),
                ('served_model_name', models.CharField(blank=True, default='', max_length=255)),
                ('namespace', models.CharField(blank=True, default='', max_length=255)),
                ('request_group', models.CharField(blank=True, max_length=255, null=True)),
                ('bytes', models.BigIntegerField(default=0)),
                ('orphaned_bytes', models.BigIntegerField(default=0)),
                ('in_flight_requests', models.BigIntegerField(default=0)),
                ('hit_blocks', models.BigIntegerField(default=0)),
                ('miss_blocks', models.BigIntegerField(default=0)),
                ('store_evicted_blocks', models.BigIntegerField(default=0)),
                ('budget_evicted_blocks', models.BigIntegerField(default=0)),
                ('orphan_removed_blocks', models.BigIntegerField(default=0)),
                ('samples', models.BigIntegerField(default=0)),
            ],
            options={
                'indexes': [models.Index(fields=['width', 'request_group', 'ts'], name='dashboard_series_group_ts'), models.Index(fields=['width', 'tenant_id', 'request_group', 'ts'], name='dashboard_series_tenant_ts')],
            },
        ),
    ]
