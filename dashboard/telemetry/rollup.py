"""Roll occupancy samples up (raw ~10 s → 1 minute → 1 hour) and apply retention, set-based in SQL.

A raw row older than ``KVPOOL_ROLLUP_RAW_AFTER_SECONDS`` is folded into the 1-minute row of its node, cache scope
and minute; a 1-minute row older than ``KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS`` into the 1-hour row. Folding: gauges
become the average weighted by ``samples`` (rounded half up to whole units), ``max_bytes`` the peak, counters
(cumulative since the agent started) the largest value, ``samples`` the sum; a rollup row that already exists (a
late sample, or an earlier chunk of the same bucket) is merged the same way, its gauges weighted by its
``samples``.

Each fold is one ``INSERT ... SELECT ... GROUP BY ... ON CONFLICT (level, ts, cache scope key) DO UPDATE`` over a
bounded chunk of source rows (a time range, ``RAW_CHUNK_SECONDS`` / ``MINUTE_CHUNK_SECONDS``), a plain ``INSERT``
when the chunk's buckets hold no rollup row yet (the usual case; only folds write rollup rows, one at a time), and
the deletion of exactly the rows it read, in one transaction per chunk: on PostgreSQL the source is a ``DELETE ...
RETURNING`` of the chunk (a row committed after the statement began is neither read nor deleted), on SQLite the
transaction holds the database's write lock from its start. So a sample that arrives while a rollup runs is never
lost nor counted twice; one for a bucket already rolled up (late, or arriving between chunks) stays raw and is
merged into the existing row on the next run.

On PostgreSQL a raw chunk whose buckets hold no 1-minute row is first tried from the series' cells
(``OccupancyCell``: the 1-minute rows of its minutes as the series' pass over the raw samples computed them): its raw
rows are deleted and, if they are exactly as many as the cells' samples, the cells inserted as the 1-minute rows;
else the deletion is rolled back (a savepoint) and the chunk aggregated as above. Raw rows are only inserted
(ingest) and deleted by this fold, and the series writes a minute's cells only under this fold's lock and only if
the minute holds nothing but raw samples (no fold moved it), so the rows deleted include every row the cells were
made of: equal counts mean the same rows. Such a minute's series rows count those very samples, so it is not
checked again (``series.changed``). The fold of a chunk deletes its cells either way.

Folds of concurrent rollups are serialized (a transaction-level advisory lock on PostgreSQL). Only buckets entirely
older than the cutoff are folded. The unique index ``dashboard_occ_rollup_key`` (its text columns compared byte by
byte on PostgreSQL, migration 0014; rollup levels only: raw rows may repeat a key, two reports of one node may carry
the same ``sent_at``) is the conflict target.

Then the occupancy summed over nodes (``dashboard.telemetry.series``) is written for the minutes ended since the
last run and written again for the minutes the raw fold just moved whose samples changed since (late ones), and its
tiers' retention applied. Retention then deletes 1-hour rows older than ``KVPOOL_RETENTION_SECONDS``, the newest
sample of each (node, cache scope) (``LatestSample``) older than the raw horizon, master
quota samples older than ``KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS``, report receipts and acks older than the
1-minute horizon (a duplicate delivered later than that would be stored again), engine facts (``InstanceStats``) no
report refreshed within that horizon, and config versions older than the retention except each node's newest; each
is one ``DELETE``.
"""
from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min, OuterRef, Subquery
from django.utils import timezone

from dashboard.models import (
    ConfigAck,
    ConfigVersion,
    InstanceStats,
    LatestSample,
    MasterQuotaSample,
    OccupancyCell,
    OccupancySample,
    Report,
)
from dashboard.telemetry import series, vendor_sql

log = logging.getLogger("kvpool.dashboard.rollup")

Level = OccupancySample.Level
#: Seconds of source rows folded per transaction (multiples of the target bucket or of the source one): at fleet
#: size (~5,000 raw rows/s) a raw chunk is ~300,000 rows, a 1-minute chunk (50,000 scopes × nodes) ~500,000.
RAW_CHUNK_SECONDS = 60
MINUTE_CHUNK_SECONDS = 600
#: ``pg_advisory_xact_lock`` key serializing the folds of concurrent rollups ("kvpool-rollup").
ADVISORY_LOCK = series.FOLD_LOCK

