"""Read-side queries shared by the pages, the live checks and the rolling upgrade (no HTTP here).

* ``occupancy_series(window, filters)`` — bytes per release namespace over time from ``OccupancySample``
  (raw rows and the 1-minute / 1-hour rollups together: each time is held by exactly one level, because a
  rollup deletes the rows it folds), bucketed for the chart, plus per-release summary numbers (latest,
  average, peak bytes, hit ratio over the window, in-flight requests, evicted blocks by cause) and per bucket the
  hit ratio and the blocks evicted by cause (``store``: the master evicted them; ``budget``: the agent removed them
  over a budget; ``orphan``: the agent removed them as orphans — ``OccupancySample.EVICTION_CAUSES``).
* ``current_occupancy(filters)`` — per release, the sum over nodes of each node's newest raw sample
  (``LatestSample``: one row per node and cache scope, kept by the database as samples are inserted).
* ``latest_master_quotas()`` — newest read-back from the Mooncake master per tenant.

Series and current occupancy are per release: keyed by the whole release's ``agent.contract.scope.CacheScope``
(``CacheScope.release_scope()``: ``request_group`` ``None``, JSON ``null``), its rows (request groups and the row
without a request group, ``""``) summed unless a filter selects one.
Sizes are bytes, times timezone-aware UTC.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection, connections, router, transaction
from django.db.models import F, Max, Window
from django.db.models.functions import Collate
from django.utils import timezone

from agent.contract.scope import CacheScope
from dashboard.models import LatestSample, MasterQuotaSample, OccupancySample, ScopeSeries
from dashboard.telemetry import vendor_sql

#: Eviction causes in display order (``cause`` label values), and the sample counter of each.
EVICTION_CAUSES: tuple[str, ...] = tuple(OccupancySample.EVICTION_CAUSES.values())
_CAUSE_COUNTERS: tuple[str, ...] = tuple(OccupancySample.EVICTION_CAUSES)

#: Window name -> (length in seconds, bucket width in seconds). 15 minutes ... 30 days, 30-120 buckets each.
WINDOWS: dict[str, tuple[int, int]] = {
    "15m": (15 * 60, 30),
    "1h": (3600, 60),
    "6h": (6 * 3600, 300),
    "24h": (86400, 900),
    "7d": (7 * 86400, 7200),
    "30d": (30 * 86400, 21600),
}
WINDOW_LABELS: dict[str, str] = {
    "15m": "15 minutes", "1h": "1 hour", "6h": "6 hours", "24h": "24 hours", "7d": "7 days", "30d": "30 days",
}
DEFAULT_WINDOW = "1h"
#: Window -> the ``ScopeSeries`` width its buckets are read from (occupancy summed over nodes,
#: ``dashboard.telemetry.series``; its bucket width: one row per release and bucket); ``None``: the samples
#: themselves (every node's rows).
WINDOW_TIERS: dict[str, int | None] = {"15m": None, "1h": 60, "6h": 300, "24h": 900, "7d": 7200, "30d": 21600}

#: Most series a chart holds: the releases with the most bytes over the window (the sum of their bucket values;
#: ties by name), the others summed into one more series (``SeriesSummary.other``: how many). A fleet's thousands of
#: releases would make megabytes of JSON no chart can show.
CHART_MAX_SERIES = 40

#: Seconds a node's newest sample may be old and still count as "current" occupancy.
CURRENT_WINDOW_SECONDS = 15 * 60


@dataclass(frozen=True)
class OccupancyFilter:
    """Which samples to include (the fields of ``CacheScope``). ``tenant_id``, ``served_model_name``,
    ``namespace``: an empty string means "all". ``request_group``: ``None`` means every row of the release (the
    whole release); a name selects that request group's rows and ``""`` (``NO_REQUEST_GROUP``) the rows without a
    request group (a query string cannot say that: ``?request_group=`` empty means no filter, ``from_params``).

    ``tenant_ids``: the Mooncake tenant ids the viewer may see (``tenants.access.visible_tenant_ids``); ``None``
    means every tenant. It is not a query parameter (``as_params`` leaves it out).
    """

    tenant_id: str = ""
    served_model_name: str = ""
    namespace: str = ""
    request_group: str | None = None
    tenant_ids: frozenset[str] | None = None

    @classmethod
    def from_params(cls, params, *, tenant_ids: frozenset[str] | None = None) -> OccupancyFilter:
        """From query parameters named like ``CacheScope``'s fields (a ``QueryDict`` or a dict): blank values and
        absent ones mean no filter (so ``?request_group=`` is every group)."""
        values = {name: (params.get(name) or "").strip() for name in CacheScope._fields}
        return cls(tenant_id=values["tenant_id"], served_model_name=values["served_model_name"],
                   namespace=values["namespace"], request_group=values["request_group"] or None,
                   tenant_ids=tenant_ids)

    def apply(self, queryset):
        """``queryset`` of ``OccupancySample`` narrowed to this filter."""
        for name in ("tenant_id", "served_model_name", "namespace"):
            value = getattr(self, name)
            if value:
                queryset = queryset.filter(**{name: value})
        if self.request_group is not None:
            queryset = queryset.filter(request_group=self.request_group)
        if self.tenant_ids is not None:
            queryset = queryset.filter(tenant_id__in=sorted(self.tenant_ids))
        return queryset

    def as_params(self) -> dict[str, str]:
        """Query parameters of the occupancy page / JSON endpoint for this filter (empty ones left out): the
        names of ``CacheScope``'s fields, as ``GET /api/v1/telemetry/occupancy/`` takes them (``from_params``
        reads them back; the rows without a request group, ``""``, have no parameter)."""
        return {name: value for name in CacheScope._fields if (value := getattr(self, name))}


@dataclass
class SeriesSummary:
    """One release's line of the chart and its numbers over the window (bytes; ratio in [0, 1] or None); ``key``
    is the whole release (``request_group`` ``None``: ``null`` in ``as_dict``)."""

    key: CacheScope
    data: list[int | None]
    latest_bytes: int | None = None
    average_bytes: int | None = None
    peak_bytes: int | None = None
    hit_blocks: int = 0
    miss_blocks: int = 0
    in_flight_requests: int = 0
    #: Bytes of cached blocks whose prefix parent is gone (unreachable by a prefix lookup), newest per node.
    orphaned_bytes: int = 0
    #: Hit / miss blocks counted in each bucket (the counters' increases ending in it), aligned with ``data``.
    hit_blocks_data: list[int] = field(default_factory=list)
    miss_blocks_data: list[int] = field(default_factory=list)
    #: Blocks evicted during the window per cause (``EVICTION_CAUSES``), and per bucket (aligned with ``data``).
    evicted_blocks: dict[str, int] = field(default_factory=dict)
    evicted_blocks_data: dict[str, list[int]] = field(default_factory=dict)
    #: 0: one release; N: the N releases beyond ``CHART_MAX_SERIES`` summed (``key`` is then all blank).
    other: int = 0

    @property
    def label(self) -> str:
        """``tenant/model/namespace`` (the chart's series label); ``(other: N releases)`` for the rest summed."""
        return f"(other: {self.other} releases)" if self.other else self.key.label

    @property
    def hit_ratio(self) -> float | None:
        """Hit blocks / (hit + miss blocks) counted during the window; None without lookups."""
        total = self.hit_blocks + self.miss_blocks
        return self.hit_blocks / total if total else None

    @property
    def hit_ratio_data(self) -> list[float | None]:
        """Hit ratio per bucket in [0, 1] (hit / (hit + miss) blocks counted in it); None without lookups."""
        return _ratios(self.hit_blocks_data, self.miss_blocks_data)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, **self.key._asdict(), "data": self.data, "latest_bytes": self.latest_bytes,
            "average_bytes": self.average_bytes,
            "peak_bytes": self.peak_bytes, "hit_blocks": self.hit_blocks, "miss_blocks": self.miss_blocks,
            "hit_ratio": self.hit_ratio, "in_flight_requests": self.in_flight_requests,
            "orphaned_bytes": self.orphaned_bytes, "hit_ratio_data": self.hit_ratio_data,
            "evicted_blocks": self.evicted_blocks, "evicted_blocks_data": self.evicted_blocks_data,
            "other": self.other,
        }


