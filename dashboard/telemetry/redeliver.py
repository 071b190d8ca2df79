"""Deliver again, within seconds, the ``dashboard.ingest`` tasks a dead ingest worker had taken.

A dashboard worker holds the ingest tasks it took unacknowledged in the broker (Redis: kombu's ``unacked`` hash,
indexed by delivery time in ``unacked_index``) until the batch that stores them commits: the task it runs
(``acks_late``), the ones prefetched behind it and the ones ``dashboard.telemetry.drain`` took from the queue.
If the worker dies — SIGKILL, OOM killer, a lost host — they stay there, and kombu puts them back in their
queue only after the transport's ``visibility_timeout`` (``KVPOOL_BROKER_VISIBILITY_TIMEOUT``, one hour by
default): far longer than the ingest lag a fleet wants.

That timeout is one setting for every queue, and lowering it is not free: kombu redelivers **any** message held
longer — a control task waiting behind a long push, a retry with a countdown (Celery holds ETA tasks unacked until
they are due) — so they would run twice. Instead each ingest worker runs ``restore_stale`` every
``KVPOOL_INGEST_REDELIVER_CHECK_SECONDS`` (``RestoreStaleIngest``, a worker bootstep of workers that consume
``dashboard.ingest``): entries of ``unacked_index`` older than ``KVPOOL_INGEST_REDELIVER_SECONDS`` whose
routing key is ``dashboard.ingest`` are put back at the consuming end of their queue (kombu's own ``restore_by_tag``,
in a WATCH transaction: a worker that acks the task meanwhile wins, and two workers cannot restore it twice).

The trade-off: a live worker whose batch takes longer than ``KVPOOL_INGEST_REDELIVER_SECONDS`` from delivery to
commit (a huge backlog, a stalled database) has its tasks delivered once more; storing is idempotent per
``(node, sequence)`` (``dashboard.telemetry.ingest``), so a second delivery stores nothing and only costs a
worker its time (counted as ``duplicate``). Keep the setting above a batch's worst duration
(``dashboard.telemetry.drain.DRAIN_MAX_MESSAGES``) and the lag after a worker's death is about the setting plus
one check interval. Only Redis brokers have the index; with another transport this does nothing.

Run ingest workers with the prefork pool (``--pool prefork``, the default) and ``--prefetch-multiplier 1``: the
drain takes the queue's backlog itself, so prefetched tasks would only age in the worker; and kombu takes a
message with ``BRPOP`` before it enters the unacked index, so a message arrives unindexed in a busy **solo**
worker's socket for the length of a batch — lost if that worker dies then — while the prefork parent indexes it
at once.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from celery import bootsteps
from django.conf import settings

from agent.contract.messages import INGEST_QUEUE
from dashboard.telemetry.agent_auth import count_refused

log = logging.getLogger("kvpool.dashboard.redeliver")

#: Entries of the unacked index looked at per check (the oldest first).
SCAN_LIMIT = 5000


def restore_stale(channel: Any, *, older_than: float, queue: str = INGEST_QUEUE, limit: int = SCAN_LIMIT,
                  now: float | None = None) -> int:
    """Put back in ``queue`` the messages of ``queue`` taken more than ``older_than`` seconds ago and never
    acknowledged, on the kombu Redis ``channel``. Returns how many were restored (0 on a transport without the
    unacked index). An entry of any queue that Python's ``json`` cannot parse as kombu's
    ``[message, exchange, routing_key]`` is deleted (logged, counted as ``invalid``): kombu's restore would raise on
    it at every pass and never restore the entries behind it."""
    qos = getattr(channel, "qos", None)
    index_key = getattr(channel, "unacked_index_key", None)
    if qos is None or index_key is None or not hasattr(qos, "restore_by_tag"):
        return 0
    ceiling = (time.time() if now is None else now) - older_than
    restored = deleted = 0
    with channel.conn_or_acquire() as client:
        tags = client.zrange(index_key, 0, ceiling, byscore=True, offset=0, num=limit)  # oldest first
        for tag in tags:
            payload = client.hget(channel.unacked_key, tag)
            if payload is None:
                continue  # acknowledged meanwhile
            try:
                _message, _exchange, routing_key = json.loads(payload)
            except (ValueError, TypeError, RecursionError):
                # kombu's restore (``restore_by_tag``, its visibility timeout too) would raise on it at every
                # pass, and so never restore the entries behind it, of any queue: delete it
                client.pipeline(transaction=False).zrem(index_key, tag).hdel(channel.unacked_key, tag).execute()
                deleted += 1
                continue
            if routing_key != queue:
                continue
            qos.restore_by_tag(tag, client)  # at the consuming end: the oldest go first
            restored += 1
    if deleted:
        log.warning("ingest: deleted %d unacknowledged broker record(s) that are not kombu's JSON "
                    "[message, exchange, routing key] (nothing could restore them)", deleted)
        try:
            count_refused("invalid", "unacknowledged broker record that is not JSON", n=deleted)
        except Exception as exc:  # the database is away: the log line stays
            log.warning("ingest: counting the deleted records failed (%s: %s)", type(exc).__name__, exc)
    if restored:
        log.warning("ingest: put back %d %s task(s) unacknowledged for more than %.0f s (a worker died holding "
                    "them); they are stored again by a live worker", restored, queue, older_than)
    return restored


class RestoreStaleIngest(bootsteps.StartStopStep):
    """Worker bootstep: ``restore_stale`` every ``KVPOOL_INGEST_REDELIVER_CHECK_SECONDS`` in workers that consume
    ``dashboard.ingest`` (on the worker's timer, with a connection of the app's pool)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        if INGEST_QUEUE not in worker.app.amqp.queues.consume_from:
            return
        self.tref = worker.timer.call_repeatedly(settings.KVPOOL_INGEST_REDELIVER_CHECK_SECONDS, self.check,
                                                 (worker,), priority=10)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def check(self, worker: Any) -> None:
        """One pass; broker trouble is logged (the next pass tries again)."""
        try:
            with worker.app.pool.acquire(block=True, timeout=5) as connection:
                restore_stale(connection.default_channel, older_than=settings.KVPOOL_INGEST_REDELIVER_SECONDS)
        except Exception as exc:
            log.warning("ingest: checking for tasks of dead workers failed (%s: %s)", type(exc).__name__, exc)
