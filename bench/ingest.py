"""Ingest rate of occupancy samples into PostgreSQL, against a raw COPY of the same rows.

    python -m bench.ingest [--reports N] [--scopes K] [--batch B] [--database-url URL]

Builds ``N`` reports of ``K`` cache scopes each (``N*K`` samples), as the agents send them (JSON text of a batch of
``B`` reports, the task message body), and stores them with ``dashboard.telemetry.ingest.ingest`` — JSON decode,
validation, the check of every row against the node's applied document (one query per batch), the idempotency
receipts (``INSERT ... ON CONFLICT DO NOTHING RETURNING``) and the bulk insert of the
samples (``COPY``), one transaction per batch, exactly what the ``dashboard.ingest`` task runs. Then re-delivers the
first batch (must store nothing). Baseline, same run, same server: ``COPY`` of the same sample rows into the same
table with psycopg, one transaction per batch. Ratio = ingest rate / COPY rate. Goal: ≥ 20,000 samples/s.

Runs in a private database ``kvpool_bench_<pid>`` created on the server of ``--database-url`` (default
``$DATABASE_URL`` if it is PostgreSQL, else ``postgres://root@127.0.0.1:5432/postgres``) and dropped at the end.
The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

DEFAULT_SERVER = "postgres://root@127.0.0.1:5432/postgres"
GOAL_SAMPLES_PER_S = 20_000


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@contextmanager
def private_database(server_url: str, prefix: str = "kvpool_bench") -> Iterator[str]:
    """Create ``<prefix>_<pid>`` on the PostgreSQL server of ``server_url``; yield its URL; drop it after."""
    import psycopg

    name = f"{prefix}_{os.getpid()}"
    admin = _with_db(server_url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_db(server_url, name)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(database_url: str, **env: str) -> None:
    """Point Django at ``database_url``, set it up and apply migrations quietly (with a throwaway secret key
    unless ``DJANGO_SECRET_KEY`` is set: the settings need one outside DEBUG; the processes a bench starts inherit
    it)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ.update(env)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def server_url(arg: str | None) -> str:
    """The PostgreSQL server URL to create private databases on."""
    if arg:
        return arg
    env = os.environ.get("DATABASE_URL", "")
    return env if env.startswith("postgres") else DEFAULT_SERVER


APPLIED_VERSION = 3


