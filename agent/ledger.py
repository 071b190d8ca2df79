"""Occupancy ledger: what this node has put into the store, per namespace, with each block's prefix parent.

Per namespace identity (tenant_id, served_model_name, release namespace, request group) the ledger keeps
counters (blocks, bytes, puts, gets, hit/miss blocks, evicted blocks, orphaned bytes) and a per-block table
that keeps the prefix tree recoverable: every block knows its parent (the previous block of its chain), its
children, size, last access and hit count. An eviction policy reads that table
(:meth:`NamespaceTable.leaves`, :attr:`BlockEntry.children_count`, :meth:`NamespaceTable.ancestors`).

Ownership: the ledger *claims* only blocks this node wrote successfully (``owned``); blocks that already
existed when it tried to put them (written by another instance of the namespace) are kept as ``foreign``
entries while they matter as parents, and never counted, so two nodes never report the same block.

Orphans: a present owned block with an ancestor known to be absent — its prefix chain is broken anywhere above
it, so it heads or lies inside the subtree below a missing block — can never be hit (a prefix lookup stops at
the first miss); its bytes are counted in ``orphaned_bytes`` (whole subtrees, as
``agent.budget.BudgetEnforcer.stats`` counts them among the owned blocks it tracks; here a missing foreign
ancestor orphans the owned blocks below it too). Orphans arise when the master evicts a parent (it knows no
prefixes) or when an ancestor is removed. Each entry keeps a ``cut`` flag ("some ancestor is absent"), updated only when
a block's presence changes and only down to where it stops changing (an absent descendant's subtree is cut
already), so the counters stay exact incrementally and a snapshot never walks the tree.

Reconciliation: blocks the master evicts stop counting when a lookup, a put's existence check, a get, or
:meth:`Ledger.reconcile` (``batch_is_exist`` on a sample, escalating to every block once a sample finds a
miss) sees them gone.

Listeners (:meth:`Ledger.add_listener`, e.g. ``agent.budget.BudgetEnforcer``) see every change of an owned
block, under the ledger's lock: ``insert`` (stored by this node), ``access`` (inside a lookup's hit prefix, or
found present by a put), ``remove`` (gone: removed by the agent, evicted by the master, or dropped).

All methods are thread-safe (one lock); :meth:`Ledger.snapshot` is O(namespaces).
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import store_error
from agent.namespace import Namespace, NamespaceId

if TYPE_CHECKING:
    from agent.store import StoreClient


class Outcome(enum.Enum):
    """What happened to one block of a put batch."""

    STORED = "stored"      # written now by this node
    EXISTED = "existed"    # already present (skipped)
    FAILED = "failed"      # the store refused it
    DROPPED = "dropped"    # behind a failed block of the chain: written then removed again, or never sent


class BlockEntry:
    """One block in a namespace's prefix tree.

    Attributes:
        key: the block's primary object key (its identity; SGLang's ``_k`` key).
        block_hash: raw block hash.
        parent: primary key of the parent block, None for a chain's first block.
        ns: the :class:`Namespace` it was written under (gives all its object keys).
        size: bytes of all its objects (0 for foreign entries).
        owned: written by this node (counted) vs. foreign (seen present, kept as a parent).
        present: believed to be in the store.
        created_at, last_access: ``Ledger.clock`` seconds.
        hit_count: lookups that found it inside the hit prefix.
        children: primary keys of known child blocks.
        children_count: how many of those children are present.
        cut: some known ancestor is absent (the prefix chain is broken above it); an owned present block with
            ``cut`` is an orphan.
    """

    __slots__ = ("key", "block_hash", "parent", "ns", "size", "owned", "present", "created_at", "last_access",
                 "hit_count", "children", "children_count", "cut")

    def __init__(self, key: str, block_hash: bytes, parent: str | None, ns: Namespace, size: int, owned: bool,
                 now: float) -> None:
        self.key = key
        self.block_hash = block_hash
        self.parent = parent
        self.ns = ns
        self.size = size
        self.owned = owned
        self.present = False
        self.created_at = now
        self.last_access = now
        self.hit_count = 0
        self.children: set[str] = set()
        self.children_count = 0
        self.cut = False

    def __repr__(self) -> str:
        state = ("owned" if self.owned else "foreign") + ("" if self.present else ",absent")
        return f"<BlockEntry {self.key[-16:]} {state} size={self.size} children={self.children_count}>"


_COUNTERS = ("blocks", "bytes", "puts", "gets", "hit_blocks", "miss_blocks", "master_evicted_blocks",
             "agent_evicted_blocks", "orphaned_blocks", "orphaned_bytes", "skipped_blocks", "failed_blocks",
             "dropped_blocks")


class NamespaceTable:
    """Counters and the block table of one namespace identity (read it under :attr:`Ledger.lock`)."""

    def __init__(self, ns_id: NamespaceId, engine: str,
                 listeners: list[Callable[[str, NamespaceTable, BlockEntry], None]] | None = None) -> None:
        self.id = ns_id
        self.engine = engine
        self.entries: dict[str, BlockEntry] = {}
        self._listeners = listeners if listeners is not None else []
        for name in _COUNTERS:
            setattr(self, name, 0)

    # counters are plain int attributes named in _COUNTERS
    blocks: int
    bytes: int
    puts: int
    gets: int
    hit_blocks: int
    miss_blocks: int
    master_evicted_blocks: int
    agent_evicted_blocks: int
    orphaned_blocks: int
    orphaned_bytes: int
    skipped_blocks: int
    failed_blocks: int
    dropped_blocks: int

    @property
    def evicted_blocks(self) -> int:
        """Owned blocks that left the store: evicted by the master or removed by the agent."""
        return self.master_evicted_blocks + self.agent_evicted_blocks

    # --- queries for eviction policies ---------------------------------------------------------------------

    def get(self, key: str) -> BlockEntry | None:
        """The entry of a primary key, if known."""
        return self.entries.get(key)

    def is_orphan(self, entry: BlockEntry) -> bool:
        """Owned, present, and some ancestor (parent, grandparent, ...) is known to be absent."""
        return entry.owned and entry.present and entry.cut

    def leaves(self) -> Iterator[BlockEntry]:
        """Owned present blocks without a present child: removing one orphans nothing."""
        return (e for e in self.entries.values() if e.owned and e.present and e.children_count == 0)

    def ancestors(self, key: str) -> Iterator[BlockEntry]:
        """Known ancestors of ``key``, nearest first."""
        entry = self.entries.get(key)
        while entry is not None and entry.parent is not None:
            entry = self.entries.get(entry.parent)
            if entry is not None:
                yield entry

    def owned_present(self) -> Iterator[BlockEntry]:
        """Every block this namespace counts."""
        return (e for e in self.entries.values() if e.owned and e.present)

    # --- bookkeeping (callers hold the ledger lock) ---------------------------------------------------------

    def _emit(self, event: str, e: BlockEntry) -> None:
        for listener in self._listeners:
            listener(event, self, e)

    def _detach(self, e: BlockEntry) -> None:
        if e.owned and e.present:
            self.blocks -= 1
            self.bytes -= e.size
            if self.is_orphan(e):
                self.orphaned_blocks -= 1
                self.orphaned_bytes -= e.size

    def _attach(self, e: BlockEntry) -> None:
        if e.owned and e.present:
            self.blocks += 1
            self.bytes += e.size
            if self.is_orphan(e):
                self.orphaned_blocks += 1
                self.orphaned_bytes += e.size

    def _set(self, e: BlockEntry, *, present: bool | None = None, owned: bool | None = None,
             size: int | None = None) -> None:
        """Change an entry's state, keeping every counter (its own and its descendants' orphan state) exact."""
        presence_changes = present is not None and present != e.present
        was_counted = e.owned and e.present
        self._detach(e)
        if presence_changes:
            e.present = bool(present)
            parent = self.entries.get(e.parent) if e.parent is not None else None
            if parent is not None:
                parent.children_count += 1 if e.present else -1
        if owned is not None:
            e.owned = owned
        if size is not None:
            e.size = size
        self._attach(e)
        if presence_changes:
            self._recut(e)
            if was_counted and not e.present:
                self._emit("remove", e)

    def _recut(self, root: BlockEntry) -> None:
        """Re-derive ``cut`` below ``root`` after its presence changed, walking down only while it changes
        (below an absent block everything is cut already), with each changed block's counters."""
        stack = [root]
        while stack:
            node = stack.pop()
            below = node.cut or not node.present
            for key in node.children:
                kid = self.entries.get(key)
                if kid is None or kid.cut == below:
                    continue
                self._detach(kid)
                kid.cut = below
                self._attach(kid)
                stack.append(kid)

    def _entry(self, ns: Namespace, block_hash: bytes, parent: str | None, now: float) -> BlockEntry:
        key = ns.primary_key(block_hash)
        e = self.entries.get(key)
        if e is None:
            e = BlockEntry(key, block_hash, parent, ns, 0, False, now)
            self.entries[key] = e
            if parent is not None:
                p = self.entries.get(parent)
                if p is not None:
                    p.children.add(key)
                    e.cut = p.cut or not p.present
        return e

    def _gc(self, key: str) -> None:
        """Drop entries that no longer matter (absent or foreign, without children), walking up."""
        e = self.entries.get(key)
        while e is not None and (not e.present or not e.owned) and not e.children:
            self._detach(e)
            del self.entries[e.key]
            parent = self.entries.get(e.parent) if e.parent is not None else None
            if parent is not None:
                parent.children.discard(e.key)
                if e.present:
                    parent.children_count -= 1
            e = parent

    def row(self, *, detail: bool = False) -> dict[str, Any]:
        """One JSON-friendly snapshot row (``agent.messages.NamespaceOccupancy`` fields; more with ``detail``)."""
        out: dict[str, Any] = {
            "tenant_id": self.id.tenant_id, "served_model_name": self.id.served_model_name,
            "namespace": self.id.namespace, "salt_group": self.id.salt_group,
            "blocks": self.blocks, "bytes": self.bytes, "puts": self.puts, "gets": self.gets,
            "hit_blocks": self.hit_blocks, "miss_blocks": self.miss_blocks,
            "evicted_blocks": self.evicted_blocks, "orphaned_bytes": self.orphaned_bytes,
        }
        if detail:
            out.update({
                "engine": self.engine, "orphaned_blocks": self.orphaned_blocks,
                "master_evicted_blocks": self.master_evicted_blocks,
                "agent_evicted_blocks": self.agent_evicted_blocks, "skipped_blocks": self.skipped_blocks,
                "failed_blocks": self.failed_blocks, "dropped_blocks": self.dropped_blocks,
                "tracked_entries": len(self.entries),
            })
        return out


