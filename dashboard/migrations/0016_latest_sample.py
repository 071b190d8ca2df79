"""The newest raw sample of each (node, cache scope) (``LatestSample``), written by a trigger on every insert of
``OccupancySample`` rows (PostgreSQL: one set-based upsert per statement from its transition table, so ingest's
``COPY`` pays once per batch; SQLite: one upsert per row), and filled here from the raw samples already stored.
The current occupancy (overview, registry and upgrade pages) and the checklist's reported names read it instead of
the raw samples of their window.
"""

from django.db import migrations, models

_KEY = "node_name, tenant_id, served_model_name, namespace, request_group"
_COPIED = "ts, blocks, bytes, in_flight_requests, hit_blocks, miss_blocks"
_UPDATE = ", ".join(f"{name} = excluded.{name}" for name in _COPIED.split(", "))

# ts moves forward only: an older (re-delivered, late) sample changes nothing; of equal ts the later insert wins.
# Rows are taken in key order (DISTINCT ON sorts them, byte by byte: a linguistic collation's sort is several times
# slower), so two ingest transactions lock pairs in the same order.
_BYTEWISE = ", ".join(f'{name} COLLATE "C"' for name in _KEY.split(", "))
POSTGRESQL = [
    f"""CREATE FUNCTION dashboard_latest_sample() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dashboard_latestsample ({_KEY}, {_COPIED})
    SELECT DISTINCT ON ({_BYTEWISE}) {_KEY}, {_COPIED} FROM new_rows WHERE level = 0
    ORDER BY {_BYTEWISE}, ts DESC, id DESC
    ON CONFLICT ({_KEY}) DO UPDATE SET {_UPDATE} WHERE dashboard_latestsample.ts <= excluded.ts;
    RETURN NULL;
END $$""",
    "CREATE TRIGGER dashboard_latest_sample AFTER INSERT ON dashboard_occupancysample "
    "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dashboard_latest_sample()",
    f"""INSERT INTO dashboard_latestsample ({_KEY}, {_COPIED})
    SELECT DISTINCT ON ({_BYTEWISE}) {_KEY}, {_COPIED} FROM dashboard_occupancysample WHERE level = 0
    ORDER BY {_BYTEWISE}, ts DESC, id DESC""",
]
POSTGRESQL_REVERSE = ["DROP TRIGGER IF EXISTS dashboard_latest_sample ON dashboard_occupancysample",
                      "DROP FUNCTION IF EXISTS dashboard_latest_sample()"]
_NEW = ", ".join(f"NEW.{name}" for name in (*_KEY.split(", "), *_COPIED.split(", ")))
SQLITE = [
    f"""CREATE TRIGGER dashboard_latest_sample AFTER INSERT ON dashboard_occupancysample
FOR EACH ROW WHEN NEW.level = 0 BEGIN
    INSERT INTO dashboard_latestsample ({_KEY}, {_COPIED}) VALUES ({_NEW})
    ON CONFLICT ({_KEY}) DO UPDATE SET {_UPDATE} WHERE dashboard_latestsample.ts <= excluded.ts;
END""",
    f"""INSERT INTO dashboard_latestsample ({_KEY}, {_COPIED})
    SELECT {_KEY}, {_COPIED} FROM dashboard_occupancysample s WHERE level = 0 AND NOT EXISTS (
        SELECT 1 FROM dashboard_occupancysample n WHERE n.level = 0 AND n.node_name = s.node_name
        AND n.tenant_id = s.tenant_id AND n.served_model_name = s.served_model_name AND n.namespace = s.namespace
        AND n.request_group = s.request_group AND (n.ts > s.ts OR n.ts = s.ts AND n.id > s.id))""",
]
SQLITE_REVERSE = ["DROP TRIGGER IF EXISTS dashboard_latest_sample"]


def _run(statements: dict[str, list[str]]):
    def run(apps, schema_editor) -> None:
        for statement in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement, params=None)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('dashboard', '0015_occupancy_cell'),
    ]

    operations = [
        migrations.CreateModel(
            name='LatestSample',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('node_name', models.CharField(max_length=128)),
                ('tenant_id', models.CharField(max_length=128)),
                ('served_model_name', models.CharField(blank=True, default='', max_length=255)),
                ('namespace', models.CharField(blank=True, default='', max_length=255)),
                ('request_group', models.CharField(blank=True, default='', max_length=255)),
                ('ts', models.DateTimeField()),
                ('blocks', models.BigIntegerField(default=0)),
                ('bytes', models.BigIntegerField(default=0)),
                ('in_flight_requests', models.BigIntegerField(default=0)),
                ('hit_blocks', models.BigIntegerField(default=0)),
                ('miss_blocks', models.BigIntegerField(default=0)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('node_name', 'tenant_id', 'served_model_name', 'namespace', 'request_group'), name='dashboard_latest_key')],
            },
        ),
        migrations.RunPython(_run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
                             _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE})),
    ]
