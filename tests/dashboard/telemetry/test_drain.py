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


# --- batched taking and acknowledging on Redis (``drain.RedisQueue``) ---------------------------------------------


def _channel(app):
    """A kombu channel of the dashboard's broker (closed with the connection at the end of the test)."""
    connection = app.connection_for_write()
    return connection, connection.default_channel


@pytest.mark.django_db
def test_a_take_records_every_task_it_pops_as_unacknowledged_in_the_same_step(queued):
    app, publish, client = queued
    for i in range(5):
        publish([report(f"node-{i:02d}", 1)])
    connection, channel = _channel(app)
    with connection:
        taken, dropped = drain.take_queued(channel, accept=app.conf.accept_content, max_tasks=3)
        assert (len(taken), dropped) == (3, 0)
        assert len(_waiting(client)) == 2  # the bound on tasks is exact
        # what was popped is held in kombu's unacked records, under the tags the batch acknowledges
        assert {tag.decode() for tag in client.hkeys("unacked")} == {item.tag for item in taken}
        assert client.zcard("unacked_index") == 3
        assert [item.messages[0]["node"] for item in taken] == ["node-00", "node-01", "node-02"]  # queue order
        drain.settle(taken)
    assert _unacked(client) == 0 and client.zcard("unacked_index") == 0
    assert len(_waiting(client)) == 2


@pytest.mark.django_db
def test_tasks_of_a_worker_that_died_before_the_commit_come_back_and_are_stored_once(queued):
    from dashboard.telemetry.redeliver import restore_stale

    app, publish, client = queued
    for i in range(4):
        publish([report(f"node-{i:02d}", 1), ack(f"node-{i:02d}", 2, version=1, digest="d" * 64)])
    connection, channel = _channel(app)
    with connection:
        taken, _ = drain.take_queued(channel, accept=app.conf.accept_content)
        assert len(taken) == 4 and _waiting(client) == []
        # the worker dies here: nothing stored, nothing acknowledged; a live worker's redelivery check puts the
        # tasks back in dashboard.ingest (the routing the unacked records name)
        assert restore_stale(channel, older_than=0) == 4
    assert _waiting(client) == ["dashboard.ingest"] * 4 and _unacked(client) == 0
    result, taken_again = ingest_queued(app, [])
    assert taken_again == 4 and (result.reports, result.acks, result.duplicate_reports) == (4, 4, 0)
    assert Report.objects.count() == 4 and ConfigAck.objects.count() == 4
    assert _waiting(client) == [] and _unacked(client) == 0


@pytest.mark.django_db
def test_tasks_of_a_worker_that_died_between_commit_and_acknowledgement_are_not_stored_twice(queued, monkeypatch):
    from dashboard.telemetry.redeliver import restore_stale

    app, publish, client = queued
    for i in range(3):
        publish([report(f"node-{i:02d}", 1)])

    def killed(items, *, requeue=False):
        raise SystemExit("killed after the commit")  # the acknowledgement never reaches Redis

    monkeypatch.setattr(drain, "settle", killed)
    with pytest.raises(SystemExit):
        ingest_queued(app, [])
    assert Report.objects.count() == 3 and _unacked(client) == 3  # stored, still held unacknowledged
    monkeypatch.undo()
    connection, channel = _channel(app)
    with connection:
        assert restore_stale(channel, older_than=0) == 3
    result, taken = ingest_queued(app, [])
    assert taken == 3 and (result.reports, result.duplicate_reports) == (0, 3)  # stored once, counted
    assert Report.objects.count() == 3
    assert _waiting(client) == [] and _unacked(client) == 0


@pytest.mark.django_db
def test_the_drain_stores_in_further_batches_what_arrives_while_a_batch_is_stored(queued, monkeypatch):
    app, publish, client = queued
    real = drain.ingest
    batches: list[list[str]] = []

    def storing(messages):
        batches.append(sorted(m["node"] for m in messages))
        if len(batches) < 3:  # two more agents send while this batch is stored
            publish([report(f"node-{10 + len(batches)}", 1)])
        return real(messages)

    monkeypatch.setattr(drain, "ingest", storing)
    publish([report("node-00", 1)])
    result, taken = ingest_queued(app, [report("node-a", 1)], own_id="own-task")
    assert batches == [["node-00", "node-a"], ["node-11"], ["node-12"]]
    assert (taken, result.reports) == (3, 4)
    assert _waiting(client) == [] and _unacked(client) == 0


@pytest.mark.django_db
def test_the_drain_stores_at_most_max_rounds_batches(queued, monkeypatch):
    app, publish, client = queued
    real = drain.ingest
    calls = []

    def storing(messages):  # an agent sends again during every batch: the queue never runs dry
        calls.append(len(messages))
        publish([report(f"node-{len(calls):02d}", 1)])
        return real(messages)

    monkeypatch.setattr(drain, "ingest", storing)
    publish([report("node-00", 1)])
    result, taken = ingest_queued(app, [], max_rounds=3)
    assert len(calls) == 3 and taken == 3
    assert len(_waiting(client)) == 1  # left to the next task


@pytest.mark.django_db
def test_a_restored_task_goes_back_to_the_ingest_queue_whatever_routing_its_payload_claims(queued):
    from dashboard.telemetry.redeliver import restore_stale

    app, publish, client = queued
    publish([report("node-a", 1)])
    payload = json.loads(client.rpop(INGEST_QUEUE))
    payload["properties"]["delivery_info"] = {"exchange": "", "routing_key": "dashboard.control"}  # a forgery
    client.lpush(INGEST_QUEUE, json.dumps(payload))
    connection, channel = _channel(app)
    with connection:
        taken, _ = drain.take_queued(channel, accept=app.conf.accept_content)
        assert len(taken) == 1
        assert restore_stale(channel, older_than=0) == 1
    assert _waiting(client) == ["dashboard.ingest"] and client.llen("dashboard.control") == 0


