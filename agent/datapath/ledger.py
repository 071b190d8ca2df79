"""Occupancy ledger: what this node has put into the store, per cache scope, with each block's prefix parent.

Per :class:`agent.contract.scope.CacheScope` (tenant_id, served_model_name, namespace, request_group) the ledger keeps
counters (blocks, bytes, puts, gets, hit/miss blocks, evicted blocks, orphaned bytes) and a per-block table
that keeps the prefix tree recoverable: every block knows its parent (the previous block of its chain), its
children, size, last access and hit count. An eviction policy reads that table
(:meth:`ScopeTable.leaves`, :attr:`BlockEntry.children_count`, :meth:`ScopeTable.ancestors`).

Ownership: the ledger *claims* only blocks this node wrote successfully (``owned``); blocks that already
existed when it tried to put them (written by another instance of the scope) are kept as ``foreign``
entries while they matter as parents, and never counted, so two nodes never report the same block.

Orphans: a present owned block with an ancestor known to be absent — its prefix chain is broken anywhere above
it, so it heads or lies inside the subtree below a missing block — can never be hit (a prefix lookup stops at
the first miss); its bytes are counted in ``orphaned_bytes`` (whole subtrees, as
``agent.datapath.budget.BudgetEnforcer.stats`` counts them among the owned blocks it tracks; here a missing foreign
ancestor orphans the owned blocks below it too). Orphans arise when the master evicts a parent (it knows no
prefixes) or when an ancestor is removed — also by another node: a chain this node continues from a block it did
not write (loaded from the Store) hangs below a *foreign* entry, which is not missing merely because this node did
not write it; its owned blocks become orphans only once a check (:meth:`Ledger.reconcile`,
:meth:`Ledger.check_foreign_parents`) found that parent gone. :meth:`Ledger.confirm_cuts` and
:meth:`Ledger.orphan_leaves` let the agent remove orphans by exact key, leaves first (``agent.node.engines``).
Each entry keeps a ``cut`` flag ("some ancestor is absent"), updated only when
a block's presence changes and only down to where it stops changing (an absent descendant's subtree is cut
already), so the counters stay exact incrementally and a snapshot never walks the tree.

Reconciliation: blocks the master evicts stop counting when a lookup, a put's existence check, a get, or
:meth:`Ledger.reconcile` (``batch_is_exist`` on a sample, escalating to every block once a sample finds a
miss) sees them gone.

Listeners (:meth:`Ledger.add_listener`, e.g. ``agent.datapath.budget.BudgetEnforcer``) see every change of an owned
block, under the ledger's lock: ``insert`` (stored by this node), ``access`` (inside a lookup's hit prefix, or
found present by a put), ``remove`` (gone: removed by the agent, evicted by the master, or dropped).

Restarts: ``agent.node.ledger_file`` keeps the owned blocks on disk through a listener; :meth:`Ledger.restore`
takes them back at start (then reconcile).

All methods are thread-safe (one lock); :meth:`Ledger.snapshot` is O(scopes).
"""

from __future__ import annotations

import builtins  # ScopeTable.bytes shadows the builtin in its method annotations
import enum
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from agent.contract.scope import CacheScope
from agent.datapath.errors import store_error
from agent.datapath.keyspace import KeySpace

if TYPE_CHECKING:
    from agent.datapath.store import StoreClient


#: Why the agent removed blocks (:meth:`Ledger.record_removed`): over a budget, or as orphans.
RemovalCause = Literal["budget", "orphan"]
REMOVAL_CAUSES: tuple[str, ...] = ("budget", "orphan")


class Outcome(enum.Enum):
    """What happened to one block of a put batch."""

    STORED = "stored"      # written now by this node
    EXISTED = "existed"    # already present (skipped)
    FAILED = "failed"      # the store refused it
    DROPPED = "dropped"    # behind a failed block of the chain: written then removed again, or never sent


