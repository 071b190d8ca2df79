"""Block writes an engine reported, waiting for the Store to confirm them: engine events are hints, the Store decides.

An engine's KV events (``agent.engines.vllm.attribution``) say which blocks it wrote; anyone who can reach the
event socket and knows a release's hashing settings can say the same. So an attributed block is not booked: it
waits in a :class:`PendingWrites` set (one per engine instance) until a Store client **of the instance's tenant**
finds its key (:meth:`PendingWrites.confirm`, ``batch_is_exist`` in batches). Only then is it ``record_put`` into the
node's :class:`agent.datapath.ledger.Ledger` (parents first, chains in one call), so occupancy, budgets and orphan
collection only ever see blocks the Store holds under the tenant's key prefix: a forged event changes no byte in the
Store and no figure of any tenant.

A block whose key is still absent ``grace`` seconds after it was reported is dropped and counted ``unconfirmed``: a
forged event, a write the master dropped although the engine got a success code (upstream Mooncake #3741: a tenant
over its quota), or a block the master evicted before the first check. Measured with Mooncake 0.3.13.post1 and
vLLM 0.32.0 (``MooncakeStoreConnector`` publishes ``BlockStored`` only after ``batch_put_from`` returned success):
a key is visible to ``batch_is_exist`` as soon as the put returned (1.2 ms later here), and every block of the
real-engine test was confirmed at its first check, so the grace (``DEFAULT_GRACE_S``) only covers a slow master.
Before it drops them, :meth:`confirm` can look expired blocks up under other key prefixes (``alternates``: the
namespaces the instance's engine really writes under, when something found them; counted per namespace, not booked).

A child whose parent is still waiting waits too; a child whose parent was dropped is booked below an absent parent
(an orphan, as the ledger defines it). ``recheck`` takes blocks an engine said it removed (``BlockRemoved``): they
leave the ledger only once the Store confirms they are gone.

Leases: Mooncake 0.3.13.post1's ``batch_is_exist`` grants each object it finds a read lease
(``--default_kv_lease_ttl``, 10 s by default), during which ``remove(force=False)`` is refused; an absent key takes
none. A confirmed block is therefore not removable by a budget for 10 s after its check, which comes within a tick
of its write: its access time moves by seconds, so the master's least-recently-accessed eviction order is unchanged.
The master's HTTP admin endpoints ``/query_key`` and ``/batch_query_keys`` answer only the ``default`` tenant
(``tenant_id`` parameters are ignored; checked on 0.3.13.post1), and ``/query_key`` leases too: they cannot confirm a
tenant's keys.

Memory: at most ``max_bytes`` per set (``PENDING_ENTRY_BYTES`` per block, measured with ``tracemalloc``); blocks
reported while it is full are not kept (``overflow``). CPU: :meth:`confirm` checks at most ``limit`` blocks per call.
Thread-safety: :meth:`add` / :meth:`recheck` (the attribution thread) and :meth:`confirm` (the maintenance thread)
may run at once; the set's lock is held only to take or return entries, never during a Store call.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from agent.datapath.errors import store_error
from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import Ledger, Outcome

#: Bytes one waiting block costs (entry, key string, digest, dictionary slot; measured with ``tracemalloc``).
PENDING_ENTRY_BYTES = 352
#: Default bound of one instance's set (bytes): about 47,000 blocks.
DEFAULT_PENDING_BYTES = 16 << 20
#: Seconds a reported block may stay absent from the Store before it is dropped as ``unconfirmed``.
DEFAULT_GRACE_S = 5.0
#: Blocks checked per :meth:`PendingWrites.confirm` call.
DEFAULT_CONFIRM_LIMIT = 16384
#: Keys per ``batch_is_exist`` call.
CONFIRM_BATCH = 4096
#: Blocks an engine said it removed, kept for a check (the oldest go first).
MAX_RECHECKS = 4096

#: ``(name, key_of)``: a namespace an instance's engine writes under, and ``key_of(keyspace, block_hash)`` giving the
#: primary key a block of ``keyspace`` has there (see :meth:`PendingWrites.confirm`).
Alternate = tuple[str, Callable[[KeySpace, bytes], str]]


#: One reported block, by its primary key: (key space, block hash, parent hash or None, bytes, first seen). A plain
#: tuple: the attribution thread makes one per block (a class instance costs twice as much).
_Value = tuple[KeySpace, bytes, "bytes | None", int, float]


@dataclass
class ConfirmResult:
    """One :meth:`PendingWrites.confirm`: blocks ``checked``, ``confirmed`` (booked), ``unconfirmed`` (dropped),
    ``waiting`` (still absent within the grace, or below a waiting parent), ``rechecked_gone`` (removals
    confirmed), ``unknown_namespace`` / ``unknown_namespace_bytes`` (name -> blocks / bytes found under another
    namespace), ``cut_parents`` (dropped blocks that confirmed children were booked below)."""

    checked: int = 0
    confirmed: int = 0
    unconfirmed: int = 0
    waiting: int = 0
    rechecked_gone: int = 0
    unknown_namespace: dict[str, int] = field(default_factory=dict)
    unknown_namespace_bytes: dict[str, int] = field(default_factory=dict)
    cut_parents: list[tuple[KeySpace, bytes]] = field(default_factory=list, repr=False)


class PendingWrites:
    """Blocks one engine instance reported stored, until the Store confirms them (module docstring).

    Args:
        max_bytes: bound of the set in bytes (``PENDING_ENTRY_BYTES`` per block).
        grace: seconds a block may stay absent before it is dropped as ``unconfirmed``.
        clock: seconds (``time.monotonic``).

    Counters (cumulative): ``confirmed``, ``unconfirmed``, ``overflow`` (reported while full, never checked),
    ``unknown_namespace_keys`` / ``unknown_namespace_bytes`` (per namespace name: blocks found under a namespace
    that is not their key space's, see :meth:`confirm`).
    """

    def __init__(self, *, max_bytes: int = DEFAULT_PENDING_BYTES, grace: float = DEFAULT_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.grace = grace
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Value] = {}  # insertion order: oldest first
        self._rechecks: OrderedDict[str, tuple[KeySpace, bytes]] = OrderedDict()
        self.confirmed = 0
        self.unconfirmed = 0
        self.overflow = 0
        self.unknown_namespace_keys: dict[str, int] = {}
        self.unknown_namespace_bytes: dict[str, int] = {}

    # --- input (the attribution thread) ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def has_work(self) -> bool:
        """Whether some block waits for a check (a reported write or removal)."""
        return bool(self._entries) or bool(self._rechecks)

    @property
    def size_bytes(self) -> int:
        """Bytes the waiting blocks cost (``PENDING_ENTRY_BYTES`` each)."""
        return len(self._entries) * PENDING_ENTRY_BYTES

    def set_max_bytes(self, max_bytes: int) -> None:
        """Change the bound; blocks over a lower one stay until they are checked (none are added meanwhile)."""
        self.max_bytes = max(0, int(max_bytes))

    def add(self, keyspace: KeySpace, block_hashes: Sequence[bytes], parent: bytes | None, size: int) -> int:
        """Report a chain the engine wrote: ``block_hashes[i]``'s parent is ``block_hashes[i-1]`` (``parent`` for
        the first), ``size`` bytes each, under ``keyspace``. A block already waiting keeps its first report.
        Returns how many were kept (the rest count as ``overflow``)."""
        room = self.max_bytes // PENDING_ENTRY_BYTES
        now = self.clock()
        keys = keyspace.keys(block_hashes) if keyspace.objects_per_block == 1 else [
            keyspace.primary_key(h) for h in block_hashes]
        parents = [parent, *block_hashes[:-1]]
        with self._lock:
            entries = self._entries
            free = room - len(entries)
            if free >= len(keys):
                for key, h, up in zip(keys, block_hashes, parents):
                    if key not in entries:
                        entries[key] = (keyspace, h, up, size, now)
                return len(keys)
            kept = 0
            for key, h, up in zip(keys, block_hashes, parents):
                if key not in entries:
                    if len(entries) >= room:
                        self.overflow += len(keys) - kept
                        return kept
                    entries[key] = (keyspace, h, up, size, now)
                kept += 1
        return kept

    def recheck(self, keyspace: KeySpace, block_hashes: Sequence[bytes]) -> None:
        """Blocks the engine said it removed: at the next :meth:`confirm` those the Store no longer holds leave the
        ledger (as evicted); the others stay."""
        with self._lock:
            for h in block_hashes:
                self._rechecks[keyspace.primary_key(h)] = (keyspace, h)
            while len(self._rechecks) > MAX_RECHECKS:
                self._rechecks.popitem(last=False)

    def merge_from(self, other: PendingWrites) -> None:
        """Take over another set's waiting blocks and counters (an instance's attributor replaced on re-apply)."""
        with other._lock:
            entries = list(other._entries.items())
            rechecks = list(other._rechecks.items())
            counters = (other.confirmed, other.unconfirmed, other.overflow, dict(other.unknown_namespace_keys),
                        dict(other.unknown_namespace_bytes))
        with self._lock:
            for key, value in entries:
                self._entries.setdefault(key, value)
            self._rechecks.update(rechecks)
            (self.confirmed, self.unconfirmed, self.overflow, self.unknown_namespace_keys,
             self.unknown_namespace_bytes) = counters

    def snapshot(self) -> dict[str, Any]:
        """``pending`` (blocks waiting), ``pending_bytes``, ``confirmed``, ``unconfirmed``, ``pending_overflow``,
        ``unknown_namespace_keys`` / ``unknown_namespace_bytes`` (copies)."""
        with self._lock:
            return {"pending": len(self._entries), "pending_bytes": len(self._entries) * PENDING_ENTRY_BYTES,
                    "confirmed": self.confirmed, "unconfirmed": self.unconfirmed, "pending_overflow": self.overflow,
                    "unknown_namespace_keys": dict(self.unknown_namespace_keys),
                    "unknown_namespace_bytes": dict(self.unknown_namespace_bytes)}

    # --- confirmation (the maintenance thread) --------------------------------------------------------------

    def confirm(self, store: Any, ledger: Ledger | None, *, limit: int = DEFAULT_CONFIRM_LIMIT,
                alternates: Callable[[], Sequence[Alternate]] | None = None) -> ConfirmResult:
        """Check up to ``limit`` waiting blocks (oldest first) in ``store`` — a Store client of the instance's tenant
        (``exists(keys) -> [1|0|-1]``) — and book the confirmed ones into ``ledger`` (``record_put``, outcome
        ``STORED``, parents first; None: count only).

        A block still absent after ``grace`` seconds is dropped as ``unconfirmed``, unless ``alternates()`` (called
        only when some block expired) names a namespace under whose key the Store holds it: then it counts in
        ``unknown_namespace_keys``/``_bytes`` of that name instead (never booked). Blocks the engine said it
        removed (:meth:`recheck`) that the Store no longer holds leave the ledger (``Ledger.observe``).

        Raises:
            StoreError: ``batch_is_exist`` answered -1 for some key (nothing was booked or dropped).
        """
        result = ConfirmResult()
        with self._lock:
            taken = list(islice(self._entries.items(), max(0, limit)))
            rechecks = list(islice(self._rechecks.items(), max(0, limit)))
            for key, _ in rechecks:
                del self._rechecks[key]
        if taken:
            self._confirm_writes(store, ledger, taken, alternates, result)
        if rechecks:  # after the writes: a block reported stored, then removed, is booked first, then checked
            gone = [item for item, ok in zip(rechecks, _present(store, [ks.keys_for(h) for _, (ks, h) in rechecks]))
                    if not ok]
            if ledger is not None:
                for _key, (ks, h) in gone:
                    ledger.observe(ks, [h], [False])
            result.rechecked_gone = len(gone)
        return result

    def _confirm_writes(self, store: Any, ledger: Ledger | None, taken: list[tuple[str, _Value]],
                        alternates: Callable[[], Sequence[Alternate]] | None, result: ConfirmResult) -> None:
        present = _present(store, [(key,) if value[0].objects_per_block == 1 else value[0].keys_for(value[1])
                                   for key, value in taken])
        if all(present):  # the common case: every reported write is there
            book, done = taken, taken
        else:
            book, done = self._sort_out(store, taken, present, alternates, result)
        if ledger is not None:
            _book(ledger, book)
            for ks, parent in result.cut_parents:  # booked below a block the Store does not hold: an orphan
                ledger.observe(ks, [parent], [False])
        with self._lock:
            entries = self._entries
            for key, value in done:
                if entries.get(key) is value:
                    del entries[key]
            self.confirmed += len(book)
            self.unconfirmed += result.unconfirmed
            for name, n in result.unknown_namespace.items():
                self.unknown_namespace_keys[name] = self.unknown_namespace_keys.get(name, 0) + n
                self.unknown_namespace_bytes[name] = (self.unknown_namespace_bytes.get(name, 0)
                                                      + result.unknown_namespace_bytes[name])
        result.checked = len(taken)
        result.confirmed = len(book)

    def _sort_out(self, store: Any, taken: list[tuple[str, _Value]], present: list[bool],
                  alternates: Callable[[], Sequence[Alternate]] | None,
                  result: ConfirmResult) -> tuple[list[tuple[str, _Value]], list[tuple[str, _Value]]]:
        """Some blocks are absent: which to book (parents first), which to drop, which wait (module docstring)."""
        now = self.clock()
        grace = self.grace
        expired = [(key, value) for (key, value), ok in zip(taken, present) if not ok and now - value[4] >= grace]
        found = _find_elsewhere(store, expired, alternates()) if expired and alternates is not None else {}
        dropped: set[str] = set()
        waiting: set[str] = set()
        done: list[tuple[str, _Value]] = []
        book: list[tuple[str, _Value]] = []
        for item, ok in zip(taken, present):
            key, (ks, _h, parent, size, first_seen) = item
            if not ok:
                if now - first_seen < grace:
                    waiting.add(key)
                    continue
                done.append(item)
                dropped.add(key)
                name = found.get(key)
                if name is None:
                    result.unconfirmed += 1
                else:
                    result.unknown_namespace[name] = result.unknown_namespace.get(name, 0) + 1
                    result.unknown_namespace_bytes[name] = result.unknown_namespace_bytes.get(name, 0) + size
                continue
            parent_key = ks.primary_key(parent) if parent is not None and (waiting or dropped) else None
            if parent_key is not None and parent_key in waiting:
                waiting.add(key)  # parents first: wait for the parent's verdict
                continue
            if parent_key is not None and parent_key in dropped:
                result.cut_parents.append((ks, parent))  # type: ignore[arg-type]
            book.append(item)
            done.append(item)
        result.waiting = len(waiting)
        return book, done


def _present(store: Any, key_groups: Sequence[Sequence[str]]) -> list[bool]:
    """Per group of object keys (one block's), whether the Store holds all of them; ``batch_is_exist`` in batches.

    Raises:
        StoreError: -1 for some key.
    """
    single = all(len(group) == 1 for group in key_groups)
    keys = [group[0] for group in key_groups] if single else [k for group in key_groups for k in group]
    codes: list[int] = []
    for start in range(0, len(keys), CONFIRM_BATCH):
        chunk = keys[start:start + CONFIRM_BATCH]
        answer = list(store.exists(chunk))
        if len(answer) != len(chunk):
            raise store_error("exist", [(chunk[0], -1)], tenant_id=getattr(store, "tenant_id", ""))
        errors = [(k, c) for k, c in zip(chunk, answer) if c < 0]
        if errors:
            raise store_error("exist", errors, tenant_id=getattr(store, "tenant_id", ""))
        codes += answer
    if single:
        return [c == 1 for c in codes]
    out = []
    pos = 0
    for group in key_groups:
        n = len(group)
        out.append(n > 0 and all(c == 1 for c in codes[pos:pos + n]))
        pos += n
    return out


def _find_elsewhere(store: Any, expired: Sequence[tuple[str, _Value]],
                    alternates: Sequence[Alternate]) -> dict[str, str]:
    """Key of each expired block found under one of ``alternates`` -> that namespace's name (first match wins)."""
    found: dict[str, str] = {}
    left = list(expired)
    for name, key_of in alternates:
        if not left:
            break
        hits = _present(store, [(key_of(value[0], value[1]),) for _key, value in left])
        for (key, _value), ok in zip(left, hits):
            if ok:
                found[key] = name
        left = [item for item, ok in zip(left, hits) if not ok]
    return found


def _book(ledger: Ledger, items: Sequence[tuple[str, _Value]]) -> None:
    """``record_put`` confirmed blocks in report order, consecutive blocks of one chain in one call."""
    head: _Value | None = None
    hashes: list[bytes] = []
    last: bytes | None = None
    for _key, value in items:
        ks, h, parent, size, _seen = value
        if head is not None and ks is head[0] and parent is not None and parent == last and size == head[3]:
            hashes.append(h)
        else:
            if head is not None:
                ledger.record_put(head[0], hashes, head[2], [Outcome.STORED] * len(hashes), head[3])
            head, hashes = value, [h]
        last = h
    if head is not None:
        ledger.record_put(head[0], hashes, head[2], [Outcome.STORED] * len(hashes), head[3])


__all__ = ["Alternate", "CONFIRM_BATCH", "ConfirmResult", "DEFAULT_CONFIRM_LIMIT", "DEFAULT_GRACE_S",
           "DEFAULT_PENDING_BYTES", "PENDING_ENTRY_BYTES", "PendingWrites"]