def store_documents(nodes: int, scopes: int) -> None:
    """Version ``APPLIED_VERSION`` of each bench node's config document, carrying the ``scopes`` cache scopes of
    ``make_reports`` (ingest refuses rows the applied document does not carry): one vLLM instance per tenant and
    namespace, with its request groups, built as the dashboard renders instances."""
    from agent.contract.messages import InstanceSpec, KVLayout, RequestGroupSpec
    from agent.contract.signing import digest
    from dashboard.models import ConfigVersion

    groups: dict[tuple[int, int], list[int]] = {}
    for k in range(scopes):
        groups.setdefault((k % 5, k // 5), []).append(k)
    instances = [InstanceSpec(
        instance_id=str(index), engine="vllm", engine_version="0.33.0", role="both", port=8000 + index,
        tenant_id=f"tenant-{tenant}", tenant_quota_bytes=1 << 40, served_model_name="qwen3-8b",
        model_path="/models/Qwen3-8B", vllm_model_name="Qwen3-8B", namespace=f"prod-{namespace}",
        release_state="serving", kv_layout=KVLayout(num_layers=36, num_kv_heads=8, head_dim=128, block_size=16),
        hash_algo="sha256_cbor", hash_seed="42", node_budget_bytes=1 << 34,
        request_groups=[RequestGroupSpec(name=f"group-{k}", cache_salt=f"salt-{k}") for k in ks],
    ).model_dump(mode="json") for index, ((tenant, namespace), ks) in enumerate(sorted(groups.items()))]
    documents = [{"node": f"bench-{node:03d}", "version": APPLIED_VERSION, "instances": instances}
                 for node in range(nodes)]
    ConfigVersion.objects.bulk_create([ConfigVersion(node_name=doc["node"], version=APPLIED_VERSION,
                                                     digest=digest(doc), content_digest=digest(doc), document=doc)
                                       for doc in documents], ignore_conflicts=True)


def make_reports(count: int, scopes: int, nodes: int = 200) -> list[dict]:
    """``count`` report wire dicts, round-robin over ``nodes`` nodes, ``scopes`` cache scopes each, signed as
    their agents send them; the nodes are registered with their secrets (ingest verifies every report) and the
    documents their agents applied are stored (``store_documents``)."""
    from agent.contract.messages import Report, ScopeOccupancy
    from agent.contract.signing import sign_message
    from tenants.models import Node

    Node.objects.bulk_create([Node(name=f"bench-{node:03d}", hostname="10.0.0.1",
                                   signing_secret=f"bench-secret-{node:03d}") for node in range(nodes)],
                             ignore_conflicts=True)
    store_documents(nodes, scopes)
    t0 = datetime.now(UTC) - timedelta(hours=1)  # inside the dashboard's receipt horizon
    reports = []
    for i in range(count):
        node, sequence = i % nodes, i // nodes + 1
        reports.append(Report(
            node=f"bench-{node:03d}", sequence=sequence, sent_at=t0 + timedelta(seconds=10 * sequence),
            started_at=t0, applied_version=APPLIED_VERSION,
            scopes=[ScopeOccupancy(
                tenant_id=f"tenant-{k % 5}", served_model_name="qwen3-8b", namespace=f"prod-{k // 5}",
                request_group=f"group-{k}", blocks=1000 + k, bytes=(1000 + k) << 20, puts=5000 + i, gets=9000 + i,
                hit_blocks=7000 + i, miss_blocks=2000 + k, evicted_blocks=3 * k, store_evicted_blocks=k,
                budget_evicted_blocks=k, orphan_removed_blocks=k, orphaned_bytes=0,
                in_flight_requests=k % 7) for k in range(scopes)],
        ).to_wire())
        reports[-1] = sign_message(reports[-1], f"bench-secret-{node:03d}")
    return reports


def run_ingest(reports: list[dict], batch: int) -> float:
    """Seconds to ingest ``reports`` in batches of ``batch`` (one ``ingest`` call = one task = one batch).

    Each batch is timed from its JSON text (the task message body), as the worker decodes it.
    """
    from dashboard.telemetry.ingest import ingest

    bodies = [json.dumps(reports[i:i + batch]) for i in range(0, len(reports), batch)]
    start = time.perf_counter()
    for body in bodies:
        ingest(json.loads(body))
    return time.perf_counter() - start


def run_copy(reports: list[dict], batch: int) -> float:
    """Seconds to COPY the same sample rows (pre-built tuples) into the samples table, one transaction/batch."""
    from django.db import connection

    from dashboard.models import OccupancySample

    columns = ("level", "ts", "node_name", "tenant_id", "served_model_name", "namespace", "request_group", "blocks",
               "bytes", "max_bytes", "orphaned_bytes", "in_flight_requests", "puts", "gets", "hit_blocks",
               "miss_blocks", "evicted_blocks", "store_evicted_blocks", "budget_evicted_blocks",
               "orphan_removed_blocks", "samples")
    batches = []
    for i in range(0, len(reports), batch):
        rows = []
        for r in reports[i:i + batch]:
            ts = datetime.fromisoformat(r["sent_at"].replace("Z", "+00:00"))
            for row in r["scopes"]:
                rows.append((0, ts, r["node"], row["tenant_id"], row["served_model_name"], row["namespace"],
                             row["request_group"], row["blocks"], row["bytes"], row["bytes"], row["orphaned_bytes"],
                             row["in_flight_requests"], row["puts"], row["gets"], row["hit_blocks"],
                             row["miss_blocks"], row["evicted_blocks"], row["store_evicted_blocks"],
                             row["budget_evicted_blocks"], row["orphan_removed_blocks"], 1))
        batches.append(rows)
    table = OccupancySample._meta.db_table
    connection.ensure_connection()
    raw = connection.connection
    start = time.perf_counter()
    for rows in batches:
        with (raw.transaction(), raw.cursor() as cursor,
              cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy):
            for row in rows:
                copy.write_row(row)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=4000, help="reports to ingest (default 4000)")
    parser.add_argument("--scopes", type=int, default=20, help="cache scopes per report (default 20)")
    parser.add_argument("--batch", type=int, default=200, help="reports per ingest task (default 200)")
    parser.add_argument("--database-url", help="PostgreSQL server URL (a private database is created on it)")
    args = parser.parse_args(argv)
    if min(args.reports, args.scopes, args.batch) < 1:
        parser.error("--reports, --scopes and --batch must be at least 1")

    with private_database(server_url(args.database_url)) as url:
        setup_django(url)
        from django.db import connection

        from dashboard.models import OccupancySample, Report
        from dashboard.telemetry.ingest import ingest

        reports = make_reports(args.reports, args.scopes)
        samples = args.reports * args.scopes
        run_ingest(reports[: args.batch], args.batch)  # warm-up (connection, statement caches)
        OccupancySample.objects.all().delete()
        Report.objects.all().delete()
        ingest_s = run_ingest(reports, args.batch)
        stored = OccupancySample.objects.count()
        again = ingest(reports[: args.batch])
        assert stored == samples, f"stored {stored} samples, expected {samples}"
        assert again.samples == 0 and again.duplicate_reports == min(args.batch, args.reports)
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {OccupancySample._meta.db_table}")
        copy_s = run_copy(reports, args.batch)
        ingest_rate, copy_rate = samples / ingest_s, samples / copy_s
        server = connection.pg_version
    ratio = ingest_rate / copy_rate
    print(f"ingest: {samples} samples ({args.reports} reports x {args.scopes} scopes, {args.batch} "
          f"reports per task) in {ingest_s:.2f} s = {ingest_rate:,.0f} samples/s (PostgreSQL {server})")
    print(f"baseline COPY of the same rows: {copy_s:.2f} s = {copy_rate:,.0f} samples/s")
    print(f"ratio ingest/COPY: {ratio:.2f}; goal >= {GOAL_SAMPLES_PER_S:,} samples/s: "
          f"{'met' if ingest_rate >= GOAL_SAMPLES_PER_S else 'NOT met'}; redelivered batch stored 0 samples")
    print(json.dumps({
        "bench": "ingest", "samples": samples, "reports": args.reports, "scopes": args.scopes,
        "batch_reports": args.batch, "ingest_s": round(ingest_s, 3), "ingest_samples_per_s": round(ingest_rate),
        "copy_s": round(copy_s, 3), "copy_samples_per_s": round(copy_rate), "ratio": round(ratio, 3),
        "goal_samples_per_s": GOAL_SAMPLES_PER_S, "meets_goal": ingest_rate >= GOAL_SAMPLES_PER_S,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
