"""Agents can push only to ``dashboard.ingest``, and the dashboard's worker runs only the agents' own tasks from it
(``dashboard.task_queues``; issue 16 item 3, "write where it should not"). Before: each agent's Redis user could
push to ``dashboard.control`` and the worker ran whatever task a message named — ``dashboard.push_nodes`` for
other nodes, ``dashboard.sync_master_quotas``, ``celery.chunks`` turning one message into a thousand runs.

A real ``redis-server`` with the agents' ACL users, the agent's own Celery app under its restricted credentials,
and a real dashboard worker on the test database."""
from __future__ import annotations

import json
from unittest import mock

import pytest
import redis
from celery.beat import ScheduleEntry, Scheduler
from kombu import Producer

from agent.contract.broker import agent_acl_rules
from agent.contract.messages import APPLY_CONFIG_TASK, INGEST_QUEUE, PURGE_RESULT_QUEUE, PURGE_RESULT_TASK, PURGE_TASK
from dashboard.models import MessageRejection
from dashboard.task_queues import SIGNATURE_HEADER, QueueCheckedTask, SigningAMQP, allowed, signature, verified
from tests.support.telemetry import dashboard_broker, redis_server, workers  # noqa: F401  (fixtures)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHUNKS = {"task": "dashboard.reconcile_configs", "args": [], "kwargs": {}, "options": {}, "subtask_type": None,
          "immutable": False}


def test_the_allow_list():
    assert PURGE_RESULT_QUEUE == INGEST_QUEUE  # the agents' one queue
    for agents_task in ("dashboard.ingest", "dashboard.purge_result"):
        assert allowed(agents_task, delivered=True, signed=False)
    for task in ("dashboard.push_nodes", "celery.chunks"):
        assert not allowed(task, delivered=True, signed=False)
        assert allowed(task, delivered=True, signed=True) and allowed(task, delivered=False, signed=False)
    good = signature("id-1", "dashboard.push_nodes")
    assert verified("id-1", "dashboard.push_nodes", good)
    for task_id, name, value in [("id-2", "dashboard.push_nodes", good), ("id-1", "celery.chunks", good),
                                 ("id-1", "dashboard.push_nodes", good.upper()), ("id-1", "dashboard.push_nodes", None),
                                 ("id-1", "dashboard.push_nodes", [good]), (None, "dashboard.push_nodes", good)]:
        assert not verified(task_id, name, value)
    import dashboard.tasks  # noqa: F401  (registers the dashboard's tasks)
    from dashboard.celery import app

    assert isinstance(app.amqp, SigningAMQP)
    assert isinstance(app.tasks["celery.chunks"], QueueCheckedTask)  # Celery's own tasks too
    assert isinstance(app.tasks["dashboard.push_nodes"], QueueCheckedTask)


def _headers_published(send) -> list[dict]:
    """The headers of each message the producer's ``publish`` got from ``send(producer)``."""
    from dashboard.celery import app

    with app.connection_for_write("memory://") as conn, \
            mock.patch.object(Producer, "publish", autospec=True) as publish:
        send(Producer(conn))
    return [dict(call.kwargs["headers"]) for call in publish.call_args_list]


def test_every_task_the_dashboard_sends_for_its_worker_is_signed_and_the_agents_tasks_are_not(settings):
    """Beat's schedule, the push on commit (``apply_async``), ``delay`` and ``send_task`` are signed; what goes to
    agents (``agent.<node>``) and the agents' own tasks are not."""
    import dashboard.tasks as tasks
    from dashboard.celery import app
    from dashboard.rollout.publish import TaskBatch

    def beat(producer):
        scheduler = Scheduler(app, lazy=True)
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
            scheduler.apply_async(ScheduleEntry(name=name, app=app, **entry), producer=producer)

    beat_headers = _headers_published(beat)
    assert [h["task"] for h in beat_headers] == [e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()]
    signed = beat_headers + _headers_published(lambda producer: (
        tasks.push_nodes.apply_async(args=[["node-a"]], producer=producer),  # dashboard.signals' push on commit
        tasks.sync_master_quotas.apply_async(args=[None], producer=producer),
        app.send_task("dashboard.reconcile_configs", producer=producer),
        TaskBatch(app, producer, expires=None).send("dashboard.rollup_occupancy", args=[], queue="dashboard.control",
                                                    argsrepr="[]", declare=[])))
    assert len(signed) == len(settings.CELERY_BEAT_SCHEDULE) + 4
    for headers in signed:
        assert verified(headers["id"], headers["task"], headers[SIGNATURE_HEADER]), headers["task"]
    unsigned = _headers_published(lambda producer: (
        app.send_task(PURGE_TASK, args=[{}], queue="agent.node-a", producer=producer, declare=[]),
        TaskBatch(app, producer, expires=None).send(APPLY_CONFIG_TASK, args=[{}], queue="agent.node-a", argsrepr="x",
                                                    declare=[]),
        app.send_task("dashboard.ingest", args=[[]], queue=INGEST_QUEUE, producer=producer, declare=[])))
    assert len(unsigned) == 3 and not any(SIGNATURE_HEADER in headers for headers in unsigned)


