"""The agent's Celery application: a worker on ``agent.<node>`` and a publisher to ``dashboard.ingest``.

No Django: the agent talks to the broker (Redis) with JSON messages only. The worker must run the ``solo`` or
``threads`` pool — every process that creates a Mooncake Store client mounts its own segment (Mooncake
0.3.13.post1), so a prefork pool would mount one segment per child; ``solo`` (the default) also applies
documents strictly in queue order.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from celery import Celery

from agent.contract.messages import APPLY_CONFIG_TASK, INGEST_QUEUE, INGEST_TASK, node_queue

if TYPE_CHECKING:
    from agent.node.daemon import Daemon

log = logging.getLogger("kvpool.agent.celery")

#: Seconds a publish waits for the broker's TCP connection before the message stays in the outbox.
CONNECT_TIMEOUT_SECONDS = 3.0


def make_app(node: str, broker_url: str) -> Celery:
    """Return a Celery app for ``node`` (JSON only, no result backend, retries the broker forever).

    ``broker_url`` wins over ``CELERY_BROKER_URL`` (and ``CELERY_BROKER_READ_URL``/``_WRITE_URL``) in the
    environment, which Celery would otherwise prefer (e.g. one exported for a dashboard on the same host): the
    agent could join another broker's queue. It is set as the read and write URL (Celery 5 reads those before
    the variable); a differing variable is logged as ignored. Raises ValueError if ``CELERY_BROKER_READ_URL`` or
    ``CELERY_BROKER_WRITE_URL`` is set, which nothing here can override.
    """
    for name in ("CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL"):
        if os.environ.get(name):
            raise ValueError(f"{name} is set in the environment; unset it (the agent uses --broker only)")
    env_url = os.environ.get("CELERY_BROKER_URL")
    if env_url and env_url != broker_url:
        log.warning("ignoring CELERY_BROKER_URL from the environment: the agent uses its --broker %s",
                    _redacted(broker_url))
    app = Celery(f"kvpool-agent-{node}", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_default_queue=node_queue(node),
        task_create_missing_queues=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_connection_timeout=CONNECT_TIMEOUT_SECONDS,
        broker_read_url=broker_url,
        broker_write_url=broker_url,
        # One Redis list per queue: no message priorities are used, and kombu's default four priority steps
        # would make every BRPOP name four keys per queue.
        # No ack emulation: the worker acknowledges a task when it starts it (acks_late is off) and runs one at a
        # time (prefetch 1), so kombu's Redis ack emulation would only guard the instant between BRPOP and the
        # start, for two extra Redis transactions per received message (the unacked hash and its index) and a
        # periodic restore sweep. A document lost in that instant is pushed again by the dashboard's reconcile
        # (the node's ack lags); on a warm shutdown reserved messages still go back to the queue.
        broker_transport_options={"socket_connect_timeout": CONNECT_TIMEOUT_SECONDS, "priority_steps": [0],
                                  "ack_emulation": False},
    )
    return app


def _redacted(url: str) -> str:
    """``url`` without its password (for logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":**@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def make_publisher(app: Celery):
    """Return ``publish(messages)`` that sends one ``dashboard.ingest`` task carrying ``messages``.

    Raises (kombu/redis connection errors) when the broker does not take the message after one reconnect.
    """

    def publish(messages: list[dict[str, Any]]) -> None:
        node = messages[0].get("node") if messages and isinstance(messages[0], dict) else None
        app.send_task(
            INGEST_TASK,
            args=[messages],
            queue=INGEST_QUEUE,
            declare=[],  # no write to the dashboard's binding sets: a LPUSH onto its list is all (agent_acl_rules)
            # What monitoring shows instead of the messages themselves (Celery would repr() them per publish).
            argsrepr=f"[<{len(messages)} messages from node {node}>]",
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5},
        )

    return publish


def register_tasks(app: Celery, daemon: Daemon) -> None:
    """Register ``agent.apply_config`` on ``app``, handing each document to ``daemon.handle_document``."""

    @app.task(name=APPLY_CONFIG_TASK, ignore_result=True)
    def apply_config(document: dict[str, Any]) -> dict[str, Any]:
        """Apply one pushed config document; returns the ack (also queued to the dashboard)."""
        return daemon.handle_document(document)


def run_worker(app: Celery, node: str, *, pool: str = "solo", loglevel: str = "INFO") -> int:
    """Run the Celery worker on ``agent.<node>`` in this process until it is stopped (SIGTERM/SIGINT); returns
    the worker's exit status (non-zero after an unrecoverable error, e.g. a broker URL the transport refuses)."""
    if pool not in {"solo", "threads"}:
        raise ValueError(f"pool {pool!r} is not allowed: use solo or threads (one Store client per process)")
    argv = [
        "worker",
        f"--hostname=agent@{node}",
        f"--queues={node_queue(node)}",
        f"--pool={pool}",
        "--concurrency=1",
        f"--loglevel={loglevel}",
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
    ]
    # app.start, not app.worker_main: worker_main drops the worker's exit status
    return app.start(argv=argv) or 0
