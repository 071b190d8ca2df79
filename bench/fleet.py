"""A fleet: 1,000 nodes and 10,000 cache scopes — push, ingest, rollups, charts, pages and ``/metrics`` at that size.

    python -m bench.fleet [--quick] [--database-url URL] [--keep-workdir] [--phases push,ingest,rollup,history,metrics]

Set-up: a private PostgreSQL database (``bench.ingest.private_database``), a private ``redis-server``
(``bench.push.Redis``) and the fleet registry of ``bench.fleet_registry.build_fleet`` (1,000 nodes, 50 tenants, 200
served models, 2,000 release namespaces, 10,000 cache scopes, about 50 per node). Phases, in this order:

* **push** — one change affecting every node: every tenant's quota grows by 1 MiB in one statement and the nodes
  it affects (all of them) are pushed after the commit, as the registry's signals do
  (``dashboard.signals.schedule_push``); until every node acked, with the agents simulated in 4 processes and the
  raw Redis fan-out of the same payloads as baseline (``bench.push.measure_push``). ``dashboard_cpu_ms_per_document``
  = the dashboard worker's CPU per measured round / nodes (rendering, versioning, signing, publishing, and storing
  the acks: the same worker ingests them).
* **ingest** — here (``sustained_ingest``, in the fleet's database; ``python -m bench.ingest --sustained`` runs the
  same kind of phase on a database of its own): every node sends a
  signed report of its cache scopes every 10 simulated seconds as its agent does (one ``dashboard.ingest`` task
  each), the simulated span compressed ``speedup`` times, to two dashboard ingest workers (Celery processes); one is
  SIGKILLed half-way (what it had taken comes back after the broker's visibility timeout, set short). Lag = when a
  tick's reports are stored (receipt ``received_at``) - when the tick was sent; lost / duplicated = reports whose
  sample rows are missing / stored more than once. ``ingest_copy_ratio``: ``bench.ingest.run_ingest`` of fleet
  reports in this process against ``bench.ingest.run_copy`` of the same rows (as ``python -m bench.ingest``).
* **rollup** — raw samples of every (node, scope) pair for ``rollup_minutes`` (every 10 s, older than the raw
  horizon, set-based ``INSERT ... SELECT generate_series``), then ``dashboard.telemetry.rollup.rollup()`` timed;
  ``rollup_hour_s`` scales that to one hour of fleet samples (rows folded per second).
* **history** — ``bench.fleet_history.load_history`` when it exists (the rows the rollups leave: 1-hour rows, then
  1-minute rows from the minute horizon, then raw rows from the raw horizon; here run with the minute horizon at
  ``minute_hours`` and the raw one at a minute, because the settings' 2 days of 1-minute rows are 72 million rows per
  fleet day), else ``load_history`` here (1-hour rows, 1-minute rows for the newest ``minute_hours``), one
  ``INSERT ... SELECT generate_series`` per level. Then the occupancy chart API (``/occupancy/data.json``, windows
  24h and 7d) for one tenant, one model, one release, one group and everything, and the overview and occupancy
  pages, through Django's test client as a logged-in superuser (server time, p99; a request slower than
  ``slow_s`` is not repeated, and a filter whose 24h chart took over ``10 * slow_s`` is not asked for 7 days:
  ``chart_skipped``, so ``chart_p99_ms`` is then a lower bound); ``db_bytes_per_day`` =
  ``pg_total_relation_size`` of the samples table / days loaded, with the bytes per row, per fleet day of 1-hour
  and of 1-minute rows, and the bound the settings' horizons and retention put on the table (``retained_bytes``).
* **metrics** — one fresh report per node ingested, then ``/metrics`` scraped with its bearer token
  (``KVPOOL_METRICS_TOKEN``): seconds (p99) and bytes.

The machine's speed varies up to 4x between runs: read the ratios (push against raw Redis, ingest against COPY).
``--quick`` (under 5 minutes here) keeps the registry's size and measures fewer rounds, a shorter simulated span,
fewer days. Human lines, then one JSON object as the last stdout line.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets as secrets_lib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.push import percentile

#: Goal per figure: (comparison, bound). Issue 17.
GOALS: dict[str, tuple[str, float]] = {
    "push_p99_s": ("<", 2.0),
    "push_ratio_p99": ("<=", 2.0),
    "dashboard_cpu_ms_per_document": ("<=", 0.5),
    "ingest_lag_max_s": ("<", 10.0),
    "ingest_copy_ratio": (">=", 0.5),
    "lost": ("==", 0),
    "duplicated": ("==", 0),
    "chart_p99_ms": ("<=", 300.0),
    "page_p99_ms": ("<=", 500.0),
    "rollup_hour_s": ("<=", 30.0),
    "metrics_scrape_s": ("<=", 1.0),
}
#: Keys the JSON line always has (issue 17), besides ``goals`` and ``goals_met``.
REQUIRED_KEYS = ("push_p99_s", "push_baseline_p99_s", "dashboard_cpu_ms_per_document", "ingest_samples_per_s",
                 "ingest_copy_ratio", "ingest_lag_max_s", "chart_p99_ms", "page_p99_ms", "rollup_hour_s",
                 "db_bytes_per_day", "metrics_scrape_s", "metrics_bytes", "lost", "duplicated")
#: Seconds between two reports of a node (the agent's default interval).
REPORT_INTERVAL_S = 10


@dataclass(frozen=True)
class Options:
    """What one run measures (``for_mode``): registry size, rounds, spans and repetitions."""

    nodes: int = 1000
    tenants: int = 50
    models: int = 200
    releases: int = 2000
    scopes: int = 10_000
    scopes_per_node: int = 50
    push_rounds: int = 5
    agent_processes: int = 4
    ingest_simulated_s: int = 3600
    ingest_speedup: float = 6.0
    ingest_workers: int = 2
    visibility_timeout_s: int = 10
    copy_reports: int = 400
    rollup_nodes: int = 1000
    rollup_minutes: int = 60
    history_days: int = 7
    minute_hours: int = 6
    repeats: int = 20
    #: a measurement whose first request takes longer than this many seconds is not repeated
    slow_s: float = 3.0

    @classmethod
    def for_mode(cls, quick: bool) -> Options:
        """The full run, or ``--quick``'s: the same registry, 2 push rounds, 4 simulated minutes of ingest, 5
        minutes of 50 nodes' raw samples to roll up, 1 day of history in 1-hour rows, 5 repetitions."""
        if not quick:
            return cls()
        return cls(push_rounds=2, ingest_simulated_s=240, ingest_speedup=4.0, copy_reports=200, rollup_nodes=50,
                   rollup_minutes=5, history_days=1, minute_hours=0, repeats=5)


