"""Occupancy summed over nodes per cache scope and per release (``ScopeSeries``): written by the rollup, read by
the occupancy chart for windows of an hour and longer, so a chart reads one row per release (or request group)
and bucket instead of every node's samples (issue 17: 1,000 nodes × 10,000 cache scopes).

Tiers, each computed set-based in SQL (``DELETE`` of the range, then ``INSERT ... SELECT ... GROUP BY``, in one
transaction under an advisory lock on PostgreSQL):

* **1 minute**, from the raw and 1-minute ``OccupancySample`` rows of the minute, in one hashed pass that makes a
  cell per node, cache scope and minute (about 6 raw samples; no sort of the samples): per cell the sample-weighted
  average of each gauge (``bytes``, ``orphaned_bytes``, ``in_flight_requests``; rounded half up), then summed over
  nodes; each counter (hit, miss, evicted blocks by cause) the cell's largest value, as the fold keeps it, and its
  increase that value minus the node's previous minute's (``LAG`` over the cells, by node and scope), or the value
  itself when smaller (an agent restart: the new value counts from zero), summed over nodes; a cell with no cell of
  its node and scope ``LOOKBACK_MINUTES`` minute before (a node's first minute, or silent for longer) counts the
  increase within it (largest - smallest value); ``samples`` the samples summed (a rollup row weighs its
  ``samples``). For samples without a restart this is the sum of the increases between consecutive samples; an
  agent restart inside a minute counts that minute's increase up to its largest value and the rest, from zero, in
  the next minute (nothing lost or counted twice over the two). A minute is computed from the raw samples
  (``SETTLE_SECONDS`` after it ends, while they stay raw for ``KVPOOL_ROLLUP_RAW_AFTER_SECONDS``) and gives the same
  values from the fold's 1-minute rows (but a node's first minute: a folded row has no increase within it). The
  release rows (``request_group`` NULL) sum the release's scope rows of the minute. On PostgreSQL the same pass
  keeps the cells of its minutes that hold nothing but raw samples of weight 1 as ``OccupancyCell`` rows (the raw
  fold's 1-minute rows: each gauge's average, ``max_bytes`` and the counters' largest value, the samples), so the
  fold of those minutes writes them instead of aggregating the raw samples again (``dashboard.telemetry.rollup``);
  the transaction also holds the fold's lock, so it never keeps cells of a minute a fold is moving.
* **5 minutes** from the 1-minute rows, then **15 minutes**, **1 hour**, **2 hours** and **6 hours** each from the
  tier before (the bucket widths of the chart's windows: a chart reads one row per release and bucket), per scope
  and per release: each gauge the mean of the finer rows in the bucket (rounded half up), counters and samples
  summed. A coarser bucket is written once every finer bucket of it is.

``summarize(now)`` (each rollup run) computes the minutes from the newest 1-minute bucket written up to
``SETTLE_SECONDS`` before ``now``. Folding a minute's raw samples into a 1-minute row changes none of its values
(weighted averages, the largest counter, the samples summed), so after a fold ``changed(start, end)`` finds the
minutes whose samples no longer add up to the series' ``samples`` (a sample stored after its minute was summed:
late, re-delivered, deleted) and ``resummarize(start, end, now)`` computes them again, with the coarser buckets over
them. So a sample arriving more than ``SETTLE_SECONDS`` after its minute enters the series when the rollup folds it
(``KVPOOL_ROLLUP_RAW_AFTER_SECONDS``), unless its minute is older than the 1-minute tier's retention by then.
``prune(now)`` applies the retentions: 1-minute rows ``KVPOOL_ROLLUP_RAW_AFTER_SECONDS`` + 1 hour, 5- and 15-minute
rows the larger of 2 days and that + 1 hour, coarser rows ``KVPOOL_RETENTION_SECONDS``.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max

from dashboard.models import OccupancyCell, OccupancySample, ScopeSeries
from dashboard.telemetry import vendor_sql

Width = ScopeSeries.Width
#: Seconds after a minute ends before it is summed (reports are sent every 10 s and stored within seconds).
SETTLE_SECONDS = 30
#: Most minutes between the minutes of a node's consecutive samples of a scope for its counters' increase to count
#: (each minute summed reads the samples of that many minutes before it too).
LOOKBACK_MINUTES = 1
#: Seconds of samples summed per transaction (at the issue's fleet: ~3M raw rows).
CHUNK_SECONDS = 600
#: ``pg_advisory_xact_lock`` key serializing the writes of concurrent rollups to the series ("kvpool-series").
ADVISORY_LOCK = 0x6B76_706F_6F6C_0002
#: ``pg_advisory_xact_lock`` key of the raw fold (``rollup.ADVISORY_LOCK``, "kvpool-rollup"): the 1-minute rows'
#: transaction holds it too, so the cells it keeps never describe a minute a fold has moved (module docstring).
FOLD_LOCK = 0x6B76_706F_6F6C_0001

#: The sample levels a minute is summed from (raw and 1-minute rows; as a list of the (level, ts) index's first
#: column, so the reads are index range scans, not a scan of every level's rows).
_LEVELS = f"{int(OccupancySample.Level.RAW)}, {int(OccupancySample.Level.MINUTE)}"
_COUNTERS = ScopeSeries.COUNTERS
_SCOPE = ScopeSeries.SCOPE
_RELEASE = ("tenant_id", "served_model_name", "namespace")
_GAUGES = ScopeSeries.GAUGES
_COLUMNS = (*_SCOPE, *_GAUGES, *_COUNTERS, "samples")
#: The columns of an ``OccupancyCell`` the series' own cells lack: gauges, and values kept as the largest.
_CELL_GAUGES = tuple(name for name in OccupancySample.GAUGES if name not in _GAUGES)
_CELL_LARGEST = tuple(name for name in ("max_bytes", *OccupancySample.COUNTERS) if name not in _COUNTERS)
#: Each coarser tier and the finer one it is made of (its width divides the coarser one's), in order.
_FINER = {Width.FIVE_MINUTES: Width.MINUTE, Width.QUARTER_HOUR: Width.FIVE_MINUTES, Width.HOUR: Width.QUARTER_HOUR,
          Width.TWO_HOURS: Width.HOUR, Width.SIX_HOURS: Width.TWO_HOURS}


def _floor(ts: datetime, seconds: int) -> datetime:
    epoch = int(ts.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _ceil(ts: datetime, seconds: int) -> datetime:
    floor = _floor(ts, seconds)
    return floor if floor == ts else floor + timedelta(seconds=seconds)


def minute_keep_seconds() -> int:
    """Seconds the 1-minute rows are kept: the raw horizon + 1 hour (a fold recomputes them until then)."""
    return settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS + 3600


def five_minute_keep_seconds() -> int:
    """Seconds the 5- and 15-minute rows are kept: 2 days (the 6- and 24-hour charts read them), or the 1-minute
    rows' + 1 hour."""
    return max(2 * 86400, minute_keep_seconds() + 3600)


