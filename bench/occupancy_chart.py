"""Occupancy chart queries at fleet size: p99 of the chart data (``queries.occupancy_series`` → JSON, what
``occupancy/data.json`` serves) per filter and window over ``--days`` days of rolled-up history, and the
database size per day of history.

    python -m bench.occupancy_chart [--nodes N] [--scopes S] [--per-node K] [--days D] [--repeats R] [--windows W,...]
                                    [--filters F,...] [--database-url URL] [--reuse NAME] [--explain FILE]

History: ``bench.fleet_history.load_history`` (1-hour rows, 1-minute rows for the last
``KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS``, raw rows for the last ``KVPOOL_ROLLUP_RAW_AFTER_SECONDS``) for ``N`` nodes
holding ``K`` of ``S`` cache scopes each (the issue's fleet: 1,000 nodes, 10,000 scopes, 50 per node). Filters:
everything, one tenant, one served model, one release, one request group (of one tenant). Baseline, same run:
``SELECT count(*)`` of the same rows (finding them, no aggregation); ratio = chart p99 / count p99. Goal: chart
p99 ≤ 300 ms for every filter. Size: ``pg_total_relation_size`` of the samples table (indexes included) / days,
and per row of each level.

Runs in a private database created on the server of ``--database-url`` and dropped at the end, unless
``--reuse NAME`` (created and loaded when missing, kept). The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from bench.ingest import private_database, server_url, setup_django

GOAL_MS = 300


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _filters(scopes):
    from dashboard.telemetry.queries import OccupancyFilter

    tenant, model, namespace, _ = scopes[0]
    group = next(scope for scope in scopes if scope[0] == tenant and scope[3])
    return {
        "everything": OccupancyFilter(),
        "tenant": OccupancyFilter(tenant_id=tenant),
        "model": OccupancyFilter(served_model_name=model),
        "release": OccupancyFilter(tenant_id=tenant, served_model_name=model, namespace=namespace),
        "group": OccupancyFilter(tenant_id=tenant, request_group=group[3]),
    }


def measure(scopes, repeats: int, explain, windows: list[str], names: list[str]) -> dict:
    """p99 ms per filter and window of the chart data and of the baseline count."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.db.models import Max

    from dashboard.models import OccupancySample, ScopeSeries
    from dashboard.telemetry import queries, vendor_sql

    now = OccupancySample.objects.aggregate(newest=Max("ts"))["newest"] + timedelta(seconds=10)
    results: dict = {}
    for name, filters in _filters(scopes).items():
        if name not in names:
            continue
        for window in windows:
            chart, count = [], []
            for _ in range(repeats):
                began = time.perf_counter()
                body = json.dumps(queries.occupancy_series(window, filters, now=now).as_dict())
                chart.append(time.perf_counter() - began)
                length, width = queries.WINDOWS[window]
                start = queries._floor(now - timedelta(seconds=length), width)
                rows = filters.apply(OccupancySample.objects.filter(ts__gte=start, ts__lte=now))
                began = time.perf_counter()
                matched = rows.count()
                count.append(time.perf_counter() - began)
            results.setdefault(name, {})[window] = {
                "p99_ms": round(1000 * _p99(chart), 1), "count_p99_ms": round(1000 * _p99(count), 1),
                "rows": matched, "json_bytes": len(body)}
            print(f"{name:10s} {window:4s} rows {matched:>10,}  chart p99 {1000 * _p99(chart):9.1f} ms  "
                  f"count p99 {1000 * _p99(count):8.1f} ms  json {len(body):>10,} B", file=sys.stderr, flush=True)
            if explain is not None and window in ("1h", "24h", "7d"):
                explain.write(f"== {name} {window}\n")
                explain.write(rows.explain(analyze=True, buffers=True) + "\n")
                with transaction.atomic(), connection.cursor() as cursor:
                    last = int((now - start).total_seconds() // width)
                    tier = queries.WINDOW_TIERS[window]
                    if tier is not None:  # the occupancy summed over nodes
                        series = filters.apply(ScopeSeries.objects.filter(width=tier, ts__gte=start, ts__lte=now))
                        if filters.request_group is None:
                            series = series.filter(request_group__isnull=True)
                        sql, params = series.values("ts", *queries._RELEASE, "bytes", "in_flight_requests",
                                                    "orphaned_bytes", *queries._COUNTERS).query.sql_with_params()
                        for statement in vendor_sql.analytic_settings(connection.vendor):
                            cursor.execute(statement)
                        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + queries._tier_sql(connection.vendor, sql),
                                       [int(start.timestamp()), width, last, *params,
                                        *[queries.CHART_MAX_SERIES] * 3])
                    else:
                        base = filters.apply(OccupancySample.objects.filter(
                            level__in=list(OccupancySample.Level.values), ts__gte=start, ts__lte=now))
                        sql, params = base.values("id", "ts", *queries._PAIR, "bytes", "samples",
                                                  "in_flight_requests", "orphaned_bytes",
                                                  *queries._COUNTERS).query.sql_with_params()
                        for statement in vendor_sql.analytic_settings(connection.vendor):
                            cursor.execute(statement)
                        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + queries._series_sql(connection.vendor, sql),
                                       [int(start.timestamp()), width, last, *params])
                    explain.write("\n".join(row[0] for row in cursor.fetchall()) + "\n\n")
                explain.flush()
    return results