def test_an_agent_can_neither_write_the_control_queue_nor_have_other_tasks_run(redis_server, workers,  # noqa: F811
                                                                             dashboard_broker):  # noqa: F811
    """Whatever queue a message claims (``delivery_info``, which kombu's Redis transport takes from the message
    itself) or sits in, the worker runs only the agents' tasks and what the dashboard signed."""
    from agent.node.celery_app import make_app
    from dashboard.celery import app as dashboard_app
    from dashboard.tasks import reconcile_configs

    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "agent-node-a", "on", ">pw-a", *agent_acl_rules("node-a"))
    url = f"redis://agent-node-a:pw-a@127.0.0.1:{redis_server.port}/0"
    agent_redis = redis.Redis(port=redis_server.port, username="agent-node-a", password="pw-a")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent_redis.lpush("dashboard.control", "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent_redis.hgetall("unacked")  # nor read what the dashboard's worker holds (signed tasks)

    app = make_app("node-a", url)  # the agent's own Celery app, its own restricted credentials
    injected = [("dashboard.push_nodes", [["node-b", "node-c"]]), ("dashboard.reconcile_configs", []),
                ("dashboard.sync_master_quotas", [None]), ("celery.chunks", [CHUNKS, [[] for _ in range(50)], 1])]
    for task, args in injected:
        app.send_task(task, args=args, queue=INGEST_QUEUE, declare=[])
    # the same, claiming to come from dashboard.control (the agent's user may LPUSH any bytes to its queue)
    for task, args in [("dashboard.push_nodes", [["node-b"]]), ("celery.chunks", [CHUNKS, [[]] * 50, 1])]:
        app.send_task(task, args=args, queue=INGEST_QUEUE, declare=[])
        raw = json.loads(admin.rpop(INGEST_QUEUE))
        raw["properties"]["delivery_info"] = {"exchange": "", "routing_key": "dashboard.control"}
        agent_redis.lpush(INGEST_QUEUE, json.dumps(raw))
        injected.append((task, args))
    # what kombu's restore of such a message puts into dashboard.control, and a signature taken from another task
    dashboard_app.send_task("dashboard.reconcile_configs", queue="dashboard.control", declare=[])
    signed = json.loads(admin.rpop("dashboard.control"))
    app.send_task("dashboard.push_nodes", args=[["node-b"]], queue=INGEST_QUEUE, declare=[])
    unsigned = json.loads(admin.rpop(INGEST_QUEUE))
    unsigned["properties"]["delivery_info"] = {"exchange": "", "routing_key": "dashboard.control"}
    admin.lpush("dashboard.control", json.dumps(unsigned))
    unsigned["headers"].update(id=signed["headers"]["id"],
                               **{SIGNATURE_HEADER: signed["headers"][SIGNATURE_HEADER]})
    admin.lpush("dashboard.control", json.dumps(unsigned))
    injected += [("dashboard.push_nodes", [["node-b"]])] * 2
    # the agents' own purge result still runs from there (and is refused for its missing signature, as before)
    app.send_task(PURGE_RESULT_TASK, args=[{"kind": "purge_result", "node": "node-a"}], queue=PURGE_RESULT_QUEUE,
                  declare=[])
    worker = workers.dashboard(redis_server.url)
    worker.wait_ready()
    wait_for(lambda: admin.llen(INGEST_QUEUE) + admin.llen("dashboard.control") == 0
             and worker.log().count("refused task") >= len(injected), 120,
             "the worker to take and refuse every injected task")
    log = worker.log()
    assert log.count("refused task") == len(injected)
    for task, _ in injected:
        assert f"refused task {task}:" in log
        done = [line for line in log.splitlines() if f"Task {task}[" in line and "received" not in line]
        assert done and all(line.endswith(": None") for line in done), done  # refused: the task body never ran
    assert "celery.starmap" not in log  # celery.chunks made no child task
    assert "node-b" not in log  # nothing of a refused message's content is echoed
    assert f"refused task {PURGE_RESULT_TASK}" not in log
    wait_for(lambda: f"Task {PURGE_RESULT_TASK}[" in worker.log(), 60, "the purge result run")
    wait_for(lambda: MessageRejection.objects.filter(reason="unsigned").exists(), 30, "the purge result's check")
    wait_for(lambda: MessageRejection.objects.filter(reason="task_not_allowed").exists(), 30, "the refusals counted")
    assert MessageRejection.objects.get(reason="task_not_allowed").count == len(injected)

    # the dashboard's own tasks still run, signed: delay() (the push on commit's way) and beat's send_task
    own = [reconcile_configs.delay().id, dashboard_app.send_task("dashboard.rollup_occupancy").id]
    wait_for(lambda: all(f"[{task_id}] succeeded" in worker.log() for task_id in own), 60, "the dashboard's tasks")
    done = [line for line in worker.log().splitlines() if any(f"[{task_id}] succeeded" in line for task_id in own)]
    assert len(done) == 2 and not any(line.endswith(": None") for line in done), done  # they ran (returned counts)
    assert worker.log().count("refused task") == len(injected)
