"""Engine facts of reports (schema 2): ``InstanceStats`` (newest per node and instance) and the unknown-topic counts
of each report receipt."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0004_occupancysample_request_group'),
    ]

    operations = [
        migrations.AddField(
            model_name='report',
            name='unknown_topic_blocks',
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='report',
            name='unknown_topic_messages',
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.CreateModel(
            name='InstanceStats',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('node_name', models.CharField(max_length=128)),
                ('instance_id', models.CharField(max_length=128)),
                ('engine', models.CharField(default='vllm', max_length=16)),
                ('tenant_id', models.CharField(blank=True, default='', max_length=128)),
                ('served_model_name', models.CharField(blank=True, default='', max_length=255)),
                ('namespace', models.CharField(blank=True, default='', max_length=255)),
                ('agent_started_at', models.DateTimeField()),
                ('reported_at', models.DateTimeField()),
                ('report_sequence', models.PositiveBigIntegerField(default=0)),
                ('observed_since', models.DateTimeField()),
                ('last_event_at', models.DateTimeField(blank=True, null=True)),
                ('messages', models.BigIntegerField(default=0)),
                ('events', models.BigIntegerField(default=0)),
                ('blocks_seen', models.BigIntegerField(default=0)),
                ('attributed', models.BigIntegerField(default=0)),
                ('unknown_salt', models.BigIntegerField(default=0)),
                ('unknown_adapter', models.BigIntegerField(default=0)),
                ('hash_mismatch', models.BigIntegerField(default=0)),
                ('unresolved_parent', models.BigIntegerField(default=0)),
                ('unverifiable', models.BigIntegerField(default=0)),
                ('decode_errors', models.BigIntegerField(default=0)),
                ('seq_gaps', models.BigIntegerField(default=0)),
                ('seq_resets', models.BigIntegerField(default=0)),
                ('attributed_by_group', models.JSONField(blank=True, default=dict)),
                ('last_error', models.TextField(blank=True, default='')),
                ('prefix_cache_queries', models.BigIntegerField(default=0)),
                ('prefix_cache_hits', models.BigIntegerField(default=0)),
                ('external_prefix_cache_queries', models.BigIntegerField(default=0)),
                ('external_prefix_cache_hits', models.BigIntegerField(default=0)),
                ('store_keys', models.JSONField(blank=True, default=dict)),
                ('store_failed_keys', models.JSONField(blank=True, default=dict)),
                ('metrics_scrapes', models.BigIntegerField(default=0)),
                ('metrics_errors', models.BigIntegerField(default=0)),
                ('metrics_error', models.TextField(blank=True, default='')),
            ],
            options={
                'ordering': ['node_name', 'instance_id'],
                'indexes': [models.Index(fields=['tenant_id', 'namespace'], name='dashboard_instancestats_scope')],
                'constraints': [models.UniqueConstraint(fields=('node_name', 'instance_id'), name='dashboard_instancestats_node_instance')],
            },
        ),
    ]
