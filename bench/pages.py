"""The dashboard's pages at fleet size (issue 17): server time and queries of the overview, occupancy, registry and
checks pages on the fleet registry of ``bench.fleet_registry`` with its telemetry.

    python -m bench.pages [--nodes 1000] [--tenants 50] [--models 200] [--releases 2000] [--scopes 10000]
                          [--scopes-per-node 50] [--reports 3] [--rounds 5] [--applied] [--database-url URL]

Set-up: a private PostgreSQL database (as ``bench.ingest``), the fleet registry, a heartbeat from every node but the
last 4 % (silent for an hour: the checks fail for them), and ``--reports`` reports of every node's cache scopes
(one occupancy sample per scope, a few minutes apart) within the occupancy page's default window, then one run of
the rollup (``dashboard.telemetry.rollup``: the page's chart reads the occupancy summed over nodes it writes).
Each page is fetched in-process with Django's test client as a platform admin (the user who sees most); the server
time is the median over ``--rounds`` requests after a warm-up, and the queries are those of one request.

Also measured: the first node's and the first release's page, the REST API's lists (``API``: first page, default
size) and the filters' type-ahead (``/api/v1/names/<kind>/``). ``--applied``: every node's config document is stored
and applied by every agent that sent a heartbeat (``apply_documents``), so the checks compare what agents run.

Baseline, same run, same process: the login page (no query of the registry or telemetry); ratio = page median /
login median. Goal: the overview and occupancy pages under 500 ms at the fleet of issue 17 (``goal_met``); every
page and API answer measured over 500 ms is named in ``over_goal``. The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from datetime import timedelta

from bench.ingest import private_database, server_url, setup_django

GOAL_MS = 500
PAGES = {"overview": "/", "occupancy": "/occupancy/", "registry": "/registry/", "checks": "/checks/"}
#: The REST API's lists (first page, default size) and the filters' type-ahead (``/api/v1/names/<kind>/``), with a
#: prefix and without; also under the goal.
API = {
    **{"api_" + name.replace("-", "_").replace("/", "_"): f"/api/v1/{name}/" for name in (
        "tenants", "models", "releases", "request-groups", "nodes", "assignments", "reserved-namespaces", "audit",
        "memberships", "telemetry/nodes", "telemetry/occupancy", "telemetry/instances", "telemetry/master",
        "telemetry/master/samples")},
    **{"names_" + kind.replace("-", "_") + ("_prefix" if prefix else ""): f"/api/v1/names/{kind}/?q={prefix}"
       for kind, prefix in (("tenants", ""), ("served-models", "model-01"), ("namespaces", ""),
                            ("namespaces", "rel-01"), ("request-groups", "app"), ("nodes", "fleet-n09"))},
}


def add_telemetry(fleet, *, alive: int | None = None, silent: int = 0, reports: int = 1,
                  per_scope: bool = False) -> int:
    """Heartbeats of ``fleet``'s first ``alive`` nodes (all but ``silent`` without it) now and of the next
    ``silent`` ones an hour ago (the rest never reported); then ``reports`` occupancy reports of every heartbeating
    node, a minute, 4 minutes, 7 minutes ... ago: one 2 MiB sample per instance (request group ``app-000``) or, with
    ``per_scope``, per cache scope of the node's document. Returns the number of samples written.

    ``fleet``: a ``bench.fleet_registry.Fleet`` built in the current database."""
    from django.utils import timezone

    from dashboard.models import NodeState, OccupancySample
    from tenants.models import InstanceAssignment

    alive = len(fleet.node_names) - silent if alive is None else alive
    now = timezone.now()
    NodeState.objects.bulk_create(
        NodeState(node_name=name, heartbeat_at=now if n < alive else now - timedelta(hours=1))
        for n, name in enumerate(fleet.node_names[:alive + silent]))
    live = fleet.node_names[:alive]
    if per_scope:
        scopes = [(node, scope) for node in live for scope in fleet.scopes_by_node[node]]
    else:
        live_set = set(live)
        scopes = [(a.node.name, (a.release.model.tenant.tenant_id, a.release.model.served_model_name,
                                 a.release.namespace, "app-000"))
                  for a in InstanceAssignment.objects.select_related("node", "release__model__tenant")
                  if a.node.name in live_set]
    written = 0
    for report in range(reports):
        ts = now - timedelta(minutes=1 + 3 * report)
        rows = [OccupancySample(level=OccupancySample.Level.RAW, ts=ts, node_name=node, tenant_id=tenant_id,
                                served_model_name=model, namespace=namespace, request_group=group, bytes=2 << 20,
                                max_bytes=2 << 20)
                for node, (tenant_id, model, namespace, group) in scopes]
        OccupancySample.objects.bulk_create(rows, batch_size=5000)
        written += len(rows)
    return written


def apply_documents(fleet) -> int:
    """Render and store every node's config document (``dashboard.rollout.push.ensure_versions``, as a push does,
    without sending) and mark it applied by the agent of every node that has sent a heartbeat (what its ack does).
    Returns the number of documents marked applied.

    ``fleet``: a ``bench.fleet_registry.Fleet`` built in the current database, after ``add_telemetry``."""
    from django.db.models import F

    from dashboard.models import NodeState
    from dashboard.rollout.push import ensure_versions
    from tenants.models import Node

    push_log = logging.getLogger("kvpool.dashboard.push")
    level = push_log.level
    push_log.setLevel(logging.WARNING)  # one line per node otherwise
    try:
        ensure_versions(Node.objects.filter(name__in=fleet.node_names))
    finally:
        push_log.setLevel(level)
    return NodeState.objects.filter(node_name__in=fleet.node_names, heartbeat_at__isnull=False).update(
        applied_version=F("desired_version"), applied_digest=F("desired_digest"))


def measure(client, url: str, rounds: int) -> tuple[float, int]:
    """Median milliseconds of ``rounds`` GETs of ``url`` (after one warm-up) and the queries of one (on every
    database alias: the pages read through ``dashboard_reads``)."""
    from contextlib import ExitStack

    from django.db import connections

    count = 0

    def counted(execute, sql, params, many, context):
        nonlocal count
        count += 1
        return execute(sql, params, many, context)

    client.get(url)
    with ExitStack() as stack:
        for connection in connections.all():
            stack.enter_context(connection.execute_wrapper(counted))
        response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        client.get(url)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("nodes", 1000), ("tenants", 50), ("models", 200), ("releases", 2000), ("scopes", 10_000),
                          ("scopes-per-node", 50), ("reports", 3), ("rounds", 5)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--database-url", help="PostgreSQL server to create the private database on")
    parser.add_argument("--applied", action="store_true",
                        help="render every node's config document and mark it applied by every agent that sent a "
                             "heartbeat (apply_documents): the checks then compare what the agents run")
    args = parser.parse_args(argv)
    with private_database(server_url(args.database_url), prefix="kvpool_bench_pages") as url:
        from agent.sim.master import free_ports

        setup_django(url, KVPOOL_MASTER_ADMIN_URL=f"http://127.0.0.1:{free_ports(1)[0]}",
                     KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS="1", KVPOOL_MASTER_SYNC="false")
        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.test.utils import setup_test_environment

        from bench.fleet_registry import build_fleet

        setup_test_environment()
        start = time.perf_counter()
        fleet = build_fleet(nodes=args.nodes, tenants=args.tenants, models=args.models, releases=args.releases,
                            scopes=args.scopes, scopes_per_node=args.scopes_per_node)
        samples = add_telemetry(fleet, silent=max(1, args.nodes // 25), reports=args.reports, per_scope=True)
        applied = apply_documents(fleet) if args.applied else 0
        build_s = time.perf_counter() - start
        from dashboard.telemetry.rollup import rollup

        start = time.perf_counter()
        rolled = rollup()  # what the periodic task does every minute: the occupancy summed over nodes among it
        print(f"rollup {rolled} in {time.perf_counter() - start:.1f} s", flush=True)
        print(f"fleet: {len(fleet.node_names)} nodes, {len(fleet.tenant_ids)} tenants, {len(fleet.releases)} "
              f"releases, {len(fleet.scopes)} cache scopes, {fleet.instances} instances, {samples} occupancy "
              f"samples, {applied} documents applied; built in {build_s:.1f} s", flush=True)
        client = Client()
        client.force_login(get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-pw"))
        baseline_ms, _ = measure(Client(), "/accounts/login/", args.rounds)
        print(f"baseline: login page {baseline_ms:.1f} ms", flush=True)
        result = {"bench": "pages", "nodes": len(fleet.node_names), "releases": len(fleet.releases),
                  "scopes": len(fleet.scopes), "samples": samples, "applied": applied,
                  "baseline_ms": round(baseline_ms, 1), "goal_ms": GOAL_MS}
        from tenants.models import Node, Release

        details = {"node": f"/nodes/{Node.objects.order_by('name').first().pk}/",
                   "release": f"/releases/{Release.objects.order_by('namespace').first().pk}/"}
        for name, page in {**PAGES, **details, **API}.items():
            ms, queries = measure(client, page, args.rounds)
            print(f"{name}: {ms:.0f} ms median of {args.rounds}, {queries} queries, "
                  f"{ms / baseline_ms:.1f}x the login page", flush=True)
            result[f"{name}_ms"] = round(ms, 1)
            result[f"{name}_queries"] = queries
            result[f"{name}_ratio"] = round(ms / baseline_ms, 1)
        result["goal_met"] = all(result[f"{name}_ms"] <= GOAL_MS for name in ("overview", "occupancy"))
        result["over_goal"] = sorted(name for name in {**PAGES, **details, **API} if result[f"{name}_ms"] > GOAL_MS)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    raise SystemExit(main())
