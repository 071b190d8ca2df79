"""Bounded on-disk buffer of the agent's outgoing messages (reports and acks).

Every report and ack is written here first, with the next value of a per-node **sequence** that survives
restarts and, because a new file starts at the current time in microseconds, a lost state directory too (the
idempotency key on the dashboard is ``(node, sequence)``), and deleted only after the broker
took it. While the broker is down messages accumulate; after a restart the agent finds them and delivers them
in sequence order. A crash between publishing and deleting delivers a message twice — the dashboard stores it
once. When the buffer holds ``max_messages`` the oldest are dropped (counted in ``dropped`` and logged), so a
long outage costs the oldest telemetry, never the disk.

**Signed at send time, not here.** Bodies are stored unsigned (``signed_at`` None, ``signature`` ""); the
daemon stamps and signs each message on every delivery attempt (``agent.node.daemon.Daemon._send``,
``agent.contract.signing.sign_message``). So a backlog delivered after a long broker outage carries a fresh
``signed_at`` and passes the dashboard's replay window (which can therefore stay short), and a backlog queued
before the node's secret was rotated is delivered under the new secret once the agent restarts with it. The
disk copy gains nothing from a signature: the secret lives on the same node. ``deliver`` hands ``send`` the
stored (unsigned) bodies. (A backlog older than the receipts the dashboard keeps — 2 days by default — is
refused there as ``expired`` all the same: it could no longer be told from a replay.)

Storage is one SQLite file (``outbox.sqlite3`` in the state directory, WAL journal, synchronous=FULL), so a
message that ``add`` returned for is on disk. Thread-safe: one connection guarded by a lock.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("kvpool.agent.outbox")

DEFAULT_MAX_MESSAGES = 20_000


def fresh_first_sequence() -> int:
    """The first sequence of a new outbox: the current Unix time in microseconds (above any earlier agent's
    sequences on this node unless it sent more than a million messages a second, or the clock went back)."""
    return time.time_ns() // 1000


class Outbox:
    """Persistent FIFO of JSON messages keyed by a monotonically increasing sequence.

    ``path`` is the SQLite file; ``max_messages`` (≥ 1) bounds how many undelivered messages are kept;
    ``first_sequence`` (≥ 1) is the sequence of the first message of a *new* file (an existing file continues
    where it stopped). The daemon starts new files at the current Unix time in microseconds
    (:func:`fresh_first_sequence`), so a node whose state directory was lost or reinstalled keeps numbering above
    its previous agent's and the dashboard does not drop its messages as duplicates of the old ones.
    """

    def __init__(self, path: str | Path, *, max_messages: int = DEFAULT_MAX_MESSAGES, first_sequence: int = 1) -> None:
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, got {max_messages}")
        if first_sequence < 1:
            raise ValueError(f"first_sequence must be at least 1, got {first_sequence}")
        self.path = Path(path)
        self.max_messages = max_messages
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from agent.node.accounts import private_file

        private_file(self.path)  # 0600: reports name tenants, namespaces and request groups
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (sequence INTEGER PRIMARY KEY, body TEXT NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('last_sequence', ?), ('first_sequence', ?), "
                         "('dropped', 0)", (first_sequence - 1, first_sequence))

    def close(self) -> None:
        """Close the database file; the object is unusable afterwards."""
        with self._lock:
            self._db.close()

    def _meta(self, name: str) -> int:
        return int(self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()[0])

    def add(self, build: Callable[[int], dict[str, Any]]) -> int:
        """Allocate the next sequence, store ``build(sequence)`` and return the sequence.

        ``build`` receives the sequence so it can put it into the message. Drops the oldest messages beyond
        ``max_messages``. Raises whatever ``build`` raises (nothing is stored then) and ``sqlite3.Error`` on a
        disk failure.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                sequence = self._meta("last_sequence") + 1
                body = json.dumps(build(sequence), separators=(",", ":"))
                self._db.execute("UPDATE meta SET value = ? WHERE name = 'last_sequence'", (sequence,))
                self._db.execute("INSERT INTO outbox (sequence, body) VALUES (?, ?)", (sequence, body))
                excess = self._count() - self.max_messages
                if excess > 0:
                    self._db.execute(
                        "DELETE FROM outbox WHERE sequence IN "
                        "(SELECT sequence FROM outbox ORDER BY sequence LIMIT ?)",
                        (excess,),
                    )
                    self._db.execute("UPDATE meta SET value = value + ? WHERE name = 'dropped'", (excess,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if excess > 0:
            log.warning("outbox full (%d messages): dropped the %d oldest undelivered", self.max_messages, excess)
        return sequence

    def _count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    @property
    def dropped(self) -> int:
        """Messages dropped since the state directory was created because the buffer was full."""
        with self._lock:
            return self._meta("dropped")

    @property
    def last_sequence(self) -> int:
        """The highest sequence allocated so far (0 before the first message)."""
        with self._lock:
            return self._meta("last_sequence")

    def peek(self, limit: int) -> list[dict[str, Any]]:
        """Return up to ``limit`` undelivered messages, oldest first, without removing them."""
        with self._lock:
            rows = self._db.execute(
                "SELECT body FROM outbox ORDER BY sequence LIMIT ?", (limit,)
            ).fetchall()
        return [json.loads(body) for (body,) in rows]

    def remove_through(self, sequence: int) -> None:
        """Forget every message with a sequence ≤ ``sequence`` (they were delivered)."""
        with self._lock:
            self._db.execute("DELETE FROM outbox WHERE sequence <= ?", (sequence,))

    def deliver(self, send: Callable[[list[dict[str, Any]]], None], *, batch: int = 200) -> int:
        """Hand undelivered messages to ``send`` in batches of up to ``batch``, oldest first.

        A batch is removed only after ``send`` returned; the first exception stops delivery and propagates
        (the batch stays for the next attempt). Returns how many messages were delivered. Messages added while
        delivering are delivered too. Callers must not run two ``deliver`` calls at once (the daemon holds a
        lock), or a batch could be sent twice — harmless for the dashboard, but wasteful.
        """
        delivered = 0
        while True:
            messages = self.peek(batch)
            if not messages:
                return delivered
            send(messages)
            self.remove_through(int(messages[-1]["sequence"]))
            delivered += len(messages)