@dataclass
class OccupancySeries:
    """Bucketed bytes per release: ``buckets`` (bucket starts), one ``SeriesSummary`` per release."""

    window: str
    bucket_seconds: int
    start: datetime
    end: datetime
    buckets: list[datetime]
    series: list[SeriesSummary] = field(default_factory=list)

    def totals(self) -> list[int | None]:
        """Stacked total per bucket (None where no release has data)."""
        out: list[int | None] = []
        for index in range(len(self.buckets)):
            values = [s.data[index] for s in self.series if s.data[index] is not None]
            out.append(sum(values) if values else None)
        return out

    def hit_ratios(self) -> list[float | None]:
        """Hit ratio per bucket over every release shown (their hit and miss blocks summed); None without
        lookups."""
        hits = [sum(s.hit_blocks_data[i] for s in self.series) for i in range(len(self.buckets))]
        misses = [sum(s.miss_blocks_data[i] for s in self.series) for i in range(len(self.buckets))]
        return _ratios(hits, misses)

    def evictions(self) -> dict[str, list[int]]:
        """Blocks evicted per cause (``EVICTION_CAUSES``) and bucket over every release shown."""
        return {cause: [sum(s.evicted_blocks_data[cause][i] for s in self.series) for i in range(len(self.buckets))]
                for cause in EVICTION_CAUSES}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form served by the occupancy data endpoint."""
        return {
            "window": self.window,
            "bucket_seconds": self.bucket_seconds,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "labels": [bucket.isoformat() for bucket in self.buckets],
            "timestamps_ms": [int(bucket.timestamp() * 1000) for bucket in self.buckets],
            "series": [s.as_dict() for s in self.series],
            "totals": self.totals(),
            "hit_ratios": self.hit_ratios(),
            "evictions": self.evictions(),
        }


def _ratios(hits: list[int], misses: list[int]) -> list[float | None]:
    """``hit / (hit + miss)`` per position; None where both are 0."""
    return [hit / (hit + miss) if hit + miss else None for hit, miss in zip(hits, misses, strict=True)]


def _floor(ts: datetime, seconds: int) -> datetime:
    epoch = int(ts.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=ts.tzinfo or UTC)


_RELEASE = ("tenant_id", "served_model_name", "namespace")
_PAIR = ("node_name", *_RELEASE, "request_group")  # one node's rows of one cache scope
_COUNTERS = ("hit_blocks", "miss_blocks", *_CAUSE_COUNTERS)


def _series_sql(vendor: str, base_sql: str) -> str:
    """One statement over the rows of ``base_sql`` (``OccupancySample`` columns; params ``start`` epoch seconds,
    ``width``, ``last`` bucket index follow ``base_sql``'s), returning rows ``(kind, index, tenant_id,
    served_model_name, namespace, a, b, *increases)``: kind 0 per bucket and release (``a`` = bytes, the
    increases of ``_COUNTERS``), kind 1 per release (``a`` = in-flight requests, ``b`` = orphaned bytes of each
    node's and scope's last row, summed)."""
    pair, release = ", ".join(_PAIR), ", ".join(_RELEASE)
    partition = ", ".join(vendor_sql.bytewise(vendor, name) for name in _PAIR)
    index = vendor_sql.least(vendor, f"({vendor_sql.epoch_seconds(vendor, 'ts')} - %s) / %s", "%s")
    lags = ", ".join(f"LAG({name}) OVER w AS prev_{name}" for name in _COUNTERS)
    # an increase of a cumulative counter; a decrease is an agent restart (the new value counts from zero)
    increases = ", ".join(
        f"CASE WHEN {name} >= prev_{name} THEN {name} - prev_{name} WHEN {name} < prev_{name} THEN {name} ELSE 0 END"
        f" AS {name}" for name in _COUNTERS)
    sums = ", ".join(f"sum({name}) AS {name}" for name in _COUNTERS)
    zeros = ", ".join("0" for _ in _COUNTERS)
    cell_bytes = vendor_sql.half_up_average(vendor, "weighted", "weight")
    return f"""
        WITH rows AS (
            SELECT {pair}, {index} AS idx, bytes, CASE WHEN samples > 1 THEN samples ELSE 1 END AS weight,
                   in_flight_requests, orphaned_bytes, {", ".join(_COUNTERS)}, {lags},
                   LEAD(id) OVER w IS NULL AS is_last
            FROM ({base_sql}) base
            WINDOW w AS (PARTITION BY {partition} ORDER BY ts, id)
        ), deltas AS (
            SELECT {pair}, idx, bytes, weight, in_flight_requests, orphaned_bytes, is_last, {increases} FROM rows
        ), cells AS (
            SELECT idx, {pair}, sum({vendor_sql.weighted(vendor, "bytes", "weight")}) AS weighted,
                   sum(weight) AS weight, {sums}
            FROM deltas GROUP BY idx, {pair}
        )
        SELECT 0, idx, {release}, sum({cell_bytes}), 0, {sums} FROM cells GROUP BY idx, {release}
        UNION ALL
        SELECT 1, 0, {release}, sum(in_flight_requests), sum(orphaned_bytes), {zeros}
        FROM deltas WHERE is_last GROUP BY {release}
    """


_TIER_VALUES = ("bytes", "in_flight_requests", "orphaned_bytes", *_COUNTERS)


def _totals_sql(vendor: str, base_sql: str) -> str:
    """One pass over the ``ScopeSeries`` rows of ``base_sql`` returning the totals per release ``(NULL, tenant_id,
    served_model_name, namespace, sums of _TIER_VALUES..., rows)`` and per bucket ``(ts, NULL, NULL, NULL, sums...,
    rows)`` (PostgreSQL: ``GROUPING SETS``, two hash aggregates over one scan; SQLite: ``UNION ALL`` of both). By
    ``ts``, the bucket start (the tier's width is the chart's): no per-row arithmetic (PostgreSQL's epoch of a
    timestamp is a ``numeric``, several times the cost of the scan)."""
    release = ", ".join(_RELEASE)
    sums = ", ".join(f"CAST(sum({name}) AS BIGINT)" for name in _TIER_VALUES)
    if vendor == "postgresql":
        return (f"SELECT CASE WHEN GROUPING(ts) = 0 THEN ts END, {release}, {sums}, count(*) FROM ({base_sql}) base "
                f"GROUP BY GROUPING SETS (({release}), (ts))")
    return (f"SELECT NULL, {release}, {sums}, count(*) FROM ({base_sql}) base GROUP BY {release} "
            f"UNION ALL SELECT ts, NULL, NULL, NULL, {sums}, count(*) FROM ({base_sql}) base GROUP BY ts")


def _cells_sql(base_sql: str, kept: int | None) -> str:
    """The ``ScopeSeries`` rows of ``base_sql`` as chart cells ``(ts, tenant_id, served_model_name, namespace,
    *_TIER_VALUES)``: the rows as they are, one per release and bucket (the tier's width is the chart's); ``kept``:
    only those of the ``kept`` releases listed after ``base_sql``'s params (3 params each)."""
    release = ", ".join(_RELEASE)
    where = "" if kept is None else f" WHERE ({release}) IN (VALUES {', '.join(['(%s, %s, %s)'] * kept)})"
    return f"SELECT ts, {release}, {', '.join(_TIER_VALUES)} FROM ({base_sql}) base{where}"


