"""Every tenant_id ever given to a tenant is reserved for it (``tenants.models.ReservedTenantId``).

Seeded with the ids the current tenants hold, then the ids the audit log shows earlier tenants held (with their
primary keys, so a tenant may take back its own old id), then ids only rows a deleted tenant left still name:
reserved namespaces and salts, the dashboard's master quota syncs (no tenant may take those).
"""
from django.db import migrations, models


def seed(apps, schema_editor):
    Tenant = apps.get_model("tenants", "Tenant")
    AuditEntry = apps.get_model("tenants", "AuditEntry")
    ReservedTenantId = apps.get_model("tenants", "ReservedTenantId")
    ReservedNamespace = apps.get_model("tenants", "ReservedNamespace")
    ReservedSalt = apps.get_model("tenants", "ReservedSalt")
    MasterQuotaSync = apps.get_model("dashboard", "MasterQuotaSync")
    holders: dict[str, int | None] = dict(Tenant.objects.values_list("tenant_id", "pk"))
    for object_id, before, after in (AuditEntry.objects.filter(object_type="tenants.tenant").order_by("pk")
                                     .values_list("object_id", "before", "after")):
        for state in (before, after):
            name = state.get("tenant_id") if isinstance(state, dict) else None
            if isinstance(name, str) and name and name not in holders and object_id.isdigit():
                holders[name] = int(object_id)
    for rows in (ReservedNamespace.objects.values_list("tenant_id", flat=True),
                 ReservedSalt.objects.values_list("tenant_id", flat=True),
                 MasterQuotaSync.objects.values_list("tenant_id", flat=True)):
        for name in rows.distinct():
            if name:
                holders.setdefault(name, None)
    ReservedTenantId.objects.bulk_create(
        [ReservedTenantId(tenant_id=name, tenant_pk=pk) for name, pk in sorted(holders.items())])


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0010_cpu_kvcache_space_and_max_model_len'),
        ('dashboard', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReservedTenantId',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tenant_id', models.CharField(max_length=255, unique=True)),
                ('tenant_pk', models.PositiveBigIntegerField(blank=True, help_text='Primary key of the tenant that holds or held the id (None: not known).', null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'verbose_name': 'reserved tenant id',
                'ordering': ['tenant_id'],
            },
        ),
        migrations.RunPython(seed, migrations.RunPython.noop),
    ]