def sizes(days: int) -> dict:
    """Bytes of the samples table (indexes included), per day of history and per row of each level; the same of
    the occupancy summed over nodes (``ScopeSeries``, rows per width)."""
    from django.db import connection

    from dashboard.models import OccupancySample, ScopeSeries

    table, series = OccupancySample._meta.db_table, ScopeSeries._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s), pg_relation_size(%s), pg_total_relation_size(%s)",
                       [table, table, series])
        total, heap, series_total = cursor.fetchone()
        cursor.execute(f"SELECT level, count(*) FROM {table} GROUP BY level ORDER BY level")
        rows = dict(cursor.fetchall())
        cursor.execute(f"SELECT width, count(*) FROM {series} GROUP BY width ORDER BY width")
        series_rows = dict(cursor.fetchall())
    count = sum(rows.values())
    return {"table_bytes": total, "heap_bytes": heap, "rows_by_level": rows,
            "bytes_per_row": round(total / count, 1) if count else None,
            "bytes_per_day": round(total / days), "series_table_bytes": series_total,
            "series_rows_by_width": series_rows, "series_bytes_per_day": round(series_total / days)}


def _load_if_empty(args) -> dict:
    from bench.fleet_history import fleet_scopes, load_history
    from dashboard.models import OccupancySample

    scopes = fleet_scopes(args.scopes)
    if not OccupancySample.objects.exists():
        began = time.perf_counter()
        nodes = [f"node-{i:04d}" for i in range(args.nodes)]
        counts = load_history(args.days, nodes, scopes, per_node=args.per_node)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {OccupancySample._meta.db_table}")
        print(f"loaded {counts} in {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    return scopes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--scopes", type=int, default=1000)
    parser.add_argument("--per-node", type=int, default=50)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database-url")
    parser.add_argument("--reuse", help="database name to keep (and reuse when already loaded)")
    parser.add_argument("--windows", default=",".join(["15m", "1h", "6h", "24h", "7d", "30d"]),
                        help="comma-separated chart windows to measure")
    parser.add_argument("--filters", default="everything,tenant,model,release,group",
                        help="comma-separated filters to measure")
    parser.add_argument("--explain", help="write EXPLAIN ANALYZE of the count and chart statements here")
    args = parser.parse_args(argv)

    def run(url: str) -> dict:
        setup_django(url)
        scopes = _load_if_empty(args)
        with open(args.explain, "w") if args.explain else _Null() as explain:
            results = measure(scopes, args.repeats, explain if args.explain else None,
                              args.windows.split(","), args.filters.split(","))
        return {"results": results, **sizes(args.days)}

    if args.reuse:
        import psycopg

        from bench.ingest import _with_db
        with psycopg.connect(_with_db(server_url(args.database_url), "postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [args.reuse]).fetchone():
                conn.execute(f'CREATE DATABASE "{args.reuse}"')
        out = run(_with_db(server_url(args.database_url), args.reuse))
    else:
        with private_database(server_url(args.database_url)) as url:
            out = run(url)
    worst = {name: max(w["p99_ms"] for w in windows.values()) for name, windows in out["results"].items()}
    ratio = {name: round(max(w["p99_ms"] / max(w["count_p99_ms"], 0.1) for w in windows.values()), 2)
             for name, windows in out["results"].items()}
    print(f"worst chart p99 per filter (ms): {worst}; goal <= {GOAL_MS} ms; ratio chart/count: {ratio}")
    print(f"samples table {out['table_bytes']:,} B, {out['bytes_per_day']:,} B per day of history, "
          f"{out['bytes_per_row']} B per row; series table {out['series_table_bytes']:,} B "
          f"{out['series_rows_by_width']}")
    print(json.dumps({"bench": "occupancy_chart", "nodes": args.nodes, "scopes": args.scopes,
                      "per_node": args.per_node, "days": args.days, "repeats": args.repeats, "goal_ms": GOAL_MS,
                      "worst_p99_ms": worst, "ratio_chart_over_count": ratio, **out}))
    return 0


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