_KEY = OccupancySample.KEY
_GAUGES = OccupancySample.GAUGES
_LARGEST = ("max_bytes", *OccupancySample.COUNTERS)  # merged by taking the largest value
_COLUMNS = (*_KEY, *_GAUGES, *_LARGEST, "samples")
_BUCKET_SECONDS = {Level.MINUTE: 60, Level.HOUR: 3600}


def floor_minute(ts: datetime) -> datetime:
    """Start of the UTC minute containing ``ts``."""
    return ts.replace(second=0, microsecond=0)


def floor_hour(ts: datetime) -> datetime:
    """Start of the UTC hour containing ``ts``."""
    return ts.replace(minute=0, second=0, microsecond=0)


def _floor_seconds(ts: datetime, seconds: int) -> datetime:
    """Start of the ``seconds``-wide UTC interval containing ``ts`` (intervals counted from the epoch)."""
    epoch = int(ts.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _aggregate_sql(vendor: str, source_sql: str, target: int) -> str:
    """``SELECT`` of the ``target`` buckets of the rows of ``source_sql`` (a FROM item with the sample columns and
    ``ts``): per bucket and key the gauges' weighted totals, the largest values, the samples and ``source_rows``."""
    agg = ", ".join([
        *_KEY,
        *(f"{vendor_sql.weighted_sum(vendor, name, 'samples')} AS {name}" for name in _GAUGES),
        *(f"max({name}) AS {name}" for name in _LARGEST),
        "sum(samples) AS samples", "count(*) AS source_rows",
    ])
    bucket = vendor_sql.bucket_start(vendor, "ts", _BUCKET_SECONDS[target])
    return f"SELECT {bucket} AS ts, {agg} FROM {source_sql} GROUP BY {bucket}, {', '.join(_KEY)}"


def _merge_sql(vendor: str, aggregated: str, merge: bool) -> str:
    """``INSERT ... SELECT`` of the rows of ``aggregated`` (a FROM item aliased ``a``, from ``_aggregate_sql``) as
    ``target`` level rows; with ``merge``, merged with the existing ones (``LEFT JOIN`` and ``ON CONFLICT DO
    UPDATE``), without, plain (when the range holds no ``target`` row: several times cheaper per row than the
    conflict checks); params: target level."""
    table = connection.ops.quote_name(OccupancySample._meta.db_table)
    if not merge:
        values = ", ".join([*(f"a.{name}" for name in _KEY),
                            *(vendor_sql.half_up_average(vendor, f"a.{name}", "a.samples") for name in _GAUGES),
                            *(f"a.{name}" for name in _LARGEST), "a.samples"])
        return (f"INSERT INTO {table} (level, ts, {', '.join(_COLUMNS)}) "
                f"SELECT %(target)s, a.ts, {values} FROM {aggregated}")
    weight = "a.samples + coalesce(o.samples, 0)"
    values = ", ".join([
        *(f"a.{name}" for name in _KEY),
        *(vendor_sql.half_up_average(
            vendor, f"a.{name} + coalesce({vendor_sql.weighted(vendor, f'o.{name}', 'o.samples')}, 0)", weight)
          for name in _GAUGES),
        *(f"CASE WHEN o.{name} > a.{name} THEN o.{name} ELSE a.{name} END" for name in _LARGEST),
        weight,
    ])
    # compared as the conflict key's index does (bytewise on PostgreSQL: migration 0014), so the join probes it
    join = " AND ".join(["o.level = %(target)s", "o.ts = a.ts",
                         *(f"{vendor_sql.bytewise(vendor, f'o.{name}')} = a.{name}" for name in _KEY)])
    return (
        f"INSERT INTO {table} (level, ts, {', '.join(_COLUMNS)}) "
        f"SELECT %(target)s, a.ts, {values} "
        f"FROM {aggregated} LEFT JOIN {table} o ON {join} "
        f"WHERE true ON CONFLICT (level, ts, {', '.join(_KEY)}) WHERE level > 0 DO UPDATE SET "
        + ", ".join(f"{name} = excluded.{name}" for name in (*_GAUGES, *_LARGEST, "samples"))
    )


def _fold_from_cells(cursor, params: dict) -> int | None:
    """PostgreSQL, a raw chunk of whole minutes whose buckets hold no 1-minute row: delete its raw rows and insert
    the 1-minute rows the series kept for its minutes (``OccupancyCell``), if those cells count exactly the rows
    deleted; returns the rows folded, or ``None`` (nothing changed) when the cells do not account for every row.

    Raw rows are only inserted (ingest) and deleted by this fold, and the cells of a minute are written (under this
    fold's lock) only while its raw rows are all there and no fold has moved it: the rows of the chunk now are the
    rows the cells were made of plus any stored since, so equal counts mean the same rows."""
    cells = connection.ops.quote_name(OccupancyCell._meta.db_table)
    table = connection.ops.quote_name(OccupancySample._meta.db_table)
    in_chunk = "minute >= %(start_minute)s AND minute < %(end_minute)s"
    cursor.execute(f"SELECT count(*), coalesce(sum(samples), 0) FROM {cells} WHERE {in_chunk}", params)
    kept, expected = cursor.fetchone()
    if not kept:
        return None
    savepoint = transaction.savepoint()
    cursor.execute(f"DELETE FROM {table} WHERE level = %(source)s AND ts >= %(start)s AND ts < %(end)s", params)
    if cursor.rowcount != expected:  # a sample stored since the cells were made: aggregate the rows themselves
        transaction.savepoint_rollback(savepoint)
        return None
    columns = (*_KEY, *_GAUGES, *_LARGEST, "samples")
    cursor.execute(f"INSERT INTO {table} (level, ts, {', '.join(columns)}) "
                   f"SELECT %(target)s, {vendor_sql.from_epoch_seconds('postgresql', 'minute * 60')}, "
                   f"{', '.join(columns)} FROM {cells} WHERE {in_chunk}", params)
    cursor.execute(f"DELETE FROM {cells} WHERE {in_chunk}", params)
    transaction.savepoint_commit(savepoint)
    return int(expected)


def _fold_chunk(source: int, target: int, start: datetime, end: datetime) -> tuple[int, bool]:
    """Fold the ``source`` rows with ``start <= ts < end`` into ``target`` rows and delete them, in one
    transaction; returns the rows folded and whether the 1-minute rows came from the series' cells (their minutes'
    series rows count those very samples). ``start`` and ``end`` are bucket starts of ``target``'s or finer."""
    vendor = connection.vendor
    table = connection.ops.quote_name(OccupancySample._meta.db_table)
    adapt = connection.ops.adapt_datetimefield_value
    params = {"source": source, "target": target, "start": adapt(start), "end": adapt(end),
              "first_bucket": adapt(_floor_seconds(start, _BUCKET_SECONDS[target])),
              "start_minute": int(start.timestamp()) // 60, "end_minute": int(end.timestamp()) // 60}
    chunk = "level = %(source)s AND ts >= %(start)s AND ts < %(end)s"
    with transaction.atomic(), connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])
        for statement in vendor_sql.analytic_settings(vendor):  # the rows moved and their buckets in memory, no JIT
            cursor.execute(statement)
        # only folds write rollup rows, one at a time (the lock; SQLite's write lock): none in the buckets now, none
        # until this transaction ends
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE level = %(target)s AND ts >= %(first_bucket)s "
                       f"AND ts < %(end)s)", params)
        merge = bool(cursor.fetchone()[0])
        if vendor == "postgresql" and source == Level.RAW:
            if not merge and (folded := _fold_from_cells(cursor, params)) is not None:
                return folded, True
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(OccupancyCell._meta.db_table)} "
                           f"WHERE minute >= %(start_minute)s AND minute < %(end_minute)s", params)
        if vendor == "postgresql":
            moved = f"DELETE FROM {table} WHERE {chunk} RETURNING ts, {', '.join(_COLUMNS)}"
            # the rows moved are read once (aggregated); their count comes from the buckets
            cursor.execute(f"WITH moved AS ({moved}), a AS ({_aggregate_sql(vendor, 'moved', target)}), "
                           f"merged AS ({_merge_sql(vendor, 'a', merge)}) SELECT coalesce(sum(source_rows), 0) FROM a",
                           params)
            return int(cursor.fetchone()[0]), False
        # SQLite: the transaction holds the write lock (IMMEDIATE) from its start, nobody inserts in between
        cursor.execute(_merge_sql(vendor, f"({_aggregate_sql(vendor, f'{table} WHERE {chunk}', target)}) a", merge),
                       params)
        cursor.execute(f"DELETE FROM {table} WHERE {chunk}", params)
        return cursor.rowcount, False