class BlockEntry:
    """One block in a scope's prefix tree.

    Attributes:
        key: the block's primary object key (its identity; SGLang's ``_k`` key).
        block_hash: raw block hash.
        parent: primary key of the parent block, None for a chain's first block.
        keyspace: the :class:`KeySpace` it was written under (gives all its object keys).
        size: bytes of all its objects (0 for foreign entries).
        owned: written by this node (counted) vs. foreign (seen present, kept as a parent).
        present: believed to be in the store.
        created_at, last_access: ``Ledger.clock`` seconds.
        hit_count: lookups that found it inside the hit prefix.
        children: primary keys of known child blocks.
        children_count: how many of those children are present.
        cut: some known ancestor is absent (the prefix chain is broken above it); an owned present block with
            ``cut`` is an orphan.
        checked_at: ``Ledger.clock`` seconds of this node's last existence check that found it present (``-inf``:
            none): that check leased it for the master's ``--default_kv_lease_ttl`` from then on, so the master
            cannot have evicted it before about ``checked_at`` + the lease (:meth:`Ledger.reconcile` ``leased_for``).
    """

    __slots__ = ("key", "block_hash", "parent", "keyspace", "size", "owned", "present", "created_at", "last_access",
                 "hit_count", "children", "children_count", "cut", "checked_at")

    def __init__(self, key: str, block_hash: bytes, parent: str | None, keyspace: KeySpace, size: int,
                 owned: bool, now: float) -> None:
        self.key = key
        self.block_hash = block_hash
        self.parent = parent
        self.keyspace = keyspace
        self.size = size
        self.owned = owned
        self.present = False
        self.created_at = now
        self.last_access = now
        self.hit_count = 0
        self.children: set[str] = set()
        self.children_count = 0
        self.cut = False
        self.checked_at = float("-inf")

    def __repr__(self) -> str:
        state = ("owned" if self.owned else "foreign") + ("" if self.present else ",absent")
        return f"<BlockEntry {self.key[-16:]} {state} size={self.size} children={self.children_count}>"


_COUNTERS = ("blocks", "bytes", "puts", "gets", "hit_blocks", "miss_blocks", "master_evicted_blocks",
             "budget_evicted_blocks", "orphan_removed_blocks", "purged_blocks", "orphaned_blocks", "orphaned_bytes",
             "skipped_blocks", "failed_blocks",
             "dropped_blocks")


