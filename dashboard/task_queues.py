"""Which tasks the dashboard's worker runs: agents push to ``dashboard.ingest`` and nothing they send may make the
dashboard do more than store what agents send.

Celery runs whatever task a message names, whichever queue it came from. Agents' broker users may push to
``dashboard.ingest`` (``agent.contract.broker.agent_acl_rules``), so a tampered agent could name any registered
task there — ``dashboard.push_nodes`` for other nodes, ``dashboard.sync_master_quotas``, or Celery's own
``celery.chunks`` / ``celery.starmap`` to turn one message into a thousand task runs. The queue a message says it
came from proves nothing: kombu's Redis transport takes ``delivery_info`` (its ``routing_key`` included) from the
message's own properties, which the sender writes, and restores an unacknowledged message to the queue its
``delivery_info`` names.

So the dashboard signs the tasks it publishes itself. :class:`SigningAMQP`, the AMQP class of the dashboard's
Celery app, adds the header ``SIGNATURE_HEADER`` — an HMAC-SHA256 (``django.utils.crypto.salted_hmac``, keyed by
``SECRET_KEY`` with the salt ``SIGNATURE_SALT``) over the task id and name, hex — to every task it sends that the
dashboard's worker runs, except the agents' own (``agent.contract.messages.AGENT_TASKS``): ``send_task``,
``apply_async``/``delay``, beat, retries and canvas parts alike (``dashboard.rollout.publish`` calls :func:`sign`
itself). :class:`QueueCheckedTask`, the base of every task of the dashboard's Celery app (Celery's built-in tasks
included), refuses a task delivered by a broker that is neither one of ``AGENT_TASKS`` nor carries a signature
that verifies, whatever its ``delivery_info`` says: the refusal is logged (task name only), counted
(``kvpool_agent_messages_rejected_total{reason="task_not_allowed"}``) and the message acknowledged; nothing runs.
``AGENT_TASKS`` run from any queue as before (they verify the agent's own per-message signature themselves); tasks
called directly or eagerly (tests, management commands) run as usual. Agents cannot read a signed message (their
Redis users read only ``agent.<node>``, where the dashboard sends agents' tasks, unsigned), so they cannot replay
one; a signature binds one task id to one task name.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.app.amqp import AMQP
from django.utils.crypto import constant_time_compare, salted_hmac

from agent.contract.messages import AGENT_TASKS

log = logging.getLogger("kvpool.dashboard.tasks")

#: Message header carrying the dashboard's signature of a task it published (hex HMAC-SHA256).
SIGNATURE_HEADER = "kvpool_dashboard_signature"
#: ``salted_hmac`` salt: the key is derived from ``SECRET_KEY`` for this use only.
SIGNATURE_SALT = "kvpool.dashboard.task_queues"


def signature(task_id: str, task_name: str) -> str:
    """Hex HMAC-SHA256 of ``task_id`` and ``task_name`` under the dashboard's key (``SECRET_KEY``, salted)."""
    return salted_hmac(SIGNATURE_SALT, f"{task_id}\x00{task_name}", algorithm="sha256").hexdigest()


def verified(task_id: Any, task_name: str, value: Any) -> bool:
    """Whether ``value`` (a message's ``SIGNATURE_HEADER``, any type; None when absent) is the dashboard's signature
    of ``task_id`` and ``task_name``."""
    return (isinstance(value, str) and isinstance(task_id, str)
            and constant_time_compare(value, signature(task_id, task_name)))


def allowed(task_name: str, *, delivered: bool, signed: bool) -> bool:
    """Whether the worker may run ``task_name``: not ``delivered`` by a broker (called directly or eagerly), one of
    the agents' tasks, or ``signed`` by the dashboard (``verified``)."""
    return not delivered or task_name in AGENT_TASKS or signed


def sign(headers: dict[str, Any], task_name: str) -> None:
    """Add the dashboard's signature to the ``headers`` of a message of ``task_name`` (its ``id`` set), in place;
    agents' tasks stay unsigned."""
    if task_name not in AGENT_TASKS:
        headers[SIGNATURE_HEADER] = signature(headers["id"], task_name)


class SigningAMQP(AMQP):
    """The dashboard app's AMQP: every task message it sends (``send_task_message``) is signed (``sign``)."""

    def _create_task_sender(self):  # type: ignore[no-untyped-def]  # Celery's, untyped
        send = super()._create_task_sender()
        registered = self.app.tasks

        def send_task_message(producer: Any, name: str, message: Any, *args: Any, headers: Any = None,
                              **kwargs: Any) -> Any:
            if name in registered:  # what the dashboard's worker would run (not agent.<node> tasks)
                merged = {**message.headers, **(headers or {})}
                sign(merged, name)
                if SIGNATURE_HEADER in merged:
                    headers = {**(headers or {}), SIGNATURE_HEADER: merged[SIGNATURE_HEADER]}
            return send(producer, name, message, *args, headers=headers, **kwargs)

        return send_task_message


class QueueCheckedTask(Task):
    """Celery task base: refuse a task delivered by a broker that is neither an agents' task nor signed by the
    dashboard (module docstring); returns None without running it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        delivered = not (request.called_directly or request.is_eager)
        if allowed(self.name, delivered=delivered,
                   signed=delivered and verified(request.id, self.name, getattr(request, SIGNATURE_HEADER, None))):
            return super().__call__(*args, **kwargs)
        log.warning("refused task %s: not signed by the dashboard, and agents may send only %s", self.name,
                    ", ".join(sorted(AGENT_TASKS)))
        from dashboard.telemetry.agent_auth import count_refused

        count_refused("task_not_allowed", f"task {self.name} without the dashboard's signature")
        return None


__all__ = ["SIGNATURE_HEADER", "QueueCheckedTask", "SigningAMQP", "allowed", "sign", "signature", "verified"]