@pytest.mark.django_db
def test_a_payload_that_is_not_json_is_dropped_and_leaves_no_unacknowledged_record(queued):
    app, publish, client = queued
    publish([report("node-a", 1)])
    client.lpush(INGEST_QUEUE, b"\xff not json")
    publish([report("node-b", 1)])
    result, taken = ingest_queued(app, [])
    assert (taken, result.reports, result.invalid) == (2, 2, 1)
    assert _waiting(client) == [] and _unacked(client) == 0 and client.zcard("unacked_index") == 0


# --- hostile payloads: bounded work in Redis and in the worker ----------------------------------------------------


def _padded(client, publish, node: str, size: int) -> bytes:
    """A real ``dashboard.ingest`` payload of ``node`` (queued by ``publish``), padded to at least ``size`` bytes
    with a header the drain ignores; popped from the queue and returned."""
    publish([report(node, 1)])
    payload = json.loads(client.rpop(INGEST_QUEUE))
    payload["headers"]["padding"] = "x" * size
    return json.dumps(payload).encode()


@pytest.mark.django_db
def test_a_payload_over_the_size_bound_is_dropped_unrecorded_and_the_others_are_stored(queued, monkeypatch, caplog):
    app, publish, client = queued
    # the real bound is megabytes; the rule is the same
    monkeypatch.setattr(drain, "MAX_PAYLOAD_BYTES", 4096, raising=False)
    huge = _padded(client, publish, "node-c", 5000)
    publish([report("node-a", 1)])
    client.lpush(INGEST_QUEUE, huge)
    publish([report("node-b", 1)])
    connection, channel = _channel(app)
    with connection, caplog.at_level(logging.WARNING, logger="kvpool.dashboard.drain"):
        taken, dropped = drain.take_queued(channel, accept=app.conf.accept_content)
        # popped but never recorded as unacknowledged: nothing would ever restore (or parse) it
        assert dropped == 1 and _unacked(client) == 2 and client.zcard("unacked_index") == 2
        assert [item.messages[0]["node"] for item in taken] == ["node-a", "node-b"]
        drain.settle(taken)
    assert _waiting(client) == [] and _unacked(client) == 0
    assert "over 4096" in caplog.text and "xxxx" not in caplog.text


@pytest.mark.django_db
def test_a_compressed_task_is_dropped_before_kombu_inflates_it(queued, caplog):
    import base64
    import zlib

    app, publish, client = queued
    publish([report("node-c", 1)])
    payload = json.loads(client.rpop(INGEST_QUEUE))
    body = base64.b64decode(payload["body"])
    # a valid task once inflated: kombu's Message() would decompress it (unbounded) and the drain store it
    payload["body"] = base64.b64encode(zlib.compress(body)).decode()
    payload["headers"]["compression"] = "application/x-gzip"
    client.lpush(INGEST_QUEUE, json.dumps(payload))
    publish([report("node-a", 1)])
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.drain"):
        result, taken = ingest_queued(app, [])
    assert (taken, result.reports, result.invalid) == (1, 1, 1)
    assert "compression" in caplog.text and payload["body"] not in caplog.text
    assert not Report.objects.filter(node_name="node-c").exists()
    assert _waiting(client) == [] and _unacked(client) == 0 and client.zcard("unacked_index") == 0


@pytest.mark.django_db
def test_an_unparsable_unacked_record_left_by_a_dead_worker_is_deleted_and_restores_resume(queued, monkeypatch,
                                                                                              caplog):
    from dashboard.telemetry.redeliver import restore_stale

    app, publish, client = queued
    # a dead worker's dashboard.control task, unacknowledged since long ago (kombu's record)
    control = {"body": "", "headers": {"task": "dashboard.push_nodes"},
               "properties": {"delivery_tag": "control-tag", "delivery_info": {}}}
    client.hset("unacked", "control-tag", json.dumps([control, "", "dashboard.control"]))
    client.zadd("unacked_index", {"control-tag": 1})
    # an agent's payload that is an object to a lenient parser (a hex number), not JSON to Python's
    client.lpush(INGEST_QUEUE, '{"headers": {"task": "dashboard.ingest"}, "x": 0x10}')
    publish([report("node-a", 1)])
    real, calls = drain._message, []

    def dying(*args):  # the worker is killed (OOM) while taking: the records of this take stay
        calls.append(1)
        if len(calls) == 2:
            raise SystemExit("killed")
        return real(*args)

    monkeypatch.setattr(drain, "_message", dying)
    connection, channel = _channel(app)
    with connection:
        with pytest.raises(SystemExit):
            drain.take_queued(channel, accept=app.conf.accept_content)
        assert _unacked(client) == 3
        client.zadd("unacked_index", {tag: 2 for tag in client.hkeys("unacked") if tag != b"control-tag"})
        with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.redeliver"):
            assert restore_stale(channel, older_than=0) == 1  # node-a's task; the unparsable record is deleted
        assert "0x10" not in caplog.text and "deleted 1" in caplog.text
        assert {tag.decode() for tag in client.hkeys("unacked")} == {"control-tag"}
        assert MessageRejection.objects.get(reason="invalid").count == 1
        # kombu's visibility-timeout restore no longer meets it: the other queue's task comes back
        channel.qos.visibility_timeout = 0
        channel.qos.restore_visible(num=10)
    assert client.llen("dashboard.control") == 1 and _unacked(client) == 0
    assert _waiting(client) == ["dashboard.ingest"]
