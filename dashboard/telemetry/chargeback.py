"""Chargeback: bytes·hours of the pool per tenant, served model, release namespace or request group over a period.

``chargeback(samples, start, end, group_by)`` integrates the ``bytes`` gauge of the stored occupancy samples
(``dashboard.models.OccupancySample``) over ``[start, end)`` in one SQL statement (a ``LEAD`` window over each
node's samples of each cache scope, then ``SUM ... GROUP BY``), on SQLite and PostgreSQL alike.

How the samples are integrated:

* **Each node's samples of each cache scope** (tenant, served model, release namespace, request group) form one
  step function; the functions of every node and scope of a group are summed (so two nodes holding 1 GiB each
  for an hour make 2 GiB·h).
* **A sample's value holds from its ``ts`` until the next sample of the same scope from the same node**, capped:
  a raw sample (one per report, about every 10 s) holds at most ``KVPOOL_CHARGEBACK_MAX_GAP_SECONDS`` (60 s by
  default: six missed reports); after that, and until the next sample, the scope counts as absent on that node
  (0 bytes: a silent agent is not billed for what nobody measured). A 1-minute or 1-hour rollup row (``ts`` = the
  bucket start, ``bytes`` = the average of the raw samples it folded) holds at most its bucket (60 s / 3600 s).
* **The finest data kept for each part of the period**: raw samples, 1-minute and 1-hour rollups are read
  together; a rollup deletes the rows it folds (``dashboard.telemetry.rollup``), so each instant of a node's
  scope is held by one level only. Where two tiers meet, the coarser row ends at its bucket end and the first finer
  sample starts at its own ``ts``: less than one report interval at the junction is not counted (a late raw
  sample not folded yet splits its minute row until the next rollup merges it).
* **Period boundaries cut samples**: a sample taken before ``start`` counts from ``start`` on (for as long as it
  holds), one holding past ``end`` counts until ``end``. A rollup row cut by a boundary counts its average for the
  part inside: where in its bucket the bytes were is not kept.

Times are resolved to the microsecond on PostgreSQL and to the millisecond on SQLite (its date functions' unit).
The pool's capacity over the period is the mounted capacity of the newest master probe
(``MasterHealth.capacity_bytes``, ``master_total_capacity_bytes``) times the period's hours: the dashboard keeps no
history of the capacity, so a period before the pool was resized is measured against today's size.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connections
from django.db.models import F, QuerySet, Window
from django.db.models.functions import Lead

from dashboard.models import OccupancySample
from dashboard.telemetry import vendor_sql

#: ``group_by`` value -> the sample fields a row of that grouping is keyed by. A request group belongs to a tenant
#: and spans its releases; ``scope`` is the whole cache scope (the four fields).
GROUPINGS: dict[str, tuple[str, ...]] = {
    "tenant": ("tenant_id",),
    "model": ("tenant_id", "served_model_name"),
    "release": ("tenant_id", "served_model_name", "namespace"),
    "request_group": ("tenant_id", "request_group"),
    "scope": ("tenant_id", "served_model_name", "namespace", "request_group"),
}
#: The fields of a row's key, in order (the cache scope's).
KEY_FIELDS = ("tenant_id", "served_model_name", "namespace", "request_group")

GIB = 1 << 30
SECONDS_PER_HOUR = 3600.0
#: Longest a rollup row of each level holds (its bucket), in seconds; raw rows: the max gap setting.
ROLLUP_HOLD_SECONDS = {OccupancySample.Level.MINUTE: 60, OccupancySample.Level.HOUR: 3600}
_EARLIEST = datetime.min.replace(tzinfo=UTC)


def max_gap_seconds() -> int:
    """``KVPOOL_CHARGEBACK_MAX_GAP_SECONDS``: the longest a raw sample holds (seconds)."""
    return settings.KVPOOL_CHARGEBACK_MAX_GAP_SECONDS


@dataclass(frozen=True)
class ChargebackRow:
    """One group's use of the pool over the period.

    ``key`` maps each field of the grouping (``GROUPINGS``) to its value; ``byte_seconds`` is the integral of its
    bytes over the period (bytes × seconds, summed over nodes and scopes).
    """

    key: dict[str, str]
    byte_seconds: float

    @property
    def byte_hours(self) -> float:
        """Bytes × hours."""
        return self.byte_seconds / SECONDS_PER_HOUR

    @property
    def gib_hours(self) -> float:
        """GiB (2**30 bytes) × hours."""
        return self.byte_hours / GIB


@dataclass
class Chargeback:
    """The rows of one period and grouping, largest use first, and the pool's capacity over the period.

    ``capacity_bytes`` is ``None`` while the capacity is unknown (no successful master probe); shares are then
    ``None`` too, as for a period of zero length.
    """

    start: datetime
    end: datetime
    group_by: str
    max_gap_seconds: int
    capacity_bytes: int | None = None
    rows: list[ChargebackRow] = field(default_factory=list)

    @property
    def hours(self) -> float:
        """Length of the period in hours."""
        return (self.end - self.start).total_seconds() / SECONDS_PER_HOUR

    @property
    def capacity_byte_hours(self) -> float | None:
        """The pool's capacity over the period (bytes × hours), ``None`` when unknown."""
        return None if self.capacity_bytes is None else self.capacity_bytes * self.hours

    @property
    def total_byte_hours(self) -> float:
        return sum(row.byte_hours for row in self.rows)

    def share(self, byte_hours: float) -> float | None:
        """``byte_hours`` / the capacity over the period (``None`` when the capacity is unknown or 0)."""
        capacity = self.capacity_byte_hours
        return byte_hours / capacity if capacity else None

    def average_bytes(self, byte_hours: float) -> float:
        """``byte_hours`` spread over the period: the average bytes held."""
        return byte_hours / self.hours if self.hours else 0.0

    def row_dict(self, row: ChargebackRow) -> dict:
        """One row, JSON-ready: the four key fields (``None`` where the grouping does not split by it),
        ``byte_hours``, ``gib_hours``, ``average_bytes`` and ``capacity_share``."""
        return {**{name: row.key.get(name) for name in KEY_FIELDS}, "byte_hours": row.byte_hours,
                "gib_hours": row.gib_hours, "average_bytes": self.average_bytes(row.byte_hours),
                "capacity_share": self.share(row.byte_hours)}

    def as_dict(self) -> dict:
        """JSON-ready form served by ``GET /api/v1/telemetry/chargeback/``."""
        total = self.total_byte_hours
        return {
            "start": self.start, "end": self.end, "hours": self.hours, "group_by": self.group_by,
            "max_gap_seconds": self.max_gap_seconds, "capacity_bytes": self.capacity_bytes,
            "capacity_byte_hours": self.capacity_byte_hours, "total_byte_hours": total,
            "total_gib_hours": total / GIB, "total_average_bytes": self.average_bytes(total),
            "total_capacity_share": self.share(total), "rows": [self.row_dict(row) for row in self.rows],
        }


