"""The node's observer of real vLLM engines: one ZMQ SUB socket for every instance's KV events, and metric scrapes.

Matches vLLM 0.32.0 (CPU) / 0.33.0 ``ZmqEventPublisher``: an engine whose ``--kv-events-config`` ``endpoint``
names a host (``tcp://127.0.0.1:5557``) *connects* its PUB socket to it, so the node binds one SUB socket and
every engine of the node connects there. Each instance is rendered with ``"topic": "<instance_id>"``; the
first frame of each message is that topic, which is how one socket tells instances apart (ZMQ subscriptions
match prefixes, so routing compares the whole topic frame; messages of unknown topics are counted and dropped, and
so are the Store blocks they announce: ``unknown_topic_blocks`` are blocks an engine the applied document does not
know wrote into the pool). The socket subscribes to every topic, so such engines are seen at all.

:class:`EngineObserver` keeps one :class:`agent.engines.vllm.attribution.Attributor` per vLLM instance of the
applied config document (:meth:`EngineObserver.apply`, the daemon's ``on_apply`` hook: subscriptions change
without closing the socket; an unchanged instance keeps its attributor, a changed one gets a new attributor
that continues the old one's counters and state), a background thread that receives and attributes messages
(:meth:`start` / :meth:`stop`; :meth:`rebind` moves it to another endpoint keeping every instance's state), and a
second one that scrapes each instance's ``http://<host>:<port>/metrics`` every ``metrics_interval`` seconds
(failures counted, never raised). :meth:`snapshot` is thread-safe.

The socket part is thin: :meth:`EngineObserver.handle_frames` routes one message and is what the thread calls.
Routing only queues the message on its instance (:class:`agent.engines.vllm.inbox.Inbox`); a third thread attributes
the queues in turn with a work budget per instance and round, so one instance's traffic cannot stall another's and
receiving never waits for attribution. Every socket should be set up with :meth:`EngineObserver.socket_options`
(``zmq.MAXMSGSIZE``: libzmq drops a peer that sends a larger message; ``handle_frames`` checks the size again).
Memory: the node's bound (``memory_bytes``) is divided among its instances' attributors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from agent.engines.vllm.attribution import DEFAULT_MEMORY_BYTES, MAX_MESSAGE_BYTES, Attributor
from agent.engines.vllm.events import MEDIUM_STORE, BlockStored, EventDecodeError, decode_message
from agent.engines.vllm.inbox import Inbox
from agent.engines.vllm.metrics import MetricsTracker, fetch_text, parse_metrics

log = logging.getLogger("kvpool.agent.engines.vllm")

#: Default node endpoint engines connect to (``--kv-events-config '{"endpoint": "tcp://127.0.0.1:5557", ...}'``).
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
#: Default seconds between ``/metrics`` scrapes of each instance.
DEFAULT_METRICS_INTERVAL = 15.0
#: Receive high-water mark (messages) of the SUB socket; the engine's PUB default is 100000 too.
DEFAULT_RCVHWM = 100_000
#: Default memory bound of all attribution state of the node (bytes), divided among its instances (each gets at
#: most ``agent.engines.vllm.attribution.DEFAULT_MEMORY_BYTES``).
DEFAULT_NODE_MEMORY_BYTES = 1 << 30


def default_topic(instance: Any) -> str:
    """The topic an instance's engine publishes under: its ``instance_id`` (rendered as the ``topic`` field)."""
    return instance.instance_id


def _instances(applied: Any) -> list[Any]:
    """Instances of a duck-typed ``AppliedConfig`` (``.document.instances``), ``ConfigDocument``
    (``.instances``) or a plain iterable of instances (None: none)."""
    if applied is None:
        return []
    document = getattr(applied, "document", applied)
    instances = getattr(document, "instances", document)
    return list(instances)