def _table() -> str:
    return connection.ops.quote_name(ScopeSeries._meta.db_table)


def _params(**values) -> dict:
    return {name: connection.ops.adapt_datetimefield_value(value) if isinstance(value, datetime) else value
            for name, value in values.items()}


def _cells_table() -> str:
    return connection.ops.quote_name(OccupancyCell._meta.db_table)


def _minute_sql(vendor: str) -> str:
    """The 1-minute scope rows of ``[start, end)`` from the samples (previous minutes from ``lookback`` on), and on
    PostgreSQL the ``OccupancyCell`` rows of its minutes that hold nothing but raw samples of weight 1.

    One hashed pass over the samples makes a cell per node, cache scope and minute (gauges' weighted totals, each
    counter's largest and smallest value, the samples); only those cells (about 6 samples each at fleet size) are
    sorted for the ``LAG`` window over each node's minutes, their node and scope columns compared byte by byte
    (``vendor_sql.bytewise``; equal values are equal bytes, so the groups are the same). ``_write`` runs it with
    ``vendor_sql.analytic_settings`` (PostgreSQL: room to hash and sort in memory)."""
    samples = connection.ops.quote_name(OccupancySample._meta.db_table)
    pair = ("node_name", *_SCOPE)
    keys = ", ".join(f"{vendor_sql.bytewise(vendor, name)} AS {name}" for name in pair)
    minute = f"{vendor_sql.epoch_seconds(vendor, 'ts')} / 60"
    weight = "CASE WHEN samples > 1 THEN samples ELSE 1 END"
    totals = ", ".join(f"{vendor_sql.weighted_sum(vendor, name, weight)} AS {name}" for name in _GAUGES)
    extremes = ", ".join(f"max({name}) AS {name}, min({name}) AS low_{name}" for name in _COUNTERS)
    lags = ", ".join(f"LAG({name}) OVER w AS prev_{name}" for name in _COUNTERS)
    increases = ", ".join(
        f"sum(CASE WHEN prev_minute IS NULL OR minute - prev_minute > {LOOKBACK_MINUTES} THEN {name} - low_{name} "
        f"WHEN {name} >= prev_{name} THEN {name} - prev_{name} ELSE {name} END)" for name in _COUNTERS)
    averages = ", ".join(f"sum({vendor_sql.half_up_average(vendor, name, 'samples')})" for name in _GAUGES)
    kept = ""
    if vendor == "postgresql":  # the fold's other columns, and the rows it could not take from the cells
        totals += "".join(f", {vendor_sql.weighted_sum(vendor, name, weight)} AS {name}" for name in _CELL_GAUGES)
        extremes += "".join(f", max({name}) AS {name}" for name in _CELL_LARGEST)
        extremes += ", count(*) FILTER (WHERE level <> 0 OR samples <> 1) AS odd"
        values = ", ".join([
            "minute", *pair,
            *(vendor_sql.half_up_average(vendor, name, "samples") for name in OccupancySample.GAUGES),
            "max_bytes", *OccupancySample.COUNTERS, "samples"])
        kept = f"""
        , kept AS (
            INSERT INTO {_cells_table()} (minute, {", ".join(pair)}, {", ".join(OccupancySample.GAUGES)}, max_bytes,
                                          {", ".join(OccupancySample.COUNTERS)}, samples)
            SELECT {values} FROM cells
            WHERE minute >= %(start_minute)s AND minute NOT IN (SELECT minute FROM cells WHERE odd > 0)
        )"""
    return f"""
        WITH cells AS (
            SELECT {keys}, {minute} AS minute, {totals}, {extremes}, sum({weight}) AS samples
            FROM {samples} WHERE level IN ({_LEVELS}) AND ts >= %(lookback)s AND ts < %(end)s
            GROUP BY {", ".join(pair)}, {minute}
        ){kept}, lagged AS (
            SELECT *, {lags}, LAG(minute) OVER w AS prev_minute
            FROM cells
            WINDOW w AS (PARTITION BY {", ".join(pair)} ORDER BY minute)
        )
        INSERT INTO {_table()} (width, ts, {", ".join(_COLUMNS)})
        SELECT {int(Width.MINUTE)}, {vendor_sql.from_epoch_seconds(vendor, "minute * 60")}, {", ".join(_SCOPE)},
               {averages}, {increases}, sum(samples)
        FROM lagged WHERE minute >= %(start_minute)s GROUP BY minute, {", ".join(_SCOPE)}
    """


