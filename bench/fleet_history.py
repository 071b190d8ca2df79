"""Bulk-load a fleet's occupancy history into PostgreSQL: exactly the rows the rollups would have left.

``load_history(days, nodes, scopes)`` writes, for every node and each cache scope placed on it, 1-hour rows from
``days`` ago up to the 1-minute horizon (``KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS``), 1-minute rows from there up to
the raw horizon (``KVPOOL_ROLLUP_RAW_AFTER_SECONDS``) and raw rows every 10 s after it (``samples`` 360, 6 and 1
per row), one ``INSERT ... SELECT`` per level from ``generate_series`` times × the node/scope pairs (``COPY``-ed
into a temporary table). Gauges vary by pair and time, counters grow with time (cumulative, as agents report).
The occupancy summed over nodes (``ScopeSeries``) is written for the same history at the tiers' densities and
retentions (``_load_series``: per bucket from each scope's and release's sums over its pairs, computed once; the
same rows and values as grouping every (pair, bucket), in a fraction of the time). The samples' trigger fills
``LatestSample`` from the raw rows, as at ingest. ``fleet_scopes(count)`` builds cache scopes like a fleet's
(tenants × served models × release namespaces × request groups, ``""`` included). Used by
``bench.occupancy_chart`` and ``bench.fleet``.
"""
from __future__ import annotations

from datetime import datetime, timedelta

RAW_SECONDS = 10  # agents report every 10 s


def fleet_scopes(count: int, *, tenants: int = 100, models: int = 2, releases: int = 2
                 ) -> list[tuple[str, str, str, str]]:
    """``count`` cache scopes ``(tenant_id, served_model_name, namespace, request_group)``: ``tenants`` tenants ×
    ``models`` served models × ``releases`` release namespaces, the request groups spread over them (the first of
    each release ``""``, the rows without a request group)."""
    releases_all = [(f"tenant-{t:03d}", f"model-{m}", f"prod-{t:03d}-{m}-{r}")
                    for t in range(tenants) for m in range(models) for r in range(releases)]
    return [(*releases_all[k % len(releases_all)],
             "" if k < len(releases_all) else f"group-{k // len(releases_all):03d}") for k in range(count)]


def placement(nodes: list[str], scopes: list[tuple[str, str, str, str]], per_node: int
              ) -> list[tuple[str, tuple[str, str, str, str]]]:
    """(node, scope) pairs: node ``i`` holds the ``per_node`` scopes from ``i * per_node`` on (wrapping), so each
    scope is on ``len(nodes) * per_node / len(scopes)`` nodes."""
    per_node = min(per_node, len(scopes))
    return [(node, scopes[(i * per_node + j) % len(scopes)]) for i, node in enumerate(nodes) for j in range(per_node)]