def chargeback(samples: QuerySet, start: datetime, end: datetime, group_by: str = "tenant", *,
               capacity_bytes: int | None = None, max_gap: int | None = None) -> Chargeback:
    """Bytes·hours of each group of ``samples`` over ``[start, end)`` (see the module docstring for the rule).

    Args:
        samples: ``OccupancySample`` rows to count, already narrowed to what the caller may see
            (``tenants.access.scope``) and filtered by cache scope fields; every level is read.
        start, end: aware date-times, ``start < end``.
        group_by: a key of ``GROUPINGS``.
        capacity_bytes: the pool's mounted capacity (``None``: unknown).
        max_gap: the longest a raw sample holds, seconds (default ``KVPOOL_CHARGEBACK_MAX_GAP_SECONDS``).

    Returns a ``Chargeback`` whose rows (groups seen in the period, zero use included) are sorted by use,
    largest first, then by key. Raises ``ValueError`` for an unknown ``group_by`` or ``end <= start``.
    """
    if group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPINGS)}, not {group_by!r}")
    if end <= start:
        raise ValueError("end must be after start")
    max_gap = max_gap_seconds() if max_gap is None else max_gap
    longest = max(max_gap, *ROLLUP_HOLD_SECONDS.values())
    earliest = start - timedelta(seconds=longest) if start - _EARLIEST > timedelta(seconds=longest) else _EARLIEST
    keys = GROUPINGS[group_by]
    held = (  # every level, spelled out so that the planner can use the (level, ts) index for the time range
        samples.filter(level__in=list(OccupancySample.Level.values), ts__gte=earliest, ts__lt=end)
        .annotate(next_ts=Window(Lead("ts"), partition_by=[F("node_name"), *(F(name) for name in KEY_FIELDS)],
                                 order_by=[F("ts").asc(), F("level").asc(), F("id").asc()]))
        .values("level", "ts", "next_ts", "bytes", *keys)
    )
    connection = connections[samples.db]
    inner_sql, inner_params = held.query.sql_with_params()
    vendor = connection.vendor
    origin = start.replace(microsecond=0)
    origin_param: datetime | int = origin if vendor == "postgresql" else int(origin.timestamp())
    begin, finish = (start - origin).total_seconds(), (end - origin).total_seconds()
    least, greatest = ("LEAST", "GREATEST") if vendor == "postgresql" else ("MIN", "MAX")
    quote = connection.ops.quote_name
    columns = ", ".join(quote(name) for name in keys)
    hold = (f"CASE level WHEN {OccupancySample.Level.RAW} THEN %s WHEN {OccupancySample.Level.MINUTE} THEN %s "
            f"ELSE %s END")
    # seconds of [ts, min(next_ts, ts + hold)) inside [start, end)
    seconds = (f"{greatest}(0.0, {least}(COALESCE(next_at, held_until), held_until, %s) - {greatest}(at, %s))")
    sql = (
        f"SELECT {columns}, SUM(bytes * {seconds}) AS byte_seconds, SUM({seconds}) AS present "
        f"FROM (SELECT {columns}, bytes, at, next_at, at + ({hold}) AS held_until FROM ("
        f"SELECT {columns}, {quote('bytes')} AS bytes, {quote('level')} AS level, "
        f"{vendor_sql.seconds_after_origin(vendor, quote('ts'))} AS at, "
        f"{vendor_sql.seconds_after_origin(vendor, quote('next_ts'))} AS next_at "
        f"FROM ({inner_sql}) held) offsets) holds "
        f"GROUP BY {columns}"
    )
    # parameters in the order their %s appear: the outer SELECT's two ``seconds`` expressions, the hold of each
    # level, the offsets (origin twice), then the inner query's own
    params = [finish, begin, finish, begin, max_gap, ROLLUP_HOLD_SECONDS[OccupancySample.Level.MINUTE],
              ROLLUP_HOLD_SECONDS[OccupancySample.Level.HOUR], origin_param, origin_param, *inner_params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    rows = [ChargebackRow(key=dict(zip(keys, row[:len(keys)])), byte_seconds=float(row[len(keys)] or 0.0))
            for row in found if row[len(keys) + 1]]
    rows.sort(key=lambda row: (-row.byte_seconds, tuple(row.key.values())))
    return Chargeback(start=start, end=end, group_by=group_by, max_gap_seconds=max_gap,
                      capacity_bytes=capacity_bytes, rows=rows)


#: Columns of the CSV download after the period and the grouping's key fields (units in the names).
CSV_VALUE_COLUMNS = ("byte_hours (B·h)", "gib_hours (GiB·h)", "average_bytes (B)", "capacity_share (fraction)")


def csv_text(report: Chargeback) -> str:
    """The rows of ``report`` as CSV (RFC 4180, ``\\r\\n`` line ends), largest use first.

    Header: ``period_start``, ``period_end`` (ISO 8601 UTC, the same on every line), the grouping's key fields
    (``GROUPINGS``), then ``CSV_VALUE_COLUMNS``: bytes × hours, GiB × hours, the average bytes held over the
    period, and the fraction of the pool's capacity over the period (empty while the capacity is unknown).
    """
    keys: Sequence[str] = GROUPINGS[report.group_by]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["period_start", "period_end", *keys, *CSV_VALUE_COLUMNS])
    period = [report.start.isoformat(), report.end.isoformat()]
    for row in report.rows:
        share = report.share(row.byte_hours)
        writer.writerow([*period, *(row.key[name] for name in keys), repr(row.byte_hours), repr(row.gib_hours),
                         repr(report.average_bytes(row.byte_hours)), "" if share is None else repr(share)])
    return out.getvalue()