def _release_sql() -> str:
    """The release rows (``request_group`` NULL) of one width over ``[start, end)``: its scope rows summed."""
    sums = ", ".join(f"sum({name})" for name in (*_GAUGES, *_COUNTERS, "samples"))
    return (f"INSERT INTO {_table()} (width, ts, {', '.join(_COLUMNS)}) "
            f"SELECT width, ts, {', '.join(_RELEASE)}, NULL, {sums} FROM {_table()} "
            f"WHERE width = %(width)s AND ts >= %(start)s AND ts < %(end)s AND request_group IS NOT NULL "
            f"GROUP BY width, ts, {', '.join(_RELEASE)}")


def _coarser_sql(vendor: str, width: int) -> str:
    """The ``width`` rows (scopes and releases) of ``[start, end)`` from the finer tier's rows."""
    bucket = vendor_sql.bucket_start(vendor, "ts", width)
    scope = ", ".join(_SCOPE)
    means = ", ".join(vendor_sql.half_up_average(vendor, f"sum({name})", "count(*)") for name in _GAUGES)
    return f"""
        INSERT INTO {_table()} (width, ts, {", ".join(_COLUMNS)})
        SELECT {int(width)}, bucket, {scope}, {means}, {", ".join(f"sum({name})" for name in (*_COUNTERS, "samples"))}
        FROM (SELECT *, {bucket} AS bucket FROM {_table()}
              WHERE width = %(finer)s AND ts >= %(start)s AND ts < %(end)s) finer
        GROUP BY bucket, {scope}
    """


