"""The node's observer of real vLLM engines: one ZMQ SUB socket per instance for its KV events, and metric scrapes.

Matches vLLM 0.32.0 (CPU) / 0.33.0 ``ZmqEventPublisher``: every instance is rendered with ``--kv-events-config
'{"endpoint": "ipc://kv-events.sock", "topic": "<instance_id>", ...}'`` (``agent.contract.kv_events``), so its engine
**binds** a socket in its own instance directory. The observer connects one SUB socket to each instance's socket, and
only after ``agent.engines.vllm.transport.open_source`` showed that nobody but the instance's account could have made
it; until then (no socket yet, or one that fails the check) it retries with backoff (``retry_initial`` doubling up to
``retry_max`` seconds) and says why in the instance's ``events_status`` / ``events_problem`` (a refused socket also
counts in ``events_refusals`` and is logged). A connected socket is checked again every ``recheck_interval``
seconds. **Catching up** (vLLM's replay socket, rendered beside the event socket: ``agent.contract.kv_events``): a ZMQ
subscriber gets nothing published before it joined, so on every connect, and whenever a message's sequence number
skips some, the observer asks the instance's replay ROUTER (a DEALER through the same checked directory) for the
messages from the next one it lacks; live messages are held meanwhile (at most ``REPLAY_HOLD`` of them and
``REPLAY_HOLD_BYTES`` of frames: more are dropped, counted in ``replay_held_dropped``, and replayed at the next gap)
and handed on after the replayed ones, those the replay already gave dropped, so the attributor sees one ordered
stream. A replay that does not end within ``REPLAY_TIMEOUT`` seconds is abandoned (the held messages go on; what is
missing counts as a gap). Counted per instance: ``replays``, ``replayed`` (messages), ``replay_timeouts``. An
engine without a replay socket is observed as before (its early messages are lost and gaps counted). After an agent
restart the first replay starts at 0, so what the engine still buffers is applied again: a block the restored ledger
already holds counts one more put.
Messages are routed **by socket**: a message on an instance's socket is that instance's. Its topic frame
is only checked: one under another topic than the instance's is dropped and counted (``topic_mismatch``; the node's
``unknown_topic`` / ``unknown_topic_blocks`` total them with the Store blocks they announce).

:class:`EngineObserver` keeps one :class:`agent.engines.vllm.attribution.Attributor` per vLLM instance of the
applied config document (:meth:`EngineObserver.apply`, the daemon's ``on_apply`` hook: an unchanged instance keeps
its attributor and its connection, a changed one gets a new attributor that continues the old one's counters and
state), a background thread that connects, receives and attributes messages for every instance with one poller
(:meth:`start` / :meth:`stop`; at most ``DRAIN_PER_SOCKET`` messages of one socket per round, so one busy instance
cannot hold the others' back), and a second one that scrapes each instance's ``http://<host>:<port>/metrics`` every
``metrics_interval`` seconds (failures counted, never raised). :meth:`snapshot` is thread-safe.

Where an instance publishes (its ``EventSource``) comes from ``source_for`` (``agent.node.engines`` builds it from the
instance's launch, its directory and its account). The socket part is thin:
:meth:`EngineObserver.handle_instance_frames` handles one message of one instance and is what the thread calls.
Handling only queues the message on its instance (:class:`agent.engines.vllm.inbox.Inbox`); a third thread attributes
the queues in turn with a work budget per instance and round, so one instance's traffic cannot stall another's and
receiving never waits for attribution. Every socket should be set up with :meth:`EngineObserver.socket_options`
(``zmq.MAXMSGSIZE``: libzmq drops a peer that sends a larger message; ``handle_instance_frames`` checks the size again).
Memory: the node's bound (``memory_bytes``) is divided among its instances' attributors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import zmq

from agent.engines.vllm.attribution import DEFAULT_MEMORY_BYTES, MAX_MESSAGE_BYTES, Attributor
from agent.engines.vllm.events import MEDIUM_STORE, BlockStored, EventDecodeError, decode_message
from agent.engines.vllm.inbox import Inbox
from agent.engines.vllm.metrics import SCRAPE_DEADLINE_S, MetricsError, MetricsTracker, parse_metrics
from agent.engines.vllm.transport import (
    CONNECTED,
    REFUSED,
    UNOBSERVED,
    WAITING,
    EventSource,
    OpenSource,
    Refused,
    launch_source,
    open_source,
)

log = logging.getLogger("kvpool.agent.engines.vllm")

#: Default seconds between ``/metrics`` scrapes of each instance.
DEFAULT_METRICS_INTERVAL = 15.0
#: Receive high-water mark (messages) of each SUB socket; the engine's PUB default is 100000 too.
DEFAULT_RCVHWM = 100_000
#: Seconds before the first retry of an instance whose socket is missing or refused; doubled per failure.
DEFAULT_RETRY_INITIAL = 0.2
#: Longest wait between two tries (seconds): an engine that starts is observed within this.
DEFAULT_RETRY_MAX = 2.0
#: Seconds between re-checks of a connected instance's socket and directory.
DEFAULT_RECHECK_INTERVAL = 2.0
#: Messages taken from one instance's socket per poll round before the next socket's turn.
DRAIN_PER_SOCKET = 1000
#: Seconds a replay may take before it is abandoned.
REPLAY_TIMEOUT = 5.0
#: Live messages held per instance while its replay runs (more are dropped: the attributor counts the gap).
REPLAY_HOLD = 10_000
#: Frame bytes of the live messages held per instance while its replay runs (more are dropped, as past
#: ``REPLAY_HOLD``): the count alone would let one engine's messages of up to ``max_message_bytes`` each make the
#: agent hold 40 GiB for 5 s, past the node's whole memory bound. The attribution inbox's per-instance queue bound.
REPLAY_HOLD_BYTES = 16 << 20
#: vLLM's end-of-replay sequence frame (``ZmqEventPublisher.END_SEQ``: -1 as 8 signed big-endian bytes).
REPLAY_END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: Default memory bound of all attribution state of the node (bytes), divided among its instances (each gets at
#: most ``agent.engines.vllm.attribution.DEFAULT_MEMORY_BYTES``).
DEFAULT_NODE_MEMORY_BYTES = 1 << 30


def default_topic(instance: Any) -> str:
    """The topic an instance's engine publishes under: its ``instance_id`` (rendered as the ``topic`` field)."""
    return instance.instance_id


