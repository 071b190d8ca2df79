"""Per cache scope, the sums over nodes of each node's newest report: one set-based query for ``/metrics``.

``scope_totals(since)`` finds each node's newest ``Report`` sent at or after ``since`` (``GROUP BY node_name``
over the ``sent_at`` index), joins the raw ``OccupancySample`` rows of exactly that report (the ``(level, ts)``
index, one lookup per node) and sums them per cache scope in the database, for tenants still in the registry. At
1,000 nodes and 10,000 scopes the dashboard receives 10,000 rows, not every node's samples.
"""
from __future__ import annotations

from datetime import datetime

from django.db import connection

from agent.contract.scope import CacheScope
from dashboard.models import OccupancySample, Report

#: Summed columns, in the order of the query's result (gauges, then counters).
FIELDS: tuple[str, ...] = (*OccupancySample.GAUGES, *OccupancySample.COUNTERS)


def _sql() -> str:
    from tenants.models import Tenant

    sums = ", ".join(f"SUM(o.{name})" for name in FIELDS)
    key = "o.tenant_id, o.served_model_name, o.namespace, o.request_group"
    return (
        f"WITH newest AS (SELECT node_name, MAX(sent_at) AS ts FROM {Report._meta.db_table} "
        f"WHERE sent_at >= %s GROUP BY node_name) "
        f"SELECT {key}, {sums} FROM newest JOIN {OccupancySample._meta.db_table} o "
        f"ON o.level = %s AND o.ts = newest.ts AND o.node_name = newest.node_name "
        f"WHERE o.tenant_id IN (SELECT tenant_id FROM {Tenant._meta.db_table}) GROUP BY {key}")


def scope_totals(since: datetime) -> dict[CacheScope, dict[str, int]]:
    """Cache scope -> ``{field: sum}`` (``FIELDS``: bytes, blocks, ..., counters since each agent started) over the
    newest report of every node sent at or after ``since``; scopes of tenants deleted from the registry are left
    out, a node without a report since then drops out of the sums."""
    params = [connection.ops.adapt_datetimefield_value(since), OccupancySample.Level.RAW]
    with connection.cursor() as cursor:
        cursor.execute(_sql(), params)
        rows = cursor.fetchall()
    return {CacheScope(*row[:4]): {name: int(value or 0) for name, value in zip(FIELDS, row[4:], strict=True)}
            for row in rows}