def load_history(days: int, nodes: list[str], scopes: list[tuple[str, str, str, str]], *, per_node: int = 50,
                 now: datetime | None = None) -> dict[str, int]:
    """Write ``days`` days of rolled-up occupancy history (ending at ``now``) for ``nodes`` holding ``per_node``
    of ``scopes`` each into the Django database (PostgreSQL only; raises ``RuntimeError`` otherwise); returns
    the rows written per level (``raw``, ``minute``, ``hour``) and ``pairs``."""
    from django.conf import settings
    from django.db import connection, transaction
    from django.utils import timezone

    from dashboard.models import OccupancySample
    from dashboard.telemetry.rollup import floor_hour, floor_minute

    if connection.vendor != "postgresql":
        raise RuntimeError("load_history needs PostgreSQL (COPY, generate_series)")
    now = now or timezone.now()
    raw_cutoff = floor_minute(now - timedelta(seconds=settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS))
    minute_cutoff = floor_hour(now - timedelta(seconds=settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS))
    start = floor_hour(now - timedelta(days=days))
    pairs = placement(nodes, scopes, per_node)
    table = connection.ops.quote_name(OccupancySample._meta.db_table)
    Level = OccupancySample.Level
    # (level, first ts, last ts, step, samples per row); node i's raw reports are i % 10 s after the step
    tiers = [(Level.HOUR, start, minute_cutoff - timedelta(hours=1), "1 hour", 3600 // RAW_SECONDS),
             (Level.MINUTE, max(start, minute_cutoff), raw_cutoff - timedelta(minutes=1), "1 minute",
              60 // RAW_SECONDS),
             (Level.RAW, max(start, raw_cutoff), now - timedelta(seconds=RAW_SECONDS), f"{RAW_SECONDS} seconds", 1)]
    epoch0 = int(start.timestamp())
    counts = {"pairs": len(pairs)}
    with transaction.atomic(), connection.cursor() as cursor:
        # the ORDER BY of each level's rows (written in time order, as the rollup writes them) and the sort of the
        # samples' trigger (LatestSample) in memory: with the default 4 MB they spilled millions of rows to disk
        cursor.execute("SET LOCAL work_mem = '256MB'")
        cursor.execute("CREATE TEMPORARY TABLE fleet_pairs (p integer, phase integer, node_name text, tenant_id text,"
                       " served_model_name text, namespace text, request_group text) ON COMMIT DROP")
        node_index = {node: i for i, node in enumerate(nodes)}
        with cursor.cursor.copy("COPY fleet_pairs FROM STDIN") as copy:
            for p, (node, scope) in enumerate(pairs):
                copy.write_row((p, node_index[node] % RAW_SECONDS, node, *scope))
        for level, first, last, step, samples in tiers:
            if last < first:
                counts[Level(level).name.lower()] = 0
                continue
            ts = "g.ts + make_interval(secs => f.phase)" if level == Level.RAW else "g.ts"
            t = f"(extract(epoch FROM {ts})::bigint - {epoch0})"  # seconds since the history began
            size = f"((f.p %% 97 + 1)::bigint << 28) + ({t} %% 86400) * (f.p %% 13 + 1) * 4096"
            cursor.execute(f"""
                INSERT INTO {table} (level, ts, node_name, tenant_id, served_model_name, namespace, request_group,
                    blocks, bytes, max_bytes, orphaned_bytes, in_flight_requests, puts, gets, hit_blocks,
                    miss_blocks, evicted_blocks, store_evicted_blocks, budget_evicted_blocks, orphan_removed_blocks,
                    samples)
                SELECT %s, {ts}, f.node_name, f.tenant_id, f.served_model_name, f.namespace, f.request_group,
                    ({size}) >> 20, {size}, ({size}) + (1 << 20), (f.p %% 5) << 20, f.p %% 7,
                    {t} / 10 * 3, {t} / 10 * 5, {t} / 10 * (f.p %% 4 + 1), {t} / 10, {t} / 100 * 3, {t} / 100,
                    {t} / 100, {t} / 100, %s
                FROM generate_series(%s::timestamptz, %s::timestamptz, %s::interval) AS g(ts) CROSS JOIN fleet_pairs f
                ORDER BY 2, f.p""", [level, samples, first, last, step])
            counts[Level(level).name.lower()] = cursor.rowcount
        counts.update(_load_series(cursor, now, start, epoch0))
    return counts


def _load_series(cursor, now: datetime, start: datetime, epoch0: int) -> dict[str, int]:
    """The ``ScopeSeries`` rows the rollup leaves over the same history (``dashboard.telemetry.series``): rows of
    each width for every complete bucket within its retention, up to the newest minute the rollup sums; per cache
    scope (the sums over the ``fleet_pairs`` placed) and per release. Values follow the samples' formulas at each
    bucket start (gauges summed over nodes; counters: their increase over the bucket), so rows, sizes and densities
    are the rollup's, the numbers approximately. Returns rows written per width (``series_60`` ...)."""
    from django.db import connection

    from dashboard.models import ScopeSeries
    from dashboard.telemetry import series

    table = connection.ops.quote_name(ScopeSeries._meta.db_table)
    newest = series._floor(now - timedelta(seconds=series.SETTLE_SECONDS), 60)  # the minutes summed so far
    keep = {60: series.minute_keep_seconds(), 300: series.five_minute_keep_seconds(),
            900: series.five_minute_keep_seconds()}
    tiers = [(width, max(start, series._ceil(now - timedelta(seconds=keep[width]), width)) if width in keep else
              series._ceil(start, width), series._floor(newest, width) - timedelta(seconds=width))
             for width in ScopeSeries.Width.values]
    # The values are sums over the pairs of linear forms of the pair's index ``p`` (the samples' formulas), so they
    # are computed once per scope (and per release) from the pairs' sums, then written per bucket: the same rows
    # and values as grouping every (pair, bucket), at a fifth (a fiftieth for the releases) of the rows read.
    # size: sum((p % 97 + 1) << 28) + (t % 86400) * sum(p % 13 + 1) * 4096; the first counter grows by
    # (t_end / 10 - t / 10) * sum(p % 4 + 1), the others by the same for every pair, times the pairs.
    cursor.execute("""
        CREATE TEMPORARY TABLE fleet_scope_sums ON COMMIT DROP AS
        SELECT tenant_id, served_model_name, namespace, request_group, count(*)::bigint AS pairs,
            sum((p % 97 + 1)::bigint << 28)::bigint AS base, sum(p % 13 + 1)::bigint AS slope,
            sum(p % 4 + 1)::bigint AS hits, sum((p % 5)::bigint << 20)::bigint AS orphaned,
            sum(p % 7)::bigint AS in_flight
        FROM fleet_pairs GROUP BY tenant_id, served_model_name, namespace, request_group""")
    cursor.execute("""
        CREATE TEMPORARY TABLE fleet_release_sums ON COMMIT DROP AS
        SELECT tenant_id, served_model_name, namespace, NULL::text AS request_group, sum(pairs)::bigint AS pairs,
            sum(base)::bigint AS base, sum(slope)::bigint AS slope, sum(hits)::bigint AS hits,
            sum(orphaned)::bigint AS orphaned, sum(in_flight)::bigint AS in_flight
        FROM fleet_scope_sums GROUP BY tenant_id, served_model_name, namespace""")
    names = ", ".join(ScopeSeries.COUNTERS)
    counts = {}
    for width, first, last in tiers:
        if last < first:
            counts[f"series_{width}"] = 0
            continue
        t, t_end = (f"(extract(epoch FROM g.ts)::bigint - {epoch0} + {shift})" for shift in (0, width))
        written = 0
        for sums in ("fleet_scope_sums", "fleet_release_sums"):
            cursor.execute(f"""
                INSERT INTO {table} (width, ts, tenant_id, served_model_name, namespace, request_group, bytes,
                    orphaned_bytes, in_flight_requests, {names}, samples)
                SELECT %s, g.ts, s.tenant_id, s.served_model_name, s.namespace, s.request_group,
                    s.base + ({t} %% 86400) * s.slope * 4096, s.orphaned, s.in_flight,
                    ({t_end} / 10 - {t} / 10) * s.hits, ({t_end} / 10 - {t} / 10) * s.pairs,
                    ({t_end} / 100 - {t} / 100) * s.pairs, ({t_end} / 100 - {t} / 100) * s.pairs,
                    ({t_end} / 100 - {t} / 100) * s.pairs, s.pairs * {width // RAW_SECONDS}
                FROM generate_series(%s::timestamptz, %s::timestamptz, %s::interval) AS g(ts) CROSS JOIN {sums} s
                ORDER BY g.ts""", [width, first, last, f"{width} seconds"])
            written += cursor.rowcount
        counts[f"series_{width}"] = written
    cursor.execute(f"ANALYZE {table}")  # as autovacuum would after such a load
    return counts