def default_source(instance: Any) -> EventSource:
    """An instance's ``EventSource`` without a node around it: an absolute ``ipc://`` endpoint of its launch,
    expected to be owned by this process's uid (tests); a relative one has no directory here (``UNOBSERVED``)."""
    import os

    return launch_source(instance, None, os.geteuid())


def _no_account(url: str, timeout: float) -> str:
    """The scrape of an instance whose account is unknown here: refused (its listener's uid cannot be checked)."""
    raise MetricsError(f"{url}: the instance has no account here, so whoever listens on its port cannot be checked: "
                       "not scraped")


def _instances(applied: Any) -> list[Any]:
    """Instances of a duck-typed ``AppliedConfig`` (``.document.instances``), ``ConfigDocument``
    (``.instances``) or a plain iterable of instances (None: none)."""
    if applied is None:
        return []
    document = getattr(applied, "document", applied)
    instances = getattr(document, "instances", document)
    return list(instances)


@dataclass(eq=False)
class _Link:
    """One instance's event connection: its source, topic and state. The receiving thread owns ``sock`` and
    ``opened``; the counters and ``status``/``problem`` are read by :meth:`EngineObserver.snapshot`."""

    source: EventSource
    topic: bytes
    status: str = WAITING
    problem: str = ""
    refusals: int = 0
    topic_mismatch: int = 0
    connects: int = 0
    backoff: float = 0.0
    next_try: float = 0.0
    next_recheck: float = 0.0
    sock: Any = None
    opened: OpenSource | None = field(default=None, repr=False)
    #: sequence number of the newest message handed on (None before the first)
    last_seq: int | None = None
    replay: Any = None            # the DEALER of a replay in progress
    replay_from: int = 0          # the first sequence number it asked for
    replay_deadline: float = 0.0
    held: list[list[bytes]] = field(default_factory=list, repr=False)
    held_bytes: int = 0
    #: live messages dropped because the held ones reached ``REPLAY_HOLD`` / ``REPLAY_HOLD_BYTES``
    held_dropped: int = 0
    replays: int = 0
    replayed: int = 0
    replay_timeouts: int = 0


