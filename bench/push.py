"""Config push fan-out: one registry change affecting N nodes, until every node's agent acked it.

    python -m bench.push [--nodes 200] [--rounds 10] [--database-url URL] [--agent-processes 1] [--keep-workdir]

Set-up: a private ``redis-server`` (free port), a private PostgreSQL database (as ``bench.ingest``), a registry
of one tenant, model and release with one instance on each of ``N`` nodes; a real dashboard Celery worker
(``celery -A dashboard.celery worker``, threads pool, 2 threads, both dashboard queues) and one process (or
``--agent-processes`` processes, each with every k-th node) that simulates the ``N`` agents: a Celery worker
(``agent.node.celery_app.make_app``) consuming the ``N`` queues ``agent.<node>`` (threads pool) that hands each
document to that node's real ``agent.node.daemon.Daemon`` (signature check, validation, key space binding,
persisted state, ack through the on-disk outbox to ``dashboard.ingest``).

A round: change the tenant's quota (every node's document changes) and commit; ``transaction.on_commit`` queues
``dashboard.push_nodes`` tasks; the worker renders, versions, signs and sends ``N`` documents; the agents apply
and ack; the ingest worker records the acks. Measured from just before the commit until the database shows
all ``N`` nodes acked the new version (p50/p99 over rounds), plus each node's own latency (its ack's send
time), and the phases of each node (sent by the dashboard, acked by its agent, recorded by the dashboard).
Goal: p99 until all acked < 2 s. On one machine the work of all ``N`` agents runs in one process beside the
dashboard, PostgreSQL and Redis on the same cores (a deployment runs each agent on its own node); the CPU
seconds per process printed with the result show where the time goes: in total, and per measured round
(``cpu_per_round_s``: dashboard worker, simulated agents, Redis, this process, and the PostgreSQL backends of
the bench database; ``dashboard_cpu_ms_per_document``: the dashboard worker's per document, the acks' ingest
included). The work directory (worker logs) is removed after a successful run unless
``--keep-workdir`` is given; a failed run keeps it and names it.

Baseline, same run, same Redis: the same fan-out with raw Redis — ``LPUSH`` one document-sized payload to
each of ``N`` lists, a consumer thread ``BRPOP``s across them and ``LPUSH``es a reply, until ``N`` replies.
Ratio = push p99 / baseline p99. The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_P99_S = 2.0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``: the smallest value with at least ``q`` % of the
    values at or below it."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


class Redis:
    """A private redis-server for the run."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        import redis

        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _tree_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of ``pid`` and its live descendants (Linux ``/proc``; 0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            children = [int(child) for child in handle.read().split()]
    except (OSError, ValueError, IndexError):
        return 0.0
    return own + sum(_tree_cpu_seconds(child) for child in children)


def _postgres_backend_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend connected to the bench's database, by pid."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        pids = [row[0] for row in cursor.fetchall()]
    return {pid: _tree_cpu_seconds(pid) for pid in pids}


def _spawn(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env}
    with open(log, "ab") as handle:
        return subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_log(proc: subprocess.Popen, log: Path, needle: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while needle not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[:4]} not ready:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# --- the simulated agents (run in their own process) ------------------------------------------------------


def simulate_agents(broker: str, secrets_file: str, state_dir: str, threads: int) -> None:
    """Celery worker consuming every node's queue; each document goes to that node's ``Daemon``."""
    from agent.contract.messages import APPLY_CONFIG_TASK, node_queue
    from agent.node.celery_app import make_app, make_publisher
    from agent.node.daemon import Daemon

    secrets = json.loads(Path(secrets_file).read_text())
    app = make_app("bench-agents", broker)
    publish = make_publisher(app)
    daemons = {name: Daemon(name, secret, Path(state_dir) / name, publish=publish)
               for name, secret in secrets.items()}

    @app.task(name=APPLY_CONFIG_TASK, ignore_result=True)
    def apply_config(document):
        daemon = daemons[document["node"]]
        daemon.handle_document(document)
        daemon.flush()

    app.worker_main(["worker", "--hostname=bench-agents@sim", f"--queues={','.join(map(node_queue, secrets))}",
                     "--pool=threads", f"--concurrency={threads}", "--loglevel=WARNING", "--without-mingle",
                     "--without-gossip", "--without-heartbeat"])


# --- baseline ----------------------------------------------------------------------------------------------


def baseline(redis, nodes: int, rounds: int, payload: bytes) -> list[float]:
    """Seconds per round of the raw Redis fan-out (see the module docstring)."""
    client = redis.client
    keys = [f"bench.raw.{i:03d}" for i in range(nodes)]
    stop = threading.Event()

    def consumer() -> None:
        import redis as redis_lib

        own = redis_lib.Redis(port=redis.port)
        while not stop.is_set():
            item = own.brpop(keys, timeout=1)
            if item is not None:
                own.lpush("bench.raw.acks", item[0])

    thread = threading.Thread(target=consumer, daemon=True)
    thread.start()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lpush(key, payload)
            pipe.execute()
        for _ in range(nodes):
            client.brpop(["bench.raw.acks"], timeout=30)
        times.append(time.perf_counter() - start)
    stop.set()
    thread.join(timeout=5)
    return times


# --- the benchmark -----------------------------------------------------------------------------------------


def run(nodes: int, rounds: int, database_url: str | None, keep_workdir: bool = False,
        agent_processes: int = 1) -> dict:
    from bench.ingest import private_database, server_url, setup_django

    workdir = Path(tempfile.mkdtemp(prefix="kvpool-bench-push-"))
    redis = Redis(workdir)
    try:
        with private_database(server_url(database_url), prefix="kvpool_bench_push") as url:
            # one tenant runs an instance on every node: lift the per-tenant instance cap to the fleet's size
            limits = {"KVPOOL_MAX_INSTANCES_PER_TENANT": str(max(nodes, 256))}
            setup_django(url, CELERY_BROKER_URL=redis.url, KVPOOL_VAR_DIR=str(workdir / "var"),
                         KVPOOL_MASTER_SYNC="false", **limits)
            from django.db import transaction

            from tenants.models import (
                InstanceAssignment,
                Node,
                Release,
                ServedModel,
                Tenant,
            )
            from tenants.services import validated_save

            tenant = validated_save(Tenant(tenant_id="bench", quota_bytes=64 << 30))
            model = validated_save(ServedModel(tenant=tenant, served_model_name="qwen3-8b",
                                               model_path="/models/Qwen3-8B"))
            release = validated_save(Release(model=model, namespace="bench-2026-11", num_layers=36, num_kv_heads=8,
                                             head_dim=128, block_size=16, engine="vllm", engine_version="0.33.0"))
            names = [f"bench-{i:03d}" for i in range(nodes)]
            with transaction.atomic():
                for name in names:
                    node = validated_save(Node(name=name, hostname="10.0.0.1", model_roots=["/models"]))
                    validated_save(InstanceAssignment(node=node, release=release, port=8000))

            def change() -> None:
                tenant.quota_bytes += 1 << 20
                tenant.save()

            result = measure_push(redis, workdir, url, names, change, rounds, agent_processes, env=limits)
    finally:
        redis.stop()
    if keep_workdir:
        print(f"logs in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)  # kept (with the logs) when the run failed
    return {"bench": "push", **result}


def measure_push(redis: Redis, workdir: Path, database_url: str, names: list[str], change, rounds: int,
                 agent_processes: int = 1, env: dict[str, str] | None = None, round_timeout_s: float = 60) -> dict:
    """Measure ``rounds`` config pushes to the nodes ``names`` (registered, with their instances, in the database
    Django uses, ``database_url``) and the raw Redis baseline; returns the figures (see ``run``'s JSON).

    Starts the dashboard worker and ``agent_processes`` agent simulators (logs in ``workdir``; ``env`` is added to
    their environment), runs a warm-up round and ``rounds`` measured rounds — each calls ``change()`` (a registry
    write that changes every named node's document) in a transaction and waits until the database shows every
    node acked the new version (at most ``round_timeout_s``) — then the baseline, and stops the processes. Raises
    ``RuntimeError`` naming ``workdir`` when a round does not complete.
    """
    from django.db import transaction
    from django.db.models import Count, Min
    from django.utils import timezone

    from dashboard.models import ConfigAck, ConfigVersion, NodeState
    from tenants.models import Node

    nodes = len(names)
    procs: list[subprocess.Popen] = []
    try:
        redis.client.flushdb()  # the set-up's own pushes: the first round sends every first document
        secrets = sorted(Node.objects.filter(name__in=names).values_list("name", "signing_secret"))
        secrets_files = []
        for shard in range(agent_processes):  # node i goes to simulator process i % agent_processes
            secrets_files.append(workdir / f"secrets-{shard}.json")
            secrets_files[-1].write_text(json.dumps(dict(secrets[shard::agent_processes])))

        env = {"DATABASE_URL": database_url, "CELERY_BROKER_URL": redis.url, "KVPOOL_VAR_DIR": str(workdir / "var"),
               "KVPOOL_MASTER_SYNC": "false", "DJANGO_SETTINGS_MODULE": "dashboard.settings", **(env or {})}
        dash_log, agents_log = workdir / "dashboard.log", workdir / "agents.log"
        procs.append(_spawn([sys.executable, "-m", "celery", "-A", "dashboard.celery", "worker", "-Q",
                             "dashboard.ingest,dashboard.control", "--pool", "threads", "-c", "2",
                             "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO"],
                            dash_log, **env))
        for secrets_file in secrets_files:
            procs.append(_spawn([sys.executable, "-m", "bench.push", "--simulate-agents", "--broker", redis.url,
                                 "--secrets-file", str(secrets_file), "--state-dir", str(workdir / "agents")],
                                agents_log))
        _wait_log(procs[0], dash_log, "ready.")
        time.sleep(2.0)  # the agents' worker logs at WARNING: give it time to subscribe to its queues

        def all_acked(version: int) -> bool:
            row = NodeState.objects.filter(node_name__in=names).aggregate(n=Count("id"), v=Min("acked_version"))
            return row["n"] == nodes and (row["v"] or 0) >= version

        round_times: list[float] = []
        node_times: list[float] = []
        phases: dict[str, list[float]] = {"sent": [], "acked": [], "recorded": []}

        def cpu_now() -> dict[str, float]:
            return {"dashboard_worker": _tree_cpu_seconds(procs[0].pid),
                    "simulated_agents": sum(_tree_cpu_seconds(proc.pid) for proc in procs[1:]),
                    "redis": _tree_cpu_seconds(redis.proc.pid), "bench": time.process_time()}

        version = dict(NodeState.objects.filter(node_name__in=names).values_list("node_name", "desired_version"))
        base = max(version.values(), default=0)  # nodes pushed before (a registry written with saves)
        for round_no in range(rounds + 1):  # round 0 is the warm-up (first documents)
            if round_no == 1:
                cpu_before, pg_before = cpu_now(), _postgres_backend_cpu()
            started_wall, started = timezone.now(), time.perf_counter()
            with transaction.atomic():
                change()
            deadline = started + round_timeout_s
            while not all_acked(base + round_no + 1):
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"round {round_no}: not all nodes acked within {round_timeout_s:g} s; logs in "
                                       f"{workdir}")
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
            if round_no == 0:
                continue
            round_times.append(elapsed)
            node_times += [(at - started_wall).total_seconds()
                           for at in NodeState.objects.filter(node_name__in=names)
                           .values_list("acked_at", flat=True)]
            for sent_at, acked_at in NodeState.objects.filter(node_name__in=names).values_list(
                    "pushed_at", "acked_at"):
                phases["sent"].append((sent_at - started_wall).total_seconds())
                phases["acked"].append((acked_at - started_wall).total_seconds())
            phases["recorded"] += [(at - started_wall).total_seconds() for at in ConfigAck.objects.filter(
                node_name__in=names, version=base + round_no + 1, status="applied").values_list(
                "received_at", flat=True)]
        cpu_after, pg_after = cpu_now(), _postgres_backend_cpu()
        per_round = {name: (cpu_after[name] - cpu_before[name]) / rounds for name in cpu_after}
        per_round["postgres_backends"] = sum(
            cpu - pg_before.get(pid, 0.0) for pid, cpu in pg_after.items()) / rounds
        cpu = {"dashboard_worker": cpu_after["dashboard_worker"],
               "simulated_agents": cpu_after["simulated_agents"], "bench": cpu_after["bench"]}
        sample = ConfigVersion.objects.filter(node_name=names[0]).order_by("-version").first()
        payload = json.dumps(sample.document).encode()
        raw_times = baseline(redis, nodes, rounds, payload)
    finally:
        for proc in procs:
            _stop(proc)
    p50, p99 = percentile(round_times, 50), percentile(round_times, 99)
    b50, b99 = percentile(raw_times, 50), percentile(raw_times, 99)
    return {
        "nodes": nodes, "rounds": rounds, "agent_processes": agent_processes,
        "document_bytes": len(payload),
        "all_acked_p50_s": round(p50, 3), "all_acked_p99_s": round(p99, 3),
        "all_acked_mean_s": round(statistics.mean(round_times), 3),
        "node_ack_p50_s": round(percentile(node_times, 50), 3), "node_ack_p99_s": round(percentile(node_times, 99), 3),
        "phase_p50_s": {name: round(percentile(v, 50), 3) for name, v in phases.items()},
        "phase_p99_s": {name: round(percentile(v, 99), 3) for name, v in phases.items()},
        "baseline_p50_s": round(b50, 4), "baseline_p99_s": round(b99, 4), "ratio_p99": round(p99 / b99, 1),
        "cpu_s": {name: round(value, 2) for name, value in cpu.items()},
        "cpu_per_round_s": {name: round(value, 3) for name, value in per_round.items()},
        # the dashboard worker's CPU per pushed document: rendering, versioning, signing, publishing, and storing
        # the document's ack (the same worker ingests the acks)
        "dashboard_cpu_ms_per_document": round(per_round["dashboard_worker"] / nodes * 1000, 3),
        "goal_p99_s": GOAL_P99_S, "meets_goal": p99 < GOAL_P99_S,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.push", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200, help="simulated nodes (default 200)")
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (default 10)")
    parser.add_argument("--database-url", help="PostgreSQL server URL (a private database is created on it)")
    parser.add_argument("--agent-processes", type=int, default=1,
                        help="processes the simulated agents are spread over (default 1)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the logs of the workers (path on stderr)")
    parser.add_argument("--simulate-agents", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--secrets-file", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.simulate_agents:
        simulate_agents(args.broker, args.secrets_file, args.state_dir, args.threads)
        return 0
    if args.nodes < 1 or args.rounds < 1 or args.agent_processes < 1:
        parser.error("--nodes, --rounds and --agent-processes must be at least 1")
    result = run(args.nodes, args.rounds, args.database_url, args.keep_workdir, args.agent_processes)
    print(f"push fan-out to {result['nodes']} nodes ({result['document_bytes']} byte documents), "
          f"{result['rounds']} rounds: all acked p50 {result['all_acked_p50_s']:.3f} s, "
          f"p99 {result['all_acked_p99_s']:.3f} s; per node p50 {result['node_ack_p50_s']:.3f} s, "
          f"p99 {result['node_ack_p99_s']:.3f} s")
    print(f"baseline raw Redis LPUSH/BRPOP fan-out: p50 {result['baseline_p50_s']:.4f} s, "
          f"p99 {result['baseline_p99_s']:.4f} s; ratio p99 {result['ratio_p99']}x")
    print(f"phases p99 (from commit): sent {result['phase_p99_s']['sent']:.3f} s, applied+acked by the agent "
          f"{result['phase_p99_s']['acked']:.3f} s, "
          f"recorded by the dashboard {result['phase_p99_s']['recorded']:.3f} s; "
          f"CPU seconds over all rounds incl. warm-up: {result['cpu_s']}")
    print(f"CPU seconds per measured round: {result['cpu_per_round_s']} (postgres_backends: the bench database's "
          f"backends alive at the end); dashboard worker {result['dashboard_cpu_ms_per_document']} ms per document "
          "(push and ack ingest)")
    print(f"goal p99 < {GOAL_P99_S} s: {'met' if result['meets_goal'] else 'NOT met'}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