class ScopeTable:
    """Counters and the block table of one :class:`CacheScope` (read and change it under :attr:`Ledger.lock`)."""

    def __init__(self, scope: CacheScope, engine: str,
                 listeners: list[Callable[[str, ScopeTable, BlockEntry], None]] | None = None) -> None:
        self.scope = scope
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
    budget_evicted_blocks: int
    orphan_removed_blocks: int
    purged_blocks: int
    orphaned_blocks: int
    orphaned_bytes: int
    skipped_blocks: int
    failed_blocks: int
    dropped_blocks: int

    @property
    def agent_evicted_blocks(self) -> int:
        """Owned blocks the agent removed: over a budget, as orphans, or by a purge of their release."""
        return self.budget_evicted_blocks + self.orphan_removed_blocks + self.purged_blocks

    @property
    def evicted_blocks(self) -> int:
        """Owned blocks evicted: by the master (``master_evicted_blocks``), or removed by the agent over a budget
        (``budget_evicted_blocks``) or as orphans (``orphan_removed_blocks``). A purge of the release
        (``purged_blocks``) is an operator's removal, not an eviction: not counted here."""
        return self.master_evicted_blocks + self.budget_evicted_blocks + self.orphan_removed_blocks

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
        """Every block this scope counts."""
        return (e for e in self.entries.values() if e.owned and e.present)

    # --- bookkeeping (the ledger calls these holding its lock) ---------------------------------------------

    def notify(self, event: str, e: BlockEntry) -> None:
        """Tell the ledger's listeners that owned block ``e`` had ``event`` (``insert``/``access``/``remove``)."""
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

    def set_state(self, e: BlockEntry, *, present: bool | None = None, owned: bool | None = None,
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
                self.notify("remove", e)

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

    def add_entry(self, keyspace: KeySpace, block_hash: builtins.bytes, parent: str | None, now: float) -> BlockEntry:
        """The entry of ``block_hash`` (created absent, foreign and empty, below ``parent``, when unknown)."""
        key = keyspace.primary_key(block_hash)
        e = self.entries.get(key)
        if e is None:
            e = BlockEntry(key, block_hash, parent, keyspace, 0, False, now)
            self.entries[key] = e
            if parent is not None:
                p = self.entries.get(parent)
                if p is not None:
                    p.children.add(key)
                    e.cut = p.cut or not p.present
        return e

    def prune(self, key: str) -> None:
        """Drop entries that no longer matter (absent or foreign, without children), from ``key`` walking up."""
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
        """One JSON-friendly snapshot row (``agent.contract.messages.ScopeOccupancy`` fields; more with ``detail``)."""
        out: dict[str, Any] = {
            **self.scope._asdict(),
            "blocks": self.blocks, "bytes": self.bytes, "puts": self.puts, "gets": self.gets,
            "hit_blocks": self.hit_blocks, "miss_blocks": self.miss_blocks,
            "evicted_blocks": self.evicted_blocks, "orphaned_bytes": self.orphaned_bytes,
            "store_evicted_blocks": self.master_evicted_blocks, "budget_evicted_blocks": self.budget_evicted_blocks,
            "orphan_removed_blocks": self.orphan_removed_blocks,
        }
        if detail:
            out.update({
                "engine": self.engine, "orphaned_blocks": self.orphaned_blocks,
                "master_evicted_blocks": self.master_evicted_blocks,
                "agent_evicted_blocks": self.agent_evicted_blocks, "purged_blocks": self.purged_blocks,
                "skipped_blocks": self.skipped_blocks,
                "failed_blocks": self.failed_blocks, "dropped_blocks": self.dropped_blocks,
                "tracked_entries": len(self.entries),
            })
        return out


class RestoredBlock(NamedTuple):
    """An owned block an earlier agent process recorded, for :meth:`Ledger.restore`: its key space, raw block
    hash, parent's primary key (None for a chain's first block) and size in bytes (all its objects)."""

    keyspace: KeySpace
    block_hash: bytes
    parent: str | None
    size: int


@dataclass(frozen=True)
class ReconcileResult:
    """Outcome of :meth:`Ledger.reconcile`: blocks checked, found missing, whether every block was checked."""

    checked: int
    missing: int
    full: bool


def _keys_and_spans(entries: Sequence[BlockEntry]) -> tuple[list[str], list[int]]:
    """Every Store key of ``entries`` in order, and how many keys each entry has (SGLang: ``_k`` and ``_v``)."""
    keys: list[str] = []
    spans: list[int] = []
    for e in entries:
        block_keys = e.keyspace.keys_for(e.block_hash)
        keys.extend(block_keys)
        spans.append(len(block_keys))
    return keys, spans


class Ledger:
    """Occupancy per cache scope, and the prefix tree of every block this node stored.

    Args:
        clock: seconds for ``created_at``/``last_access`` (``time.monotonic`` by default; a simulator may pass
            a logical clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self._tables: dict[CacheScope, ScopeTable] = {}
        self._listeners: list[Callable[[str, ScopeTable, BlockEntry], None]] = []
        self._foreign_checked: dict[str, float] = {}  # foreign parent key -> clock() of its last check

    def add_listener(self, listener: Callable[[str, ScopeTable, BlockEntry], None]) -> None:
        """Call ``listener(event, table, entry)`` for every ``insert``/``access``/``remove`` of an owned block
        (see the module docstring), under the ledger's lock: it must be quick and must not raise."""
        with self.lock:
            self._listeners.append(listener)

    # --- access ---------------------------------------------------------------------------------------------

    def table(self, ks: KeySpace | CacheScope) -> ScopeTable:
        """The table of a key space's scope, or of a scope (created empty on first use)."""
        scope = ks.scope if isinstance(ks, KeySpace) else ks
        with self.lock:
            t = self._tables.get(scope)
            if t is None:
                t = ScopeTable(scope, ks.engine if isinstance(ks, KeySpace) else "", self._listeners)
                self._tables[scope] = t
            elif not t.engine and isinstance(ks, KeySpace):
                t.engine = ks.engine
            return t

    def tables(self) -> list[ScopeTable]:
        """Every scope's table."""
        with self.lock:
            return list(self._tables.values())

    def snapshot(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """One dict per scope, JSON-friendly, O(scopes).

        Fields (``agent.contract.messages.ScopeOccupancy``): tenant_id, served_model_name, namespace, request_group,
        blocks, bytes, puts, gets, hit_blocks, miss_blocks, evicted_blocks, orphaned_bytes, and evicted_blocks by
        cause: store_evicted_blocks (the master's), budget_evicted_blocks, orphan_removed_blocks (the agent's).
        ``detail=True`` adds engine, orphaned_blocks, master_evicted_blocks, agent_evicted_blocks, purged_blocks,
        skipped_blocks, failed_blocks, dropped_blocks, tracked_entries.
        """
        with self.lock:
            return [t.row(detail=detail) for t in self._tables.values()]

    def present_keys(self, ks: KeySpace | CacheScope) -> set[str]:
        """Primary keys of the blocks a scope counts (owned and present)."""
        with self.lock:
            return {e.key for e in self.table(ks).owned_present()}

    # --- restoring ------------------------------------------------------------------------------------------

    def restore(self, blocks: Iterable[RestoredBlock]) -> int:
        """Take back owned, present blocks an earlier agent process recorded (``agent.node.ledger_file``).

        Each becomes an owned present entry below its parent (when that is among ``blocks`` or already known),
        parents first, and every listener sees an ``insert`` (a budget enforcer adopts it). ``created_at`` and
        ``last_access`` are now; counters other than ``blocks``/``bytes`` are not restored. Blocks the ledger
        already knows are left as they are. Returns how many blocks were restored. Check the result against the
        Store afterwards (:meth:`reconcile`): blocks that left it meanwhile are still counted until then.
        """
        by_scope: dict[CacheScope, dict[str, RestoredBlock]] = {}
        for block in blocks:
            by_scope.setdefault(block.keyspace.scope, {})[block.keyspace.primary_key(block.block_hash)] = block
        restored = 0
        now = self.clock()
        with self.lock:
            for rows in by_scope.values():
                depth: dict[str, int] = {}

                def depth_of(key: str, rows: dict[str, RestoredBlock] = rows, depth: dict[str, int] = depth) -> int:
                    chain: list[str] = []
                    while key in rows and key not in depth and key not in chain:
                        chain.append(key)
                        parent = rows[key].parent
                        if parent is None:
                            break
                        key = parent
                    base = depth.get(key, 0) if key not in chain else 0
                    for n, k in enumerate(reversed(chain), start=1):
                        depth[k] = base + n
                    return depth[chain[0]] if chain else base

                t = self.table(next(iter(rows.values())).keyspace)
                for key in sorted(rows, key=depth_of):
                    block = rows[key]
                    if key in t.entries:
                        continue
                    e = t.add_entry(block.keyspace, block.block_hash, block.parent, now)
                    t.set_state(e, present=True, owned=True, size=block.size)
                    t.notify("insert", e)
                    restored += 1
        return restored

    # --- recording ------------------------------------------------------------------------------------------

    def record_put(self, ks: KeySpace, block_hashes: Sequence[bytes], parent: bytes | None,
                   outcomes: Sequence[Outcome], block_bytes: int, *, checked: bool = False) -> None:
        """Record one put batch of a chain: ``block_hashes[i]``'s parent is ``block_hashes[i-1]`` (``parent``
        for the first), each with its :class:`Outcome`. Only ``STORED`` blocks become owned and counted.
        ``checked``: an existence check just found the ``STORED`` blocks (an engine's write confirmed by
        ``agent.datapath.pending``), so they are under its read lease from now (``BlockEntry.checked_at``).

        Call :meth:`observe` with the batch's existence check first, so evictions it reveals are counted."""
        if len(outcomes) != len(block_hashes):
            raise ValueError(f"{len(outcomes)} outcomes for {len(block_hashes)} blocks")
        now = self.clock()
        with self.lock:
            t = self.table(ks)
            parent_key = ks.primary_key(parent) if parent is not None else None
            if parent is not None and parent_key not in t.entries:  # parent_key is set exactly when parent is
                # the caller continues a chain whose head this ledger never saw: keep it as a present parent
                head = t.add_entry(ks, parent, None, now)
                t.set_state(head, present=True)
            touched: list[str] = []
            for h, outcome in zip(block_hashes, outcomes):
                e = t.add_entry(ks, h, parent_key, now)
                if outcome is Outcome.STORED:
                    if not e.present:
                        e.created_at = now
                    was_counted = e.owned and e.present
                    t.set_state(e, present=True, owned=True, size=block_bytes)
                    e.last_access = now
                    if checked:
                        e.checked_at = now
                    t.puts += 1
                    t.notify("access" if was_counted else "insert", e)
                elif outcome is Outcome.EXISTED:
                    if not e.present:  # written by another instance of the scope: not ours to count
                        t.set_state(e, present=True, owned=False, size=0)
                    elif e.owned:
                        e.last_access = now
                        t.notify("access", e)
                    t.skipped_blocks += 1
                else:
                    if e.owned and e.present:
                        t.master_evicted_blocks += 1
                    t.set_state(e, present=False)
                    if outcome is Outcome.FAILED:
                        t.failed_blocks += 1
                    else:
                        t.dropped_blocks += 1
                touched.append(e.key)
                parent_key = e.key
            for key in reversed(touched):
                t.prune(key)

    def record_lookup(self, ks: KeySpace, block_hashes: Sequence[bytes], present: Sequence[bool]) -> int:
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
            t = self.table(ks)
            t.hit_blocks += hits
            t.miss_blocks += len(block_hashes) - hits
            self._observe(t, ks, block_hashes, present)
            for h in block_hashes[:hits]:
                e = t.entries.get(ks.primary_key(h))
                if e is not None:
                    e.hit_count += 1
                    e.last_access = now
                    if e.owned and e.present:
                        t.notify("access", e)
        return hits

    def record_hits(self, scope: KeySpace | CacheScope, hit_blocks: int, miss_blocks: int) -> None:
        """Add lookups the node saw only as counts (a real engine's own lookups, from its ``/metrics``, see
        ``agent.node.engines``) to a scope's ``hit_blocks`` / ``miss_blocks``; no block is touched.

        Raises:
            ValueError: a negative count (the counters only grow).
        """
        if hit_blocks < 0 or miss_blocks < 0:
            raise ValueError(f"hit_blocks and miss_blocks must not be negative, got {hit_blocks}, {miss_blocks}")
        with self.lock:
            t = self.table(scope)
            t.hit_blocks += hit_blocks
            t.miss_blocks += miss_blocks

    def observe(self, ks: KeySpace, block_hashes: Sequence[bytes], present: Sequence[bool]) -> None:
        """Apply the store's existence answers for known blocks (no hit/miss accounting): a block believed
        present but absent counts as evicted by the master; a known absent block found present again is kept
        as foreign (someone else wrote it)."""
        with self.lock:
            self._observe(self.table(ks), ks, block_hashes, present)

    def _observe(self, t: ScopeTable, ks: KeySpace, block_hashes: Sequence[bytes],
                 present: Sequence[bool]) -> None:
        for h, p in zip(block_hashes, present):
            e = t.entries.get(ks.primary_key(h))
            if e is None or bool(p) == e.present:
                continue
            if p:
                t.set_state(e, present=True, owned=False, size=0)
            else:
                self._evicted(t, e)

    def record_get(self, ks: KeySpace, block_hashes: Sequence[bytes], loaded: Sequence[bool]) -> None:
        """Record a get: ``loaded[i]`` whether block ``i`` was read; unread blocks the ledger believed present
        count as evicted by the master. Adds the leading loaded run to ``gets``."""
        now = self.clock()
        with self.lock:
            t = self.table(ks)
            for _h, ok in zip(block_hashes, loaded):
                if not ok:
                    break
                t.gets += 1
            self._observe(t, ks, block_hashes, loaded)
            for h, ok in zip(block_hashes, loaded):
                e = t.entries.get(ks.primary_key(h)) if ok else None
                if e is not None:
                    e.last_access = now

    def record_removed(self, ks: KeySpace, block_hashes: Sequence[bytes], cause: RemovalCause = "budget") -> int:
        """Record blocks the agent removed (its own eviction: ``cause`` ``budget``, over a budget, counted in
        ``budget_evicted_blocks``, or ``orphan``, below a missing block, in ``orphan_removed_blocks``); returns how
        many counted blocks that freed."""
        if cause not in REMOVAL_CAUSES:
            raise ValueError(f"cause must be one of {REMOVAL_CAUSES}, got {cause!r}")
        counter = "orphan_removed_blocks" if cause == "orphan" else "budget_evicted_blocks"
        freed = 0
        with self.lock:
            t = self.table(ks)
            for h in block_hashes:
                e = t.entries.get(ks.primary_key(h))
                if e is None or not e.present:
                    continue
                if e.owned:
                    setattr(t, counter, getattr(t, counter) + 1)
                    freed += 1
                t.set_state(e, present=False)
                t.prune(e.key)
        return freed

    def mark_evicted(self, ks: KeySpace | CacheScope, keys: Sequence[str]) -> int:
        """Mark blocks (by primary key) the master evicted; returns how many counted blocks that removed."""
        count = 0
        with self.lock:
            t = self.table(ks)
            for key in keys:
                e = t.entries.get(key)
                if e is not None and e.present:
                    count += int(e.owned)
                    self._evicted(t, e)
        return count

    def forget_release(self, *, tenant_id: str, namespace: str, engine: str,
                       served_model_name: str | None = None) -> int:
        """Record that every block of a release namespace is gone (a purge removed its keys): every present block
        of ``engine``'s key spaces in the scopes of ``tenant_id`` and ``namespace`` (of ``served_model_name``
        only, when given), as :meth:`record_removed` does, counted in ``purged_blocks`` (not an eviction). Returns
        how many entries were present."""
        forgotten = 0
        with self.lock:
            for t in list(self._tables.values()):
                scope = t.scope
                if scope.tenant_id != tenant_id or scope.namespace != namespace:
                    continue
                if served_model_name is not None and scope.served_model_name != served_model_name:
                    continue
                for e in [e for e in t.entries.values() if e.present and e.keyspace.engine == engine]:
                    if t.entries.get(e.key) is not e or not e.present:  # pruned above with an earlier one
                        continue
                    if e.owned:
                        t.purged_blocks += 1
                    t.set_state(e, present=False)
                    t.prune(e.key)
                    forgotten += 1
        return forgotten

    @staticmethod
    def _evicted(t: ScopeTable, e: BlockEntry) -> None:
        if e.owned:
            t.master_evicted_blocks += 1
        t.set_state(e, present=False)
        t.prune(e.key)

    # --- reconciliation -------------------------------------------------------------------------------------

    def reconcile(self, store: StoreClient, *, sample: int | None = 64, rng: random.Random | None = None,
                  batch: int = 4096, leased_for: float = 0.0, exclude: Collection[str] = ()) -> ReconcileResult:
        """Check the blocks of ``store.tenant_id``'s scopes against the store with ``batch_is_exist``.

        Checks ``sample`` random present blocks (every block when ``sample`` is None or larger than their
        number); when a sample finds one missing, checks every block (master evictions come in rounds). A block
        is present only if all its objects exist; SGLang halves left alone are removed from the store.

        Left out (neither checked nor leased again): blocks this node's own check found present less than
        ``leased_for`` seconds ago (``BlockEntry.checked_at``; the master cannot have evicted them while that
        check's read lease runs: pass a little under the master's ``--default_kv_lease_ttl``, 0 checks all), and the
        primary keys in ``exclude`` (a budget's next victims: its removal says whether they are gone, without the
        lease a check would put on them). ``ReconcileResult.full`` means every other present block was checked.

        Raises:
            StoreError: ``batch_is_exist`` answered -1 for some key.
        """
        rng = rng or random.Random()
        now = self.clock()
        with self.lock:
            candidates = [e for t in self._tables.values() if t.scope.tenant_id == store.tenant_id
                          for e in t.entries.values()
                          if e.present and now - e.checked_at >= leased_for and e.key not in exclude]
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

    def recent_bytes(self, scopes: Iterable[CacheScope], within: float) -> int:
        """Bytes of the owned present blocks of ``scopes`` this node booked less than ``within`` seconds ago
        (``BlockEntry.created_at``): what its engines wrote lately, the rate a budget's trim must keep up with."""
        now = self.clock()
        with self.lock:
            return sum(e.size for s in scopes if (t := self._tables.get(s)) is not None
                       for e in t.entries.values() if e.owned and e.present and now - e.created_at < within)

    # --- orphans --------------------------------------------------------------------------------------------

    def check_foreign_parents(self, store: StoreClient, *, limit: int = 32, recheck_after: float = 30.0,
                              batch: int = 4096) -> ReconcileResult:
        """Check with ``batch_is_exist`` whether the foreign parents of ``store.tenant_id``'s owned blocks are
        still in the Store.

        A foreign parent is a present entry this node did not write (another node's block, which this node's
        blocks continue) with present children. At most ``limit`` of them are checked, those checked longest ago
        first, and none checked less than ``recheck_after`` ledger-clock seconds ago: Mooncake 0.3.13.post1 leases
        every checked object that exists for ``--default_kv_lease_ttl`` (10 s by default), during which its
        writer's own budget removal is refused, so keep ``recheck_after`` well above that TTL. A parent found
        gone is marked absent: the owned blocks below it become orphans (:meth:`orphan_leaves`).

        Raises:
            StoreError: ``batch_is_exist`` answered -1 for some key.
        """
        now = self.clock()
        with self.lock:
            checked_at = self._foreign_checked
            due = [e for t in self._tables.values() if t.scope.tenant_id == store.tenant_id
                   for e in t.entries.values()
                   if e.present and not e.owned and e.children_count > 0
                   and now - checked_at.get(e.key, float("-inf")) >= recheck_after]
            due.sort(key=lambda e: checked_at.get(e.key, float("-inf")))
            chosen = due[:max(0, limit)]
            for e in chosen:
                checked_at[e.key] = now
            if len(checked_at) > 65536:  # forget keys no longer tracked
                live = {e.key for t in self._tables.values() for e in t.entries.values()}
                for key in [k for k in checked_at if k not in live]:
                    del checked_at[key]
        if not chosen:
            return ReconcileResult(0, 0, True)
        missing = self._check(store, chosen, batch)
        return ReconcileResult(len(chosen), len(missing), len(chosen) == len(due))

    def confirm_cuts(self, store: StoreClient, tenant_id: str | None = None) -> int:
        """Check, with ``batch_is_exist``, the absent blocks whose present owned children are orphan roots of
        ``tenant_id`` (default ``store.tenant_id``): one found present again (another node wrote it since) becomes
        a present foreign entry, so the blocks below it stop being orphans. Returns how many were found present.
        Absent objects take no read lease. Call it before removing orphans (:meth:`orphan_leaves`).

        Raises:
            StoreError: ``batch_is_exist`` answered -1 for some key.
        """
        tenant_id = tenant_id or store.tenant_id
        with self.lock:
            cuts: dict[str, BlockEntry] = {}
            for t in self._tables.values():
                if t.scope.tenant_id != tenant_id or not t.orphaned_blocks:
                    continue
                for e in t.entries.values():
                    if not t.is_orphan(e) or e.parent is None:
                        continue
                    p = t.entries.get(e.parent)
                    if p is not None and not p.present:
                        cuts[p.key] = p
        if not cuts:
            return 0
        entries = list(cuts.values())
        keys, spans = _keys_and_spans(entries)
        codes = store.exists(keys)
        errors = [(k, c) for k, c in zip(keys, codes) if c < 0]
        if errors:
            raise store_error("exist", errors, tenant_id=tenant_id)
        back = 0
        pos = 0
        with self.lock:
            for e, n in zip(entries, spans):
                if all(codes[pos:pos + n]):
                    table = self._tables.get(e.keyspace.scope)
                    if table is not None and table.entries.get(e.key) is e and not e.present:
                        table.set_state(e, present=True, owned=False, size=0)
                        back += 1
                pos += n
        return back

    def orphan_leaves(self, tenant_id: str) -> dict[KeySpace, list[bytes]]:
        """Orphans of ``tenant_id`` without a present child, by key space: the next blocks to remove when
        collecting orphans leaves first (an orphan is an owned present block below a block known to be absent,
        unreachable by prefix lookup; module docstring)."""
        out: dict[KeySpace, list[bytes]] = {}
        with self.lock:
            for t in self._tables.values():
                if t.scope.tenant_id != tenant_id or not t.orphaned_blocks:
                    continue
                for e in t.entries.values():
                    if t.is_orphan(e) and e.children_count == 0:
                        out.setdefault(e.keyspace, []).append(e.block_hash)
        return out

    def _check(self, store: StoreClient, entries: list[BlockEntry], batch: int) -> list[BlockEntry]:
        missing: list[BlockEntry] = []
        partial: list[str] = []
        found: list[tuple[BlockEntry, float]] = []
        for start in range(0, len(entries), batch):
            chunk = entries[start:start + batch]
            keys, spans = _keys_and_spans(chunk)
            sent = self.clock()  # the lease runs from the master's answer, after this
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
                else:
                    found.append((e, sent))
                pos += n
        if partial:
            store.remove(partial)
        with self.lock:
            for e, sent in found:
                e.checked_at = max(e.checked_at, sent)
            for e in missing:
                t = self._tables.get(e.keyspace.scope)
                if t is not None and t.entries.get(e.key) is e and e.present:
                    self._evicted(t, e)
        return missing