class EngineObserver:
    """KV events and metrics of every vLLM instance of the node's applied document (module docstring).

    Args:
        ledger: the node's ``agent.datapath.ledger.Ledger`` that attributed blocks are recorded in (None: count
            only).
        source_for: ``instance -> EventSource``: where the instance publishes and who must own the socket
            (default :func:`default_source`).
        metrics_interval: seconds between scrapes of each instance's ``/metrics`` (0: no scraping thread).
        metrics_host: host of the engines' HTTP servers.
        metrics_timeout: seconds per scrape, in all (``agent.engines.vllm.metrics.SCRAPE_DEADLINE_S``).
        fetch: ``(url, timeout) -> text`` for scrapes (tests; default: ``fetch_text``, which reads nothing from a
            listener whose uid is not the instance's account, the source's ``owner_uid``; an instance without a
            known account is not scraped).
        topic_for: ``instance -> topic string`` its messages must carry (default: the instance id).
        attributor_options: keyword arguments for each :class:`Attributor` (``block_bytes``, ``store_media``,
            ``known_blocks``, ``gpu_memo_blocks``).
        rcvhwm: each SUB socket's receive high-water mark (messages).
        poll_ms: how often the receiving thread looks at connections and stop (milliseconds).
        retry_initial / retry_max: backoff of an instance whose socket is missing or refused (seconds).
        recheck_interval: seconds between checks of a connected socket.
        max_message_bytes: largest message accepted (bytes; :meth:`socket_options` and each attributor).
        memory_bytes: bound of the node's attribution state (bytes), divided among the instances.
        inbox_options: keyword arguments of the :class:`agent.engines.vllm.inbox.Inbox` (``round_work``,
            ``max_bytes``, ``max_total_bytes``).
    """

    def __init__(self, ledger: Any = None, *, source_for: Callable[[Any], EventSource] = default_source,
                 metrics_interval: float = DEFAULT_METRICS_INTERVAL, metrics_host: str = "127.0.0.1",
                 metrics_timeout: float = SCRAPE_DEADLINE_S, fetch: Callable[[str, float], str] | None = None,
                 topic_for: Callable[[Any], str] = default_topic,
                 attributor_options: Mapping[str, Any] | None = None, rcvhwm: int = DEFAULT_RCVHWM,
                 poll_ms: int = 100, retry_initial: float = DEFAULT_RETRY_INITIAL,
                 retry_max: float = DEFAULT_RETRY_MAX, recheck_interval: float = DEFAULT_RECHECK_INTERVAL,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, memory_bytes: int = DEFAULT_NODE_MEMORY_BYTES,
                 inbox_options: Mapping[str, Any] | None = None) -> None:
        self.ledger = ledger
        self.source_for = source_for
        self.metrics_interval = metrics_interval
        self.metrics_host = metrics_host
        self.metrics_timeout = metrics_timeout
        self.fetch = fetch
        self.topic_for = topic_for
        self.attributor_options = dict(attributor_options or {})
        self.rcvhwm = rcvhwm
        self.poll_ms = poll_ms
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.recheck_interval = recheck_interval
        self.max_message_bytes = max_message_bytes
        self.memory_bytes = memory_bytes
        self._inbox = Inbox(self.attributor, **dict(inbox_options or {}))
        self._lock = threading.Lock()
        self._attributors: dict[str, Attributor] = {}   # instance_id -> attributor
        self._links: dict[str, _Link] = {}              # instance_id -> its connection (replaced, never mutated)
        self._closing: list[_Link] = []                 # links of instances that left, for the thread to close
        self._trackers: dict[str, MetricsTracker] = {}  # instance_id -> its /metrics tracker
        self.apply_errors: dict[str, str] = {}           # instance_id -> why it is not observed
        self._observed_since: dict[str, float] = {}      # instance_id -> unix seconds of its first apply
        self.unknown_topic = 0
        self.unknown_topic_blocks = 0
        self.received = 0
        self._ctx: zmq.Context | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- config -------------------------------------------------------------------------------------------

    def apply(self, applied: Any) -> None:
        """Observe the vLLM instances of a newly applied document (the daemon's ``on_apply`` hook; also takes a
        ``ConfigDocument`` or an iterable of instances). Never raises for a bad instance: it is left out and
        named in :attr:`apply_errors`. An instance whose source and topic are unchanged keeps its connection."""
        attributors: dict[str, Attributor] = {}
        links: dict[str, _Link] = {}
        errors: dict[str, str] = {}
        with self._lock:
            old = dict(self._attributors)
            old_links = dict(self._links)
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
                source = self.source_for(instance)
            except Exception as exc:  # a bad instance must not stop the others
                errors[iid] = str(exc)
                log.warning("engine observer: instance %s is not observed: %s", iid, exc)
                continue
            attributors[iid] = att
            link = old_links.get(iid)
            if link is None or link.source != source or link.topic != topic:
                fresh = _Link(source, topic, backoff=self.retry_initial)
                if link is not None:  # a changed source: start over, keep the counters
                    fresh.refusals, fresh.topic_mismatch = link.refusals, link.topic_mismatch
                if source.problem:
                    fresh.status, fresh.problem = source.status or UNOBSERVED, source.problem
                    log.error("engine observer: KV events of instance %s are not observed: %s", iid, source.problem)
                link = fresh
            links[iid] = link
        if attributors:  # the node's bound, shared: no instance gets more than an attributor's default
            share = min(int(self.attributor_options.get("memory_bytes", DEFAULT_MEMORY_BYTES)),
                        self.memory_bytes // len(attributors))
            for att in attributors.values():
                if att.memory_bytes != share:
                    att.set_memory_bytes(share)
        now = time.time()
        with self._lock:
            self._closing += [link for iid, link in self._links.items() if links.get(iid) is not link]
            self._attributors = attributors
            self._links = links
            self.apply_errors = errors
            self._observed_since = {iid: self._observed_since.get(iid, now) for iid in attributors}
            trackers = {}
            for iid, att in attributors.items():
                url = f"http://{self.metrics_host}:{att.instance.port}/metrics"
                owner = links[iid].source.owner_uid
                tracker = self._trackers.get(iid)
                if tracker is None or tracker.url != url or tracker.owner_uid != owner:
                    fetch = self.fetch if self.fetch is not None or owner is not None else _no_account
                    tracker = MetricsTracker(url, fetch=fetch, timeout=self.metrics_timeout, owner_uid=owner)
                trackers[iid] = tracker
            self._trackers = trackers

    @property
    def topics(self) -> set[bytes]:
        """Topic frames the observed instances' messages must carry."""
        return {link.topic for link in self._links.values()}

    def attributor(self, instance_id: str) -> Attributor | None:
        """The attributor of an observed instance."""
        return self._attributors.get(instance_id)

    def source(self, instance_id: str) -> EventSource | None:
        """Where an observed instance publishes (None when it is not observed)."""
        link = self._links.get(instance_id)
        return link.source if link is not None else None

    def status(self, instance_id: str) -> tuple[str, str]:
        """``(events_status, events_problem)`` of an observed instance (``("", "")`` when it is not observed)."""
        link = self._links.get(instance_id)
        return (link.status, link.problem) if link is not None else ("", "")

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

    def handle_instance_frames(self, instance_id: str, frames: list[bytes]) -> bool:
        """Handle one multipart message that arrived on ``instance_id``'s socket.

        Its topic frame must be the instance's; otherwise it is dropped, counted in the instance's
        ``topic_mismatch`` and the node's ``unknown_topic``, and the Store blocks it announces (``BlockStored``
        with the Store medium) in ``unknown_topic_blocks``; returns False then (and for an instance no longer
        observed, or when its queue was full: counted on the instance). A message of the instance's topic is queued
        for the attribution thread (:class:`agent.engines.vllm.inbox.Inbox`; attributed at once when that thread
        does not run). Never raises for malformed input (the attributor counts it); a message over
        ``max_message_bytes`` is not decoded."""
        self.received += 1
        link = self._links.get(instance_id)
        att = self._attributors.get(instance_id)
        if link is None or att is None:
            return False
        if not frames or bytes(frames[0]) != link.topic:
            link.topic_mismatch += 1
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
    def running(self) -> bool:
        """Whether the threads run (:meth:`start` called, :meth:`stop` not)."""
        return bool(self._threads)

    def connected(self) -> set[str]:
        """Ids of the instances whose socket is connected now."""
        return {iid for iid, link in self._links.items() if link.status == CONNECTED}

    def observed_since(self, instance_id: str) -> float | None:
        """Unix seconds since an instance is observed (its first apply; None when it is not observed)."""
        return self._observed_since.get(instance_id)

    def start(self) -> None:
        """Start the threads (connections are made, and retried, by the receiving thread)."""
        if self._threads:
            return
        self._stop.clear()
        self._ctx = zmq.Context()
        threads = [threading.Thread(target=self._receive_loop, name="kvpool-vllm-events", daemon=True)]
        if self.metrics_interval > 0:
            threads.append(threading.Thread(target=self._metrics_loop, name="kvpool-vllm-metrics", daemon=True))
        self._threads = threads
        self._inbox.start()
        for t in threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads and close every socket (idempotent)."""
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

    def _close(self, link: _Link, poller: zmq.Poller, socks: dict[Any, str]) -> None:
        self._end_replay(link, poller, socks, flush=False)
        if link.sock is not None:
            try:
                poller.unregister(link.sock)
            except KeyError:
                pass
            socks.pop(link.sock, None)
            link.sock.close(0)
            link.sock = None
        if link.opened is not None:
            link.opened.close()
            link.opened = None

    def _refused(self, iid: str, link: _Link, exc: Refused, now: float) -> None:
        changed = (link.status, link.problem) != (exc.status, str(exc))
        link.status, link.problem = exc.status, str(exc)
        if exc.status == REFUSED:
            link.refusals += 1
        if changed:
            level = logging.WARNING if exc.status == REFUSED else logging.INFO
            log.log(level, "engine observer: instance %s: %s%s", iid, exc,
                    "; not connected, retrying" if exc.status == REFUSED else "; retrying")
        link.next_try = now + link.backoff
        link.backoff = min(self.retry_max, max(self.retry_initial, link.backoff * 2))

    def _connect(self, iid: str, link: _Link, poller: zmq.Poller, socks: dict[Any, str], now: float) -> None:
        try:
            opened = open_source(link.source)
        except Refused as exc:
            self._refused(iid, link, exc, now)
            return
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        for option, value in self.socket_options().items():
            sock.setsockopt(option, value)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: a message under another one is counted, then dropped
        try:
            sock.connect(opened.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            opened.close()
            self._refused(iid, link, Refused(WAITING, f"connecting to {link.source.socket_path}: {exc}"), now)
            return
        link.sock, link.opened = sock, opened
        link.status, link.problem = CONNECTED, ""
        link.connects += 1
        link.backoff = self.retry_initial
        link.next_recheck = now + self.recheck_interval
        poller.register(sock, zmq.POLLIN)
        socks[sock] = iid
        log.info("engine observer: instance %s: KV events from %s (owned by uid %s)", iid, link.source.socket_path,
                 link.source.owner_uid)
        self._start_replay(iid, link, poller, socks, now)

    # --- replay -------------------------------------------------------------------------------------------

    def _start_replay(self, iid: str, link: _Link, poller: zmq.Poller, socks: dict[Any, str], now: float) -> bool:
        """Ask the instance's replay socket for the messages after ``link.last_seq`` (all it has before the first);
        returns False when it has none (the engine renders no replay endpoint) or one runs already."""
        if link.replay is not None or link.opened is None:
            return False
        endpoint = link.opened.replay_endpoint()
        if endpoint is None:
            return False
        assert self._ctx is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(endpoint)
            start = 0 if link.last_seq is None else link.last_seq + 1
            dealer.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
            link.replay_from = start
        except zmq.ZMQError as exc:
            dealer.close(0)
            log.info("engine observer: instance %s: replay request failed: %s", iid, exc)
            return False
        link.replay, link.replay_deadline = dealer, now + REPLAY_TIMEOUT
        link.replays += 1
        poller.register(dealer, zmq.POLLIN)
        socks[dealer] = iid
        return True

    def _end_replay(self, link: _Link, poller: zmq.Poller, socks: dict[Any, str], *, flush: bool = True) -> None:
        """Close the replay of ``link`` and hand on the held live messages the replay did not already give."""
        dealer, link.replay = link.replay, None
        if dealer is not None:
            try:
                poller.unregister(dealer)
            except KeyError:
                pass
            socks.pop(dealer, None)
            dealer.close(0)
        held, link.held, link.held_bytes = link.held, [], 0
        iid = next((i for i, candidate in self._links.items() if candidate is link), None)
        if not flush or iid is None:
            return
        for frames in held:
            seq = _seq_of(frames, link.topic)
            if seq is not None and link.last_seq is not None and seq <= link.last_seq:
                continue  # the replay gave it already
            self._hand_on(iid, link, frames, seq)

    def _hand_on(self, iid: str, link: _Link, frames: list[bytes], seq: int | None) -> None:
        if seq is not None:
            link.last_seq = seq
        self.handle_instance_frames(iid, frames)

    def _on_live(self, iid: str, link: _Link, frames: list[bytes], poller: zmq.Poller, socks: dict[Any, str],
                 now: float) -> None:
        """A message from the instance's event socket: held while a replay runs; a gap starts one."""
        seq = _seq_of(frames, link.topic)
        if link.replay is None and seq is not None and link.last_seq is not None:
            if seq <= link.last_seq:  # the engine restarted (its sequence starts at 0): what it published first
                link.last_seq = None
                self._start_replay(iid, link, poller, socks, now)
            elif seq > link.last_seq + 1:  # missed some (published before the socket joined, or dropped)
                self._start_replay(iid, link, poller, socks, now)
        if link.replay is not None:
            size = sum(len(frame) for frame in frames)
            if len(link.held) < REPLAY_HOLD and link.held_bytes + size <= REPLAY_HOLD_BYTES:
                link.held.append(frames)
                link.held_bytes += size
            else:
                link.held_dropped += 1
            return
        self._hand_on(iid, link, frames, seq)

    def _on_replayed(self, iid: str, link: _Link, frames: list[bytes], poller: zmq.Poller,
                     socks: dict[Any, str]) -> None:
        """A message from the instance's replay socket (``[b"", topic, seq, payload]``), or its end marker."""
        body = frames[1:] if frames and not frames[0] else frames
        if len(body) == 3 and bytes(body[1]) == REPLAY_END_SEQ:
            if link.last_seq is None:  # caught up with nothing before replay_from: a later message after it is a gap
                link.last_seq = link.replay_from - 1
            self._end_replay(link, poller, socks)
            return
        seq = _seq_of(body, link.topic)
        if seq is not None and link.last_seq is not None and seq <= link.last_seq:
            return  # older than asked for
        link.replayed += 1
        self._hand_on(iid, link, body, seq)

    def _sync(self, poller: zmq.Poller, socks: dict[Any, str], now: float) -> None:
        """Close the links of instances that left; connect (or retry) the others; re-check connected ones."""
        with self._lock:
            closing, self._closing = self._closing, []
            links = dict(self._links)
        for link in closing:
            self._close(link, poller, socks)
        for iid, link in links.items():
            if link.source.problem:
                continue
            if link.replay is not None and now >= link.replay_deadline:
                link.replay_timeouts += 1
                log.warning("engine observer: instance %s: the replay did not end within %.0f s; going on without it",
                            iid, REPLAY_TIMEOUT)
                self._end_replay(link, poller, socks)
            if link.sock is None:
                if now >= link.next_try:
                    self._connect(iid, link, poller, socks, now)
            elif now >= link.next_recheck:
                link.next_recheck = now + self.recheck_interval
                try:
                    assert link.opened is not None
                    link.opened.recheck()
                except Refused as exc:
                    self._close(link, poller, socks)
                    self._refused(iid, link, exc, now)
                    if exc.status == WAITING:  # the directory was rewritten: reconnect at once
                        link.next_try = now

    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        socks: dict[Any, str] = {}
        try:
            while not self._stop.is_set():
                self._sync(poller, socks, time.monotonic())
                if not socks:
                    self._stop.wait(self.poll_ms / 1000)
                    continue
                for sock, _ in poller.poll(self.poll_ms):
                    iid = socks.get(sock)
                    if iid is None:
                        continue
                    link = self._links.get(iid)
                    for _ in range(DRAIN_PER_SOCKET):  # then the next socket's turn
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            if link is None:
                                self.handle_instance_frames(iid, frames)
                            elif sock is link.replay:
                                self._on_replayed(iid, link, frames, poller, socks)
                                if link.replay is None:
                                    break
                            else:
                                self._on_live(iid, link, frames, poller, socks, time.monotonic())
                        except Exception:  # pragma: no cover - a bug must not end observation
                            log.exception("engine observer: message handling failed")
        finally:
            with self._lock:
                links = list(self._links.values()) + self._closing
                self._closing = []
            for link in links:
                self._close(link, poller, socks)
                if link.status == CONNECTED:
                    link.status, link.problem = WAITING, "the observer stopped"

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
        """Thread-safe, JSON-ready: ``running``, ``received``, ``unknown_topic`` (messages under another topic than
        their socket's instance), ``unknown_topic_blocks`` (Store blocks in them), ``apply_errors``, and per
        observed instance id its attribution counters (``Attributor.snapshot``) with ``topic``,
        ``events_endpoint`` (as its launch renders it), ``events_socket`` (the path connected to),
        ``events_status`` / ``events_problem`` (``agent.engines.vllm.transport``), ``events_refusals``,
        ``topic_mismatch``, ``observed_since`` (unix seconds) and ``metrics`` (``MetricsTracker.snapshot``)."""
        with self._lock:
            attributors = dict(self._attributors)
            links = dict(self._links)
            metrics = {iid: tracker.snapshot() for iid, tracker in self._trackers.items()}
            since = dict(self._observed_since)
            out: dict[str, Any] = {"running": bool(self._threads),
                                   "received": self.received, "unknown_topic": self.unknown_topic,
                                   "unknown_topic_blocks": self.unknown_topic_blocks,
                                   "apply_errors": dict(self.apply_errors)}
        instances = {}
        for iid, att in attributors.items():
            row = att.snapshot()
            link = links.get(iid)
            if link is not None:
                row.update(topic=link.topic.decode("utf-8", "replace"), events_endpoint=link.source.endpoint,
                           events_socket=str(link.source.socket_path or ""), events_status=link.status,
                           events_problem=link.problem, events_refusals=link.refusals,
                           topic_mismatch=link.topic_mismatch, replays=link.replays, replayed=link.replayed,
                           replay_timeouts=link.replay_timeouts, replay_held_dropped=link.held_dropped)
            row["observed_since"] = since.get(iid)
            row["metrics"] = metrics.get(iid)
            instances[iid] = row
        out["instances"] = instances
        return out


def _seq_of(frames: list[bytes], topic: bytes) -> int | None:
    """The sequence number of a ``[topic, seq, payload]`` message under ``topic`` (None for anything else: the
    attributor or the topic check counts it)."""
    if len(frames) != 3 or len(frames[1]) != 8 or bytes(frames[0]) != topic:
        return None
    return int.from_bytes(frames[1], "big")


def observe(ledger: Any, applied: Any = None, **options: Any) -> EngineObserver:
    """An :class:`EngineObserver` for ``ledger``, applied to ``applied`` (if given) and started."""
    observer = EngineObserver(ledger, **options)
    if applied is not None:
        observer.apply(applied)
    observer.start()
    return observer


__all__ = ["DEFAULT_METRICS_INTERVAL", "EngineObserver", "default_source", "default_topic", "observe"]
