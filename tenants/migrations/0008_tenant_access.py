"""Tenant-scoped access (``tenants.access``): memberships with roles, the platform admin permission, the tenant of
every audit entry (filled in for the entries written before), and the end of plain-text API tokens.

The API tokens of ``rest_framework.authtoken`` were stored in plain text; tokens are now django-rest-knox digests
(``knox`` app). Its old table is dropped here, so no readable token stays in the database: create new tokens
(``manage.py create_api_token USER`` or ``POST /api/v1/auth-token/``).
"""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

#: Audit object types whose snapshot names the tenant by its Mooncake tenant_id (text).
_BY_NAME = ("tenants.reservedsalt", "tenants.reservednamespace", "dashboard.purgerequest",
            "dashboard.quotaconfirmation")


def tenant_of_entries(apps, schema_editor):
    """Fill ``AuditEntry.tenant_pk`` of the existing entries from what each one recorded (an entry whose tenant
    cannot be told any more, e.g. a deleted release's, stays ``None``: platform admins only)."""
    AuditEntry = apps.get_model("tenants", "AuditEntry")
    by_name = dict(apps.get_model("tenants", "Tenant").objects.values_list("tenant_id", "pk"))
    model_tenant = dict(apps.get_model("tenants", "ServedModel").objects.values_list("pk", "tenant_id"))
    release_model = dict(apps.get_model("tenants", "Release").objects.values_list("pk", "model_id"))
    changed, requests = [], {}
    for entry in AuditEntry.objects.filter(tenant_pk__isnull=True).order_by("pk").iterator():
        snapshot = entry.after or entry.before or {}
        kind, tenant_pk = entry.object_type, None
        if kind == "tenants.tenant" and entry.object_id.isdigit():
            tenant_pk = int(entry.object_id)
        elif kind in ("tenants.servedmodel", "tenants.requestgroup"):
            tenant_pk = snapshot.get("tenant_id")
        elif kind == "tenants.release":
            tenant_pk = model_tenant.get(snapshot.get("model_id"))
        elif kind == "tenants.instanceassignment":
            tenant_pk = model_tenant.get(release_model.get(snapshot.get("release_id")))
        elif kind in _BY_NAME:
            tenant_pk = by_name.get(snapshot.get("tenant_id"))
        elif kind == "dashboard.purgeresult":
            tenant_pk = requests.get(entry.request_id)
        if isinstance(tenant_pk, int):
            entry.tenant_pk = tenant_pk
            changed.append(entry)
            if kind == "dashboard.purgerequest":
                requests[entry.request_id] = tenant_pk
    AuditEntry.objects.bulk_update(changed, ["tenant_pk"], batch_size=500)


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0007_reserved_namespace"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="auditentry",
            name="tenant_pk",
            field=models.PositiveBigIntegerField(
                blank=True, db_index=True, null=True,
                help_text="Primary key of the tenant the entry is about (a plain number: the tenant may be deleted "
                "since)."),
        ),
        migrations.CreateModel(
            name="TenantMembership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("role", models.CharField(choices=[
                    ("viewer", "Viewer (reads the tenant's objects, telemetry and audit entries)"),
                    ("operator", "Operator (viewer + creates and changes models, releases, request groups, "
                                 "instances)"),
                    ("admin", "Admin (operator + deletes, purges, changes the tenant's description)")],
                    default="viewer", max_length=16)),
                ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships",
                                             to="tenants.tenant")),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="tenant_memberships", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "ordering": ["tenant__tenant_id", "user__username"],
                "permissions": [("platform_admin", "Platform admin: sees every tenant (each write still needs its "
                                                   "model permission)")],
                "constraints": [models.UniqueConstraint(fields=("user", "tenant"),
                                                        name="uniq_membership_per_user_tenant")],
            },
        ),
        migrations.RunPython(tenant_of_entries, migrations.RunPython.noop),
        # rest_framework.authtoken's table held every API token in plain text (the app is no longer installed).
        migrations.RunSQL("DROP TABLE IF EXISTS authtoken_token", migrations.RunSQL.noop),
    ]
