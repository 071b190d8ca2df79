"""`python -m agent` argument handling, Celery wiring of both sides (task names, queues, JSON only)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support.paths import ROOT


def _agent(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "KVPOOL_NODE_SECRET"}
    full_env.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=60)


def test_run_without_a_secret_is_refused():
    result = _agent("run", "--node", "node-a", "--broker", "redis://127.0.0.1:1/0")
    assert result.returncode == 2 and "no signing secret" in result.stderr


def test_a_secret_file_others_may_read_is_refused(tmp_path):
    secret = tmp_path / "node-a.secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o644)
    result = _agent("run", "--node", "node-a", "--broker", "redis://x", "--secret-file", str(secret))
    assert result.returncode == 2 and "readable or writable by group or others (mode 0644)" in result.stderr
    assert f"chmod 600 {secret}" in result.stderr


def test_run_with_bad_arguments_names_them(tmp_path):
    empty = tmp_path / "secret"
    empty.write_text("\n")
    empty.chmod(0o600)
    result = _agent("run", "--node", "node-a", "--broker", "redis://x", "--secret-file", str(empty))
    assert result.returncode == 2 and "is empty" in result.stderr
    result = _agent("run", "--node", "bad/name", "--broker", "redis://x", env={"KVPOOL_NODE_SECRET": "s"})
    assert result.returncode == 2 and "not a valid node name" in result.stderr
    result = _agent("run", "--node", "n", "--broker", "redis://x", "--report-interval", "0")
    assert result.returncode == 2 and "--report-interval" in result.stderr
    result = _agent("run", "--node", "n", "--broker", "redis://x", "--pool", "prefork")
    assert result.returncode == 2 and "--pool" in result.stderr


def test_second_agent_on_the_same_state_dir_is_refused(tmp_path):
    from agent.node.daemon import Daemon

    holder = Daemon("node-a", "s", tmp_path / "state", publish=lambda batch: None)
    try:
        result = _agent("run", "--node", "node-a", "--broker", "redis://127.0.0.1:1/0", "--state-dir",
                        str(tmp_path / "state"), env={"KVPOOL_NODE_SECRET": "s"})
        assert result.returncode != 0 and "in use by another agent" in result.stderr
    finally:
        holder.stop()


def test_agent_app_speaks_json_only_and_hands_documents_to_the_daemon(tmp_path):
    from agent.contract.messages import APPLY_CONFIG_TASK
    from agent.node.celery_app import make_app, register_tasks, run_worker
    from agent.node.daemon import Daemon
    from tests.support.messages import document

    app = make_app("node-a", "memory://")
    assert app.conf.task_serializer == "json" and app.conf.accept_content == ["json"]
    assert app.conf.task_default_queue == "agent.node-a"
    assert app.conf.broker_transport_options["ack_emulation"] is False  # see make_app
    with pytest.raises(ValueError, match="solo or threads"):
        run_worker(app, "node-a", pool="prefork")
    daemon = Daemon("node-a", "s3cret", tmp_path / "state", publish=lambda batch: None)
    try:
        register_tasks(app, daemon)
        ack = app.tasks[APPLY_CONFIG_TASK].apply(args=[document(version=4)]).get()
        assert ack["status"] == "applied" and daemon.applied_version == 4
    finally:
        daemon.stop()


def test_dashboard_tasks_and_routes():
    import dashboard.tasks  # noqa: F401  (registers the tasks)
    from dashboard.celery import app

    names = set(app.tasks)
    assert {"dashboard.ingest", "dashboard.push_nodes", "dashboard.reconcile_configs",
            "dashboard.rollup_occupancy", "dashboard.sync_master_quotas", "dashboard.sample_master_quotas"} <= names
    assert {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} <= names
    assert app.conf.task_routes["dashboard.ingest"] == {"queue": "dashboard.ingest"}
    assert app.conf.task_default_queue == "dashboard.control"
    assert app.conf.accept_content == ["json"] and app.conf.task_serializer == "json"


def test_ingest_task_runs_the_ingest_function(db):
    from dashboard.models import Report
    from dashboard.tasks import ingest
    from tests.support.messages import register, report

    register("node-a")
    assert ingest.apply(args=[[report(sequence=1)]]).get()["reports"] == 1
    assert Report.objects.count() == 1


def test_dashboard_worker_keeps_database_connections_across_tasks(db):
    from celery.fixups.django import DjangoWorkerFixup
    from django.db import connection

    from dashboard.celery import DB_REUSE_MAX_TASKS, _close_old_connections, app

    assert DjangoWorkerFixup(app).db_reuse_max == DB_REUSE_MAX_TASKS  # no close before and after every task
    connection.ensure_connection()
    eager_task = type("Task", (), {"request": type("Request", (), {"is_eager": True})()})()
    _close_old_connections(sender=eager_task)  # an eager task runs inside the caller's transaction: left alone
    assert connection.in_atomic_block and not connection.closed_in_transaction and not connection.needs_rollback