@dataclass(frozen=True)
class ReconcileResult:
    """Outcome of :meth:`Ledger.reconcile`: blocks checked, found missing, whether every block was checked."""

    checked: int
    missing: int
    full: bool


class Ledger:
    """Occupancy per namespace, and the prefix tree of every block this node stored.

    Args:
        clock: seconds for ``created_at``/``last_access`` (``time.monotonic`` by default; a simulator may pass
            a logical clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self._tables: dict[NamespaceId, NamespaceTable] = {}
        self._listeners: list[Callable[[str, NamespaceTable, BlockEntry], None]] = []

    def add_listener(self, listener: Callable[[str, NamespaceTable, BlockEntry], None]) -> None:
        """Call ``listener(event, table, entry)`` for every ``insert``/``access``/``remove`` of an owned block
        (see the module docstring), under the ledger's lock: it must be quick and must not raise."""
        with self.lock:
            self._listeners.append(listener)

    # --- access ---------------------------------------------------------------------------------------------

    def table(self, ns: Namespace | NamespaceId) -> NamespaceTable:
        """The table of a namespace (created empty on first use)."""
        ns_id = ns.id if isinstance(ns, Namespace) else ns
        with self.lock:
            t = self._tables.get(ns_id)
            if t is None:
                t = NamespaceTable(ns_id, ns.engine if isinstance(ns, Namespace) else "", self._listeners)
                self._tables[ns_id] = t
            elif not t.engine and isinstance(ns, Namespace):
                t.engine = ns.engine
            return t

    def tables(self) -> list[NamespaceTable]:
        """Every namespace table."""
        with self.lock:
            return list(self._tables.values())

    def snapshot(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """One dict per namespace, JSON-friendly, O(namespaces).

        Fields (``agent.messages.NamespaceOccupancy``): tenant_id, served_model_name, namespace, salt_group,
        blocks, bytes, puts, gets, hit_blocks, miss_blocks, evicted_blocks, orphaned_bytes. ``detail=True`` adds
        engine, orphaned_blocks, master_evicted_blocks, agent_evicted_blocks, skipped_blocks, failed_blocks,
        dropped_blocks, tracked_entries.
        """
        with self.lock:
            return [t.row(detail=detail) for t in self._tables.values()]

    def present_keys(self, ns: Namespace | NamespaceId) -> set[str]:
        """Primary keys of the blocks a namespace counts (owned and present)."""
        with self.lock:
            return {e.key for e in self.table(ns).owned_present()}

    # --- recording ------------------------------------------------------------------------------------------

    def record_put(self, ns: Namespace, block_hashes: Sequence[bytes], parent: bytes | None,
                   outcomes: Sequence[Outcome], block_bytes: int) -> None:
        """Record one put batch of a chain: ``block_hashes[i]``'s parent is ``block_hashes[i-1]`` (``parent``
        for the first), each with its :class:`Outcome`. Only ``STORED`` blocks become owned and counted.

        Call :meth:`observe` with the batch's existence check first, so evictions it reveals are counted."""
        if len(outcomes) != len(block_hashes):
            raise ValueError(f"{len(outcomes)} outcomes for {len(block_hashes)} blocks")
        now = self.clock()
        with self.lock:
            t = self.table(ns)
            parent_key = ns.primary_key(parent) if parent is not None else None
            if parent_key is not None and parent_key not in t.entries:
                # the caller continues a chain whose head this ledger never saw: keep it as a present parent
                head = t._entry(ns, parent, None, now)
                t._set(head, present=True)
            touched: list[str] = []
            for h, outcome in zip(block_hashes, outcomes):
                e = t._entry(ns, h, parent_key, now)
                if outcome is Outcome.STORED:
                    if not e.present:
                        e.created_at = now
                    was_counted = e.owned and e.present
                    t._set(e, present=True, owned=True, size=block_bytes)
                    e.last_access = now
                    t.puts += 1
                    t._emit("access" if was_counted else "insert", e)
                elif outcome is Outcome.EXISTED:
                    if not e.present:  # written by another instance of the namespace: not ours to count
                        t._set(e, present=True, owned=False, size=0)
                    elif e.owned:
                        e.last_access = now
                        t._emit("access", e)
                    t.skipped_blocks += 1
                else:
                    if e.owned and e.present:
                        t.master_evicted_blocks += 1
                    t._set(e, present=False)
                    if outcome is Outcome.FAILED:
                        t.failed_blocks += 1
                    else:
                        t.dropped_blocks += 1
                touched.append(e.key)
                parent_key = e.key
            for key in reversed(touched):
                t._gc(key)

    def record_lookup(self, ns: Namespace, block_hashes: Sequence[bytes], present: Sequence[bool]) -> int:
        """Record a prefix lookup: ``present[i]`` is the store's answer for block ``i``.

        Adds the leading present run to ``hit_blocks`` and the rest to ``miss_blocks``; raises the hit count and
        last access of hit blocks the ledger knows; blocks it believed present but the store lacks count as
        evicted by the master. Returns the hit count (leading present blocks).
        """
        hits = 0
        for p in present:
            if not p:
                break
            hits += 1
        now = self.clock()
        with self.lock:
            t = self.table(ns)
            t.hit_blocks += hits
            t.miss_blocks += len(block_hashes) - hits
            self._observe(t, ns, block_hashes, present)
            for h in block_hashes[:hits]:
                e = t.entries.get(ns.primary_key(h))
                if e is not None:
                    e.hit_count += 1
                    e.last_access = now
                    if e.owned and e.present:
                        t._emit("access", e)
        return hits

    def observe(self, ns: Namespace, block_hashes: Sequence[bytes], present: Sequence[bool]) -> None:
        """Apply the store's existence answers for known blocks (no hit/miss accounting): a block believed
        present but absent counts as evicted by the master; a known absent block found present again is kept
        as foreign (someone else wrote it)."""
        with self.lock:
            self._observe(self.table(ns), ns, block_hashes, present)

    def _observe(self, t: NamespaceTable, ns: Namespace, block_hashes: Sequence[bytes],
                 present: Sequence[bool]) -> None:
        for h, p in zip(block_hashes, present):
            e = t.entries.get(ns.primary_key(h))
            if e is None or bool(p) == e.present:
                continue
            if p:
                t._set(e, present=True, owned=False, size=0)
            else:
                self._evicted(t, e)

    def record_get(self, ns: Namespace, block_hashes: Sequence[bytes], loaded: Sequence[bool]) -> None:
        """Record a get: ``loaded[i]`` whether block ``i`` was read; unread blocks the ledger believed present
        count as evicted by the master. Adds the leading loaded run to ``gets``."""
        now = self.clock()
        with self.lock:
            t = self.table(ns)
            for h, ok in zip(block_hashes, loaded):
                if not ok:
                    break
                t.gets += 1
            self._observe(t, ns, block_hashes, loaded)
            for h, ok in zip(block_hashes, loaded):
                e = t.entries.get(ns.primary_key(h)) if ok else None
                if e is not None:
                    e.last_access = now

    def record_removed(self, ns: Namespace, block_hashes: Sequence[bytes]) -> int:
        """Record blocks the agent removed (its own eviction); returns how many counted blocks that freed."""
        freed = 0
        with self.lock:
            t = self.table(ns)
            for h in block_hashes:
                e = t.entries.get(ns.primary_key(h))
                if e is None or not e.present:
                    continue
                if e.owned:
                    t.agent_evicted_blocks += 1
                    freed += 1
                t._set(e, present=False)
                t._gc(e.key)
        return freed

    def mark_evicted(self, ns: Namespace | NamespaceId, keys: Sequence[str]) -> int:
        """Mark blocks (by primary key) the master evicted; returns how many counted blocks that removed."""
        count = 0
        with self.lock:
            t = self.table(ns)
            for key in keys:
                e = t.entries.get(key)
                if e is not None and e.present:
                    count += int(e.owned)
                    self._evicted(t, e)
        return count

    @staticmethod
    def _evicted(t: NamespaceTable, e: BlockEntry) -> None:
        if e.owned:
            t.master_evicted_blocks += 1
        t._set(e, present=False)
        t._gc(e.key)

    # --- reconciliation -------------------------------------------------------------------------------------

    def reconcile(self, store: StoreClient, *, sample: int | None = 64, rng: random.Random | None = None,
                  batch: int = 4096) -> ReconcileResult:
        """Check the blocks of ``store.tenant_id``'s namespaces against the store with ``batch_is_exist``.

        Checks ``sample`` random present blocks (every block when ``sample`` is None or larger than their
        number); when a sample finds one missing, checks every block (master evictions come in rounds). A block
        is present only if all its objects exist; SGLang halves left alone are removed from the store.

        Raises:
            StoreError: ``batch_is_exist`` answered -1 for some key.
        """
        rng = rng or random.Random()
        with self.lock:
            candidates = [e for t in self._tables.values() if t.id.tenant_id == store.tenant_id
                          for e in t.entries.values() if e.present]
        if not candidates:
            return ReconcileResult(0, 0, True)
        full = sample is None or sample >= len(candidates)
        chosen = candidates if full else rng.sample(candidates, sample)  # type: ignore[arg-type]
        missing = self._check(store, chosen, batch)
        checked = len(chosen)
        if missing and not full:
            missing = self._check(store, candidates, batch)
            checked += len(candidates)
            full = True
        return ReconcileResult(checked, len(missing), full)

    def _check(self, store: StoreClient, entries: list[BlockEntry], batch: int) -> list[BlockEntry]:
        missing: list[BlockEntry] = []
        partial: list[str] = []
        for start in range(0, len(entries), batch):
            chunk = entries[start:start + batch]
            keys: list[str] = []
            spans: list[int] = []
            for e in chunk:
                ks = e.ns.keys_for(e.block_hash)
                keys.extend(ks)
                spans.append(len(ks))
            codes = store.exists(keys)
            errors = [(k, c) for k, c in zip(keys, codes) if c < 0]
            if errors:
                raise store_error("exist", errors, tenant_id=store.tenant_id)
            pos = 0
            for e, n in zip(chunk, spans):
                flags = codes[pos:pos + n]
                if not all(flags):
                    missing.append(e)
                    partial.extend(k for k, c in zip(keys[pos:pos + n], flags) if c)
                pos += n
        if partial:
            store.remove(partial)
        with self.lock:
            for e in missing:
                t = self._tables.get(e.ns.id)
                if t is not None and t.entries.get(e.key) is e and e.present:
                    self._evicted(t, e)
        return missing