def _write(width: int, start: datetime, end: datetime) -> None:
    """Recompute the ``width`` rows of ``[start, end)`` (bucket starts of ``width``), in one transaction."""
    if start >= end:
        return
    vendor = connection.vendor
    params = _params(width=int(width), start=start, end=end, start_minute=int(start.timestamp()) // 60,
                     end_minute=int(end.timestamp()) // 60,
                     lookback=start - timedelta(minutes=LOOKBACK_MINUTES), finer=int(_FINER.get(width, 0)))
    with transaction.atomic(), connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])
            if width == Width.MINUTE:  # the cells: no fold moves these minutes until this transaction ends
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FOLD_LOCK])
                cursor.execute(f"DELETE FROM {_cells_table()} WHERE minute >= %(start_minute)s "
                               f"AND minute < %(end_minute)s", params)
        for statement in vendor_sql.analytic_settings(vendor):  # sorts and hashes in memory, no JIT
            cursor.execute(statement)
        cursor.execute(f"DELETE FROM {_table()} WHERE width = %(width)s AND ts >= %(start)s AND ts < %(end)s",
                       params)
        if width == Width.MINUTE:
            cursor.execute(_minute_sql(vendor), params)
            cursor.execute(_release_sql(), params)
        else:
            cursor.execute(_coarser_sql(vendor, width), params)


def resummarize(start: datetime, end: datetime, now: datetime) -> None:
    """Recompute the 1-minute rows of ``[start, end)`` (rounded out to whole minutes) and of the
    ``LOOKBACK_MINUTES`` after it (``CHUNK_SECONDS`` per transaction), and the 5-minute and 1-hour buckets over
    them that are complete (every finer bucket of them written up to the newest 1-minute bucket), within the
    1-minute tier's retention (older samples are left out)."""
    watermark = _watermark()
    if watermark is None:
        return
    oldest = _ceil(now - timedelta(seconds=minute_keep_seconds()), Width.FIVE_MINUTES)
    start = max(_floor(start, Width.MINUTE), oldest)
    # the next minutes' increases may start from these samples
    end = min(_ceil(end, Width.MINUTE) + timedelta(minutes=LOOKBACK_MINUTES), watermark)
    if start >= end:
        return
    chunk = start
    while chunk < end:
        stop = min(_floor(chunk, CHUNK_SECONDS) + timedelta(seconds=CHUNK_SECONDS), end)
        _write(Width.MINUTE, chunk, stop)
        chunk = stop
    for width in _FINER:
        start = _floor(start, width)
        end = min(_ceil(end, width), _floor(watermark, width))
        _write(width, start, end)


