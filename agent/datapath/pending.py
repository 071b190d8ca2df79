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
The Store cannot name them itself: Mooncake 0.3.13.post1's Python client lists no keys and the master's HTTP key
listing sees only the ``default`` tenant (``docs/design.md``, "Not from the Store's keys alone").

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

#: Bytes one waiting block costs (digest, dictionary slot, a share of its report's head; measured with ``tracemalloc``).
PENDING_ENTRY_BYTES = 120
#: Default bound of one instance's set (bytes): about 140,000 blocks.
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


#: One reported block, by its primary key: (key space, block hash, parent hash or None, bytes, first seen).
_Value = tuple[KeySpace, bytes, "bytes | None", int, float]
#: As stored, in the dictionary of its key space by block hash (report order): the first new block of each report
#: holds ``(parent hash or None, bytes, first seen)``; every later block of the report holds only its parent's hash
#: (the previous block's digest: an object that exists anyway) and shares the head's bytes and time. So the
#: attribution thread allocates one tuple per reported chain, not per block (a container per block made the garbage
#: collector run a third more often). A kept block whose head left becomes a head itself. Keys are built at
#: confirmation, in the maintenance thread.
_Head = tuple["bytes | None", int, float]
_Stored = "bytes | _Head"


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


class _Batch:
    """Waiting blocks of one key space taken for a check, in report order: its number, the key space, their hashes,
    the entries as stored, and per block its parent, bytes and first-seen time; ``after``: the block that followed
    the taken ones (None: none); ``keys`` once made."""

    __slots__ = ("number", "keyspace", "hashes", "stored", "parents", "sizes", "seen", "after", "keys")

    def __init__(self, number: int, keyspace: KeySpace, hashes: list[bytes], stored: list[Any],
                 after: bytes | None, size: int, seen: float) -> None:
        self.number = number
        self.keyspace = keyspace
        self.hashes = hashes
        self.stored = stored
        self.after = after
        self.parents: list[bytes | None] = []
        self.sizes: list[int] = []
        self.seen: list[float] = []
        for value in stored:  # (size, seen): the key space's last report until the first head (never needed)
            if type(value) is tuple:
                parent, size, seen = value
            else:
                parent = value
            self.parents.append(parent)
            self.sizes.append(size)
            self.seen.append(seen)
        self.keys: list[str] = []


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
        self._spaces: list[KeySpace] = []  # the key spaces of the entries, by number
        self._space_number: dict[int, int] = {}  # id(key space) -> its number (the list keeps it alive)
        self._by_space: list[dict[bytes, Any]] = []  # per key space number: block hash -> entry (_Stored), oldest first
        self._sizes: list[int] = []  # per key space number: the bytes of its last report
        self._count = 0
        self._rechecks: OrderedDict[str, tuple[KeySpace, bytes]] = OrderedDict()
        self.confirmed = 0
        self.unconfirmed = 0
        self.overflow = 0
        self.unknown_namespace_keys: dict[str, int] = {}
        self.unknown_namespace_bytes: dict[str, int] = {}

    # --- input (the attribution thread) ---------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def has_work(self) -> bool:
        """Whether some block waits for a check (a reported write or removal)."""
        return self._count > 0 or bool(self._rechecks)

    @property
    def size_bytes(self) -> int:
        """Bytes the waiting blocks cost (``PENDING_ENTRY_BYTES`` each)."""
        return self._count * PENDING_ENTRY_BYTES

    def set_max_bytes(self, max_bytes: int) -> None:
        """Change the bound; blocks over a lower one stay until they are checked (none are added meanwhile)."""
        self.max_bytes = max(0, int(max_bytes))

    def add(self, keyspace: KeySpace, block_hashes: Sequence[bytes], parent: bytes | None, size: int) -> int:
        """Report a chain the engine wrote: ``block_hashes[i]``'s parent is ``block_hashes[i-1]`` (``parent`` for
        the first), ``size`` bytes each, under ``keyspace``. A block already waiting keeps its first report.
        Returns how many were kept (the rest count as ``overflow``)."""
        room = self.max_bytes // PENDING_ENTRY_BYTES
        now = self.clock()
        n = len(block_hashes)
        with self._lock:
            number = self._space_number.get(id(keyspace))
            if number is None:
                number = self._space_number[id(keyspace)] = len(self._spaces)
                self._spaces.append(keyspace)
                self._by_space.append({})
                self._sizes.append(size)
            self._sizes[number] = size
            entries = self._by_space[number]
            before = len(entries)
            free = room - self._count
            head = True
            kept = 0
            for h in block_hashes:
                if h not in entries:
                    if free <= 0:
                        self.overflow += n - kept
                        break
                    if head:
                        entries[h] = (parent, size, now)
                        head = False
                    else:
                        entries[h] = parent
                    free -= 1
                kept += 1
                parent = h
            self._count += len(entries) - before
        return kept

    def recheck(self, keyspace: KeySpace, block_hashes: Sequence[bytes]) -> None:
        """Blocks the engine said it removed: at the next :meth:`confirm` those the Store no longer holds leave the
        ledger (as evicted); the others stay."""
        with self._lock:
            for h in block_hashes:
                self._rechecks[keyspace.primary_key(h)] = (keyspace, h)
            while len(self._rechecks) > MAX_RECHECKS:
                self._rechecks.popitem(last=False)

    def snapshot(self) -> dict[str, Any]:
        """``pending`` (blocks waiting), ``pending_bytes``, ``confirmed``, ``unconfirmed``, ``pending_overflow``,
        ``unknown_namespace_keys`` / ``unknown_namespace_bytes`` (copies)."""
        with self._lock:
            return {"pending": self._count, "pending_bytes": self._count * PENDING_ENTRY_BYTES,
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
        now = self.clock()
        with self._lock:
            batches: list[_Batch] = []
            left = max(0, limit)
            for number, entries in enumerate(self._by_space):
                if left <= 0:
                    break
                if entries:
                    hashes = list(islice(entries, left + 1))
                    after = hashes.pop() if len(hashes) > left else None
                    batches.append(_Batch(number, self._spaces[number], hashes, [entries[h] for h in hashes], after,
                                          self._sizes[number], now))
                    left -= len(hashes)
            rechecks = list(islice(self._rechecks.items(), max(0, limit)))
            for key, _ in rechecks:
                del self._rechecks[key]
        if batches:
            self._confirm_writes(store, ledger, batches, alternates, result)
        if rechecks:  # after the writes: a block reported stored, then removed, is booked first, then checked
            gone = [item for item, ok in zip(rechecks, _present(store, [ks.keys_for(h) for _, (ks, h) in rechecks]))
                    if not ok]
            if ledger is not None:
                for _key, (ks, h) in gone:
                    ledger.observe(ks, [h], [False])
            result.rechecked_gone = len(gone)
        return result

    def _confirm_writes(self, store: Any, ledger: Ledger | None, batches: list[_Batch],
                        alternates: Callable[[], Sequence[Alternate]] | None, result: ConfirmResult) -> None:
        keys: list[str] = []
        for batch in batches:  # keys are made here, in the maintenance thread
            ks = batch.keyspace
            batch.keys = ks.keys(batch.hashes) if ks.objects_per_block == 1 else [ks.primary_key(h)
                                                                                 for h in batch.hashes]
            keys += batch.keys
        if all(b.keyspace.objects_per_block == 1 for b in batches):
            present = _exists(store, keys)
        else:
            present = _present(store, [b.keyspace.keys_for(h) for b in batches for h in b.hashes])
        checked = len(present)
        if all(present):  # the common case: every reported write is there, parents before children
            booked = checked
            if ledger is not None:
                for batch in batches:
                    _book_runs(ledger, batch.keyspace, batch.hashes, batch.parents, batch.sizes)
            done: set[str] | None = None
        else:
            taken = [(key, (b.keyspace, h, parent, size, seen)) for b in batches
                     for key, h, parent, size, seen in zip(b.keys, b.hashes, b.parents, b.sizes, b.seen)]
            book, finished = self._sort_out(store, taken, present, alternates, result)
            booked = len(book)
            if ledger is not None:
                for ks, items in _by_keyspace(book):
                    _book_runs(ledger, ks, [v[1] for _key, v in items], [v[2] for _key, v in items],
                               [v[3] for _key, v in items])
                for ks, parent in result.cut_parents:  # booked below a block the Store does not hold: an orphan
                    ledger.observe(ks, [parent], [False])
            done = {key for key, _value in finished}
        with self._lock:
            for batch in batches:
                self._remove(batch, done)
            if self._count == 0:  # nothing refers to the old key spaces any more
                self._spaces.clear()
                self._space_number.clear()
                self._by_space.clear()
                self._sizes.clear()
            self.confirmed += booked
            self.unconfirmed += result.unconfirmed
            for name, n in result.unknown_namespace.items():
                self.unknown_namespace_keys[name] = self.unknown_namespace_keys.get(name, 0) + n
                self.unknown_namespace_bytes[name] = (self.unknown_namespace_bytes.get(name, 0)
                                                      + result.unknown_namespace_bytes[name])
        result.checked = checked
        result.confirmed = booked

    def _remove(self, batch: _Batch, done: set[str] | None) -> None:
        """Remove a batch's finished blocks (all when ``done`` is None); a kept block whose predecessor in its report
        left takes the head's bytes and time itself (under the lock)."""
        entries = self._by_space[batch.number]
        gone_before = False
        for key, h, stored, parent, size, seen in zip(batch.keys, batch.hashes, batch.stored, batch.parents,
                                                      batch.sizes, batch.seen):
            if entries.get(h) is not stored:  # reported again meanwhile: leave it
                gone_before = False
                continue
            if done is None or key in done:
                del entries[h]
                self._count -= 1
                gone_before = True
            else:
                if gone_before and type(stored) is not tuple:
                    entries[h] = (parent, size, seen)
                gone_before = False
        if gone_before and batch.after is not None and batch.stored:
            nxt = entries.get(batch.after)
            if nxt is not None and type(nxt) is not tuple:  # it continued the last removed block's report
                entries[batch.after] = (nxt, batch.sizes[-1], batch.seen[-1])

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


def _exists(store: Any, keys: Sequence[str]) -> list[bool]:
    """Whether the Store holds each key: ``batch_is_exist`` in batches of ``CONFIRM_BATCH``.

    Raises:
        StoreError: -1 for some key, or an answer of the wrong length.
    """
    out: list[bool] = []
    for start in range(0, len(keys), CONFIRM_BATCH):
        chunk = keys[start:start + CONFIRM_BATCH]
        answer = list(store.exists(chunk))
        if len(answer) != len(chunk):
            raise store_error("exist", [(chunk[0], -1)], tenant_id=getattr(store, "tenant_id", ""))
        if min(answer, default=0) < 0:
            raise store_error("exist", [(k, c) for k, c in zip(chunk, answer) if c < 0],
                              tenant_id=getattr(store, "tenant_id", ""))
        out += [c == 1 for c in answer]
    return out


def _present(store: Any, key_groups: Sequence[Sequence[str]]) -> list[bool]:
    """Per group of object keys (one block's: SGLang's ``_k`` and ``_v``), whether the Store holds all of them.

    Raises:
        StoreError: -1 for some key.
    """
    found = _exists(store, [k for group in key_groups for k in group])
    out = []
    pos = 0
    for group in key_groups:
        n = len(group)
        out.append(n > 0 and all(found[pos:pos + n]))
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


def _by_keyspace(items: Sequence[tuple[str, _Value]]) -> list[tuple[KeySpace, list[tuple[str, _Value]]]]:
    """Consecutive items of one key space together, in order."""
    out: list[tuple[KeySpace, list[tuple[str, _Value]]]] = []
    for item in items:
        ks = item[1][0]
        if out and out[-1][0] is ks:
            out[-1][1].append(item)
        else:
            out.append((ks, [item]))
    return out


def _book_runs(ledger: Ledger, ks: KeySpace, hashes: Sequence[bytes], parents: Sequence[bytes | None],
               sizes: Sequence[int]) -> None:
    """``record_put`` confirmed blocks of one key space in report order, each run of consecutive blocks of one chain
    in one call, as just checked (the check leased them: ``BlockEntry.checked_at``)."""
    start = 0
    n = len(hashes)
    while start < n:
        parent, size = parents[start], sizes[start]
        end = start + 1
        while end < n and parents[end] == hashes[end - 1] and sizes[end] == size:
            end += 1
        ledger.record_put(ks, hashes[start:end], parent, [Outcome.STORED] * (end - start), size, checked=True)
        start = end


__all__ = ["Alternate", "CONFIRM_BATCH", "ConfirmResult", "DEFAULT_CONFIRM_LIMIT", "DEFAULT_GRACE_S",
           "DEFAULT_PENDING_BYTES", "PENDING_ENTRY_BYTES", "PendingWrites"]
