"""Two dashboard ingest workers on real Redis and the test database: the first is SIGKILLed mid-batch, the second
(started after it died, so what it stores can only have come back through redelivery) stores the rest.

Every report must be stored once at most, and all of them but the one task a kill may catch between kombu's pop
and its unacked record (docs/ingest.md): the tasks the dead worker held unacknowledged (the one it ran —
``acks_late`` —, the one prefetched and the ones ``dashboard.telemetry.drain`` took) come back through
``dashboard.telemetry.redeliver`` within seconds (not after the hour of the transport's visibility timeout, which
the workers here keep at 3600 s), and the receipts keep a redelivered report from being stored twice. The
workers run as an ingest fleet is sized (``docs/operations.md``): prefork, one process, prefetch 1.
"""
from __future__ import annotations

import os
import signal

import pytest
from django.db import connection

from bench.ingest import make_reports
from dashboard.models import OccupancySample, Report
from tests.support.telemetry import PYTHON, Worker, _base_env, database_url, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REPORTS = 3000
SCOPES = 10
NODES = 50


def _stored() -> int:
    return Report.objects.count()


#: The worker is killed as soon as its first batch committed: it is then storing the next one. The drain takes up to
#: 100 tasks per Redis script call (``dashboard.telemetry.drain``), so 3,000 reports are far more than it stores
#: between the poll that sees the first batch and the kill. Celery's own consumer still takes one task at a time with
#: kombu's ``RPOP`` before it indexes it as unacknowledged: killed in that window of a few milliseconds, a worker
#: loses that task (docs/ingest.md; seen once in seven runs on a loaded machine), so the test allows that one task.
#: Reports the kill may lose in the pop window (one task: the one being popped).
POP_WINDOW_LOSS = 1


def _ingest_worker(name: str, broker_url: str, tmp_path) -> Worker:
    """``celery worker -Q dashboard.ingest --pool prefork -c 1 --prefetch-multiplier 1`` on the test database."""
    return Worker(
        [PYTHON, "-m", "celery", "-A", "dashboard.celery", "worker", "-Q", "dashboard.ingest", "--pool", "prefork",
         "-c", "1", "--prefetch-multiplier", "1", "--without-mingle", "--without-gossip", "--without-heartbeat",
         "-n", f"{name}@test", "-l", "INFO"],
        _base_env(DATABASE_URL=database_url(), CELERY_BROKER_URL=broker_url, KVPOOL_VAR_DIR=str(tmp_path / "var"),
                  KVPOOL_BROKER_VISIBILITY_TIMEOUT="3600", KVPOOL_INGEST_REDELIVER_SECONDS="5",
                  KVPOOL_INGEST_REDELIVER_CHECK_SECONDS="1"),
        tmp_path / f"{name}.log").start()


@pytest.mark.timeout(600)  # hang guard: every wait below has its own generous limit
def test_a_worker_killed_mid_batch_duplicates_nothing_and_loses_at_most_the_task_it_popped(dashboard_broker, tmp_path):
    from dashboard.celery import app

    reports = make_reports(REPORTS, SCOPES, nodes=NODES)
    with app.producer_or_acquire() as producer:  # the backlog first: the doomed worker meets it whole
        for report in reports:  # one task per report, as each agent sends its own
            app.send_task("dashboard.ingest", args=[[report]], queue="dashboard.ingest", producer=producer)
    doomed = _ingest_worker("doomed", dashboard_broker.url, tmp_path)
    survivor = None
    try:
        doomed.wait_ready()
        redis = dashboard_broker.client()
        wait_for(lambda: _stored() > 0, 240, "the first batch to be stored", interval=0.05)
        os.killpg(doomed.proc.pid, signal.SIGKILL)  # the worker and its pool process, holding taken tasks
        doomed.proc.wait(timeout=30)
        assert _stored() < REPORTS, "the worker finished before it was killed: nothing was mid-batch"
        assert redis.hlen("unacked") > 0, "the killed worker held no task"

        survivor = _ingest_worker("survivor", dashboard_broker.url, tmp_path)
        wait_for(lambda: redis.hlen("unacked") == 0 and redis.llen("dashboard.ingest") == 0
                 and _stored() >= REPORTS - POP_WINDOW_LOSS, 400,
                 "every task stored and acknowledged (acks follow the commit)", interval=0.5)
        assert "put back" in survivor.log(), "the dead worker's tasks were not redelivered by the survivor"
    finally:
        for worker in (survivor, doomed):
            if worker is not None:
                worker.stop()

    stored = _stored()
    assert REPORTS - POP_WINDOW_LOSS <= stored <= REPORTS
    assert OccupancySample.objects.count() == stored * SCOPES  # each stored report's samples once
    table = connection.ops.quote_name(OccupancySample._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM (SELECT node_name, ts, request_group FROM {table} "
                       "GROUP BY node_name, ts, request_group HAVING COUNT(*) > 1) AS twice")
        assert cursor.fetchone()[0] == 0
    assert set(Report.objects.values_list("node_name", "sequence")) <= {
        (report["node"], report["sequence"]) for report in reports}