def _tier_rows(filters: OccupancyFilter, tier: int, start: datetime, end: datetime, width: int,
               count: int) -> list[tuple]:
    """The chart's rows (as ``_series_sql``'s) for ``filters`` over ``[start, end]`` from the ``tier``-wide
    ``ScopeSeries`` rows (``tier`` must be the chart's bucket ``width``: ``ValueError`` otherwise): per bucket and
    release its row's values (bytes, the counters' increases), per release the in-flight requests and orphaned bytes
    of its newest bucket. Beyond ``CHART_MAX_SERIES`` releases (ranked by the sum of their bytes over the window,
    ties by name in byte order), the others are summed per bucket under the key ``(None, None, None)``, their number
    in ``b``.

    Two statements: the totals per release (the ranking) and per bucket in one pass (``_totals_sql``), then the
    kept releases' rows (``_cells_sql``, named as parameters); the others' sums per bucket are the bucket's total
    minus the kept releases' (exact: integer sums). A join of the rows with per-release totals let a planner without
    statistics (right after the series was written) loop over both (7.7 s for 5,760 cells); ranking by window
    functions sorted every row twice (1.2 s for 24 hours of 2,000 releases)."""
    if tier != width:
        raise ValueError(f"series tier {tier} s for {width} s buckets: WINDOW_TIERS must map a window to its width")
    base = filters.apply(ScopeSeries.objects.filter(width=tier, ts__gte=start, ts__lte=end))
    if filters.request_group is None:
        base = base.filter(request_group__isnull=True)  # the release rows
    try:
        base_sql, base_params = base.values("ts", *_RELEASE, *_TIER_VALUES).query.sql_with_params()
    except EmptyResultSet:  # a viewer who may see no tenant
        return []
    vendor = connection.vendor
    settings_sql = vendor_sql.analytic_settings(vendor)
    cap = CHART_MAX_SERIES
    # SET LOCAL needs a transaction; none on SQLite, where one would take the write lock (IMMEDIATE)
    with transaction.atomic() if settings_sql else nullcontext(), connection.cursor() as cursor:
        for statement in settings_sql:
            cursor.execute(statement)
        cursor.execute(_totals_sql(vendor, base_sql), [*base_params] * (1 if vendor == "postgresql" else 2))
        totals = cursor.fetchall()
        releases = {tuple(row[1:4]): row[4] for row in totals if row[0] is None}
        kept = None
        if len(releases) > cap:
            kept = sorted(releases, key=lambda key: (-releases[key], *(name.encode() for name in key)))[:cap]
        cursor.execute(_cells_sql(base_sql, None if kept is None else len(kept)),
                       [*base_params, *(name for key in kept or () for name in key)])
        cells = [(_index(ts, start, width, count), *rest) for ts, *rest in cursor.fetchall()]
    totals = [(_index(row[0], start, width, count), *row[1:]) for row in totals if row[0] is not None]
    if kept is not None:  # the others per bucket: the bucket's totals less the kept releases' rows
        others = {row[0]: [*row[4:]] for row in totals}
        for cell in cells:
            rest = others[cell[0]]
            for n, value in enumerate(cell[4:]):
                rest[n] -= value
            rest[-1] -= 1
        cells.extend((index, None, None, None, *rest[:-1]) for index, rest in others.items() if rest[-1])
    # as _series_sql's rows: kind 0 per bucket (b: the releases summed), kind 1 per release (in-flight and orphaned
    # of its newest bucket); the releases beyond the cap under the key (None, None, None)
    summed = 0 if kept is None else len(releases) - cap
    newest: dict[tuple, tuple] = {}
    for cell in cells:
        if cell[1:4] not in newest or newest[cell[1:4]][0] < cell[0]:
            newest[cell[1:4]] = cell
    return [*((0, cell[0], *cell[1:4], cell[4], summed if cell[1] is None else 0, *cell[7:]) for cell in cells),
            *((1, 0, *key, cell[5], cell[6], *(0 for _ in _COUNTERS)) for key, cell in newest.items())]


