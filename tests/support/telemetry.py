"""Fixtures of the telemetry tests: a private Redis, dashboard and agent Celery workers, a real master.

Everything runs on free ports with private state, so concurrent test runs do not meet: each Redis is a
``redis-server`` started here (never the shared one on 6379), each worker a subprocess.

The dashboard worker is another process and must see the test database, so the SQLite test database is a file
(``/tmp/kvpool-test-<pid>.sqlite3``) instead of Django's in-memory default; this module sets that when it is
imported, before pytest-django creates the test database.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings

from agent.sim.master import MasterProcess, free_ports
from tests.support.paths import ROOT
from tests.support.waiting import wait_for  # noqa: F401  (re-exported for telemetry tests)

PYTHON = sys.executable

_db = django_settings.DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    _db.setdefault("TEST", {})["NAME"] = f"/tmp/kvpool-test-{os.getpid()}.sqlite3"


@pytest.fixture(autouse=True)
def _no_leftover_pushes():
    """Other tests' transactions never commit: drop the node names their registry changes left pending."""
    from dashboard.signals import discard_pending

    discard_pending()
    yield


class RedisServer:
    """A private ``redis-server`` on a fixed free port that can be stopped and started again (same data dir).

    ``appendonly`` keeps queued messages across a restart, like a production broker with persistence.
    """

    def __init__(self, workdir: Path, *, appendonly: bool = False) -> None:
        self.port = free_ports(1)[0]
        self.workdir = workdir
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--dir", str(self.workdir), "--appendonly", "yes" if self.appendonly else "no"]
        if self.appendonly:
            args += ["--appendfsync", "always"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for(self.ping, 10, f"redis-server on port {self.port}", interval=0.05)

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: Redis flushes the append-only file and exits
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        import redis

        return redis.Redis(port=self.port)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """A fresh private Redis (with append-only persistence) for one test."""
    server = RedisServer(tmp_path, appendonly=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def master() -> Iterator[MasterProcess]:
    """A real ``mooncake_master`` (multi-tenant, file policy) on free ports."""
    with MasterProcess() as process:
        yield process


def database_url() -> str:
    """URL of the test database pytest-django created (for worker subprocesses)."""
    from django.db import connection

    cfg = connection.settings_dict
    if cfg["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{cfg['NAME']}"
    user = quote(cfg.get("USER") or "")
    password = f":{quote(cfg['PASSWORD'])}" if cfg.get("PASSWORD") else ""
    host = cfg.get("HOST") or "127.0.0.1"
    port = f":{cfg['PORT']}" if cfg.get("PORT") else ""
    return f"postgres://{user}{password}@{host}{port}/{cfg['NAME']}"


class Worker:
    """A subprocess with its log in a file; ``stop()`` sends SIGTERM, then SIGKILL after ``grace`` seconds."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv, self.env, self.log_path = argv, env, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        with open(self.log_path, "ab") as handle:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: "ready." in self.log() or self.proc.poll() is not None, timeout,
                 f"{self.argv[3:6]} to be ready")
        if self.proc.poll() is not None:
            pytest.fail(f"worker exited with {self.proc.returncode}:\n{self.log()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: a crash, nothing is flushed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, grace: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()


def _base_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra})
    return env


@pytest.fixture
def workers(tmp_path) -> Iterator[Callable[..., Worker]]:
    """Factory of workers stopped at teardown (before the database is flushed).

    ``workers.dashboard(broker_url, **env)`` starts ``celery -A dashboard.celery worker`` on both dashboard
    queues with the test database; ``workers.agent(node, secret, broker_url, state_dir)`` starts
    ``python -m agent run``.
    """
    started: list[Worker] = []

    def dashboard(broker_url: str, **env: str) -> Worker:
        worker = Worker(
            [PYTHON, "-m", "celery", "-A", "dashboard.celery", "worker", "-Q", "dashboard.ingest,dashboard.control",
             "--pool", "solo", "--without-mingle", "--without-gossip", "--without-heartbeat", "-n",
             f"dashboard-{len(started)}@test", "-l", "INFO"],
            _base_env(DATABASE_URL=database_url(), CELERY_BROKER_URL=broker_url,
                      KVPOOL_VAR_DIR=str(tmp_path / "var"), KVPOOL_BROKER_VISIBILITY_TIMEOUT="5", **env),
            tmp_path / f"dashboard-{len(started)}.log",
        ).start()
        started.append(worker)
        return worker

    def agent(node: str, secret: str, broker_url: str, state_dir: Path | None = None,
              report_interval: float = 1.0) -> Worker:
        secret_file = tmp_path / f"{node}.secret"
        secret_file.write_text(secret)
        secret_file.chmod(0o600)  # the agent refuses a secret others can read
        state_dir = state_dir or tmp_path / f"state-{node}"
        worker = Worker(
            [PYTHON, "-m", "agent", "run", "--node", node, "--broker", broker_url, "--secret-file",
             str(secret_file), "--state-dir", str(state_dir), "--report-interval", str(report_interval),
             "--heartbeat-interval", "1"],
            _base_env(), tmp_path / f"agent-{node}-{len(started)}.log",
        ).start()
        started.append(worker)
        return worker

    factory = type("Workers", (), {"dashboard": staticmethod(dashboard), "agent": staticmethod(agent),
                                   "started": started})
    yield factory
    for worker in reversed(started):
        worker.stop()


@pytest.fixture
def dashboard_broker(redis_server):
    """Point this process's dashboard Celery app (the push on commit) at the private Redis."""
    from dashboard.celery import app, use_broker

    previous = app.conf.broker_url
    use_broker(redis_server.url)
    yield redis_server
    use_broker(previous)