class EngineObserver:
    """KV events and metrics of every vLLM instance of the node's applied document (module docstring).

    Args:
        ledger: the node's ``agent.datapath.ledger.Ledger`` that attributed blocks are recorded in (None: count
            only).
        endpoint: ZMQ endpoint to bind (``tcp://host:port``; port ``*`` picks a free one, see :attr:`endpoint`).
        metrics_interval: seconds between scrapes of each instance's ``/metrics`` (0: no scraping thread).
        metrics_host: host of the engines' HTTP servers.
        metrics_timeout: seconds per scrape.
        fetch: ``(url, timeout) -> text`` for scrapes (tests).
        topic_for: ``instance -> topic string`` (default: the instance id).
        attributor_options: keyword arguments for each :class:`Attributor` (``block_bytes``, ``store_media``,
            ``known_blocks``, ``gpu_memo_blocks``).
        rcvhwm: the SUB socket's receive high-water mark (messages).
        poll_ms: how often the receiving thread checks for subscription changes and stop (milliseconds).
        max_message_bytes: largest message accepted (bytes; :meth:`socket_options` and each attributor).
        memory_bytes: bound of the node's attribution state (bytes), divided among the instances.
        inbox_options: keyword arguments of the :class:`agent.engines.vllm.inbox.Inbox` (``round_work``,
            ``max_bytes``, ``max_total_bytes``).
    """

    def __init__(self, ledger: Any = None, *, endpoint: str = DEFAULT_ENDPOINT,
                 metrics_interval: float = DEFAULT_METRICS_INTERVAL, metrics_host: str = "127.0.0.1",
                 metrics_timeout: float = 2.0, fetch: Callable[[str, float], str] = fetch_text,
                 topic_for: Callable[[Any], str] = default_topic,
                 attributor_options: Mapping[str, Any] | None = None, rcvhwm: int = DEFAULT_RCVHWM,
                 poll_ms: int = 100, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 memory_bytes: int = DEFAULT_NODE_MEMORY_BYTES,
                 inbox_options: Mapping[str, Any] | None = None) -> None:
        self.ledger = ledger
        self._endpoint = endpoint
        self.metrics_interval = metrics_interval
        self.metrics_host = metrics_host
        self.metrics_timeout = metrics_timeout
        self.fetch = fetch
        self.topic_for = topic_for
        self.attributor_options = dict(attributor_options or {})
        self.rcvhwm = rcvhwm
        self.poll_ms = poll_ms
        self.max_message_bytes = max_message_bytes
        self.memory_bytes = memory_bytes
        self._inbox = Inbox(self.attributor, **dict(inbox_options or {}))
        self._lock = threading.Lock()
        self._attributors: dict[str, Attributor] = {}   # instance_id -> attributor
        self._routes: dict[bytes, Attributor] = {}      # topic frame -> attributor (replaced, never mutated)
        self._trackers: dict[str, MetricsTracker] = {}  # instance_id -> its /metrics tracker
        self.apply_errors: dict[str, str] = {}           # instance_id -> why it is not observed
        self._observed_since: dict[str, float] = {}      # instance_id -> unix seconds of its first apply
        self.unknown_topic = 0
        self.unknown_topic_blocks = 0
        self.received = 0
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- config -------------------------------------------------------------------------------------------

    def apply(self, applied: Any) -> None:
        """Observe the vLLM instances of a newly applied document (the daemon's ``on_apply`` hook; also takes a
        ``ConfigDocument`` or an iterable of instances). Never raises for a bad instance: it is left out and
        named in :attr:`apply_errors`."""
        attributors: dict[str, Attributor] = {}
        routes: dict[bytes, Attributor] = {}
        errors: dict[str, str] = {}
        with self._lock:
            old = dict(self._attributors)
        for instance in _instances(applied):
            if getattr(instance, "engine", None) != "vllm":
                continue
            iid = instance.instance_id
            previous = old.get(iid)
            try:
                if previous is not None and previous.instance == instance:
                    att = previous
                else:
                    options = {"max_message_bytes": self.max_message_bytes, **self.attributor_options}
                    att = Attributor(instance, self.ledger, previous=previous, **options)
                topic = self.topic_for(instance).encode("utf-8")
            except Exception as exc:  # a bad instance must not stop the others
                errors[iid] = str(exc)
                log.warning("engine observer: instance %s is not observed: %s", iid, exc)
                continue
            if topic in routes:
                errors[iid] = f"topic {topic!r} is also the topic of instance {routes[topic].instance_id}"
                continue
            attributors[iid] = att
            routes[topic] = att
        if attributors:  # the node's bound, shared: no instance gets more than an attributor's default
            share = min(int(self.attributor_options.get("memory_bytes", DEFAULT_MEMORY_BYTES)),
                        self.memory_bytes // len(attributors))
            for att in attributors.values():
                if att.memory_bytes != share:
                    att.set_memory_bytes(share)
        now = time.time()
        with self._lock:
            self._attributors = attributors
            self._routes = routes
            self.apply_errors = errors
            self._observed_since = {iid: self._observed_since.get(iid, now) for iid in attributors}
            trackers = {}
            for iid, att in attributors.items():
                url = f"http://{self.metrics_host}:{att.instance.port}/metrics"
                tracker = self._trackers.get(iid)
                if tracker is None or tracker.url != url:
                    tracker = MetricsTracker(url, fetch=self.fetch, timeout=self.metrics_timeout)
                trackers[iid] = tracker
            self._trackers = trackers

    @property
    def topics(self) -> set[bytes]:
        """Topic frames currently routed to an instance's attributor."""
        return set(self._routes)

    def attributor(self, instance_id: str) -> Attributor | None:
        """The attributor of an observed instance."""
        return self._attributors.get(instance_id)

    def attributors(self) -> list[Attributor]:
        """The attributors of every observed instance (ordered by instance id)."""
        return [att for _iid, att in sorted(self._attributors.items())]

    @property
    def inbox(self) -> Inbox:
        """The per-instance queues of received messages and the attribution thread."""
        return self._inbox

    def socket_options(self) -> dict[int, int]:
        """ZMQ options for each SUB socket: ``MAXMSGSIZE`` (``max_message_bytes``) and ``RCVHWM``."""
        return {zmq.MAXMSGSIZE: self.max_message_bytes, zmq.RCVHWM: self.rcvhwm}

    # --- messages -----------------------------------------------------------------------------------------

    def handle_frames(self, frames: list[bytes]) -> bool:
        """Route one multipart message to its instance by its topic frame (exact match): queued for the attribution
        thread (:class:`agent.engines.vllm.inbox.Inbox`; attributed at once when that thread does not run).

        Returns False when no observed instance has that topic: the message is counted in ``unknown_topic`` and
        the Store blocks it announces (``BlockStored`` with the Store medium) in ``unknown_topic_blocks`` (not
        decoded when over ``max_message_bytes``); also False when the instance's queue was full (counted on the
        instance). Never raises for malformed input (the attributor counts it).
        """
        self.received += 1
        att = self._routes.get(bytes(frames[0])) if frames else None
        if att is None:
            self.unknown_topic += 1
            if sum(len(f) for f in frames) > self.max_message_bytes:
                return False
            try:
                events = decode_message(frames).batch.events
            except EventDecodeError:
                return False
            self.unknown_topic_blocks += sum(len(ev.block_hashes) for ev in events
                                             if type(ev) is BlockStored and ev.medium == MEDIUM_STORE)
            return False
        return self._inbox.put(att.instance_id, frames)

    # --- threads ------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The bound endpoint (with the port the OS chose for ``*``) once started, else the configured one."""
        return self._endpoint

    @property
    def running(self) -> bool:
        """Whether the socket is bound and the threads run (:meth:`start` succeeded, :meth:`stop` not called)."""
        return bool(self._threads)

    def rebind(self, endpoint: str) -> None:
        """Move the SUB socket to ``endpoint`` (stop, then :meth:`start` there when it was running); every
        instance keeps its attributor and metrics. Raises as :meth:`start` does."""
        running = bool(self._threads)
        self.stop()
        self._endpoint = endpoint
        if running:
            self.start()

    def observed_since(self, instance_id: str) -> float | None:
        """Unix seconds since an instance is observed (its first apply; None when it is not observed)."""
        return self._observed_since.get(instance_id)

    def start(self) -> None:
        """Bind the SUB socket (errors such as a port in use raise here) and start the threads."""
        if self._threads:
            return
        self._stop.clear()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        for option, value in self.socket_options().items():
            sock.setsockopt(option, value)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(self._endpoint)
        except zmq.ZMQError:
            sock.close(0)
            ctx.term()
            raise
        self._endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._ctx, self._sock = ctx, sock
        threads = [threading.Thread(target=self._receive_loop, name="kvpool-vllm-events", daemon=True)]
        if self.metrics_interval > 0:
            threads.append(threading.Thread(target=self._metrics_loop, name="kvpool-vllm-metrics", daemon=True))
        self._threads = threads
        self._inbox.start()
        for t in threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads and close the socket (idempotent)."""
        self._stop.set()
        alive = False
        for t in self._threads:
            t.join(timeout)
            alive = alive or t.is_alive()
        self._threads = []
        self._inbox.stop(timeout)
        if self._ctx is not None and not alive:  # term() would wait for a socket a stuck thread still holds
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> EngineObserver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _receive_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        subscribed: set[bytes] = set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                # one subscription to every topic: messages of instances the document does not know are counted
                wanted = {b""}
                if wanted != subscribed:
                    for topic in wanted - subscribed:
                        sock.setsockopt(zmq.SUBSCRIBE, topic)
                    for topic in subscribed - wanted:
                        sock.setsockopt(zmq.UNSUBSCRIBE, topic)
                    subscribed = wanted
                if not poller.poll(self.poll_ms):
                    continue
                for _ in range(10_000):  # drain, then look at subscriptions and stop again
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self.handle_frames(frames)
                    except Exception:  # pragma: no cover - a bug must not end observation
                        log.exception("engine observer: message handling failed")
        finally:
            sock.close(0)
            self._sock = None

    def _metrics_loop(self) -> None:
        while not self._stop.wait(self.metrics_interval):
            self.scrape_metrics_now()

    def scrape_metrics_now(self) -> None:
        """Scrape every observed instance's ``/metrics`` once (failures counted per instance)."""
        with self._lock:
            trackers = list(self._trackers.values())
        for tracker in trackers:
            if self._stop.is_set():
                return
            try:  # fetched outside the lock: a slow engine must not block snapshots
                metrics = parse_metrics(tracker.fetch(tracker.url, tracker.timeout))
            except Exception as exc:  # never raise from a scrape
                with self._lock:
                    tracker.failures += 1
                    tracker.last_error = str(exc)
                continue
            with self._lock:
                tracker.update(metrics)

    # --- output -------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Thread-safe, JSON-ready: ``endpoint``, ``running``, ``received``, ``unknown_topic`` (messages),
        ``unknown_topic_blocks`` (Store blocks in them), ``apply_errors``, and per observed instance id its
        attribution counters (``Attributor.snapshot``) with ``topic``, ``observed_since`` (unix seconds) and
        ``metrics`` (``MetricsTracker.snapshot``)."""
        with self._lock:
            attributors = dict(self._attributors)
            topics = {att.instance_id: topic for topic, att in self._routes.items()}
            metrics = {iid: tracker.snapshot() for iid, tracker in self._trackers.items()}
            since = dict(self._observed_since)
            out: dict[str, Any] = {"endpoint": self._endpoint, "running": bool(self._threads),
                                   "received": self.received, "unknown_topic": self.unknown_topic,
                                   "unknown_topic_blocks": self.unknown_topic_blocks,
                                   "apply_errors": dict(self.apply_errors)}
        instances = {}
        for iid, att in attributors.items():
            row = att.snapshot()
            row["topic"] = topics.get(iid, b"").decode("utf-8", "replace")
            row["observed_since"] = since.get(iid)
            row["metrics"] = metrics.get(iid)
            instances[iid] = row
        out["instances"] = instances
        return out


def observe(ledger: Any, applied: Any = None, **options: Any) -> EngineObserver:
    """An :class:`EngineObserver` for ``ledger``, applied to ``applied`` (if given) and started."""
    observer = EngineObserver(ledger, **options)
    if applied is not None:
        observer.apply(applied)
    observer.start()
    return observer


__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_METRICS_INTERVAL", "EngineObserver", "default_topic", "observe"]