def occupancy_series(window: str = DEFAULT_WINDOW, filters: OccupancyFilter | None = None,
                     now: datetime | None = None) -> OccupancySeries:
    """Bytes per release over ``window`` (a key of ``WINDOWS``), bucketed; aggregated in SQL (one statement; for the
    series' windows two: the ranking, then the cells).

    Windows of an hour and longer (``WINDOW_TIERS``) read the occupancy summed over nodes (``ScopeSeries``, one
    row per release or request group and bucket of the window's width, ``dashboard.telemetry.series``): a
    release's value in a bucket is that row's bytes (the release's, or the selected request group's, bytes summed
    over nodes, averaged over the bucket as the tiers average), ``None`` without a row; counters are the increases
    in it; in-flight requests and orphaned bytes those of the release's newest bucket. Those rows are written by the
    rollup for each minute ``series.SETTLE_SECONDS`` after it ends (coarser buckets when complete): the newest
    minutes are not shown yet. At most ``CHART_MAX_SERIES`` series (the rest summed in one).

    The 15-minute window reads every node's samples: in each bucket, a node's value for one scope (release and
    request group) is the sample-weighted average of its rows in that bucket (rollup rows weigh ``samples``;
    rounded half up); a release's value is the sum of those over nodes and request groups; ``None`` when no row of
    the release fell in the bucket. Hit and miss blocks count the increases of the agents' cumulative counters
    between consecutive rows (a decrease is an agent restart: the new value counts from zero); an increase counts
    in the bucket of the row that ends it. Evicted blocks by cause are counted the same way. In-flight requests
    and orphaned bytes: of each node's and scope's last row, summed. Raises ``KeyError`` for an unknown window.
    """
    length, width = WINDOWS[window]
    filters = filters or OccupancyFilter()
    end = now or timezone.now()
    start = _floor(end - timedelta(seconds=length), width)
    count = int((end - start).total_seconds() // width) + 1
    buckets = [start + timedelta(seconds=width * i) for i in range(count)]
    tier = WINDOW_TIERS[window]
    if tier is None:
        rows = _sample_rows(filters, start, end, width, count)
    else:
        rows = _tier_rows(filters, tier, start, end, width, count)
    return _assemble(rows, window, width, start, end, buckets)


def _index(ts, start: datetime, width: int, count: int) -> int:
    """The chart bucket of a bucket start ``ts`` as a cursor returns it (a datetime, or SQLite's text)."""
    return min(int((_aware(ts) - start).total_seconds()) // width, count - 1)


def _sample_rows(filters: OccupancyFilter, start: datetime, end: datetime, width: int, count: int) -> list[tuple]:
    """``_series_sql``'s rows for ``filters`` over ``[start, end]`` from every node's samples."""
    # every level: each time is held by one (a rollup deletes what it folds); level IN (...) lets the (level, ts)
    # indexes serve the time range
    base = filters.apply(OccupancySample.objects.filter(level__in=list(OccupancySample.Level.values),
                                                        ts__gte=start, ts__lte=end))
    base_sql, base_params = base.values("id", "ts", *_PAIR, "bytes", "samples", "in_flight_requests",
                                        "orphaned_bytes", *_COUNTERS).query.sql_with_params()
    settings_sql = vendor_sql.analytic_settings(connection.vendor)
    # SET LOCAL needs a transaction; none on SQLite, where one would take the write lock (IMMEDIATE)
    with transaction.atomic() if settings_sql else nullcontext(), connection.cursor() as cursor:
        for statement in settings_sql:
            cursor.execute(statement)
        cursor.execute(_series_sql(connection.vendor, base_sql),
                       [int(start.timestamp()), width, count - 1, *base_params])
        return _capped(cursor.fetchall())


def _capped(rows: list[tuple]) -> list[tuple]:
    """``_series_sql``'s rows with the releases beyond ``CHART_MAX_SERIES`` (ranked as ``_tier_sql`` ranks them)
    summed under the key ``(None, None, None)``, their number in kind 0 rows' ``b``."""
    totals: dict[tuple, int] = defaultdict(int)
    for row in rows:
        if row[0] == 0:
            totals[row[2:5]] += int(row[5])
    ranked = sorted(totals, key=lambda key: (-totals[key], key))
    if len(ranked) <= CHART_MAX_SERIES:
        return rows
    kept = set(ranked[:CHART_MAX_SERIES])
    others = len(ranked) - CHART_MAX_SERIES
    out = [row for row in rows if row[2:5] in kept]
    merged: dict[tuple[int, int], list[int]] = {}
    for row in rows:
        if row[2:5] in kept:
            continue
        cell = merged.setdefault((row[0], row[1]), [0] * (len(row) - 5))
        for n, value in enumerate(row[5:]):
            cell[n] += int(value)
    for (kind, index), (first, second, *counters) in merged.items():
        out.append((kind, index, None, None, None, first, others if kind == 0 else second, *counters))
    return out


def _assemble(rows: list[tuple], window: str, width: int, start: datetime, end: datetime,
              buckets: list[datetime]) -> OccupancySeries:
    """The ``OccupancySeries`` of ``_series_sql`` / ``_tier_sql`` rows."""
    count = len(buckets)
    data: dict[CacheScope, list[int | None]] = {}
    per_bucket: dict[CacheScope, list[list[int]]] = {}
    last: dict[CacheScope, tuple[int, int]] = {}
    other_key, others = CacheScope("", "", ""), 0  # the releases beyond CHART_MAX_SERIES (key None in the rows)
    for kind, index, tenant_id, model, namespace, first, second, *counters in rows:
        key = CacheScope(tenant_id, model, namespace) if tenant_id is not None else other_key  # the whole release
        if kind == 1:
            last[key] = (int(first), int(second))
            continue
        if tenant_id is None:  # the tier statement counts per bucket the ranks in it: the whole window's is the most
            others = max(others, int(second))
        values = data.get(key)
        if values is None:  # the lists are made once per release, not per row
            values = data[key] = [None] * count
            per_bucket[key] = [[0] * count for _ in _COUNTERS]
        values[index] = int(first)
        for column, value in zip(per_bucket[key], counters, strict=True):
            column[index] = int(value)
    series = []
    for key in [*sorted(key for key in data if key is not other_key), *([other_key] if others else [])]:
        values, columns = data[key], per_bucket[key]
        present = [value for value in values if value is not None]
        totals = [sum(column) for column in columns]
        in_flight, orphaned = last.get(key, (0, 0))
        series.append(SeriesSummary(
            key=key, data=values,
            latest_bytes=next((value for value in reversed(values) if value is not None), None),
            average_bytes=round(sum(present) / len(present)) if present else None,
            peak_bytes=max(present) if present else None,
            hit_blocks=totals[0], miss_blocks=totals[1], in_flight_requests=in_flight, orphaned_bytes=orphaned,
            hit_blocks_data=columns[0], miss_blocks_data=columns[1],
            evicted_blocks={cause: totals[2 + n] for n, cause in enumerate(EVICTION_CAUSES)},
            evicted_blocks_data={cause: columns[2 + n] for n, cause in enumerate(EVICTION_CAUSES)},
            other=others if key is other_key else 0,
        ))
    return OccupancySeries(window=window, bucket_seconds=width, start=start, end=end, buckets=buckets,
                           series=series)


@dataclass
class ReleaseNow:
    """Current occupancy of one release (its ``CacheScope.release_scope()``): sums over nodes of each node's
    newest raw sample (bytes).

    ``by_node`` maps node name -> bytes; ``by_group`` request group name (``""``: the row without a request group)
    -> bytes; ``hit_blocks`` / ``miss_blocks`` are the agents' counters since they started.
    """

    key: CacheScope
    bytes: int = 0
    blocks: int = 0
    in_flight_requests: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    newest: datetime | None = None
    by_node: dict[str, int] = field(default_factory=dict)
    by_group: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.key.label

    @property
    def hit_ratio(self) -> float | None:
        total = self.hit_blocks + self.miss_blocks
        return self.hit_blocks / total if total else None


def _newest_pairs(filters: OccupancyFilter, now: datetime, max_age_seconds: int, node_name: str | None):
    """``LatestSample`` rows of ``filters`` (``node_name``'s only, when given) whose newest raw sample is not older
    than ``now - max_age_seconds``, each with ``newest``: the newest such ``ts`` of its node and release. A sample
    dated after ``now`` (an agent's clock ahead, within the skew ingest accepts: ``agent_auth.check_not_ahead``)
    counts: it is the pair's newest, and the one before it is not kept."""
    base = filters.apply(LatestSample.objects.filter(ts__gte=now - timedelta(seconds=max_age_seconds)))
    if node_name is not None:
        base = base.filter(node_name=node_name)
    release = ("node_name", "tenant_id", "served_model_name", "namespace")
    # grouped byte by byte (equal names are equal bytes): a linguistic collation's sort is several times slower
    keys = [Collate(F(name), "C") if connection.vendor == "postgresql" else F(name) for name in release]
    return base.order_by().annotate(newest=Window(Max("ts"), partition_by=keys))


def current_occupancy(filters: OccupancyFilter | None = None, *, now: datetime | None = None,
                      max_age_seconds: int = CURRENT_WINDOW_SECONDS,
                      node_name: str | None = None) -> dict[CacheScope, ReleaseNow]:
    """Per release (keyed by its ``CacheScope.release_scope()``), the sum over nodes of each node's newest raw
    sample of it (not older than ``max_age_seconds``; every request group's row at that time). A node that stopped
    reporting longer ago drops out. ``node_name``: of that node's samples only (a node page: one node's share of
    each release, ``by_node``). Read from ``LatestSample`` (the newest raw sample of each node and cache scope:
    one row per pair, not the window's samples); ``max_age_seconds`` beyond the raw horizon
    (``KVPOOL_ROLLUP_RAW_AFTER_SECONDS``) sees no more than it."""
    now = now or timezone.now()
    filters = filters or OccupancyFilter()
    result: dict[CacheScope, ReleaseNow] = {}
    try:
        rows_sql, params = _newest_pairs(filters, now, max_age_seconds, node_name).values_list(
            "ts", "newest", "node_name", "tenant_id", "served_model_name", "namespace", "request_group", "bytes",
            "blocks", "in_flight_requests", "hit_blocks", "miss_blocks").query.sql_with_params()
    except EmptyResultSet:  # a viewer who may see no tenant
        return result
    with connections[router.db_for_read(LatestSample)].cursor() as cursor:
        cursor.execute(f"SELECT * FROM ({rows_sql}) w WHERE w.ts = w.newest", params)
        fetched = cursor.fetchall()
    for ts, _newest, node, tenant_id, model, namespace, group, size, blocks, flight, hit, miss in fetched:
        ts = _aware(ts)
        key = CacheScope(tenant_id, model, namespace)  # the whole release
        entry = result.setdefault(key, ReleaseNow(key=key))
        entry.bytes += size
        entry.blocks += blocks
        entry.in_flight_requests += flight
        entry.hit_blocks += hit
        entry.miss_blocks += miss
        entry.by_node[node] = entry.by_node.get(node, 0) + size
        entry.by_group[group] = entry.by_group.get(group, 0) + size
        entry.newest = ts if entry.newest is None or ts > entry.newest else entry.newest
    return result


def _aware(value) -> datetime:
    """A ``ts`` as a raw cursor returns it (a datetime, or SQLite's text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def tenant_bytes(occupancy: dict[CacheScope, ReleaseNow]) -> dict[str, int]:
    """Sum of ``current_occupancy`` per tenant_id."""
    totals: dict[str, int] = defaultdict(int)
    for key, entry in occupancy.items():
        totals[key.tenant_id] += entry.bytes
    return dict(totals)


def tenant_bytes_now(*, now: datetime | None = None, max_age_seconds: int = CURRENT_WINDOW_SECONDS) -> dict[str, int]:
    """``tenant_bytes(current_occupancy())`` summed in the database: per tenant_id, the bytes of each node's newest
    raw sample of each release (every request group's row at that time), one query over ``LatestSample`` (one row
    per node and cache scope) whatever the fleet (the overview's figure; ``current_occupancy`` builds every
    release's entry in Python)."""
    now = now or timezone.now()
    rows_sql, params = _newest_pairs(OccupancyFilter(), now, max_age_seconds, None).values(
        "tenant_id", "ts", "bytes", "newest").query.sql_with_params()
    sql = f"SELECT w.tenant_id, SUM(w.bytes) FROM ({rows_sql}) w WHERE w.ts = w.newest GROUP BY w.tenant_id"
    with connections[router.db_for_read(LatestSample)].cursor() as cursor:
        cursor.execute(sql, params)
        return {tenant_id: int(total) for tenant_id, total in cursor.fetchall()}


def latest_master_quotas() -> dict[str, MasterQuotaSample]:
    """tenant_id -> the newest ``MasterQuotaSample`` (the master's requested/effective/charged bytes)."""
    newest = dict(MasterQuotaSample.objects.values("tenant_id").annotate(ts=Max("ts")).values_list("tenant_id", "ts"))
    if not newest:
        return {}
    rows = MasterQuotaSample.objects.filter(tenant_id__in=list(newest), ts__in=set(newest.values()))
    return {row.tenant_id: row for row in rows if newest.get(row.tenant_id) == row.ts}
