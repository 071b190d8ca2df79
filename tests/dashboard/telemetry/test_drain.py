"""dashboard.drain: one ingest task stores the ingest tasks queued behind it (real Redis, real kombu).

Tasks are queued the way agents queue them (``agent.node.celery_app.make_publisher`` on a private Redis), then
``ingest_queued`` runs in this process against the same Redis; the last test lets a real dashboard worker do it.
"""
from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.db import IntegrityError, OperationalError

from agent.contract.messages import INGEST_QUEUE, INGEST_TASK
from agent.node.celery_app import make_app, make_publisher
from dashboard.models import ConfigAck, MessageRejection, NodeState, Report
from dashboard.telemetry import drain
from dashboard.telemetry.drain import ingest_queued
from tests.support.messages import T0, ack, heartbeat, register, report, sent
from tests.support.telemetry import wait_for

pytestmark = [pytest.mark.integration]


@pytest.fixture
def queued(dashboard_broker):
    """(dashboard Celery app, agent-side ``publish(messages)``, redis client), all on a private Redis."""
    from dashboard.celery import app

    register("node-a", "node-b", "node-c", "poison", *(f"node-{i:02d}" for i in range(30)))
    agent_app = make_app("tests", dashboard_broker.url)
    yield app, make_publisher(agent_app), dashboard_broker.client()
    agent_app.close()


def _waiting(client) -> list[str]:
    """Task names of the messages waiting on ``dashboard.ingest``, oldest first."""
    return [json.loads(raw)["headers"]["task"] for raw in reversed(client.lrange(INGEST_QUEUE, 0, -1))]


def _unacked(client) -> int:
    return client.hlen("unacked")


@pytest.mark.django_db
def test_batch_with_a_duplicate_and_bad_messages_stores_the_good_ones_once(queued, caplog):
    app, publish, client = queued
    publish([report("node-a", 1)])
    publish([report("node-a", 1), report("node-a", 2, at=T0 + timedelta(seconds=10))])  # an outbox re-send
    bad = ack("node-b", 1, secret=None)
    bad["status"] = "maybe"
    publish([sent(bad), ack("node-b", 2, version=1, digest="b" * 64)])
    publish([ack("node-b", 3, version=9, digest="f" * 64, secret=None)])  # unsigned: a forgery
    app.send_task(INGEST_TASK, args=["not a list"], queue=INGEST_QUEUE)  # a malformed task
    publish([heartbeat("node-c", applied_version=1)])
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard"):
        result, taken = ingest_queued(app, [ack("node-a", 3, version=1, digest="a" * 64)], own_id="own-task")

    assert taken == 5  # the malformed task was dropped, not taken
    assert (result.reports, result.duplicate_reports, result.acks, result.heartbeats) == (2, 1, 2, 1)
    assert result.invalid == 2  # the ack with a bad status and the malformed task
    assert result.rejected == {"invalid": 2, "unsigned": 1, "duplicate": 1}
    assert MessageRejection.objects.get(reason="unsigned").count == 1
    assert sorted(Report.objects.values_list("node_name", "sequence")) == [("node-a", 1), ("node-a", 2)]
    assert sorted(ConfigAck.objects.values_list("node_name", "sequence")) == [("node-a", 3), ("node-b", 2)]
    assert NodeState.objects.get(node_name="node-b").acked_digest == "b" * 64
    assert NodeState.objects.get(node_name="node-c").heartbeat_at == T0
    assert "status" in caplog.text and "dropped malformed dashboard.ingest task" in caplog.text
    assert _waiting(client) == [] and _unacked(client) == 0  # everything taken was acknowledged


@pytest.mark.django_db
def test_a_message_that_is_not_a_plain_ingest_task_stays_queued_and_stops_the_drain(queued):
    app, publish, client = queued
    publish([report("node-a", 1)])
    app.send_task("dashboard.reconcile_configs", queue=INGEST_QUEUE)
    publish([report("node-a", 2, at=T0 + timedelta(seconds=10))])
    result, taken = ingest_queued(app, [])
    assert (taken, result.reports) == (1, 1)
    assert sorted(_waiting(client)) == ["dashboard.ingest", "dashboard.reconcile_configs"]
    assert _unacked(client) == 0


@pytest.mark.django_db
def test_a_message_the_database_refuses_loses_only_itself(queued, monkeypatch, caplog):
    app, publish, client = queued
    real = drain.ingest

    def refusing(messages):  # stands in for a constraint the database enforces on one node's data
        if any(isinstance(m, dict) and m.get("node") == "poison" for m in messages):
            raise IntegrityError("value refused")
        return real(messages)

    monkeypatch.setattr(drain, "ingest", refusing)
    publish([report("node-a", 1), report("poison", 1)])
    publish([report("node-b", 1)])
    with caplog.at_level(logging.ERROR, logger="kvpool.dashboard.drain"):
        result, taken = ingest_queued(app, [report("node-c", 1)], own_id="own-task")
    assert taken == 2 and result.invalid == 1
    assert sorted(Report.objects.values_list("node_name", flat=True)) == ["node-a", "node-b", "node-c"]
    assert "'poison'" in caplog.text and "value refused" in caplog.text
    assert _waiting(client) == [] and _unacked(client) == 0


@pytest.mark.django_db
def test_unreachable_database_puts_the_taken_tasks_back(queued, monkeypatch):
    app, publish, client = queued

    def unreachable(messages):
        raise OperationalError("connection refused")

    monkeypatch.setattr(drain, "ingest", unreachable)
    publish([report("node-a", 1)])
    publish([report("node-b", 1)])
    with pytest.raises(OperationalError):
        ingest_queued(app, [report("node-c", 1)])
    assert _waiting(client) == ["dashboard.ingest", "dashboard.ingest"] and _unacked(client) == 0


@pytest.mark.django_db
def test_the_task_called_directly_stores_only_its_own_messages(queued):
    from dashboard.tasks import ingest

    app, publish, client = queued
    publish([report("node-a", 1)])
    assert ingest([report("node-b", 1)])["tasks"] == 1
    assert ingest("not a list")["invalid"] == 1
    assert list(Report.objects.values_list("node_name", flat=True)) == ["node-b"]
    assert _waiting(client) == ["dashboard.ingest"]


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_stores_a_backlog_in_batches(queued, workers):
    app, publish, client = queued
    for node in range(30):
        name = f"node-{node:02d}"
        publish([report(name, 1), ack(name, 2, version=1, digest="c" * 64)])
    publish([report("node-00", 1)])  # a duplicate delivery
    publish([sent({"kind": "report", "node": "node-00"})])  # invalid: fields missing
    publish([{"kind": "report", "node": "node-01"}])  # unsigned
    worker = workers.dashboard(app.conf.broker_url)
    worker.wait_ready()
    wait_for(lambda: Report.objects.count() == 30 and ConfigAck.objects.count() == 30, 60,
             "the backlog to be stored")
    wait_for(lambda: not _waiting(client) and _unacked(client) == 0, 30, "the queue to be empty")
    assert NodeState.objects.filter(acked_version=1, acked_digest="c" * 64).count() == 30
    assert "queued tasks together" in worker.log()  # batches, not one task per agent message
    assert "refused report message naming node 'node-00': invalid" in worker.log()
    assert "refused report message naming node 'node-01': unsigned" in worker.log()
    assert dict(MessageRejection.objects.values_list("reason", "count")) == {
        "duplicate": 1, "invalid": 1, "unsigned": 1}
