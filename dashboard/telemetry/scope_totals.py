"""Per cache scope, the sums over nodes of each node's newest report: set-based queries for ``/metrics``.

``scope_totals(since)`` finds each node's newest ``Report`` sent at or after ``since`` (``GROUP BY node_name`` over
the ``sent_at`` index: one row per node), then sums per cache scope, in the database, the raw ``OccupancySample``
rows of exactly those reports. The sample query names the reports' times (``ts IN (...)``: a bitmap scan of the
``(level, ts)`` index, whatever the number of older raw rows) and keeps the rows whose ``(node_name, ts)`` pair is
one of them (a semi-join: a row of an older report sent at another node's newest time does not count). At 1,000
nodes and 10,000 scopes the dashboard receives 10,000 rows, not every node's samples.

Scopes of tenants no longer in the registry are dropped from the result in Python: joined with the tenants in SQL,
PostgreSQL misjudged the row count and looped over every pair (23 s instead of 0.4 s, ``bench.metrics_scrape``).
"""
from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Max

from agent.contract.scope import CacheScope
from dashboard.models import OccupancySample, Report

#: Summed columns, in the order of the query's result (gauges, then counters).
FIELDS: tuple[str, ...] = (*OccupancySample.GAUGES, *OccupancySample.COUNTERS)


def _sql(nodes: int) -> str:
    """The per-scope sums over ``nodes`` (node name, report time) pairs, bound first, then the level."""
    sums = ", ".join(f"SUM(o.{name})" for name in FIELDS)
    key = "o.tenant_id, o.served_model_name, o.namespace, o.request_group"
    pairs = ", ".join(["(%s, %s)"] * nodes)
    times = ", ".join(["%s"] * nodes)
    return (
        f"SELECT {key}, {sums} FROM {OccupancySample._meta.db_table} o "
        f"WHERE (o.node_name, o.ts) IN (VALUES {pairs}) AND o.level = %s AND o.ts IN ({times}) GROUP BY {key}")


def newest_reports(since: datetime) -> list[tuple[str, datetime]]:
    """``(node name, sent_at)`` of each node's newest report sent at or after ``since``."""
    return list(Report.objects.filter(sent_at__gte=since).values("node_name").annotate(ts=Max("sent_at"))
                .values_list("node_name", "ts"))


def sql_and_params(newest: list[tuple[str, datetime]]) -> tuple[str, list]:
    """The per-scope query over the ``newest`` reports and its parameters (``bench.metrics_scrape`` explains it)."""
    adapt = connection.ops.adapt_datetimefield_value
    params: list = [value for node, ts in newest for value in (node, adapt(ts))]
    params += [OccupancySample.Level.RAW, *(adapt(ts) for _, ts in newest)]
    return _sql(len(newest)), params


def scope_totals(since: datetime) -> dict[CacheScope, dict[str, int]]:
    """Cache scope -> ``{field: sum}`` (``FIELDS``: bytes, blocks, ..., counters since each agent started) over the
    newest report of every node sent at or after ``since``; scopes of tenants deleted from the registry are left
    out, a node without a report since then drops out of the sums."""
    from tenants.models import Tenant

    newest = newest_reports(since)
    if not newest:
        return {}
    sql, params = sql_and_params(newest)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    tenants = set(Tenant.objects.values_list("tenant_id", flat=True))
    return {CacheScope(*row[:4]): {name: int(value or 0) for name, value in zip(FIELDS, row[4:], strict=True)}
            for row in rows if row[0] in tenants}
