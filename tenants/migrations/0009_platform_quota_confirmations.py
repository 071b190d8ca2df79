"""Audit entries of confirmed overcommits (``dashboard.quotaconfirmation``) belong to no tenant: their plan lists
every tenant's quota and the pool's capacity, so only platform admins may read them. ``0008_tenant_access`` gave
the existing ones the confirming tenant; this takes it back."""
from django.db import migrations


def platform_only(apps, schema_editor):
    AuditEntry = apps.get_model("tenants", "AuditEntry")
    AuditEntry.objects.filter(object_type="dashboard.quotaconfirmation").update(tenant_pk=None)


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0008_tenant_access"),
    ]

    operations = [
        migrations.RunPython(platform_only, migrations.RunPython.noop),
    ]
