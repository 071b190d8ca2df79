"""Agents can push only to ``dashboard.ingest``, and the dashboard's worker runs only the agents' own tasks from it
(``dashboard.task_queues``; issue 16 item 3, "write where it should not"). Before: each agent's Redis user could
push to ``dashboard.control`` and the worker ran whatever task a message named — ``dashboard.push_nodes`` for
other nodes, ``dashboard.sync_master_quotas``, ``celery.chunks`` turning one message into a thousand runs.

A real ``redis-server`` with the agents' ACL users, the agent's own Celery app under its restricted credentials,
and a real dashboard worker on the test database."""
from __future__ import annotations

import pytest
import redis

from agent.contract.broker import agent_acl_rules
from agent.contract.messages import INGEST_QUEUE, PURGE_RESULT_QUEUE, PURGE_RESULT_TASK
from dashboard.models import MessageRejection
from dashboard.task_queues import QueueCheckedTask, allowed
from tests.support.telemetry import redis_server, workers  # noqa: F401  (fixtures)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHUNKS = {"task": "dashboard.reconcile_configs", "args": [], "kwargs": {}, "options": {}, "subtask_type": None,
          "immutable": False}


def test_the_allow_list():
    assert PURGE_RESULT_QUEUE == INGEST_QUEUE  # the agents' one queue
    assert allowed("dashboard.ingest", INGEST_QUEUE) and allowed("dashboard.purge_result", INGEST_QUEUE)
    assert not allowed("dashboard.push_nodes", INGEST_QUEUE) and not allowed("celery.chunks", INGEST_QUEUE)
    assert allowed("dashboard.push_nodes", "dashboard.control") and allowed("dashboard.push_nodes", None)
    import dashboard.tasks  # noqa: F401  (registers the dashboard's tasks)
    from dashboard.celery import app

    assert isinstance(app.tasks["celery.chunks"], QueueCheckedTask)  # Celery's own tasks too
    assert isinstance(app.tasks["dashboard.push_nodes"], QueueCheckedTask)


def test_an_agent_can_neither_write_the_control_queue_nor_have_other_tasks_run(redis_server, workers,  # noqa: F811
                                                                             settings):
    from agent.node.celery_app import make_app

    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "agent-node-a", "on", ">pw-a", *agent_acl_rules("node-a"))
    url = f"redis://agent-node-a:pw-a@127.0.0.1:{redis_server.port}/0"
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis(port=redis_server.port, username="agent-node-a", password="pw-a").lpush("dashboard.control", "x")

    app = make_app("node-a", url)  # the agent's own Celery app, its own restricted credentials
    injected = [("dashboard.push_nodes", [["node-b", "node-c"]]), ("dashboard.reconcile_configs", []),
                ("dashboard.sync_master_quotas", [None]), ("celery.chunks", [CHUNKS, [[] for _ in range(50)], 1])]
    for task, args in injected:
        app.send_task(task, args=args, queue=INGEST_QUEUE, declare=[])
    # the agents' own purge result still runs from there (and is refused for its missing signature, as before)
    app.send_task(PURGE_RESULT_TASK, args=[{"kind": "purge_result", "node": "node-a"}], queue=PURGE_RESULT_QUEUE,
                  declare=[])
    worker = workers.dashboard(redis_server.url)
    worker.wait_ready()
    wait_for(lambda: admin.llen(INGEST_QUEUE) == 0 and worker.log().count("refused task") >= len(injected), 120,
             "the worker to take and refuse every injected task")
    log = worker.log()
    for task, _ in injected:
        assert f"refused task {task} " in log
        done = [line for line in log.splitlines() if f"Task {task}[" in line and "received" not in line]
        assert done and all(line.endswith(": None") for line in done), done  # refused: the task body never ran
    assert "celery.starmap" not in log  # celery.chunks made no child task
    assert f"refused task {PURGE_RESULT_TASK}" not in log
    wait_for(lambda: f"Task {PURGE_RESULT_TASK}[" in worker.log(), 60, "the purge result run")
    wait_for(lambda: MessageRejection.objects.filter(reason="unsigned").exists(), 30, "the purge result's check")
    wait_for(lambda: MessageRejection.objects.filter(reason="task_not_allowed").exists(), 30, "the refusals counted")
    assert MessageRejection.objects.get(reason="task_not_allowed").count == len(injected)