def _fold(source: int, target: int, cutoff: datetime, chunk_seconds: int,
          changed: list[tuple[datetime, datetime]] | None = None) -> int:
    """Fold rows of level ``source`` older than ``cutoff`` (a ``target`` bucket start) into level ``target``, a
    ``chunk_seconds`` time range per transaction, oldest first; returns rows folded, and appends each range folded
    to ``changed`` but those folded from the series' cells (unchanged since summed). A row that arrives for a range
    already passed waits for the next run."""
    folded = 0
    rows = OccupancySample.objects.filter(level=source, ts__lt=cutoff)
    while (first := rows.aggregate(first=Min("ts"))["first"]) is not None:
        start = _floor_seconds(first, chunk_seconds)
        end = min(start + timedelta(seconds=chunk_seconds), cutoff)
        moved, from_cells = _fold_chunk(source, target, start, end)
        folded += moved
        if changed is not None and not from_cells:
            changed.append((start, end))
        rows = rows.filter(ts__gte=end)
    return folded


def _spans(ranges: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """``ranges`` (in order) with adjacent or overlapping ones merged."""
    spans: list[tuple[datetime, datetime]] = []
    for start, end in ranges:
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((start, end))
    return spans


def _old_config_versions(cutoff: datetime):
    """``ConfigVersion`` rows created before ``cutoff`` that are not their node's newest."""
    newest = ConfigVersion.objects.filter(node_name=OuterRef("node_name")).order_by("-version").values("version")[:1]
    return ConfigVersion.objects.filter(created_at__lt=cutoff, version__lt=Subquery(newest))


def rollup(now: datetime | None = None) -> dict[str, int]:
    """Run both folds, the occupancy summed over nodes (``dashboard.telemetry.series``: new minutes, the minutes
    folded again) and the retention; returns counts per step (JSON-ready): ``raw_folded``, ``minute_folded`` (source
    rows folded), ``series_minutes`` (new minutes summed), ``series_deleted`` (series rows past retention),
    ``hour_deleted``, ``latest_deleted`` (``LatestSample`` rows older than the raw horizon), ``receipts_deleted``,
    ``acks_deleted``, ``instance_stats_deleted``, ``master_samples_deleted``, ``config_versions_deleted``."""
    now = now or timezone.now()
    raw_cutoff = floor_minute(now - timedelta(seconds=settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS))
    minute_cutoff = floor_hour(now - timedelta(seconds=settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS))
    retention_cutoff = now - timedelta(seconds=settings.KVPOOL_RETENTION_SECONDS)
    folded: list[tuple[datetime, datetime]] = []
    counts = {
        "raw_folded": _fold(Level.RAW, Level.MINUTE, raw_cutoff, RAW_CHUNK_SECONDS, folded),
        "minute_folded": _fold(Level.MINUTE, Level.HOUR, minute_cutoff, MINUTE_CHUNK_SECONDS),
    }
    written = series.summarize(now)
    counts["series_minutes"] = 0 if written is None else int((written[1] - written[0]).total_seconds() // 60)
    for span in _spans(folded):  # minutes folded whose samples changed since they were summed (late ones)
        for start, end in series.changed(*span):
            series.resummarize(start, end, now)
    counts["series_deleted"] = series.prune(now)
    counts["hour_deleted"] = OccupancySample.objects.filter(level=Level.HOUR, ts__lt=retention_cutoff).delete()[0]
    # the newest sample of pairs whose raw samples were all folded (the node or the scope stopped reporting)
    counts["latest_deleted"] = LatestSample.objects.filter(ts__lt=raw_cutoff).delete()[0]
    counts["receipts_deleted"] = Report.objects.filter(sent_at__lt=minute_cutoff).delete()[0]
    counts["acks_deleted"] = ConfigAck.objects.filter(sent_at__lt=minute_cutoff).delete()[0]
    # engine facts no report refreshed since the receipts of that time went (the instance or its agent is gone)
    counts["instance_stats_deleted"] = InstanceStats.objects.filter(reported_at__lt=minute_cutoff).delete()[0]
    counts["master_samples_deleted"] = MasterQuotaSample.objects.filter(
        ts__lt=now - timedelta(seconds=settings.KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS)).delete()[0]
    counts["config_versions_deleted"] = _old_config_versions(retention_cutoff).delete()[0]
    if any(counts.values()):
        log.info("rollup: %s", counts)
    return counts
