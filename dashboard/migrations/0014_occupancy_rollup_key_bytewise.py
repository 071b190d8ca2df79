"""The rollups' conflict key (``dashboard_occ_rollup_key``) compares its text columns byte by byte on PostgreSQL
(``COLLATE "C"``): the same equality, cheaper comparisons, and every 1-minute row the raw fold inserts updates this
index (``dashboard.telemetry.rollup``; the fold's merge joins compare with the same collation, so they probe it).

PostgreSQL: the new index is built beside the old one without blocking writes (``CONCURRENTLY``, so this migration
is not atomic), then replaces it under the same name; ``ON CONFLICT (columns)`` infers it whatever its collation.
SQLite compares bytes already: nothing changes. The model's ``UniqueConstraint`` (same name, columns, condition)
stays as it is.
"""

from django.db import migrations

NAME = "dashboard_occ_rollup_key"
COLUMNS = ("node_name", "tenant_id", "served_model_name", "namespace", "request_group")


def _rebuild(apps, schema_editor, bytewise: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    table = quote(apps.get_model("dashboard", "OccupancySample")._meta.db_table)
    columns = ", ".join(f'{quote(name)} COLLATE "C"' if bytewise else quote(name) for name in COLUMNS)
    new = quote(f"{NAME}_new")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {new}")  # left invalid by an interrupted run
    schema_editor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {new} ON {table} (level, ts, {columns}) WHERE level > 0")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(NAME)}")
    schema_editor.execute(f"ALTER INDEX {new} RENAME TO {quote(NAME)}")


def bytewise(apps, schema_editor):
    _rebuild(apps, schema_editor, bytewise=True)


def linguistic(apps, schema_editor):
    _rebuild(apps, schema_editor, bytewise=False)


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('dashboard', '0013_scope_series'),
    ]

    operations = [
        migrations.RunPython(bytewise, linguistic),
    ]
