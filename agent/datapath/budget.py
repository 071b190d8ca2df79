"""Byte budgets on the node: the agent removes a cache scope's blocks itself before the master must evict.

:class:`BudgetEnforcer` keeps one eviction policy per :class:`agent.contract.scope.CacheScope` (tenant, served
model, release namespace, request group) and feeds it from the :class:`agent.datapath.ledger.Ledger`'s events
(``insert`` / ``access`` / ``remove`` of owned blocks; the master's own evictions arrive as ``remove`` when a
lookup, put or reconciliation sees them). The policy is the same object the simulator runs (``bench/eviction.py``):
:class:`agent.datapath.eviction.HitDensityPolicy` by default, :class:`agent.datapath.eviction.LeafLRUPolicy` as the
baseline.

:meth:`BudgetEnforcer.enforce` runs when a scope (a request group with its own budget) or a release (all its
groups) is over budget: it asks the policies for a leaf-first plan and removes it in waves, each wave holding
only blocks without a present child in the ledger (owned or written by another node), through a caller's
``remove_fn`` (``KVConnector.remove`` without force: a block under another client's read lease stays, and so do
its ancestors). Zero orphans by construction; SGLang's ``_k``/``_v`` objects of a block go in one call.

Orphans (present blocks a prefix lookup cannot reach because an ancestor is gone, e.g. after the master evicted
it) are reported per scope by :meth:`BudgetEnforcer.stats` (whole subtrees) and by the ledger snapshot's
``orphaned_bytes`` (whole subtrees too), and are always planned first.

No Django. Sizes are bytes; times are the ledger's clock in seconds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any, cast

from agent.contract.scope import CacheScope
from agent.datapath.eviction import EvictionPolicy, HitDensityPolicy, LeafLRUPolicy
from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import BlockEntry, Ledger, RemovalCause, ScopeTable

log = logging.getLogger("kvpool.agent.budget")

#: ``remove_fn(keyspace, block_hashes)``: remove these blocks from the store and record it in the ledger
#: (``KVConnector.remove(..., force=False)`` does both); blocks it could not remove stay present in the ledger.
RemoveFn = Callable[[KeySpace, list[bytes]], Any]

#: Plan-and-remove rounds per :meth:`BudgetEnforcer.enforce` call (each round leaves out what the last one
#: could not remove).
MAX_ROUNDS = 16

#: Waves of removals per :meth:`BudgetEnforcer.enforce` round (a plan of depth d needs d waves).
MAX_WAVES = 4096

def _hit_density_inferred() -> EvictionPolicy:
    policy = HitDensityPolicy()
    policy.infer_access = True
    return policy


#: Budget policies by name (the agent's ``--budget-policy``): ``hit-density`` (:class:`HitDensityPolicy`, the
#: prefix-aware default), ``hit-density-inferred`` (the same with ``infer_access``: a store under a present parent
#: counts the prefix as read, docs/eviction.md §7, for scopes fed by engine KV events, which carry no reads) and
#: ``lru`` (:class:`LeafLRUPolicy`: least recently used leaf first, the baseline).
BUDGET_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "hit-density": HitDensityPolicy, "hit-density-inferred": _hit_density_inferred, "lru": LeafLRUPolicy}
#: The default of :data:`BUDGET_POLICIES` (``BudgetEnforcer``'s own default factory).
DEFAULT_BUDGET_POLICY = "hit-density"


def budget_policy_factory(name: str) -> Callable[[], EvictionPolicy]:
    """The policy factory of :data:`BUDGET_POLICIES` named ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        return BUDGET_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown budget policy {name!r}: one of {', '.join(BUDGET_POLICIES)}") from None


