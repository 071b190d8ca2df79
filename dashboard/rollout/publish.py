"""Celery tasks to many queues in one kombu batch, without ``app.send_task``'s cost per message.

``app.send_task`` resolves routes, settings and the task's options and builds the message anew for every call:
about 0.25 ms of CPU per message, more than the rest of a config push per document. A :class:`TaskBatch` builds
the Celery protocol-2 message of a task name once (``app.amqp.create_task_message``, exactly as ``send_task``
does) and publishes one copy per delivery through the producer with a fresh task id, its own arguments and
``argsrepr``, to the queue's name on the default exchange (where ``send_task`` puts a task with
``queue=<name>`` on a direct exchange): a worker receives the same headers, properties and body as from
``send_task``. The ``before_task_publish``/``after_task_publish`` signals are sent as ``send_task`` sends them.
"""
from __future__ import annotations

from typing import Any

from celery import signals
from celery.utils import uuid

from dashboard.task_queues import sign


class TaskBatch:
    """Publishes tasks through ``producer`` (usually inside ``producer.batch()``: one Redis pipeline).

    ``expires`` (seconds, or None) is counted from when the batch's first message of a task name is built, as
    ``send_task`` counts it from each call (the messages of one batch are built within moments of each other).
    ``retry_policy`` is kombu's (``send_task``'s ``retry=True, retry_policy=...``). Inside a running Celery task
    the messages carry its root and parent ids, as ``send_task`` sets them.
    """

    def __init__(self, app, producer, *, expires: float | None = None,
                 retry_policy: dict[str, Any] | None = None) -> None:
        self.app = app
        self.producer = producer
        self.expires = expires
        self.retry_policy = dict(app.conf.task_publish_retry_policy or {}, **(retry_policy or {}))
        self.serializer = app.conf.task_serializer
        self._templates: dict[str, Any] = {}
        parent = app.current_worker_task
        self._root_id = (parent.request.root_id or parent.request.id) if parent else None
        self._parent_id = parent.request.id if parent else None

    def _template(self, name: str):
        template = self._templates.get(name)
        if template is None:
            task_id = uuid()
            template = self.app.amqp.create_task_message(
                task_id, name, [], {}, expires=self.expires, reply_to=self.app.thread_oid,
                create_sent_event=False, root_id=self._root_id, parent_id=self._parent_id, ignore_result=None)
            self._templates[name] = template
        return template

    def send(self, name: str, *, args: list[Any], queue: str, argsrepr: str,
             declare: list | None = None) -> str:
        """Publish task ``name`` with positional ``args`` to ``queue`` (a queue name); returns the task id.

        ``declare`` as kombu's (None: declare the queue first, ``[]``: it exists). Raises what the producer
        raises (outside a batch: when the broker does not take the message after the retry policy)."""
        template = self._template(name)
        task_id = uuid()
        headers = {**template.headers, "id": task_id, "root_id": self._root_id or task_id, "argsrepr": argsrepr}
        body = (list(args), {}, template.body[2])
        properties = {**template.properties, "correlation_id": task_id}
        if self.expires is not None:
            properties["expiration"] = self.expires
        properties["argsrepr"] = argsrepr  # send_task passes its extra options on as message properties
        declared = self.app.amqp.queues[queue]  # created on first use, as send_task creates missing queues
        if declare is None:
            declare = [declared]
        delivery_mode = declared.exchange.delivery_mode or self.app.conf.task_default_delivery_mode
        exchange, routing_key = "", queue
        if name in self.app.tasks:  # a task the dashboard's worker runs: signed as send_task signs it
            sign(headers, name)
        signals.before_task_publish.send(
            sender=name, body=body, exchange=exchange, routing_key=routing_key, declare=declare, headers=headers,
            properties=properties, retry_policy=self.retry_policy)
        self.producer.publish(
            body, exchange=exchange, routing_key=routing_key, serializer=self.serializer,
            compression=None, retry=True, retry_policy=self.retry_policy, delivery_mode=delivery_mode, declare=declare,
            headers=headers, timeout=None, confirm_timeout=None, **properties)
        signals.after_task_publish.send(sender=name, body=body, headers=headers, exchange=exchange,
                                        routing_key=routing_key)
        return task_id
