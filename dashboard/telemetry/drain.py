"""Store what waits on ``dashboard.ingest`` together: one ingest task takes the queued tasks of many agents.

Each agent sends its acks, reports and heartbeats as ``dashboard.ingest`` tasks (one JSON list of messages
each). When many agents send at once — 200 nodes acking one config push — running every task on its own
costs a task dispatch, a transaction and its statements per agent. ``ingest_queued`` therefore takes,
besides the messages of the task being run, up to ``DRAIN_MAX_TASKS`` more ``dashboard.ingest`` tasks that
are waiting in the queue (kombu ``Queue.get`` without auto-ack: a taken task sits in the broker's unacked set
until it is acknowledged, and is redelivered after the visibility timeout if the worker dies first) and stores
all their messages with one ``dashboard.telemetry.ingest.ingest`` call, in one transaction. The taken tasks are
acknowledged after the commit. With nothing queued this costs one empty poll; batches grow with the backlog,
and no timer holds anything back.

What is taken but not stored:

* a queued message that is not a plain ``dashboard.ingest`` task (another task name, an ETA/countdown or an
  expiry, an unknown protocol) goes back to the queue (marked redelivered), and draining stops: the Celery
  worker runs it;
* a ``dashboard.ingest`` task whose body cannot be decoded or whose arguments are not one list of messages is
  logged (WARNING, with the task id) and acknowledged — it can never be stored, as a worker would fail it too;
* agent messages inside a list that are unsigned, forged, replayed or invalid are logged, counted and skipped
  by ``ingest`` (``dashboard.telemetry.agent_auth``), as a task run on its own would.

If the batch cannot be stored — the database refuses something one message carries — every task is stored
on its own, and a task that still fails message by message, so only the message at fault is lost (logged
with its node, ERROR, counted as ``invalid``). If the database is unreachable the taken tasks not yet stored
are put back in the queue and the error is raised (the task fails as it would have without draining). A
broker failure while taking or acknowledging is logged: what was taken is still stored, and a task whose
acknowledgement failed is delivered again after the visibility timeout (storing it twice is harmless).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError
from kombu import Queue

from agent.contract.messages import INGEST_QUEUE, INGEST_TASK
from dashboard.telemetry.agent_auth import count_refused
from dashboard.telemetry.ingest import IngestResult, ingest

log = logging.getLogger("kvpool.dashboard.drain")

#: Most queued ``dashboard.ingest`` tasks one task takes besides its own.
DRAIN_MAX_TASKS = 500
#: Stop taking more tasks once this many agent messages are collected (bounds one transaction).
DRAIN_MAX_MESSAGES = 5000


@dataclass
class Taken:
    """One ``dashboard.ingest`` task taken from the queue: its id, messages and kombu message (to ack)."""

    task_id: str
    messages: list[Any]
    message: Any = field(repr=False)


class _Foreign(Exception):
    """The queued message is not a plain ``dashboard.ingest`` task: leave it to the Celery worker."""


def _ingest_args(message) -> list[Any]:
    """The list of agent messages a ``dashboard.ingest`` task message (Celery protocol 2) carries.

    Raises ``_Foreign`` for anything a plain worker should run, ``ValueError`` for a malformed ingest task.
    """
    headers = message.headers or {}
    if headers.get("task") != INGEST_TASK:
        raise _Foreign(f"task {headers.get('task')!r}")
    if headers.get("eta") or headers.get("expires"):
        raise _Foreign("scheduled or expiring task")
    body = message.decode()  # refuses content types outside the accepted ones (JSON)
    if not (isinstance(body, (list, tuple)) and len(body) == 3):
        raise ValueError("body is not [args, kwargs, embed] (Celery task protocol 2)")
    args, kwargs, _embed = body
    if kwargs or not (isinstance(args, (list, tuple)) and len(args) == 1 and isinstance(args[0], list)):
        raise ValueError("arguments are not one list of agent messages")
    return args[0]


def take_queued(channel, *, accept, max_tasks: int = DRAIN_MAX_TASKS,
                max_messages: int = DRAIN_MAX_MESSAGES, queue: str = INGEST_QUEUE) -> tuple[list[Taken], int]:
    """Take up to ``max_tasks`` waiting ``dashboard.ingest`` tasks from ``queue`` on the kombu ``channel``.

    Returns the tasks taken (not yet acknowledged: the caller must ``ack`` or ``reject`` each ``message``) and
    how many malformed tasks were dropped (logged and acknowledged). ``accept`` is the accepted content types
    (``app.conf.accept_content``). Stops early when ``max_messages`` agent messages are collected, when the
    queue is empty, at a message that is not a plain ingest task (put back in the queue), or when the broker
    fails (logged; what was taken so far is returned).
    """
    bound = Queue(queue)(channel)
    taken: list[Taken] = []
    dropped = collected = 0
    while len(taken) < max_tasks and collected < max_messages:
        try:
            message = bound.get(no_ack=False, accept=accept)
        except Exception as exc:  # broker trouble: store what we have, the rest waits in the queue
            log.warning("ingest drain: taking queued tasks failed (%s: %s); storing the %d taken",
                        type(exc).__name__, exc, len(taken))
            break
        if message is None:
            break
        task_id = (message.headers or {}).get("id", "?")
        try:
            messages = _ingest_args(message)
        except _Foreign as exc:
            _settle(message, requeue=True)
            log.debug("ingest drain: left %s in the queue: %s", task_id, exc)
            break
        except Exception as exc:  # undecodable or malformed: it can never be stored
            _settle(message)
            dropped += 1
            log.warning("ingest: dropped malformed dashboard.ingest task %s: %s: %s", task_id,
                        type(exc).__name__, exc)
            continue
        taken.append(Taken(task_id, messages, message))
        collected += len(messages)
    return taken, dropped


def _settle(message, *, requeue: bool = False) -> None:
    """Acknowledge ``message`` (or put it back in its queue); a broker failure is logged, not raised.

    An unacknowledged message stays in the broker's unacked set and is delivered again after the visibility
    timeout: storing it twice is harmless (acks and reports are idempotent on ``(node, sequence)``, the newest
    heartbeat wins).
    """
    try:
        if requeue:
            message.reject(requeue=True)
        else:
            message.ack()
    except Exception as exc:
        log.warning("ingest drain: %s of task %s failed (%s: %s); the broker redelivers it after its "
                    "visibility timeout", "requeue" if requeue else "ack", (message.headers or {}).get("id", "?"),
                    type(exc).__name__, exc)


def _merge(total: IngestResult, part: IngestResult) -> None:
    for name in ("reports", "duplicate_reports", "samples", "acks", "duplicate_acks", "heartbeats", "invalid"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    for reason, count in part.rejected.items():
        total.rejected[reason] = total.rejected.get(reason, 0) + count
    total.errors.extend(part.errors)


def _store_one_by_one(task_id: str, messages: list[Any], total: IngestResult) -> None:
    """Store one task's messages; if the database refuses them, each message on its own (refused ones are
    logged at ERROR and counted as ``invalid``). Connection errors propagate."""
    try:
        _merge(total, ingest(messages))
        return
    except (OperationalError, InterfaceError):
        raise
    except Exception as exc:
        log.warning("ingest: storing task %s failed (%s: %s); storing its %d messages one by one", task_id,
                    type(exc).__name__, exc, len(messages))
    for raw in messages:
        try:
            _merge(total, ingest([raw]))
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            total.invalid += 1
            node = raw.get("node") if isinstance(raw, dict) else None
            total.errors.append(f"{type(exc).__name__}: {exc}")
            log.error("ingest: dropped a message of node %r (task %s) the database refused: %s: %s", node,
                      task_id, type(exc).__name__, exc)


def store_batch(own: list[Any], taken: list[Taken], own_id: str = "") -> IngestResult:
    """Store ``own`` (the running task's messages) and the ``taken`` tasks' messages; acknowledge ``taken``.

    One ``ingest`` call for everything, acknowledged after the commit. If the database refuses the batch,
    each task (then each message) is stored on its own, so only what it refuses is lost (see the module
    docstring). On a connection error (``OperationalError``/``InterfaceError``) the taken tasks not yet stored
    are put back in the queue and the error is raised.
    """
    pending = list(taken)
    try:
        try:
            result = ingest(list(own) + [m for item in taken for m in item.messages])
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            log.error("ingest: storing %d tasks together failed (%s: %s); storing them one by one",
                      len(taken) + 1, type(exc).__name__, exc)
            result = IngestResult()
            _store_one_by_one(own_id or "?", own, result)
            while pending:
                item = pending[0]
                _store_one_by_one(item.task_id, item.messages, result)
                pending.pop(0)
                _settle(item.message)
            return result
        pending = []
        for item in taken:
            _settle(item.message)
        return result
    finally:
        for item in pending:  # not stored (database unreachable, or a bug): back to the queue, nothing lost
            _settle(item.message, requeue=True)


@contextmanager
def _held(channel, tags: list[str]) -> Iterator[None]:
    """While the batch is stored, mark its tasks as held by a live worker: every third of
    ``KVPOOL_INGEST_REDELIVER_SECONDS`` their entries in kombu's unacked index (Redis) are moved to the current
    time (``ZADD XX``: an acknowledged one is not brought back), so ``dashboard.telemetry.redeliver`` puts back
    only the tasks of a worker that died, never those of a long batch. A thread; broker errors are ignored
    (the entry then ages as without this)."""
    index_key = getattr(channel, "unacked_index_key", None)
    client = getattr(channel, "client", None)
    tags = [tag for tag in tags if tag]
    if index_key is None or client is None or not tags:
        yield
        return
    done = threading.Event()
    every = max(settings.KVPOOL_INGEST_REDELIVER_SECONDS / 3, 0.2)

    def refresh() -> None:
        while True:  # at once (taking a long backlog may have aged the first ones), then every ``every`` s
            try:
                client.zadd(index_key, dict.fromkeys(tags, time.time()), xx=True)
            except Exception as exc:  # the broker is away: the entries age; redelivery would be harmless
                log.debug("ingest drain: refreshing held tasks failed: %s", exc)
            if done.wait(every):
                return

    thread = threading.Thread(target=refresh, name="ingest-held", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def ingest_queued(app, own: list[Any], *, own_id: str = "", own_tag: str = "") -> tuple[IngestResult, int]:
    """Store ``own`` together with what waits on ``dashboard.ingest`` (see the module docstring).

    ``app`` is the dashboard's Celery app (its broker connection pool and accepted content types are used).
    Returns the combined ``IngestResult`` (malformed queued tasks are counted as ``invalid``) and how many
    queued tasks were taken besides ``own``. ``own_tag`` (the running task's delivery tag) is kept marked as held
    with the taken ones while the batch is stored (``_held``).
    """
    taken: list[Taken] = []
    dropped = 0
    with app.pool.acquire(block=True) as connection:
        try:
            channel = connection.default_channel
        except Exception as exc:  # the broker is unreachable right now: store this task's messages alone
            log.warning("ingest drain: no broker channel (%s: %s); storing task %s alone", type(exc).__name__,
                        exc, own_id or "?")
            channel = None
        if channel is not None:
            taken, dropped = take_queued(channel, accept=app.conf.accept_content)
            with _held(channel, [own_tag] + [str(item.message.delivery_tag or "") for item in taken]):
                result = store_batch(own, taken, own_id)
        else:
            result = store_batch(own, taken, own_id)
    if dropped:
        count_refused("invalid", "malformed dashboard.ingest task", n=dropped)
        result.rejected["invalid"] = result.rejected.get("invalid", 0) + dropped
    result.invalid += dropped
    if taken:
        log.info("ingest: stored %d queued tasks together with task %s (%d acks, %d reports, %d heartbeats)",
                 len(taken), own_id or "?", result.acks, result.reports, result.heartbeats)
    return result, len(taken)
