"""Store what waits on ``dashboard.ingest`` together: one ingest task takes the queued tasks of many agents.

Each agent sends its acks, reports and heartbeats as ``dashboard.ingest`` tasks (one JSON list of messages
each). When many agents send at once — 1,000 nodes acking one config push — running every task on its own
costs a task dispatch, a transaction and its statements per agent. ``ingest_queued`` therefore takes,
besides the messages of the task being run, up to ``DRAIN_MAX_TASKS`` more ``dashboard.ingest`` tasks that
are waiting in the queue and stores all their messages with one ``dashboard.telemetry.ingest.ingest`` call, in
one transaction; the taken tasks are acknowledged after the commit. It then takes again what arrived meanwhile,
batch after batch (at most ``DRAIN_MAX_ROUNDS``), until a take finds the queue empty: a burst of acks is stored
by the task that met it, not received by Celery one task at a time. With nothing queued this costs one empty
take; batches grow with the backlog, and no timer holds anything back.

Taking, on Redis (``RedisQueue``): one Lua script pops up to ``TAKE_CHUNK`` tasks and, in the same atomic step,
records each in kombu's unacked hash and index under a fresh tag (what kombu's ``basic_get`` does with one
``RPOP`` and one more round trip per task, with a moment between them in which a dying worker lost the task). A
taken task is therefore always either in the queue or in the unacked records until its batch commits and one
pipeline (``ZREM`` + ``HDEL`` of all the batch's tags) acknowledges it: a worker that dies at any point loses
nothing — its tasks come back through ``dashboard.telemetry.redeliver`` (or kombu's visibility timeout), and
storing them again stores nothing twice (receipts per ``(node, sequence)``). The unacked record puts a task back
in this queue whatever routing its payload claims. Other transports use kombu's ``Queue.get`` one task at a time.

What is taken but not stored:

* a queued message that is not a plain ``dashboard.ingest`` task (another task name, an ETA/countdown or an
  expiry, an unknown protocol) goes back to the queue, and draining stops: the Celery worker runs it (the tasks
  taken after it in the same take go back to the head of the queue, in their order);
* a queued payload over ``MAX_PAYLOAD_BYTES``, one that is not a JSON object (kombu's parser, in the worker: the
  take script parses nothing), one with a ``compression`` header (kombu would inflate it, unbounded; agents never
  compress), and a ``dashboard.ingest`` task whose body cannot be decoded or whose arguments are not one list of
  messages are logged (WARNING, with the task id when known, never the content), counted as ``invalid`` and
  acknowledged — they can never be stored;
* agent messages inside a list that are unsigned, forged, replayed or invalid are logged, counted and skipped
  by ``ingest`` (``dashboard.telemetry.agent_auth``), message by message, as a task run on its own would.

If the batch cannot be stored — the database refuses something one message carries — every task is stored
on its own, and a task that still fails message by message, so only the message at fault is lost (logged
with its node, ERROR, counted as ``invalid``). If the database is unreachable the taken tasks not yet stored
are put back in the queue and the error is raised (the task fails as it would have without draining). A
broker failure while taking or acknowledging is logged: what was taken is still stored, and a task whose
acknowledgement failed is delivered again by ``dashboard.telemetry.redeliver`` (storing it twice is harmless).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError
from kombu import Queue
from kombu.utils.objects import cached_property

from agent.contract.messages import INGEST_QUEUE, INGEST_TASK
from dashboard.broker_json import loads
from dashboard.telemetry.agent_auth import count_refused
from dashboard.telemetry.ingest import IngestResult, ingest

log = logging.getLogger("kvpool.dashboard.drain")

#: Most queued ``dashboard.ingest`` tasks one batch takes besides the running task's own.
DRAIN_MAX_TASKS = 500
#: Stop taking more tasks once this many agent messages are collected (bounds one transaction; checked after each
#: take of at most ``TAKE_CHUNK`` tasks, the later takes sized by the messages per task seen so far).
DRAIN_MAX_MESSAGES = 5000
#: Most batches one task stores (it takes again after each commit while the previous take found tasks).
DRAIN_MAX_ROUNDS = 20
#: Most tasks one Redis take (one script call) pops.
TAKE_CHUNK = 100

#: Largest queued payload (bytes, as queued: kombu's JSON envelope around the base64 task body) the drain takes;
#: a larger one is popped, not recorded, and dropped (counted as ``invalid``). An agent's task carries at most
#: ``agent.node.outbox.Outbox.deliver``'s 200 messages, far below it.
MAX_PAYLOAD_BYTES = 8 << 20

#: Redis Lua script: pop up to ARGV[1] messages from the lists KEYS[3..] (the queue's priority lists, consumed in
#: that order, from the end kombu consumes) and, in the same atomic step, record each as unacknowledged as kombu's
#: Redis transport does (hash KEYS[1]: tag -> ``[payload, exchange, routing_key]``, ARGV[4] is the text after the
#: payload; sorted set KEYS[2]: tag -> ARGV[2], the time). Tags are ARGV[3] followed by the message's number. The
#: script never parses a payload (JSON parsing of agent-written text would block Redis for everyone: nesting,
#: size): a payload that does not start with ``{`` or is longer than ARGV[5] bytes is not recorded (tag ""), and
#: one longer than ARGV[5] is not returned either (its length is, as an integer). Whether a recorded payload is
#: JSON is checked in Python, with kombu's parser (``_message``); one that is not is acknowledged there, or
#: deleted by ``dashboard.telemetry.redeliver`` if the worker died first. Returns a flat list, per message: the
#: 0-based index of its list in KEYS[3..], its tag, its payload (or its length).
_TAKE_SCRIPT = """
local limit = tonumber(ARGV[1])
local cap = tonumber(ARGV[5])
local out, n = {}, 0
for k = 3, #KEYS do
  while n < limit do
    local payload = redis.call('RPOP', KEYS[k])
    if not payload then break end
    n = n + 1
    local tag = ''
    local size = string.len(payload)
    if size <= cap and string.byte(payload, 1) == 123 then
      tag = ARGV[3] .. n
      redis.call('HSET', KEYS[1], tag, '[' .. payload .. ARGV[4])
      redis.call('ZADD', KEYS[2], ARGV[2], tag)
    end
    out[#out + 1] = k - 3
    out[#out + 1] = tag
    if size > cap then
      out[#out + 1] = size
    else
      out[#out + 1] = payload
    end
  end
end
return out
"""


@dataclass
class Taken:
    """One ``dashboard.ingest`` task taken from the queue: its id, messages and kombu message; on Redis its
    unacked tag, the list it came from and its payload as queued (to put it back unchanged)."""

    task_id: str
    messages: list[Any]
    message: Any = field(repr=False)
    tag: str = ""
    key: str = field(default="", repr=False)
    raw: bytes = field(default=b"", repr=False)


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
    if headers.get("compression") is not None:  # kombu decompressed it already (``Queue.get``): never store it
        raise ValueError("the task names a compression (agents never compress)")
    body = message.decode()  # refuses content types outside the accepted ones (JSON)
    if not (isinstance(body, (list, tuple)) and len(body) == 3):
        raise ValueError("body is not [args, kwargs, embed] (Celery task protocol 2)")
    args, kwargs, _embed = body
    if kwargs or not (isinstance(args, (list, tuple)) and len(args) == 1 and isinstance(args[0], list)):
        raise ValueError("arguments are not one list of agent messages")
    return args[0]


class RedisQueue:
    """A queue's Redis lists and kombu's unacked records (``unacked`` hash, ``unacked_index`` sorted set), reached
    through a kombu Redis ``channel``: take many tasks in one atomic step, acknowledge or put back many in one
    pipeline. Raises what redis-py raises when the broker fails."""

    def __init__(self, channel, queue: str = INGEST_QUEUE) -> None:
        self.channel = channel
        self.queue = queue
        # the lists kombu's consumer reads, in its order (one per priority step; the first is the queue's name)
        self.keys = list(dict.fromkeys(channel._q_for_pri(queue, pri) for pri in channel.priority_steps))
        self.unacked_key = channel.unacked_key
        self.index_key = channel.unacked_index_key
        # a restore (dashboard.telemetry.redeliver, kombu's visibility timeout) puts the payload back in this
        # queue through the default exchange, whatever exchange or routing key the payload itself names
        self.tail = ',"",' + json.dumps(queue) + "]"

    @classmethod
    def of(cls, channel, queue: str = INGEST_QUEUE) -> RedisQueue | None:
        """The queue on ``channel`` when it is a kombu Redis channel with ack emulation and no key prefix, else
        None (then kombu's ``Queue.get`` takes one task at a time)."""
        needed = ("unacked_key", "unacked_index_key", "priority_steps", "_q_for_pri", "conn_or_acquire")
        if not all(hasattr(channel, name) for name in needed):
            return None
        if not getattr(channel, "ack_emulation", False) or getattr(channel, "global_keyprefix", ""):
            return None
        return cls(channel, queue)

    @cached_property
    def _script(self):
        with self.channel.conn_or_acquire() as client:
            return client.register_script(_TAKE_SCRIPT)

    def take(self, limit: int) -> list[tuple[str, str, bytes | int]]:
        """Pop up to ``limit`` messages, each recorded as unacknowledged in the same atomic step (``_TAKE_SCRIPT``).
        Returns ``(list key, tag, payload)`` per message in queue order; tag "" for a payload that does not start
        with ``{`` (popped, not recorded), and tag "" with the payload's length (an ``int``) instead of the payload
        for one over ``MAX_PAYLOAD_BYTES``."""
        prefix = f"drain.{uuid.uuid4().hex}."
        with self.channel.conn_or_acquire() as client:
            flat = self._script(keys=[self.unacked_key, self.index_key, *self.keys],
                                args=[limit, repr(time.time()), prefix, self.tail, MAX_PAYLOAD_BYTES], client=client)
        taken = []
        for i in range(0, len(flat), 3):
            tag = flat[i + 1]
            taken.append((self.keys[int(flat[i])], tag.decode() if isinstance(tag, bytes) else str(tag),
                          flat[i + 2]))
        return taken

    def forget(self, tags: Sequence[str]) -> None:
        """Acknowledge: drop the unacked records of ``tags`` (one pipeline: ``ZREM`` + ``HDEL``)."""
        tags = [tag for tag in tags if tag]
        if not tags:
            return
        with self.channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            pipe.zrem(self.index_key, *tags).hdel(self.unacked_key, *tags).execute()

    def put_back(self, *, head: Sequence[tuple[str, str, bytes]] = (),
                 tail: Sequence[tuple[str, str, bytes]] = ()) -> None:
        """Put taken messages back unchanged and drop their unacked records, in one transaction: ``head`` (in queue
        order) where the consumer takes next, ``tail`` behind everything queued."""
        with self.channel.conn_or_acquire() as client, client.pipeline(transaction=True) as pipe:
            tags = [tag for _, tag, _ in (*head, *tail) if tag]
            if tags:
                pipe.zrem(self.index_key, *tags).hdel(self.unacked_key, *tags)
            for key, _, raw in tail:
                pipe.lpush(key, raw)
            for key, _, raw in reversed(head):  # the first of ``head`` ends up at the consuming end
                pipe.rpush(key, raw)
            pipe.execute()


def _message(channel, raw: bytes | int, accept) -> Any:
    """The kombu message of a queued ``payload`` (as ``Queue.get`` returns it; ``raw`` is its length when the
    take did not return it, see ``RedisQueue.take``). Raises ``ValueError`` for a payload over
    ``MAX_PAYLOAD_BYTES``, one that kombu's parser (the one its restore uses, ``dashboard.broker_json.loads``)
    refuses or that is not a JSON object, and one with a ``compression`` header (kombu would decompress it while
    building the message, unbounded; agents never compress). Error texts never quote the payload."""
    if isinstance(raw, int) or len(raw) > MAX_PAYLOAD_BYTES:
        size = raw if isinstance(raw, int) else len(raw)
        raise ValueError(f"the queued payload has {size} bytes, over {MAX_PAYLOAD_BYTES}")
    try:
        payload = loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise ValueError(f"the queued payload is not JSON ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise ValueError("the queued payload is not a JSON object")
    headers = payload.get("headers")
    if not isinstance(headers, dict):
        raise ValueError("the queued payload has no headers object")
    if headers.get("compression") is not None:
        raise ValueError("the queued payload names a compression (agents never compress)")
    from kombu.message import Message
    from kombu.serialization import prepare_accept_content

    message = channel.Message(payload, channel=channel)
    if not isinstance(message, Message):  # pragma: no cover - kombu's virtual channels return kombu Messages
        raise ValueError("unexpected message type")
    message.accept = prepare_accept_content(accept)
    return message


def take_queued(channel, *, accept, max_tasks: int = DRAIN_MAX_TASKS,
                max_messages: int = DRAIN_MAX_MESSAGES, queue: str = INGEST_QUEUE) -> tuple[list[Taken], int]:
    """Take up to ``max_tasks`` waiting ``dashboard.ingest`` tasks from ``queue`` on the kombu ``channel``.

    Returns the tasks taken (not yet acknowledged: the caller acknowledges them with :func:`settle` after storing)
    and how many malformed tasks were dropped (logged and acknowledged). ``accept`` is the accepted content types
    (``app.conf.accept_content``). Stops when ``max_messages`` agent messages are collected, when the queue is
    empty, at a message that is not a plain ingest task (put back in the queue), or when the broker fails (logged;
    what was taken so far is returned). On Redis each take is one script call (see the module docstring).
    """
    taken, dropped, _foreign = _take(channel, accept=accept, max_tasks=max_tasks, max_messages=max_messages,
                                     queue=queue)
    return taken, dropped


def _take(channel, *, accept, max_tasks: int = DRAIN_MAX_TASKS, max_messages: int = DRAIN_MAX_MESSAGES,
          queue: str = INGEST_QUEUE) -> tuple[list[Taken], int, bool]:
    """``take_queued``, and whether it stopped at a message that is not a plain ingest task."""
    redis_queue = RedisQueue.of(channel, queue)
    if redis_queue is None:
        return _take_one_by_one(channel, accept=accept, max_tasks=max_tasks, max_messages=max_messages, queue=queue)
    taken: list[Taken] = []
    malformed: list[str] = []
    collected = 0
    stop = False
    while not stop and len(taken) < max_tasks and collected < max_messages:
        per_task = -(-collected // len(taken)) if taken else 1  # messages per task so far, rounded up
        want = min(max_tasks - len(taken), TAKE_CHUNK, max(1, (max_messages - collected) // per_task))
        try:
            items = redis_queue.take(want)
        except Exception as exc:  # broker trouble: store what we have, the rest waits in the queue
            log.warning("ingest drain: taking queued tasks failed (%s: %s); storing the %d taken",
                        type(exc).__name__, exc, len(taken))
            break
        for i, (key, tag, raw) in enumerate(items):
            task_id = "?"
            payload = b""
            try:
                if not tag and isinstance(raw, bytes):  # refused by the take script (an oversize one: _message)
                    raise ValueError("the queued payload is not a JSON object")
                message = _message(channel, raw, accept)
                payload = raw if isinstance(raw, bytes) else b""  # always bytes here: _message refuses an int
                task_id = str((message.headers or {}).get("id", "?"))[:64]
                messages = _ingest_args(message)
            except _Foreign as exc:
                rest = [(k, t, r) for k, t, r in items[i + 1:] if isinstance(r, bytes)]
                malformed.extend("" for item in items[i + 1:] if not isinstance(item[2], bytes))  # oversized
                try:  # it goes behind the queue, the ones taken after it back to its head: the worker runs it
                    redis_queue.put_back(tail=[(key, tag, payload)], head=rest)
                except Exception as broker_exc:  # their unacked records stay: redelivered, nothing lost
                    log.warning("ingest drain: putting back %d taken tasks failed (%s: %s); they are delivered "
                                "again later", len(items) - i, type(broker_exc).__name__, broker_exc)
                log.debug("ingest drain: left %s in the queue: %s", task_id, exc)
                stop = True
                break
            except Exception as exc:  # undecodable or malformed: it can never be stored
                malformed.append(tag)
                log.warning("ingest: dropped malformed dashboard.ingest task %s: %s: %s", task_id,
                            type(exc).__name__, exc)
                continue
            taken.append(Taken(task_id, messages, message, tag, key, payload))
            collected += len(messages)
        if len(items) < want:  # the queue is empty
            break
    if malformed:
        _forget(redis_queue, malformed)
    return taken, len(malformed), stop


def _take_one_by_one(channel, *, accept, max_tasks: int, max_messages: int,
                     queue: str) -> tuple[list[Taken], int, bool]:
    """``_take`` on a transport other than Redis: kombu's ``Queue.get`` per task."""
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
            _settle_one(message, requeue=True)
            log.debug("ingest drain: left %s in the queue: %s", task_id, exc)
            return taken, dropped, True
        except Exception as exc:  # undecodable or malformed: it can never be stored
            _settle_one(message)
            dropped += 1
            log.warning("ingest: dropped malformed dashboard.ingest task %s: %s: %s", task_id,
                        type(exc).__name__, exc)
            continue
        taken.append(Taken(task_id, messages, message))
        collected += len(messages)
    return taken, dropped, False


def _forget(redis_queue: RedisQueue, tags: list[str]) -> None:
    try:
        redis_queue.forget(tags)
    except Exception as exc:
        log.warning("ingest drain: acknowledging %d tasks failed (%s: %s); the broker redelivers them",
                    len(tags), type(exc).__name__, exc)


def _settle_one(message, *, requeue: bool = False) -> None:
    """Acknowledge ``message`` through kombu (or put it back in its queue); a broker failure is logged, not raised.

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


def settle(items: Sequence[Taken], *, requeue: bool = False) -> None:
    """Acknowledge the taken ``items`` (or put them back at the head of the queue, in their order): those taken
    from Redis in one pipeline, others through kombu one by one. A broker failure is logged, not raised (what is
    not acknowledged is delivered again: harmless)."""
    tagged = [item for item in items if item.tag]
    if tagged:
        redis_queue = RedisQueue.of(tagged[0].message.channel)
        if redis_queue is None:  # pragma: no cover - tags only come from a RedisQueue
            raise RuntimeError("a tagged task without its Redis channel")
        try:
            if requeue:
                redis_queue.put_back(head=[(item.key, item.tag, item.raw) for item in tagged])
            else:
                redis_queue.forget([item.tag for item in tagged])
        except Exception as exc:
            log.warning("ingest drain: %s of %d tasks failed (%s: %s); the broker redelivers them",
                        "requeue" if requeue else "ack", len(tagged), type(exc).__name__, exc)
    for item in items:
        if not item.tag:
            _settle_one(item.message, requeue=requeue)


def _merge(total: IngestResult, part: IngestResult) -> None:
    """Add the counts of ``part`` to ``total``."""
    for name in ("reports", "duplicate_reports", "samples", "instance_stats", "refused_scopes", "refused_instances",
                 "acks", "duplicate_acks", "heartbeats", "invalid"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    for reason, count in part.rejected.items():
        total.rejected[reason] = total.rejected.get(reason, 0) + count
    total.duplicate_nodes.update(part.duplicate_nodes)
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

    One ``ingest`` call for everything, acknowledged after the commit (one Redis pipeline, :func:`settle`). If
    the database refuses the batch, each task (then each message) is stored on its own and acknowledged after it,
    so only what it refuses is lost (see the module docstring). On a connection error
    (``OperationalError``/``InterfaceError``) the taken tasks not yet stored are put back in the queue and the
    error is raised.
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
                settle([item])
            return result
        pending = []
        settle(taken)
        return result
    finally:
        if pending:  # not stored (database unreachable, or a bug): back to the queue, nothing lost
            settle(pending, requeue=True)


class _Held:
    """The tags ``_held`` keeps young; ``tags`` is replaced (never changed in place) while its thread reads it."""

    def __init__(self, tags: Sequence[str] = ()) -> None:
        self.tags: frozenset[str] = frozenset(tag for tag in tags if tag)


@contextmanager
def _held(channel, held: _Held) -> Iterator[None]:
    """While batches are stored, mark their tasks as held by a live worker: every third of
    ``KVPOOL_INGEST_REDELIVER_SECONDS`` the entries of ``held.tags`` in kombu's unacked index (Redis) are moved to
    the current time (``ZADD XX``: an acknowledged one is not brought back), so ``dashboard.telemetry.redeliver``
    puts back only the tasks of a worker that died, never those of a long batch. A thread; broker errors are ignored
    (the entry then ages as without this)."""
    index_key = getattr(channel, "unacked_index_key", None)
    client = getattr(channel, "client", None)
    if index_key is None or client is None:
        yield
        return
    done = threading.Event()
    every = max(settings.KVPOOL_INGEST_REDELIVER_SECONDS / 3, 0.2)

    def refresh() -> None:
        while True:  # at once (taking a long backlog may have aged the first ones), then every ``every`` s
            tags = held.tags
            if tags:
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


def ingest_queued(app, own: list[Any], *, own_id: str = "", own_tag: str = "",
                  max_rounds: int = DRAIN_MAX_ROUNDS) -> tuple[IngestResult, int]:
    """Store ``own`` together with what waits on ``dashboard.ingest`` (see the module docstring): a batch, then
    another of what arrived meanwhile, while the previous take found tasks, at most ``max_rounds`` batches.

    ``app`` is the dashboard's Celery app (its broker connection pool and accepted content types are used).
    Returns the combined ``IngestResult`` (malformed queued tasks are counted as ``invalid``) and how many
    queued tasks were taken besides ``own``. ``own_tag`` (the running task's delivery tag) is kept marked as held
    with the taken ones while the batches are stored (``_held``).
    """
    result = IngestResult()
    taken_total = dropped = batches = 0
    with app.pool.acquire(block=True) as connection:
        try:
            channel = connection.default_channel
        except Exception as exc:  # the broker is unreachable right now: store this task's messages alone
            log.warning("ingest drain: no broker channel (%s: %s); storing task %s alone", type(exc).__name__,
                        exc, own_id or "?")
            channel = None
        if channel is None:
            return store_batch(own, [], own_id), 0
        held = _Held([own_tag])
        with _held(channel, held):
            for round_no in range(max(1, max_rounds)):
                taken, malformed, foreign = _take(channel, accept=app.conf.accept_content)
                dropped += malformed
                if round_no and not taken:
                    break
                held.tags = held.tags | {item.tag for item in taken if item.tag}
                _merge(result, store_batch(own if round_no == 0 else [], taken, own_id))
                held.tags = frozenset([own_tag] if own_tag else [])
                taken_total += len(taken)
                batches += 1
                if foreign or not (taken or malformed):  # the worker runs the foreign task; or the queue is empty
                    break
    if dropped:
        count_refused("invalid", "malformed dashboard.ingest task", n=dropped)
        result.rejected["invalid"] = result.rejected.get("invalid", 0) + dropped
    result.invalid += dropped
    if taken_total:
        log.info("ingest: stored %d queued tasks together with task %s in %d batch(es) (%d acks, %d reports, "
                 "%d heartbeats)", taken_total, own_id or "?", batches, result.acks, result.reports,
                 result.heartbeats)
    return result, taken_total
