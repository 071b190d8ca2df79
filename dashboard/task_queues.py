"""Which tasks the dashboard's worker runs from which queue: agents push to ``dashboard.ingest`` and nothing there
may make the dashboard do more than store what agents send.

Celery runs whatever task a message names, whichever queue it came from. Agents' broker users may push to
``dashboard.ingest`` (``agent.contract.broker.agent_acl_rules``), so a tampered agent could name any registered
task there — ``dashboard.push_nodes`` for other nodes, ``dashboard.sync_master_quotas``, or Celery's own
``celery.chunks`` / ``celery.starmap`` to turn one message into a thousand task runs. :class:`QueueCheckedTask`, the
base of every task of the dashboard's Celery app (Celery's built-in tasks included), refuses to run a task other
than ``agent.contract.messages.AGENT_TASKS`` when its message was delivered from an agent queue
(``AGENT_QUEUES``): the refusal is logged, counted (``kvpool_agent_messages_rejected_total{reason="task_not_allowed"}``)
and the message acknowledged; nothing runs. Tasks called directly or eagerly (tests, management commands) and
tasks delivered from ``dashboard.control`` (which only the dashboard's own processes can write) run as usual.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import Task

from agent.contract.messages import AGENT_TASKS, INGEST_QUEUE

log = logging.getLogger("kvpool.dashboard.tasks")

#: Queues agents can write to (their Redis users push there).
AGENT_QUEUES = frozenset({INGEST_QUEUE})


def allowed(task_name: str, queue: str | None) -> bool:
    """Whether the worker may run ``task_name`` delivered from ``queue`` (None: not delivered by a broker)."""
    return queue not in AGENT_QUEUES or task_name in AGENT_TASKS


class QueueCheckedTask(Task):
    """Celery task base: refuse a task an agent may not send when it arrives on an agent queue (module
    docstring); returns None without running it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        queue = None if request.called_directly or request.is_eager else (
            (request.delivery_info or {}).get("routing_key"))
        if allowed(self.name, queue):
            return super().__call__(*args, **kwargs)
        log.warning("refused task %s (id %s) from queue %s: agents may send only %s there", self.name, request.id,
                    queue, ", ".join(sorted(AGENT_TASKS)))
        from dashboard.telemetry.agent_auth import count_refused

        count_refused("task_not_allowed", f"task {self.name} from queue {queue}")
        return None


__all__ = ["AGENT_QUEUES", "QueueCheckedTask", "allowed"]