def changed(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """The minutes of ``[start, end)`` (whole minutes) where a cache scope's samples (of every level, each weighing
    its ``samples``) do not add up to the ``samples`` of its row in the 1-minute tier, as ranges of adjacent
    minutes. One statement: the samples' totals and the series' (negated) per minute and scope, summed, the minutes
    where a sum is not 0 returned (both sides weigh at least 1 per row, so a scope on one side only is not 0)."""
    vendor = connection.vendor
    samples = connection.ops.quote_name(OccupancySample._meta.db_table)
    bucket = vendor_sql.bucket_start(vendor, "ts", 60)
    scope = ", ".join(_SCOPE)
    params = _params(start=_floor(start, 60), end=_ceil(end, 60))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT bucket FROM ("
            f"SELECT {bucket} AS bucket, {scope}, CASE WHEN samples > 1 THEN samples ELSE 1 END AS weight "
            f"FROM {samples} WHERE level IN ({_LEVELS}) AND ts >= %(start)s AND ts < %(end)s "
            f"UNION ALL SELECT ts, {scope}, -samples FROM {_table()} WHERE width = {int(Width.MINUTE)} "
            f"AND request_group IS NOT NULL AND ts >= %(start)s AND ts < %(end)s) both_sides "
            f"GROUP BY bucket, {scope} HAVING sum(weight) <> 0 ORDER BY bucket", params)
        minutes = [_aware(ts) for (ts,) in cursor.fetchall()]
    ranges: list[tuple[datetime, datetime]] = []
    for minute in minutes:
        if ranges and ranges[-1][1] == minute:
            ranges[-1] = (ranges[-1][0], minute + timedelta(minutes=1))
        else:
            ranges.append((minute, minute + timedelta(minutes=1)))
    return ranges


def _aware(value) -> datetime:
    """A bucket start as the backend returns it (a datetime, or SQLite's text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _watermark() -> datetime | None:
    """End of the newest 1-minute bucket written (``None`` before the first)."""
    newest = ScopeSeries.objects.filter(width=Width.MINUTE).aggregate(newest=Max("ts"))["newest"]
    return None if newest is None else newest + timedelta(seconds=Width.MINUTE)


def summarize(now: datetime) -> tuple[datetime, datetime] | None:
    """Write the minutes from the newest 1-minute bucket written (the first time: the 1-minute tier's retention
    ago) up to ``SETTLE_SECONDS`` before ``now``, and the coarser buckets they complete; returns the range of
    minutes written, ``None`` when there was none."""
    end = _floor(now - timedelta(seconds=SETTLE_SECONDS), Width.MINUTE)
    watermark = _watermark()
    oldest = _ceil(now - timedelta(seconds=minute_keep_seconds()), Width.FIVE_MINUTES)
    start = oldest if watermark is None or watermark < oldest else watermark
    if start >= end:
        return None
    chunk = start
    while chunk < end:
        stop = min(_floor(chunk, CHUNK_SECONDS) + timedelta(seconds=CHUNK_SECONDS), end)
        _write(Width.MINUTE, chunk, stop)
        chunk = stop
    if _watermark() is None:  # no sample at all yet: nothing to coarsen, start over next time
        return None
    # a coarser bucket from before ``start`` (the 1-minute tier's retention) would lack finer rows: from ``start`` on
    for width in _FINER:
        _write(width, _floor(start, width), _floor(end, width))
    return start, end


def prune(now: datetime) -> int:
    """Delete the rows older than each tier's retention (module docstring); returns the rows deleted."""
    deleted = 0
    for width, seconds in ((Width.MINUTE, minute_keep_seconds()), (Width.FIVE_MINUTES, five_minute_keep_seconds()),
                           (Width.QUARTER_HOUR, five_minute_keep_seconds()),
                           *((width, settings.KVPOOL_RETENTION_SECONDS)
                             for width in (Width.HOUR, Width.TWO_HOURS, Width.SIX_HOURS))):
        deleted += ScopeSeries.objects.filter(width=width, ts__lt=now - timedelta(seconds=seconds)).delete()[0]
    return deleted