def goals_met(result: dict) -> dict[str, bool | None]:
    """Per goal of ``GOALS``: whether ``result`` meets it (``None`` when the figure is missing)."""
    compare: dict[str, Callable[[float, float], bool]] = {
        "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b, "==": lambda a, b: a == b}
    return {name: (None if result.get(name) is None else compare[op](result[name], bound))
            for name, (op, bound) in GOALS.items()}


def goals_line(met: dict[str, bool | None]) -> str:
    """``goals: N of M measured met`` with the missed and the unmeasured goals named."""
    measured = [name for name, value in met.items() if value is not None]
    missed = [name for name in measured if met[name] is False]
    unmeasured = [name for name, value in met.items() if value is None]
    return (f"goals: {len(measured) - len(missed)} of {len(measured)} measured met"
            + (f"; missed: {', '.join(missed)}" if missed else "")
            + (f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""))


def summary(figures: dict) -> dict:
    """The JSON line: ``figures`` with every ``REQUIRED_KEYS`` entry (``None`` where a phase did not measure it),
    ``goals`` ({name: "<op> <bound>"}) and ``goals_met`` (``goals_met``)."""
    result = {"bench": "fleet", **dict.fromkeys(REQUIRED_KEYS), **figures}
    result["goals"] = {name: f"{op} {bound:g}" for name, (op, bound) in GOALS.items()}
    result["goals_met"] = goals_met(result)
    return result


def p99_ms(seconds: list[float]) -> float:
    """p99 of ``seconds`` in milliseconds (nearest rank), rounded to 0.1 ms."""
    return round(percentile(seconds, 99) * 1000, 1)


# --- reports as agents send them ---------------------------------------------------------------------------


class ReportMaker:
    """Signed report wire dicts of the fleet's nodes, as their agents send them (``agent.contract.messages.Report``,
    ``agent.contract.signing.sign_message``): one row per cache scope the node's document carries, gauges steady,
    counters growing with the sequence. ``applied`` maps node -> the config version its agent applied."""

    def __init__(self, scopes_by_node: dict[str, list[tuple[str, str, str, str]]], node_secrets: dict[str, str],
                 applied: dict[str, int], started_at: datetime) -> None:
        self.scopes_by_node = scopes_by_node
        self.secrets = node_secrets
        self.applied = applied
        self.started_at = started_at

    def report(self, node: str, sequence: int, sent_at: datetime) -> dict:
        """The signed wire dict of ``node``'s report ``sequence`` (>= 1), sent at ``sent_at``."""
        from agent.contract.messages import Report, ScopeOccupancy
        from agent.contract.signing import sign_message

        rows = [ScopeOccupancy(tenant_id=t, served_model_name=m, namespace=ns, request_group=g,
                               blocks=1000 + k, bytes=(1000 + k) << 20, puts=50 * sequence + k, gets=90 * sequence,
                               hit_blocks=70 * sequence, miss_blocks=20 * sequence, evicted_blocks=3 * sequence,
                               store_evicted_blocks=sequence, budget_evicted_blocks=sequence,
                               orphan_removed_blocks=sequence, in_flight_requests=k % 7)
                for k, (t, m, ns, g) in enumerate(self.scopes_by_node[node])]
        wire = Report(node=node, sequence=sequence, sent_at=sent_at, started_at=self.started_at,
                      applied_version=self.applied[node], scopes=rows).to_wire()
        return sign_message(wire, self.secrets[node])


# --- processes ---------------------------------------------------------------------------------------------


def _spawn_ingest_worker(index: int, workdir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    from bench.push import _spawn, _wait_log

    log = workdir / f"ingest-{index}.log"
    proc = _spawn([sys.executable, "-m", "celery", "-A", "dashboard.celery", "worker", "-Q", "dashboard.ingest",
                   "--pool", "threads", "-c", "1", "-n", f"ingest{index}@fleet", "--without-mingle",
                   "--without-gossip", "--without-heartbeat", "-l", "INFO"], log, **env)
    _wait_log(proc, log, "ready.")
    return proc, log


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (a worker dying mid-batch: nothing it took is acknowledged)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


# --- phases ------------------------------------------------------------------------------------------------


def phase_push(fleet, redis, workdir: Path, url: str, opts: Options) -> dict:
    """Config push to every node until all acked, against raw Redis (``bench.push.measure_push``)."""
    from django.db.models import F

    from bench.push import measure_push
    from dashboard.signals import schedule_push
    from tenants.models import Tenant

    def change() -> None:
        Tenant.objects.filter(tenant_id__in=fleet.tenant_ids).update(quota_bytes=F("quota_bytes") + (1 << 20))
        schedule_push(fleet.node_names)

    push = measure_push(redis, workdir, url, fleet.node_names, change, opts.push_rounds, opts.agent_processes,
                        env=_limits_env(), round_timeout_s=600)
    return {"push_p99_s": push["all_acked_p99_s"], "push_baseline_p99_s": push["baseline_p99_s"],
            "push_ratio_p99": push["ratio_p99"], "dashboard_cpu_ms_per_document": push["dashboard_cpu_ms_per_document"],
            "push": push}


def sustained_ingest(fleet, redis, workdir: Path, url: str, opts: Options) -> dict:
    """Sustained report ingest by ``opts.ingest_workers`` Celery workers, one killed half-way (module docstring).
    Returns lag, rate, lost and duplicated reports."""
    from django.db import connection

    from agent.node.celery_app import make_app, make_publisher
    from bench.push import _stop
    from dashboard.models import NodeState, OccupancySample
    from dashboard.models import Report as Receipt

    env = {"DATABASE_URL": url, "CELERY_BROKER_URL": redis.url, "DJANGO_SETTINGS_MODULE": "dashboard.settings",
           "KVPOOL_MASTER_SYNC": "false", "KVPOOL_BROKER_VISIBILITY_TIMEOUT": str(opts.visibility_timeout_s),
           **_limits_env()}
    ticks = max(1, opts.ingest_simulated_s // REPORT_INTERVAL_S)
    tick_wall_s = REPORT_INTERVAL_S / opts.ingest_speedup
    applied = dict(NodeState.objects.filter(node_name__in=fleet.node_names).values_list("node_name", "acked_version"))
    sim_start = datetime.now(UTC) - timedelta(seconds=opts.ingest_simulated_s + 2 * 3600)  # older than the raw horizon
    maker = ReportMaker(fleet.scopes_by_node, fleet.secrets, applied, sim_start - timedelta(minutes=1))
    publish = make_publisher(make_app("fleet-agents", redis.url))
    workers = [_spawn_ingest_worker(i, workdir, env) for i in range(opts.ingest_workers)]
    sent_at_wall: list[float] = []
    killed_at: float | None = None
    behind_s = 0.0
    try:
        start = time.time()
        for tick in range(ticks):
            due = start + tick * tick_wall_s
            if time.time() < due:
                time.sleep(due - time.time())
            behind_s = max(behind_s, time.time() - due)
            sent_at_wall.append(time.time())
            sent_at = sim_start + timedelta(seconds=REPORT_INTERVAL_S * tick)
            for node in fleet.node_names:
                publish([maker.report(node, tick + 1, sent_at)])
            if killed_at is None and tick >= ticks // 2 and len(workers) > 1:
                _kill(workers[-1][0])  # mid-run, with batches in flight
                killed_at = time.time()
            elif killed_at is not None and len(workers) == opts.ingest_workers and (
                    time.time() > killed_at + opts.visibility_timeout_s + 1):
                workers.append(_spawn_ingest_worker(len(workers), workdir, env))  # the supervisor's restart
        if killed_at is not None and len(workers) == opts.ingest_workers:
            time.sleep(max(0.0, killed_at + opts.visibility_timeout_s + 1 - time.time()))
            workers.append(_spawn_ingest_worker(len(workers), workdir, env))
        expected = ticks * len(fleet.node_names)
        deadline = time.time() + opts.visibility_timeout_s + 120 + ticks * tick_wall_s
        stored = 0
        while time.time() < deadline:
            stored = Receipt.objects.filter(node_name__in=fleet.node_names, sent_at__gte=sim_start).count()
            if stored >= expected:
                break
            time.sleep(0.5)
        left = {"queued": redis.client.llen("dashboard.ingest"), "unacked": redis.client.hlen("unacked")}
    finally:
        for proc, _log in workers:
            _stop(proc)
    table = OccupancySample._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT sequence, MAX(received_at), MIN(received_at) FROM {Receipt._meta.db_table} "
            "WHERE sent_at >= %s GROUP BY sequence", [sim_start])
        by_tick = {int(seq): (latest.timestamp(), first.timestamp()) for seq, latest, first in cursor.fetchall()}
        cursor.execute(
            f"SELECT node_name, ts, COUNT(*) FROM {table} WHERE level = 0 AND ts >= %s AND ts < %s "
            "GROUP BY node_name, ts", [sim_start, sim_start + timedelta(seconds=REPORT_INTERVAL_S * ticks)])
        rows_per_report = cursor.fetchall()
    duplicated = sum(1 for node, _ts, n in rows_per_report if n > len(fleet.scopes_by_node[node]))
    complete = sum(1 for node, _ts, n in rows_per_report if n >= len(fleet.scopes_by_node[node]))
    lags = [by_tick[t + 1][0] - sent_at_wall[t] for t in range(ticks) if t + 1 in by_tick]
    samples = sum(n for _node, _ts, n in rows_per_report)
    with connection.cursor() as cursor:  # when 99 % of the reports were stored (the redelivered tail aside)
        cursor.execute(f"SELECT PERCENTILE_DISC(0.99) WITHIN GROUP (ORDER BY received_at) FROM "
                       f"{Receipt._meta.db_table} WHERE sent_at >= %s", [sim_start])
        stored_99 = cursor.fetchone()[0]
    span = (stored_99.timestamp() if stored_99 else time.time()) - start
    return {"ingest_lag_max_s": round(max(lags, default=float("inf")), 2),
            "ingest_lag_p99_s": round(percentile(lags, 99), 2) if lags else None,
            "ingest_samples_per_s": round(0.99 * samples / span), "lost": expected - complete, "duplicated": duplicated,
            "ingest": {"reports_sent": expected, "reports_stored": stored, "samples": samples, "ticks": ticks,
                       "simulated_s": ticks * REPORT_INTERVAL_S, "speedup": opts.ingest_speedup,
                       "offered_samples_per_s": round(samples / max(ticks * tick_wall_s, 1e-9)),
                       "sender_behind_max_s": round(behind_s, 2), "workers": opts.ingest_workers,
                       "killed_worker": killed_at is not None, "visibility_timeout_s": opts.visibility_timeout_s,
                       "broker_left": left}}


def ingest_copy_ratio(fleet, opts: Options, applied: dict[str, int]) -> dict:
    """``bench.ingest.run_ingest`` of ``opts.copy_reports`` fleet reports against ``run_copy`` of the same rows."""
    from django.db import connection

    from bench.ingest import run_copy, run_ingest
    from dashboard.models import OccupancySample

    sent_at = datetime.now(UTC) - timedelta(hours=3)
    maker = ReportMaker(fleet.scopes_by_node, fleet.secrets, applied, sent_at - timedelta(hours=1))
    nodes = fleet.node_names
    reports = [maker.report(nodes[i % len(nodes)], 1_000_000 + i // len(nodes),
                            sent_at + timedelta(seconds=i // len(nodes))) for i in range(opts.copy_reports)]
    samples = sum(len(r["scopes"]) for r in reports)
    table = OccupancySample._meta.db_table

    def clear() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE level = 0 AND ts >= %s AND ts < %s",
                           [sent_at, sent_at + timedelta(hours=1)])

    ingest_s = run_ingest(reports, 200)
    clear()
    copy_s = run_copy(reports, 200)
    clear()
    return {"ingest_copy_ratio": round(copy_s / ingest_s, 3),
            "ingest_in_process_samples_per_s": round(samples / ingest_s),
            "copy_samples_per_s": round(samples / copy_s)}


def _pairs_table(cursor, fleet, nodes: list[str] | None = None) -> None:
    """Temporary table ``bench_fleet_pairs`` (dropped at commit) of every (node, cache scope) pair the fleet's
    documents carry (of ``nodes`` when given), with ``COPY``; must run inside a transaction."""
    cursor.execute("CREATE TEMP TABLE bench_fleet_pairs (node_name text, tenant_id text, served_model_name text, "
                   "namespace text, request_group text, k int) ON COMMIT DROP")
    with cursor.cursor.copy("COPY bench_fleet_pairs FROM STDIN") as copy:
        for node in nodes or fleet.node_names:
            for k, scope in enumerate(fleet.scopes_by_node[node]):
                copy.write_row((node, *scope, k))


_SAMPLE_SELECT = """
INSERT INTO {table} (level, ts, node_name, tenant_id, served_model_name, namespace, request_group, blocks, bytes,
  max_bytes, orphaned_bytes, in_flight_requests, puts, gets, hit_blocks, miss_blocks, evicted_blocks,
  store_evicted_blocks, budget_evicted_blocks, orphan_removed_blocks, samples)
SELECT %(level)s, g.ts, p.node_name, p.tenant_id, p.served_model_name, p.namespace, p.request_group,
  1000 + p.k, (1000 + p.k)::bigint << 20, (1100 + p.k)::bigint << 20, 0, p.k %% 7,
  s.n * 50 + p.k, s.n * 90, s.n * 70, s.n * 20, s.n * 3, s.n, s.n, s.n, %(samples)s
FROM bench_fleet_pairs p
CROSS JOIN generate_series(%(start)s::timestamptz, %(stop)s::timestamptz, %(step)s::interval) AS g(ts)
CROSS JOIN LATERAL (SELECT (EXTRACT(EPOCH FROM g.ts - %(start)s::timestamptz) / 10)::bigint + 1 AS n) s
"""


def insert_samples(fleet, level: int, start: datetime, stop: datetime, step_s: int,
                   nodes: list[str] | None = None) -> int:
    """Insert rows of ``level`` for every (node, scope) pair of ``fleet`` (of ``nodes`` when given) at ``start``,
    ``start + step_s``, ... up to ``stop`` (exclusive), in one set-based statement; ``samples`` = raw rows a row of
    that width folds. Returns the rows inserted."""
    from django.db import connection, transaction

    from dashboard.models import OccupancySample

    if stop <= start:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        _pairs_table(cursor, fleet, nodes)
        cursor.execute(_SAMPLE_SELECT.format(table=OccupancySample._meta.db_table),
                       {"level": level, "start": start, "stop": stop - timedelta(microseconds=1),
                        "step": f"{step_s} seconds", "samples": max(1, step_s // REPORT_INTERVAL_S)})
        return cursor.rowcount


def load_history(fleet, days: int, minute_hours: int, now: datetime) -> dict:
    """Rolled-up history (module docstring): 1-hour rows from ``now - days`` up to the newest ``minute_hours``,
    1-minute rows for those; bucket starts aligned as the rollup writes them. Returns rows per level."""
    from dashboard.models import OccupancySample
    from dashboard.telemetry.rollup import floor_hour

    Level = OccupancySample.Level
    end = floor_hour(now)
    split = end - timedelta(hours=minute_hours)
    return {"hour_rows": insert_samples(fleet, Level.HOUR, end - timedelta(days=days), split, 3600),
            "minute_rows": insert_samples(fleet, Level.MINUTE, split, end, 60)}


def phase_rollup(fleet, opts: Options) -> dict:
    """``rollup()`` of ``opts.rollup_minutes`` of raw samples of ``opts.rollup_nodes`` nodes, scaled to one hour of
    the fleet's samples (by rows folded): the samples end a minute past the raw horizon, and ``rollup()`` runs
    twice, as the periodic task would have: once 90 s after they end (the occupancy summed over nodes of their
    minutes, from the raw rows; on PostgreSQL also the fold's 1-minute rows of those minutes) and once now (their
    fold: on PostgreSQL from those rows when no sample came since, else with a check that their minutes' samples did
    not change); both timed."""
    from django.conf import settings

    from dashboard.models import OccupancySample
    from dashboard.telemetry.rollup import floor_minute, rollup

    now = datetime.now(UTC)
    stop = floor_minute(now - timedelta(seconds=settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS + 60))
    raw = insert_samples(fleet, OccupancySample.Level.RAW, stop - timedelta(minutes=opts.rollup_minutes), stop,
                         REPORT_INTERVAL_S, fleet.node_names[:opts.rollup_nodes])
    started = time.perf_counter()
    summed = rollup(stop + timedelta(seconds=90))
    counts = rollup(now)
    elapsed = time.perf_counter() - started
    _say(f"rollup runs: {summed}, {counts}")
    hour_rows = sum(len(scopes) for scopes in fleet.scopes_by_node.values()) * 3600 // REPORT_INTERVAL_S
    folded = max(counts["raw_folded"], 1)
    return {"rollup_hour_s": round(elapsed * hour_rows / folded, 2),
            "rollup": {"raw_rows_inserted": raw, "raw_folded": counts["raw_folded"], "seconds": round(elapsed, 2),
                       "fleet_raw_rows_per_hour": hour_rows}}


def _timed(client, path: str, repeats: int, params: dict | None = None, slow_s: float = float("inf"),
           **headers: str) -> tuple[list[float], int]:
    """Seconds of ``repeats`` GETs of ``path`` (server time: Django's test client, in this process) and the size of
    the last answer; stops after a request slower than ``slow_s``. Raises ``RuntimeError`` on a status other
    than 200."""
    times: list[float] = []
    size = 0
    while len(times) < repeats and (not times or times[-1] <= slow_s):
        started = time.perf_counter()
        response = client.get(path, params or {}, **headers)
        times.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} {params}: HTTP {response.status_code}")
        size = len(response.content)
    return times, size


def chart_filters(fleet) -> dict[str, dict[str, str]]:
    """The chart filters measured: one tenant, one model, one release, one group, everything."""
    tenant, model, namespace = fleet.releases[0]
    group = next(name for t, name in fleet.groups if t == tenant)
    return {"tenant": {"tenant_id": tenant}, "model": {"tenant_id": tenant, "served_model_name": model},
            "release": {"tenant_id": tenant, "served_model_name": model, "namespace": namespace},
            "group": {"tenant_id": tenant, "request_group": group}, "everything": {}}


def retained_bytes(bytes_per_row: float, pairs: int) -> dict:
    """What the samples table holds at the settings' horizons, for ``pairs`` (node, cache scope) pairs reporting
    every 10 s, at ``bytes_per_row`` (table and indexes): bytes per day of 1-hour rows and of 1-minute rows, and the
    table's bound (raw rows for the raw horizon, 1-minute rows for the minute horizon, 1-hour rows for the rest of
    ``KVPOOL_RETENTION_SECONDS``)."""
    from django.conf import settings

    per_day = {"hour": pairs * 24, "minute": pairs * 1440, "raw": pairs * 86400 // REPORT_INTERVAL_S}
    raw_days = settings.KVPOOL_ROLLUP_RAW_AFTER_SECONDS / 86400
    minute_days = settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS / 86400 - raw_days
    hour_days = settings.KVPOOL_RETENTION_SECONDS / 86400 - minute_days - raw_days
    rows = per_day["raw"] * raw_days + per_day["minute"] * minute_days + per_day["hour"] * hour_days
    return {"db_bytes_per_day_hour_rows": round(per_day["hour"] * bytes_per_row),
            "db_bytes_per_day_minute_rows": round(per_day["minute"] * bytes_per_row),
            "db_bytes_retained_bound": round(rows * bytes_per_row)}


def phase_history(fleet, opts: Options) -> dict:
    """Load the history, then the chart API and the pages (server time through Django's test client)."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from dashboard.models import OccupancySample

    loader = _history_loader(opts)
    now = datetime.now(UTC)
    started = time.perf_counter()
    loaded = loader(fleet, opts.history_days, opts.minute_hours, now)
    load_s = time.perf_counter() - started
    from dashboard.models import ScopeSeries

    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OccupancySample._meta.db_table}")
        cursor.execute("SELECT pg_total_relation_size(%s), (SELECT COUNT(*) FROM " + OccupancySample._meta.db_table
                       + "), pg_total_relation_size(%s)", [OccupancySample._meta.db_table, ScopeSeries._meta.db_table])
        table_bytes, rows, series_bytes = cursor.fetchone()
    user = get_user_model().objects.create_superuser("fleet-bench", "fleet@example.com", secrets_lib.token_hex(8))
    client = Client()
    client.force_login(user)
    charts: dict[str, float] = {}
    skipped: list[str] = []
    for window in ("24h", "7d"):
        for name, params in chart_filters(fleet).items():
            if charts.get(f"24h/{name}", 0) > 10_000 * opts.slow_s:  # 7 days would take longer still
                skipped.append(f"{window}/{name}")
                continue
            times, _ = _timed(client, "/occupancy/data.json", 1, {"window": window, **params})  # warm-up
            if times[0] <= opts.slow_s:
                times, _ = _timed(client, "/occupancy/data.json", opts.repeats, {"window": window, **params},
                                  opts.slow_s)
            charts[f"{window}/{name}"] = p99_ms(times)
    pages: dict[str, float] = {}
    for name, path, params in (("overview", "/", {}), ("occupancy", "/occupancy/", {}),
                               ("occupancy_7d", "/occupancy/", {"window": "7d"})):
        times, _ = _timed(client, path, 1, params)
        if times[0] <= opts.slow_s:
            times, _ = _timed(client, path, opts.repeats, params, opts.slow_s)
        pages[name] = p99_ms(times)
    retained = retained_bytes(table_bytes / max(rows, 1), sum(len(s) for s in fleet.scopes_by_node.values()))
    return {"chart_p99_ms": max(charts.values()), "page_p99_ms": max(pages.values()),
            "db_bytes_per_day": round(table_bytes / opts.history_days), "db_bytes_per_row": round(table_bytes / rows),
            "series_bytes_per_day": round(series_bytes / opts.history_days),
            **retained,
            "history": {**loaded, "days": opts.history_days, "minute_hours": opts.minute_hours,
                        "load_s": round(load_s, 1), "table_bytes": table_bytes, "loader": loader.__module__},
            "chart_p99_ms_by_filter": charts, "chart_skipped": skipped, "page_p99_ms_by_page": pages}


def phase_metrics(fleet, opts: Options, applied: dict[str, int], token: str) -> dict:
    """One fresh report per node ingested, then ``/metrics`` scraped (bearer token)."""
    from django.test import Client

    from dashboard.telemetry.ingest import ingest

    now = datetime.now(UTC)
    maker = ReportMaker(fleet.scopes_by_node, fleet.secrets, applied, now - timedelta(hours=1))
    reports = [maker.report(node, 2_000_000, now - timedelta(seconds=5)) for node in fleet.node_names]
    for i in range(0, len(reports), 200):
        ingest(reports[i:i + 200])
    client = Client()
    _timed(client, "/metrics", 1, HTTP_AUTHORIZATION=f"Bearer {token}")  # warm-up
    times, size = _timed(client, "/metrics", max(3, opts.repeats // 2), HTTP_AUTHORIZATION=f"Bearer {token}")
    return {"metrics_scrape_s": round(percentile(times, 99), 3), "metrics_bytes": size}


def _history_loader(opts: Options):
    """``bench.fleet_history.load_history`` when that module exists (it places ``scopes_per_node`` of the fleet's
    cache scopes on each node, and writes 1-hour, 1-minute and raw rows by the rollup horizons: here with the
    1-minute horizon at ``minute_hours`` and the raw one at a minute, see the module docstring), else this module's
    ``load_history``."""
    try:
        from bench.fleet_history import load_history as theirs
    except ImportError:
        return load_history

    def load(fleet, days: int, minute_hours: int, now: datetime) -> dict:
        from django.test import override_settings

        with override_settings(KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS=minute_hours * 3600,
                               KVPOOL_ROLLUP_RAW_AFTER_SECONDS=60):
            return theirs(days, fleet.node_names, fleet.scopes, per_node=opts.scopes_per_node, now=now)

    load.__module__ = theirs.__module__
    return load


def _clear_samples() -> None:
    from django.db import connection

    from dashboard.models import OccupancySample

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {OccupancySample._meta.db_table}")


def _limits_env() -> dict[str, str]:
    """Instance caps the fleet needs (a tenant runs 200 instances at the default shape)."""
    return {"KVPOOL_MAX_INSTANCES_PER_TENANT": "100000"}


#: The phases, in the order they run.
PHASES = ("push", "ingest", "rollup", "history", "metrics")


def run(opts: Options, database_url: str | None, keep_workdir: bool = False,
        phases: tuple[str, ...] = PHASES) -> dict:
    """The ``phases`` (module docstring; default every one); returns ``summary`` of the figures. Without
    ``push`` the nodes' documents are versioned in this process (nothing is sent) for the reports to name."""
    from bench.ingest import private_database, server_url, setup_django
    from bench.push import Redis

    workdir = Path(tempfile.mkdtemp(prefix="kvpool-bench-fleet-"))
    redis = Redis(workdir)
    token = secrets_lib.token_hex(16)
    figures: dict = {"options": asdict(opts)}
    try:
        with private_database(server_url(database_url), prefix="kvpool_bench_fleet") as url:
            setup_django(url, CELERY_BROKER_URL=redis.url, KVPOOL_VAR_DIR=str(workdir / "var"),
                         KVPOOL_MASTER_SYNC="false", KVPOOL_METRICS_TOKEN=token, **_limits_env())
            from dashboard.celery import use_broker

            use_broker(redis.url)
            from bench.fleet_registry import build_fleet
            from dashboard.models import NodeState

            started = time.perf_counter()
            fleet = build_fleet(nodes=opts.nodes, tenants=opts.tenants, models=opts.models, releases=opts.releases,
                                scopes=opts.scopes, scopes_per_node=opts.scopes_per_node)
            figures["registry"] = {"nodes": len(fleet.node_names), "tenants": len(fleet.tenant_ids),
                                   "models": len(fleet.models), "releases": len(fleet.releases),
                                   "scopes": len(fleet.scopes), "instances": fleet.instances,
                                   "build_s": round(time.perf_counter() - started, 1)}
            _say(f"registry: {figures['registry']}")
            if "push" in phases:
                figures.update(phase_push(fleet, redis, workdir, url, opts))
                _say(f"push: p99 {figures['push_p99_s']} s, raw Redis p99 {figures['push_baseline_p99_s']} s "
                     f"(ratio {figures['push_ratio_p99']}x), dashboard CPU "
                     f"{figures['dashboard_cpu_ms_per_document']} ms per document")
                applied = dict(NodeState.objects.filter(node_name__in=fleet.node_names)
                               .values_list("node_name", "acked_version"))
            else:
                from dashboard.rollout.push import ensure_versions
                from tenants.models import Node

                applied = {name: ensured.version.version
                           for name, ensured in ensure_versions(Node.objects.all()).items()}

            if "ingest" in phases:  # in the fleet's own database and registry (bench.ingest.run_sustained sets
                # Django up on a database of its own, which would leave this process on it)
                figures.update(sustained_ingest(fleet, redis, workdir, url, opts))
                figures.update(ingest_copy_ratio(fleet, opts, applied))
                _clear_samples()  # counted: the rollup phase loads its own span
            if "ingest" in phases:
                _say(f"ingest: {figures['ingest_samples_per_s']} samples/s sustained, lag max "
                     f"{figures['ingest_lag_max_s']} s, lost {figures['lost']}, duplicated {figures['duplicated']}; "
                     f"ingest/COPY {figures['ingest_copy_ratio']}; {figures['ingest']}")
            if "rollup" in phases:
                figures.update(phase_rollup(fleet, opts))
                _say(f"rollup: {figures['rollup']['raw_folded']} raw rows in {figures['rollup']['seconds']} s -> "
                     f"{figures['rollup_hour_s']} s per fleet hour")
            if "history" in phases:
                figures.update(phase_history(fleet, opts))
                _say(f"history ({figures['history']}): chart p99 {figures['chart_p99_ms']} ms "
                     f"{figures['chart_p99_ms_by_filter']} (skipped: {figures['chart_skipped']}); pages p99 "
                     f"{figures['page_p99_ms_by_page']} ms; {figures['db_bytes_per_day']:,} bytes per day loaded, "
                     f"{figures['db_bytes_per_row']} per row, {figures['db_bytes_retained_bound']:,} bytes bound "
                     "by the horizons and retention")
            if "metrics" in phases:
                figures.update(phase_metrics(fleet, opts, applied, token))
                _say(f"/metrics: {figures['metrics_scrape_s']} s, {figures['metrics_bytes']:,} bytes")
    finally:
        redis.stop()
    if keep_workdir:
        print(f"logs in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary(figures)


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter spans (under 5 minutes)")
    parser.add_argument("--database-url", help="PostgreSQL server URL (a private database is created on it)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the workers' logs (path on stderr)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated phases to run (default all: {','.join(PHASES)})")
    args = parser.parse_args(argv)
    phases = tuple(name.strip() for name in args.phases.split(",") if name.strip())
    unknown = sorted(set(phases) - set(PHASES))
    if unknown or not phases:
        parser.error(f"--phases: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(PHASES)}")
    result = run(Options.for_mode(args.quick), args.database_url, args.keep_workdir, phases)
    _say(goals_line(result["goals_met"]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
