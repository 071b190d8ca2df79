"""Received KV-event messages waiting for attribution: one bounded queue per engine instance, served in turn.

The thread that receives messages (``agent.engines.vllm.observer``) only routes them here (:meth:`Inbox.put`, O(1));
one attribution thread (:meth:`Inbox.start`) takes them in rounds: each round visits every instance with queued
messages once and attributes its messages until that instance's work in the round reaches ``round_work``
(``Attributor.work``: blocks handled, GPU blocks walked and candidate contexts hashed for first blocks no GPU event
names) — at least one message, at most one message past the budget (whose root hashes are capped at
``agent.engines.vllm.attribution.MAX_ROOT_HASHES``). So one instance's traffic, however heavy or hostile, delays
another instance's messages by at most one round budget (and one bounded message,
``agent.engines.vllm.attribution.MAX_MESSAGE_BLOCKS`` blocks and ``MAX_ROOT_HASHES`` root hashes) per instance, and
receiving never waits for attribution.

Memory: at most ``max_bytes`` of queued frames per instance and ``max_total_bytes`` over all; a message that does
not fit is dropped and counted on its instance (``dropped_messages``; its sequence number then shows as a gap).

Before :meth:`Inbox.start` (or :meth:`Inbox.open`, which queues without a thread: the caller runs the rounds)
:meth:`Inbox.put` attributes at once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("kvpool.agent.engines.vllm")

#: Work units (blocks handled + GPU blocks walked + root contexts hashed) one instance may use per round.
DEFAULT_ROUND_WORK = 4096
#: Queued frame bytes per instance.
DEFAULT_INSTANCE_QUEUE_BYTES = 16 << 20
#: Queued frame bytes over all instances of the node.
DEFAULT_TOTAL_QUEUE_BYTES = 128 << 20


class Inbox:
    """Per-instance queues of received messages and the attribution thread (module docstring).

    Args:
        resolve: ``instance_id -> Attributor | None`` (the observer's current attributor: a re-applied instance's
            queued messages go to its new attributor; an instance that left the document drops them).
        round_work: work units per instance and round.
        max_bytes: queued frame bytes per instance.
        max_total_bytes: queued frame bytes over all instances.
    """

    def __init__(self, resolve: Callable[[str], Any], *, round_work: int = DEFAULT_ROUND_WORK,
                 max_bytes: int = DEFAULT_INSTANCE_QUEUE_BYTES,
                 max_total_bytes: int = DEFAULT_TOTAL_QUEUE_BYTES) -> None:
        self.resolve = resolve
        self.round_work = max(1, round_work)
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self._cond = threading.Condition()
        self._queues: dict[str, deque[tuple[Sequence[bytes], int]]] = {}
        self._bytes: dict[str, int] = {}
        self._total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queueing = False
        #: Rounds run (an operation count for tests and the bench).
        self.rounds = 0

    @property
    def running(self) -> bool:
        """Whether the attribution thread runs."""
        return self._thread is not None

    def open(self) -> None:
        """Queue messages from now on without starting the thread (the caller calls :meth:`run_round`)."""
        self._queueing = True

    def queued(self, instance_id: str | None = None) -> int:
        """Messages waiting (of one instance, or of all)."""
        with self._cond:
            if instance_id is not None:
                return len(self._queues.get(instance_id, ()))
            return sum(len(q) for q in self._queues.values())

    def put(self, instance_id: str, frames: Sequence[bytes]) -> bool:
        """Queue one message of an instance (attribute it at once when the thread does not run). Returns False when
        it was dropped: the instance's or the node's queue is full, or the instance is not observed."""
        if not self._queueing:
            att = self.resolve(instance_id)
            if att is None:
                return False
            att.handle_frames(frames)
            return True
        try:
            size = sum(len(f) for f in frames)
        except TypeError:
            size = 0
        with self._cond:
            held = self._bytes.get(instance_id, 0)
            if held + size > self.max_bytes or self._total + size > self.max_total_bytes:
                full = True
            else:
                full = False
                self._queues.setdefault(instance_id, deque()).append((frames, size))
                self._bytes[instance_id] = held + size
                self._total += size
                self._cond.notify()
        if full:
            att = self.resolve(instance_id)
            if att is not None:
                att.note_dropped()
            return False
        return True

    def run_round(self) -> int:
        """One round: every instance with queued messages attributes up to ``round_work`` (module docstring).
        Returns the messages handled."""
        with self._cond:
            order = [iid for iid, q in self._queues.items() if q]
        handled = 0
        for iid in order:
            used = 0
            while used < self.round_work:
                with self._cond:
                    queue = self._queues.get(iid)
                    if not queue:
                        break
                    frames, size = queue.popleft()
                    self._bytes[iid] -= size
                    self._total -= size
                    if not queue:
                        del self._queues[iid]
                        del self._bytes[iid]
                att = self.resolve(iid)  # per message: a re-applied instance's next message goes to its new attributor
                if att is None:
                    continue  # the instance left the document: its messages go
                before = att.work
                try:
                    att.handle_frames(frames)
                except Exception:  # pragma: no cover - a bug must not end attribution
                    log.exception("engine observer: attributing a message of instance %s failed", iid)
                handled += 1
                used += max(1, att.work - before)
        self.rounds += 1
        return handled

    # --- the thread ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the attribution thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._queueing = True
        self._thread = threading.Thread(target=self._run, name="kvpool-vllm-attribution", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after the message it is attributing; queued messages are attributed at the next start,
        new ones at once."""
        self._queueing = False
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if not any(self._queues.values()):
                    self._cond.wait(0.5)
                    continue
            self.run_round()


__all__ = ["DEFAULT_INSTANCE_QUEUE_BYTES", "DEFAULT_ROUND_WORK", "DEFAULT_TOTAL_QUEUE_BYTES", "Inbox"]