class BudgetEnforcer:
    """Per-scope eviction policies fed by a ledger, and budget enforcement with them.

    Args:
        ledger: the node's ledger; the enforcer registers a listener and adopts the blocks it already holds.
        policy_factory: ``() -> EvictionPolicy`` for each new scope (``HitDensityPolicy`` by default).

    Thread-safety: the policies change under ``ledger.lock`` only; :meth:`enforce` plans under it and calls the
    store without it.
    """

    def __init__(self, ledger: Ledger, policy_factory: Callable[[], EvictionPolicy] = HitDensityPolicy) -> None:
        self.ledger = ledger
        self.policy_factory = policy_factory
        self._policies: dict[CacheScope, EvictionPolicy] = {}
        self.removed_blocks: dict[CacheScope, int] = {}
        self.refused_blocks: dict[CacheScope, int] = {}
        with ledger.lock:
            ledger.add_listener(self._on_event)
            for table in ledger.tables():
                for entry in sorted(table.owned_present(), key=lambda e: _depth(table, e)):
                    self._on_event("insert", table, entry)

    # --- the policies ---------------------------------------------------------------------------------------

    def policy(self, scope: CacheScope | KeySpace) -> EvictionPolicy:
        """The policy of a scope (created empty on first use)."""
        key = scope.scope if isinstance(scope, KeySpace) else scope
        with self.ledger.lock:
            policy = self._policies.get(key)
            if policy is None:
                policy = self._policies[key] = self.policy_factory()
            return policy

    def _on_event(self, event: str, table: ScopeTable, entry: BlockEntry) -> None:
        """Ledger listener (called under the ledger's lock); never raises into the ledger."""
        try:
            policy = self.policy(table.scope)
            key = entry.key
            if event == "remove":
                if key in policy:
                    policy.on_remove(key)
            elif key in policy:
                policy.on_access(key, entry.last_access)
            elif event == "insert" or (event == "access" and entry.owned and entry.present):
                parent = table.get(entry.parent) if entry.parent is not None else None
                # a parent this node does not own (written by another node) is outside the policy's tree: the
                # block is a root there, and the ledger's leaf check keeps the foreign parent's children safe
                parent_key = entry.parent if parent is not None and parent.owned else None
                policy.on_insert(key, parent_key, entry.size, entry.created_at if event == "insert"
                                 else entry.last_access)
        except Exception:  # a policy bug must not break the data path's bookkeeping
            log.exception("budget policy of %s: %s event for %s failed", tuple(table.scope), event, entry.key)

    # --- enforcement ----------------------------------------------------------------------------------------

    def used_bytes(self, scopes: CacheScope | KeySpace | Iterable[CacheScope]) -> int:
        """Bytes the ledger counts for these scopes (owned, present)."""
        with self.ledger.lock:
            return sum(self.ledger.table(i).bytes for i in _scopes(scopes))

    def enforce(self, scopes: CacheScope | KeySpace | Iterable[CacheScope], budget_bytes: int,
                remove_fn: RemoveFn, *, low_water: float = 1.0) -> list[str]:
        """Hold ``scopes`` (one request group, or every group of a release) under ``budget_bytes``.

        Nothing happens while the ledger's bytes are at most the budget. Over it, blocks are removed down to the
        **low-water mark** ``ceil(low_water * budget_bytes)`` in whole blocks: the fewest planned blocks that bring
        the bytes to at most ``min(budget_bytes, mark + m - 1)`` (``m`` the largest planned block), so a trim that
        is not refused ends at or above the mark and less than one block above it (never above the budget) —
        rounding to whole blocks does not waste budget, on any node. With several scopes each gives up bytes in
        proportion to what it holds, chosen by its own policy. Blocks are removed leaf-first in waves through
        ``remove_fn``; a block the store refused (read lease) stays, with its ancestors, and is tried again at
        the next call.

        Returns:
            primary keys of the blocks removed, in removal order.

        Raises:
            ValueError: negative budget, or ``low_water`` outside (0, 1].
            StoreError: whatever ``remove_fn`` raises for codes other than a lease (after the ledger recorded the
                blocks that did go).
        """
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must not be negative, got {budget_bytes}")
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water}")
        ids = _scopes(scopes)
        if self.used_bytes(ids) <= budget_bytes:
            return []
        target = min(budget_bytes, math.ceil(budget_bytes * low_water))
        removed: list[str] = []
        blocked: set[str] = set()  # refused by the store, or above a refused block: kept until the next call
        for _ in range(MAX_ROUNDS):
            plan = self._plan(ids, target, budget_bytes, blocked)
            if not plan:
                break
            removed.extend(self._remove_waves(plan, remove_fn, blocked))
        return removed

    def next_victims(self, scopes: CacheScope | KeySpace | Iterable[CacheScope], budget_bytes: int, *,
                     low_water: float = 1.0, ahead_bytes: int = 0) -> set[str]:
        """Primary keys of the blocks :meth:`enforce` would remove next — the plan down to the low-water mark, and
        ``ahead_bytes`` (bytes) further, for what the engines will write before the next trims — without removing
        anything. Empty while the bytes are at most that mark less ``ahead_bytes``. A check that leases blocks
        (``Ledger.reconcile(exclude=...)``) leaves these out, so it does not refuse the trim's coming removals.

        Raises:
            ValueError: negative ``budget_bytes`` or ``ahead_bytes``, or ``low_water`` outside (0, 1].
        """
        if budget_bytes < 0 or ahead_bytes < 0:
            raise ValueError(f"budget_bytes and ahead_bytes must not be negative, got {budget_bytes}, {ahead_bytes}")
        if not 0.0 < low_water <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water}")
        ids = _scopes(scopes)
        goal = max(0, min(budget_bytes, math.ceil(budget_bytes * low_water)) - ahead_bytes)
        if self.used_bytes(ids) <= goal:
            return set()
        return {key for _, key in self._plan(ids, goal, max(goal, budget_bytes - ahead_bytes), set())}

    def _plan(self, ids: list[CacheScope], target: int, budget_bytes: int,
              blocked: set[str]) -> list[tuple[ScopeTable, str]]:
        """Victims per scope for its share of the bytes above ``target``, ``blocked`` keys left out (asked
        for on top, so the plan reaches past them), cut to the fewest that leave at most ``min(budget_bytes,
        target + m - 1)`` bytes (``m`` the largest victim): planned blocks dropped from the end of a scope's list
        (a prefix of a plan never orphans) while the rest still frees enough. Empty once the bytes are there."""
        with self.ledger.lock:
            tables = [self.ledger.table(i) for i in ids]
            used = [t.bytes for t in tables]
            need = sum(used) - target
            if need <= 0:
                return []
            total = sum(used)
            lists: list[list[tuple[ScopeTable, str, int]]] = []
            for table, held in zip(tables, used):
                if held <= 0:
                    continue
                share = -(-need * held // total)  # ceil: the shares together free at least ``need``
                policy = self.policy(table.scope)
                stuck = sum(block.size for k in blocked if k in policy and (block := policy.tree.get(k)) is not None)
                victims = []
                for key in policy.select_victims(share + stuck, self.ledger.clock()):
                    entry = table.get(cast(str, key))  # the policy holds the ledger's keys
                    if key not in blocked and entry is not None:
                        victims.append((table, cast(str, key), entry.size))
                lists.append(victims)
            largest = max((size for victims in lists for _, _, size in victims), default=0)
            # free at least this much: the bytes end at most one block (less a byte) above ``target``, never
            # above the budget; removing fewer planned blocks than that never takes the bytes below ``target``
            floor = total - min(budget_bytes, target + largest - 1)
            if floor <= 0:
                return []
            freed = sum(size for victims in lists for _, _, size in victims)
            dropped = True
            while dropped:
                dropped = False
                for victims in lists:
                    if victims and freed - victims[-1][2] >= floor:
                        freed -= victims.pop()[2]
                        dropped = True
            return [(table, key) for victims in lists for table, key, _ in victims]

    def _remove_waves(self, plan: list[tuple[ScopeTable, str]], remove_fn: RemoveFn,
                      blocked: set[str]) -> list[str]:
        """Remove the plan in waves of ledger leaves; returns the keys that went. Refused keys, and planned keys
        that never became leaves (above a refused block, or with a child another node wrote), join
        ``blocked``."""
        removed: list[str] = []
        pending = plan
        for _ in range(MAX_WAVES):
            wave: dict[KeySpace, list[tuple[ScopeTable, BlockEntry]]] = {}
            rest: list[tuple[ScopeTable, str]] = []
            with self.ledger.lock:
                for table, key in pending:
                    entry = table.get(key)
                    if entry is None or not (entry.owned and entry.present) or key in blocked:
                        continue
                    if entry.children_count == 0:
                        wave.setdefault(entry.keyspace, []).append((table, entry))
                    else:
                        rest.append((table, key))
            if not wave:
                blocked.update(key for _, key in rest)
                break
            for keyspace, items in wave.items():
                try:
                    remove_fn(keyspace, [e.block_hash for _, e in items])
                finally:
                    with self.ledger.lock:
                        for table, entry in items:
                            if entry.present and table.get(entry.key) is entry:
                                blocked.add(entry.key)
                                self.refused_blocks[table.scope] = self.refused_blocks.get(table.scope, 0) + 1
                            else:
                                removed.append(entry.key)
                                self.removed_blocks[table.scope] = self.removed_blocks.get(table.scope, 0) + 1
            pending = rest
        return removed

    # --- reporting ------------------------------------------------------------------------------------------

    def stats(self, scope: CacheScope | KeySpace) -> dict[str, Any]:
        """Per scope: ``policy`` (name), ``policy_blocks``/``policy_bytes`` (what it tracks),
        ``orphaned_blocks``/``orphaned_bytes`` (unreachable whole subtrees, e.g. below a block the master
        evicted), ``budget_removed_blocks``, ``budget_refused_blocks`` (removals refused, e.g. read leases), and
        ``lru_share`` (how far the hit-density guard distrusts its model; absent for other policies)."""
        key = scope.scope if isinstance(scope, KeySpace) else scope
        with self.ledger.lock:
            policy = self.policy(key)
            out: dict[str, Any] = {
                "policy": policy.name, "policy_blocks": len(policy), "policy_bytes": policy.used_bytes,
                "orphaned_blocks": policy.orphaned_blocks, "orphaned_bytes": policy.orphaned_bytes,
                "budget_removed_blocks": self.removed_blocks.get(key, 0),
                "budget_refused_blocks": self.refused_blocks.get(key, 0),
            }
            share = getattr(policy, "lru_share", None)
            if share is not None:
                out["lru_share"] = share
            return out


def connector_remover(connector: Any) -> RemoveFn:
    """A :data:`RemoveFn` over ``KVConnector.remove`` without force: a block under a read lease (-706) stays and
    is not an error; any other failure raises the connector's ``StoreError``."""
    from agent.datapath.errors import StoreError

    def remove(keyspace: KeySpace, block_hashes: list[bytes]) -> int:
        try:
            return connector.remove(block_hashes, keyspace=keyspace, force=False)
        except StoreError as exc:
            if all(code == _HAS_LEASE for _, code in exc.failures):
                return 0
            raise

    return remove


_HAS_LEASE = -706  # OBJECT_HAS_LEASE (Mooncake 0.3.13.post1): another client is reading the object
_NOT_FOUND = -704  # OBJECT_NOT_FOUND: already gone (evicted by the master, or removed by someone else)


def store_remover(store: Any, ledger: Ledger, cause: RemovalCause = "budget") -> RemoveFn:
    """A :data:`RemoveFn` straight over a Store client (``agent.datapath.store.StoreClient``), for blocks no
    connector of this process wrote (a real engine's, see ``agent.node.engines``): ``batch_remove`` of exactly the
    blocks' keys (every object of a block in one call), **never** ``force=True``, then
    ``ledger.record_removed`` of the blocks that went, booked under ``cause`` (``budget`` or ``orphan``,
    ``agent.datapath.ledger.RemovalCause``; already absent, -704, counts as gone). A block under a
    read lease (-706) stays present in the ledger and is tried again at the next enforcement; any other negative
    code raises ``StoreError`` after the ledger recorded what did go."""
    from agent.datapath.errors import store_error

    def remove(keyspace: KeySpace, block_hashes: list[bytes]) -> int:
        if not block_hashes:
            return 0
        keys = keyspace.keys(block_hashes)
        codes = store.remove(keys, force=False)
        per = keyspace.objects_per_block
        failures: list[tuple[str, int]] = []
        gone_blocks: set[int] = set()
        for n, (key, code) in enumerate(zip(keys, codes)):
            if code == 0 or code == _NOT_FOUND:
                gone_blocks.add(n // per)
            elif code != _HAS_LEASE:
                failures.append((key, code))
        freed = ledger.record_removed(keyspace, [h for i, h in enumerate(block_hashes) if i in gone_blocks], cause)
        if failures:
            raise store_error("remove", failures, tenant_id=store.tenant_id)
        return freed

    return remove


def _scopes(scopes: CacheScope | KeySpace | Iterable[CacheScope]) -> list[CacheScope]:
    if isinstance(scopes, KeySpace):
        return [scopes.scope]
    if isinstance(scopes, CacheScope):
        return [scopes]
    return [s.scope if isinstance(s, KeySpace) else s for s in scopes]


def _depth(table: ScopeTable, entry: BlockEntry) -> int:
    depth = 0
    for _ in table.ancestors(entry.key):
        depth += 1
    return depth


__all__ = ["BUDGET_POLICIES", "DEFAULT_BUDGET_POLICY", "BudgetEnforcer", "RemoveFn", "budget_policy_factory",
           "connector_remover", "store_remover"]
