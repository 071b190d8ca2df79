"""Sustained fleet ingest: simulated agents report every ``interval_s`` into real Celery ingest workers.

Used by ``bench.ingest.run_sustained`` (and ``python -m bench.ingest --sustained``). Set-up: a private
``redis-server`` (the broker), a private PostgreSQL database, ``workers`` dashboard ingest workers as an operator
runs them (``celery -A dashboard.celery worker -Q dashboard.ingest --pool prefork -c 1 --prefetch-multiplier 1``,
each its own process). The registry holds ``nodes`` nodes whose applied documents carry ``scopes_per_node``
cache scopes each (``bench.ingest.store_documents``).

Every tick (``interval_s / speedup`` real seconds; ``simulated_s / interval_s`` ticks) each node sends one signed
report of ``scopes_per_node`` rows as its own ``dashboard.ingest`` task, stamped with the real time. With
``kill_worker`` the pool process of worker 0 is SIGKILLed half-way, while it stores a batch (its tasks come back
through ``reject_on_worker_lost`` and ``dashboard.telemetry.redeliver``; Celery starts a new pool process).

Measured: lag = the time a tick's reports were all visible in the database (polled every ``POLL_S``) minus when
the tick began sending, the worst over the run; ``lost`` = reports sent but never stored, ``duplicated`` = sample
rows stored more than once for one (node, time, cache scope); ``samples_per_s`` = samples stored per real second
over the run (the offered load, when the workers keep up).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

#: Seconds between two polls of the receipts (the lag's resolution).
POLL_S = 0.5
#: Seconds the run waits after the last tick for the backlog to be stored.
DRAIN_WAIT_S = 180.0
#: Redelivery delay of a dead pool process's tasks in the bench's workers (``KVPOOL_INGEST_REDELIVER_SECONDS``).
REDELIVER_S = 5


class Redis:
    """A private ``redis-server`` on a free port (no persistence)."""

    def __init__(self, workdir: Path) -> None:
        from agent.sim.master import free_ports

        self.port = free_ports(1)[0]
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 15
        while not self.ping():
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING within 15 s")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class IngestWorker:
    """One ``celery worker -Q dashboard.ingest`` process (prefork, one pool process, prefetch 1)."""

    def __init__(self, index: int, env: dict[str, str], logdir: Path) -> None:
        self.log_path = logdir / f"ingest-worker-{index}.log"
        with open(self.log_path, "ab") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "dashboard.celery", "worker", "-Q", "dashboard.ingest",
                 "--pool", "prefork", "-c", "1", "--prefetch-multiplier", "1", "--without-mingle",
                 "--without-gossip", "--without-heartbeat", "-n", f"ingest-{index}@bench", "-l", "INFO"],
                env=env, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pool_pids(self) -> list[int]:
        """The worker's pool processes (children of its main process)."""
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@dataclass
class Progress:
    """Per tick: when it began sending, when all its reports were visible (monitor thread)."""

    started: dict[int, float] = field(default_factory=dict)
    complete: dict[int, float] = field(default_factory=dict)
    stored: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def _monitor(progress: Progress, nodes: int, database_url: str) -> None:
    """Poll the receipts per sequence (= tick + 1) every ``POLL_S``; record when each tick is complete."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        while not progress.stop.is_set():
            floor = min((t for t in progress.started if t not in progress.complete), default=None)
            counts = dict(conn.execute("SELECT sequence, COUNT(*) FROM dashboard_report WHERE sequence >= %s "
                                       "GROUP BY sequence", [(floor or 0) + 1]).fetchall()) if floor is not None else {}
            progress.stored = conn.execute("SELECT COUNT(*) FROM dashboard_report").fetchone()[0]
            now = time.monotonic()
            for tick in list(progress.started):
                if tick not in progress.complete and counts.get(tick + 1, 0) >= nodes:
                    progress.complete[tick] = now
            progress.stop.wait(POLL_S)


def _templates(nodes: int, scopes: int) -> list[dict[str, Any]]:
    """The unsigned report wire dict of each node (rows as ``bench.ingest.make_reports`` builds them)."""
    from agent.contract.messages import Report, ScopeOccupancy

    started = datetime.now(UTC) - timedelta(minutes=5)
    rows = [ScopeOccupancy(tenant_id=f"tenant-{k % 5}", served_model_name="qwen3-8b", namespace=f"prod-{k // 5}",
                           request_group=f"group-{k}", blocks=1000 + k, bytes=(1000 + k) << 20, puts=5000,
                           gets=9000, hit_blocks=7000, miss_blocks=2000 + k, evicted_blocks=3 * k,
                           store_evicted_blocks=k, budget_evicted_blocks=k, orphan_removed_blocks=k)
            for k in range(scopes)]
    from bench.ingest import APPLIED_VERSION

    return [Report(node=f"bench-{node:03d}", sequence=1, sent_at=started, started_at=started,
                   applied_version=APPLIED_VERSION, scopes=rows).to_wire() for node in range(nodes)]


def sustained(*, database_url: str, nodes: int, scopes_per_node: int, interval_s: float, simulated_s: float,
              speedup: float, workers: int, kill_worker: bool, workdir: Path, log=print) -> dict[str, Any]:
    """Run the sustained phase on the private database ``database_url`` (Django already set up on it, registry
    stored); see the module docstring. Returns the measured figures."""
    from agent.contract.signing import sign_message, timestamp
    from dashboard.celery import app, use_broker

    ticks = max(1, int(simulated_s // interval_s))
    period = interval_s / speedup
    redis = Redis(workdir)
    env = {**os.environ, "DATABASE_URL": database_url, "CELERY_BROKER_URL": redis.url,
           "KVPOOL_INGEST_REDELIVER_SECONDS": str(REDELIVER_S), "KVPOOL_INGEST_REDELIVER_CHECK_SECONDS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PYTHONUNBUFFERED": "1"}
    pool = [IngestWorker(i, env, workdir) for i in range(workers)]
    progress = Progress()
    monitor = threading.Thread(target=_monitor, args=(progress, nodes, database_url), daemon=True)
    killed = None
    try:
        deadline = time.monotonic() + 120
        while not all("ready." in w.log() for w in pool):
            if time.monotonic() > deadline or any(w.proc.poll() is not None for w in pool):
                raise RuntimeError("ingest workers did not start:\n" + "\n".join(w.log()[-2000:] for w in pool))
            time.sleep(0.2)
        use_broker(redis.url)
        templates = _templates(nodes, scopes_per_node)
        secrets_ = [f"bench-secret-{node:03d}" for node in range(nodes)]
        monitor.start()
        begin = time.monotonic()
        for tick in range(ticks):
            due = begin + tick * period
            time.sleep(max(0.0, due - time.monotonic()))
            progress.started[tick] = time.monotonic()
            sent_at = timestamp(datetime.now(UTC))
            with app.producer_or_acquire() as producer:
                for node in range(nodes):
                    report = sign_message({**templates[node], "sequence": tick + 1, "sent_at": sent_at},
                                          secrets_[node])
                    app.send_task("dashboard.ingest", args=[[report]], queue="dashboard.ingest", producer=producer)
            if kill_worker and killed is None and tick >= ticks // 2:
                killed = _kill_mid_batch(pool[0], redis)
                log(f"sustained: killed pool process {killed} of ingest worker 0 at tick {tick}")
            if tick % max(1, ticks // 10) == 0:
                log(f"sustained: tick {tick + 1}/{ticks} sent; {progress.stored} reports stored")
        last = time.monotonic()
        while progress.stored < nodes * ticks and time.monotonic() - last < DRAIN_WAIT_S:
            time.sleep(POLL_S)
        time.sleep(2 * POLL_S)
        end = max(progress.complete.values(), default=time.monotonic())
    finally:
        progress.stop.set()
        for worker in pool:
            worker.stop()
        redis.stop()
    return _figures(progress, nodes, scopes_per_node, ticks, begin, end, killed, pool, database_url)


def _kill_mid_batch(worker: IngestWorker, redis: Redis) -> int | None:
    """SIGKILL the worker's pool process while it holds tasks (unacked entries in Redis); its pid, or None when
    it had none within 60 s (then it is killed anyway)."""
    import redis as redis_py

    client = redis_py.Redis(port=redis.port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.hlen("unacked") < 2:
        time.sleep(0.01)
    pids = worker.pool_pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids[0] if pids else None


def _figures(progress: Progress, nodes: int, scopes: int, ticks: int, begin: float, end: float,
             killed: int | None, pool: list[IngestWorker], database_url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        reports = conn.execute("SELECT COUNT(*) FROM dashboard_report").fetchone()[0]
        samples = conn.execute("SELECT COUNT(*) FROM dashboard_occupancysample").fetchone()[0]
        twice = conn.execute("SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) AS n FROM "
                             "dashboard_occupancysample GROUP BY node_name, ts, tenant_id, served_model_name, "
                             "namespace, request_group HAVING COUNT(*) > 1) AS d").fetchone()[0]
    lags = [progress.complete[t] - progress.started[t] for t in progress.complete]
    expected = nodes * ticks
    elapsed = max(end - begin, 1e-9)
    return {"reports": reports, "reports_expected": expected, "lost": expected - reports,
            "duplicated": int(twice), "samples": samples, "samples_expected": expected * scopes,
            "samples_per_s": round(samples / elapsed),
            "lag_max_s": round(max(lags), 2) if len(lags) == ticks else None,
            "lag_p50_s": round(sorted(lags)[len(lags) // 2], 2) if lags else None,
            "ticks": ticks, "ticks_complete": len(lags), "elapsed_s": round(elapsed, 1),
            "killed_pool_process": killed,
            "redelivered_tasks": sum(int(n) for w in pool for n in re.findall(r"put back (\d+)", w.log()))}
