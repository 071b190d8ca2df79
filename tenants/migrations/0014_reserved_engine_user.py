"""Every engine_user ever given to a tenant is reserved for it (``tenants.models.ReservedEngineUser``).

Seeded with the names the current tenants hold, then the names the audit log shows earlier tenants held (with their
primary keys, so a tenant may take back its own old name; ``None`` when the entry does not say which tenant).
"""
from django.db import migrations, models


def seed(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    AuditEntry = apps.get_model("tenants", "AuditEntry")
    ReservedEngineUser = apps.get_model("tenants", "ReservedEngineUser")
    holders: dict[str, int | None] = {
        name: pk for name, pk in Tenant.objects.exclude(engine_user="").values_list("engine_user", "pk")}
    for object_id, before, after in (AuditEntry.objects.filter(object_type="tenants.tenant").order_by("pk")
                                     .values_list("object_id", "before", "after")):
        for state in (before, after):
            name = state.get("engine_user") if isinstance(state, dict) else None
            if isinstance(name, str) and name and len(name) <= 32 and name not in holders:
                holders[name] = int(object_id) if object_id.isdigit() else None
    ReservedEngineUser.objects.bulk_create(
        [ReservedEngineUser(engine_user=name, tenant_pk=pk) for name, pk in sorted(holders.items())])


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0013_tenant_engine_user'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReservedEngineUser',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('engine_user', models.CharField(max_length=32, unique=True)),
                ('tenant_pk', models.PositiveBigIntegerField(blank=True, help_text='Primary key of the tenant that holds or held the name (None: not known).', null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'verbose_name': 'reserved engine user',
                'ordering': ['engine_user'],
            },
        ),
        migrations.RunPython(seed, migrations.RunPython.noop),
    ]
