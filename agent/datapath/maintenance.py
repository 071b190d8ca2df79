"""One node's upkeep of its ledger against the Store: budgets, orphan collection, reconcile and lease-aware probes.

This is the one implementation of the node-maintenance policy. The agent runs it for real engines
(``agent.node.engines.NodeEngines.tick``) and the engine simulator for its own writes (``agent.sim.workload``), so
the demo runs the product's policy. A round (:meth:`Maintenance.tick`), in this order:

1. **budgets** — every release and request group over its budget (:class:`Budget`, from the applied document:
   :func:`document_budgets`; each node holds its own share) is trimmed to ``BUDGET_LOW_WATER`` of it in whole blocks
   (at or above it, less than a block above: no budget lost to rounding) by ``agent.datapath.budget.BudgetEnforcer``
   (the prefix-aware policy): leaf blocks only, removed by exact key,
   never forced (``agent.datapath.budget.store_remover``), so no block is orphaned, and a block another client reads
   (a read lease) stays until a later round;
2. **orphans** — blocks of this node below a block known to be gone (evicted by the master, removed by another
   node's budget) cannot be hit (a prompt's blocks are looked up in order): every ``foreign_check_interval`` seconds
   up to ``FOREIGN_PARENT_SAMPLE`` foreign parents per tenant are checked (``Ledger.check_foreign_parents``; none
   again within ``FOREIGN_RECHECK_AFTER`` seconds, as each check leases an existing object), the cuts are
   re-checked (``Ledger.confirm_cuts``: a parent written again un-orphans its subtree) and the orphans are removed
   leaves first, never forced. When this runs is the **orphan rule** (``orphan_collection``, one of
   ``ORPHAN_RULES``): ``pressure`` (the default) collects a tenant's orphans only while it is under pressure — one
   of its budgets was passed, or the master evicted inside it, within the last ``PRESSURE_WINDOW`` seconds (so the
   orphans another node's trim leaves below its blocks are found and collected too) — and then
   *before* the budgets are trimmed, so an unreachable block goes before a reachable one; otherwise orphans stay,
   since a later request that recomputes and stores their missing parent makes them reachable again (the eager
   collection measured 5x the master's evictions in removed descendants). ``eager`` collects every round,
   ``off`` never (orphans stay until the master evicts them: ``python -m bench.engine_pressure`` arms
   ``prefix`` = pressure, ``prefix_eager_orphans``, ``prefix_keep_orphans``; ``docs/eviction.md`` §8);
3. **reconcile** — every ``reconcile_interval`` seconds the ledger's present blocks of each tenant are checked
   against the Store (``Ledger.reconcile``: a sample of ``reconcile_sample``, every block once a sample finds one
   gone), so master evictions leave the ledger; between reconciles a **probe** of ``PROBE_SAMPLE`` blocks per
   tenant every ``probe_interval`` seconds catches a restarted master (every object lost) within seconds. Mooncake
   0.3.13.post1's ``batch_is_exist`` grants each existing object it checks a read lease (``--default_kv_lease_ttl``,
   10 s by default, measured), so no probe runs while a budget is still over: its leases would hold the very leaves
   the enforcer waits to remove.
4. **eviction signal** — the master's eviction counters (``agent.datapath.eviction_signal.EvictionWatch`` over the
   ``/metrics`` URLs of the applied document's ``NodeSettings.master_metrics_urls``: one small HTTP read, no lease)
   are polled every ``poll_interval`` seconds (at a round: as often as the caller runs rounds, or light rounds of
   this step alone, :meth:`Maintenance.signal_round`, between them: the real-engine agent does); a tenant whose
   counter grew (every tenant when only a global one grew, or the master restarted) is reconciled at once, not at
   the next interval, so the ledger follows the Store within seconds of an eviction round (at most once per
   ``signal_gap`` seconds per tenant: a signal inside the gap waits for its end). That reconcile stands for the
   round's scheduled reconcile or probe of that tenant. After a master restart (a counter went down: every object
   is gone, leased or not) it checks every block, not lease-aware.

Every reconcile is **lease-aware** (``docs/eviction.md`` §8, "How soon the ledger follows a master eviction"): a
check leases what it finds for the master's ``--default_kv_lease_ttl`` (``lease_ttl``), and a leased block is
neither evictable by the master nor removable by a trim. So a reconcile leaves out (a) the blocks this node's own
check found present less than ``lease_ttl - LEASE_MARGIN`` seconds ago (the confirmation of an engine's write, an
earlier reconcile: the master cannot have evicted them since) and (b) each budget's next victims
(``BudgetEnforcer.next_victims``: the trim's plan to ``BUDGET_LOW_WATER``, plus what this node's engines wrote in
the last ``lease_ttl``, which the trims of the coming lease must remove too): the trim's own removal tells whether
those are gone (-704), and a check would refuse that removal for the whole lease while the master, which ignores
budgets, evicts at the quota instead.

Store clients come from the caller (``store_for(tenant_id)``, one per tenant, None while it cannot be opened). A
failing step is reported through ``on_problem(part, message)`` (``budget``, ``orphans``, ``store:<tenant>``) and
``on_problem(part, None)`` once it works again; ``on_store_failure(tenant_id)`` lets the caller drop a client that
broke. No Django here; sizes are bytes, intervals seconds of ``time.monotonic``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from agent.contract.scope import NO_REQUEST_GROUP, CacheScope
from agent.datapath.eviction_signal import EvictionWatch

log = logging.getLogger("kvpool.agent.maintenance")

#: A release or request group over its budget is trimmed to this share of it (the whole-block amount at or above it:
#: ``BudgetEnforcer.enforce``), so a release whose nodes are each at their share ends within 10 % of its budget.
BUDGET_LOW_WATER = 0.9
#: Default seconds between reconciles with the Store (each leases the checked objects for the master's
#: ``--default_kv_lease_ttl``, 10 s by default in Mooncake 0.3.13.post1: keep this well above it).
DEFAULT_RECONCILE_INTERVAL = 30.0
#: Blocks sampled per tenant at each reconcile (every block once a sample finds one gone).
DEFAULT_RECONCILE_SAMPLE = 64
#: Default seconds between Store probes of ``PROBE_SAMPLE`` blocks per tenant between reconciles.
DEFAULT_PROBE_INTERVAL = 5.0
#: Blocks a probe checks per tenant (each leased for ``--default_kv_lease_ttl``: a handful, not a budget's worth).
PROBE_SAMPLE = 4
#: Seconds between checks of foreign parents (another node's blocks that this node's blocks continue).
DEFAULT_FOREIGN_CHECK_INTERVAL = 5.0
#: Foreign parents checked per tenant and check (each one that exists is leased for ``--default_kv_lease_ttl``).
FOREIGN_PARENT_SAMPLE = 32
#: Seconds before the same foreign parent is checked again: 3x Mooncake's default 10 s read lease, so its writer's
#: budget removal is refused at most a third of the time.
FOREIGN_RECHECK_AFTER = 30.0
#: Most leaf-first removal rounds per tenant and round when collecting orphans (a removal round frees one level).
ORPHAN_ROUNDS = 256
#: Least seconds between two reconciles of one tenant on an eviction signal (each leases the tenant's existing
#: objects for ``--default_kv_lease_ttl``, 10 s).
DEFAULT_SIGNAL_GAP = 3.0
#: The master's ``--default_kv_lease_ttl`` in seconds (Mooncake 0.3.13.post1's default, ``mooncake_master --help``):
#: how long a block this node's check found present stays leased, so unevictable and unremovable.
DEFAULT_LEASE_TTL = 10.0
#: Seconds of that lease not counted on (the check's answer, and the booking after it, come after the master granted
#: the lease; a master configured with a shorter lease than ``lease_ttl`` needs ``lease_ttl`` set to it).
LEASE_MARGIN = 1.0
#: The orphan rules (module docstring, step 2) and the default.
ORPHAN_RULES = ("pressure", "eager", "off")
DEFAULT_ORPHAN_RULE = "pressure"
#: Seconds a passed budget or a master eviction inside a tenant keeps it "under pressure" (``pressure`` orphan rule).
PRESSURE_WINDOW = 60.0


class Budget(NamedTuple):
    """One budget to hold: ``scopes`` (one request group, or every group of a release that the ledger holds),
    ``node_budget_bytes`` (this node's share) and the ``tenant_id`` whose Store client removes the blocks."""

    scopes: list[CacheScope]
    node_budget_bytes: int
    tenant_id: str

    @property
    def label(self) -> str:
        """The group's label, or the release's for a release budget."""
        return self.scopes[0].label if len(self.scopes) == 1 else self.scopes[0].release_scope().label


def document_budgets(instances: Iterable[Any], held: Iterable[CacheScope]) -> list[Budget]:
    """The budgets of ``instances`` (``agent.contract.messages.InstanceSpec``: ``node_budget_bytes`` of the release
    and of each of its ``request_groups``, this node's shares; None = no budget): one per request group with a budget,
    then one per release with a budget over every scope of it in ``held`` (the ledger's tables; the release's row
    without a request group, ``NO_REQUEST_GROUP``, when none)."""
    release_budgets: dict[CacheScope, tuple[int, str]] = {}
    group_budgets: dict[CacheScope, tuple[int, str]] = {}
    for instance in instances:
        release = CacheScope(instance.tenant_id, instance.served_model_name, instance.namespace)
        if instance.node_budget_bytes is not None:
            release_budgets[release] = (instance.node_budget_bytes, instance.tenant_id)
        for group in instance.request_groups:
            if group.node_budget_bytes is not None:
                group_budgets[release._replace(request_group=group.name)] = (group.node_budget_bytes,
                                                                              instance.tenant_id)
    out = [Budget([scope], budget, tenant) for scope, (budget, tenant) in group_budgets.items()]
    tables = list(held)
    for release, (budget, tenant) in release_budgets.items():
        held_scopes = [s for s in tables if s.release_scope() == release]
        out.append(Budget(held_scopes or [release._replace(request_group=NO_REQUEST_GROUP)], budget, tenant))
    return out


def orphan_rule(value: str | bool) -> str:
    """The orphan rule named by ``value`` (one of ``ORPHAN_RULES``; True -> ``eager``, False -> ``off``); raises
    ``ValueError`` naming the rules for anything else."""
    if value is True or value is False:
        return "eager" if value else "off"
    if value not in ORPHAN_RULES:
        raise ValueError(f"orphan collection {value!r} is not one of {', '.join(ORPHAN_RULES)}")
    return str(value)


class Maintenance:
    """The node-maintenance policy over one ``agent.datapath.ledger.Ledger`` (module docstring).

    Args:
        node: this node's name (log lines).
        ledger: the node's ledger.
        budget: the ``agent.datapath.budget.BudgetEnforcer`` listening on ``ledger``.
        store_for: ``tenant_id -> StoreClient`` (``agent.datapath.store``) or None while none can be opened.
        reconcile_interval / reconcile_sample / probe_interval / foreign_check_interval: as the module docstring
            says (``probe_interval`` <= 0: no probes; ``reconcile_interval`` <= 0: a reconcile every round;
            ``reconcile_sample`` None: every block).
        orphan_collection: the orphan rule of step 2 (``ORPHAN_RULES``: ``pressure``, ``eager`` or ``off``; True and
            False, the older form, mean ``eager`` and ``off``). Raises ``ValueError`` for another value.
        on_problem: ``(part, message or None)`` — a step failed (message) or works again (None).
        on_store_failure: ``tenant_id`` whose Store client raised (the caller may reopen it next round).
        eviction_watch: the master's eviction counters (``agent.datapath.eviction_signal.EvictionWatch``; default
            one without URLs, polling nothing, until :meth:`set_master_metrics`).
        signal_gap: least seconds between two reconciles of a tenant on an eviction signal.
        lease_ttl: the master's ``--default_kv_lease_ttl`` in seconds (module docstring, lease-aware reconciles; 0:
            every reconcile checks every present block).

    Not thread-safe: one caller runs the rounds (the maintenance thread, or the simulator under its batch lock).
    Counters: :attr:`removed_over_budget`, :attr:`removed_orphans` (blocks, since creation),
    :attr:`signal_reconciles` (tenant reconciles run on an eviction signal).
    """

    def __init__(self, node: str, ledger: Any, budget: Any, store_for: Callable[[str], Any | None], *,
                 reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL,
                 reconcile_sample: int | None = DEFAULT_RECONCILE_SAMPLE,
                 probe_interval: float = DEFAULT_PROBE_INTERVAL,
                 foreign_check_interval: float = DEFAULT_FOREIGN_CHECK_INTERVAL,
                 orphan_collection: str | bool = DEFAULT_ORPHAN_RULE,
                 on_problem: Callable[[str, str | None], None] | None = None,
                 on_store_failure: Callable[[str], None] | None = None,
                 eviction_watch: EvictionWatch | None = None,
                 signal_gap: float = DEFAULT_SIGNAL_GAP,
                 lease_ttl: float = DEFAULT_LEASE_TTL) -> None:
        self.node = node
        self.ledger = ledger
        self.budget = budget
        self.store_for = store_for
        self.reconcile_interval = reconcile_interval
        self.reconcile_sample = reconcile_sample
        self.probe_interval = probe_interval
        self.foreign_check_interval = foreign_check_interval
        self.orphan_collection = orphan_rule(orphan_collection)
        self._pressed_at: dict[str, float] = {}           # tenant -> time.monotonic() it was last under pressure
        self._on_problem = on_problem
        self._on_store_failure = on_store_failure
        self.last_reconcile: float | None = None     # time.monotonic() of the last reconcile
        self.last_probe: float | None = None         # ... of the last probe or reconcile
        self.last_foreign_check: float | None = None  # ... of the last check of foreign parents
        self.removed_over_budget = 0
        self.removed_orphans = 0
        self.eviction_watch = eviction_watch if eviction_watch is not None else EvictionWatch()
        self.signal_gap = signal_gap
        self.lease_ttl = lease_ttl
        self.signalled: set[str] = set()                  # tenants waiting for their reconcile on a signal
        self._restarted: set[str] = set()                 # ... of them, after a master restart (not lease-aware)
        self._signal_reconciled: dict[str, float] = {}    # tenant -> time.monotonic() of its last one
        self.signal_reconciles = 0

    def set_master_metrics(self, urls: Iterable[str]) -> None:
        """Poll the eviction counters at ``urls`` (the masters' ``/metrics``; none: no polling)."""
        self.eviction_watch.set_urls(urls)
        if not self.eviction_watch.active:
            self.signalled.clear()
            self._problem("master_metrics", None)

    def signal_due(self, now: float) -> bool:
        """Whether a round at ``now`` has eviction-signal work: a poll due, or a signalled tenant waiting."""
        return self.eviction_watch.due(now) or bool(self.signalled)

    # --- a round ------------------------------------------------------------------------------------------

    def tick(self, budgets: list[Budget], tenants: Iterable[str], *, now: float | None = None,
             reconcile: bool | None = None, full: bool = False, enforce: bool = True) -> dict[str, int]:
        """One round: budgets and orphans (unless ``enforce`` is False), then the eviction signal (a reconcile of
        each tenant whose master eviction counter grew, not sampled, at most once per ``signal_gap``), then a
        reconcile of the other tenants when ``reconcile`` (None: when ``reconcile_interval`` passed since the last
        one; ``full``: every present block, neither a sample nor lease-aware), else a probe when ``probe_interval``
        passed and no budget is still over. The other reconciles are lease-aware (module docstring).
        Returns ``checked`` and ``missing`` blocks, ``removed`` over budget and ``orphans_removed``. Orphans are
        collected before the budgets are trimmed (of the tenants :meth:`orphan_tenants` names)."""
        now = time.monotonic() if now is None else now
        tenants = sorted(set(tenants))
        if reconcile is None:
            reconcile = self.last_reconcile is None or now - self.last_reconcile >= self.reconcile_interval
        orphans = self.collect_orphans(self.orphan_tenants(budgets, tenants, now), now) if enforce else 0
        removed = self.enforce_budgets(budgets) if enforce else 0
        checked, missing, done = self._on_eviction_signal(tenants, now, budgets)
        tenants = [t for t in tenants if t not in done]  # just checked every block of these
        if reconcile:
            self.last_reconcile = self.last_probe = now
            scheduled = (self.reconcile(tenants, None, lease_aware=False) if full
                         else self.reconcile(tenants, self.reconcile_sample, budgets))
            checked, missing = checked + scheduled[0], missing + scheduled[1]
        elif self.probe_interval > 0 and not self.over_budget(budgets) and (
                self.last_probe is None or now - self.last_probe >= self.probe_interval):
            self.last_probe = now
            probed = self.reconcile(tenants, PROBE_SAMPLE, budgets)
            checked, missing = checked + probed[0], missing + probed[1]
        return {"checked": checked, "missing": missing, "removed": removed, "orphans_removed": orphans}

    def signal_round(self, budgets: list[Budget], tenants: Iterable[str], *,
                     now: float | None = None) -> tuple[int, int]:
        """Only step 4 (a caller's light round between full rounds): poll the eviction counters when due and reconcile
        each signalled tenant of ``tenants`` whose last such reconcile is ``signal_gap`` old: every block but the
        next victims of its ``budgets`` and what this node's checks leased (module docstring). Returns ``(checked,
        missing)`` blocks."""
        now = time.monotonic() if now is None else now
        checked, missing, _ = self._on_eviction_signal(sorted(set(tenants)), now, budgets)
        return checked, missing

    # --- the steps ----------------------------------------------------------------------------------------

    def _on_eviction_signal(self, tenants: list[str], now: float,
                            budgets: Iterable[Budget] = ()) -> tuple[int, int, set[str]]:
        """Poll the eviction counters when due; reconcile each signalled tenant of ``tenants`` whose last such
        reconcile is ``signal_gap`` old, lease-aware (:meth:`reconcile` with ``budgets``: a budget's next victims and
        what this node's checks leased are left out, so the trim is not refused while the master evicts at the quota
        instead). Returns ``(checked, missing, tenants reconciled)``."""
        watch = self.eviction_watch
        if watch.due(now):
            signal = watch.poll(now)
            self._problem("master_metrics", f"reading the master's eviction counters: {watch.last_error}"
                          if watch.last_error else None)
            affected = signal.affected(tenants)
            self.signalled.update(affected)
            if signal.restarted:  # every object went, leased or not: check every block, not lease-aware
                self._restarted.update(affected)
            self._pressed_at.update(dict.fromkeys(affected, now))
        self.signalled &= set(tenants)
        self._restarted &= self.signalled
        ready = sorted(t for t in self.signalled
                       if t not in self._signal_reconciled or now - self._signal_reconciled[t] >= self.signal_gap)
        if not ready:
            return 0, 0, set()
        for tenant_id in ready:
            self.signalled.discard(tenant_id)
            self._signal_reconciled[tenant_id] = now
        self.signal_reconciles += len(ready)
        restarted = self._restarted.intersection(ready)
        self._restarted -= restarted
        checked, missing = self.reconcile(sorted(set(ready) - restarted), None, budgets)
        if restarted:
            full = self.reconcile(sorted(restarted), None, lease_aware=False)
            checked, missing = checked + full[0], missing + full[1]
        log.info("node %s: the master evicted: reconciled tenant(s) %s (%d block(s) checked, %d gone)", self.node,
                 ", ".join(ready), checked, missing)
        return checked, missing, set(ready)

    def orphan_tenants(self, budgets: Iterable[Budget], tenants: Iterable[str], now: float) -> list[str]:
        """The tenants of ``tenants`` whose orphans the orphan rule collects at ``now``: all (``eager``), none
        (``off``), or those under pressure (``pressure``: a budget of the tenant passed, or a master eviction inside
        it signalled, within the last ``PRESSURE_WINDOW`` seconds)."""
        tenants = sorted(set(tenants))
        if self.orphan_collection == "eager":
            return tenants
        if self.orphan_collection == "off":
            return []
        for item in budgets:
            if self.budget.used_bytes(item.scopes) > item.node_budget_bytes:
                self._pressed_at[item.tenant_id] = now
        return [t for t in tenants if t in self._pressed_at and now - self._pressed_at[t] <= PRESSURE_WINDOW]

    def over_budget(self, budgets: Iterable[Budget]) -> bool:
        """Whether some budget is still passed (a removal was refused under a read lease)."""
        return any(self.budget.used_bytes(b.scopes) > b.node_budget_bytes for b in budgets)

    def enforce_budgets(self, budgets: Iterable[Budget]) -> int:
        """Trim every budget passed to ``BUDGET_LOW_WATER`` of it (in whole blocks, at or above it); returns blocks
        removed."""
        from agent.datapath.budget import store_remover

        removed = 0
        for item in budgets:
            if self.budget.used_bytes(item.scopes) <= item.node_budget_bytes:
                continue
            store = self.store_for(item.tenant_id)
            if store is None:
                continue
            refused_before = self._refused()
            try:
                keys = self.budget.enforce(item.scopes, item.node_budget_bytes, store_remover(store, self.ledger),
                                           low_water=BUDGET_LOW_WATER)
            except Exception as exc:
                self._problem("budget", f"holding {item.label} under {item.node_budget_bytes} bytes failed: {exc}")
                continue
            self._problem("budget", None)
            refused = self._refused() - refused_before
            if keys or refused:
                removed += len(keys)
                log.info("node %s: removed %d block(s) of %s over its budget of %d bytes (%d refused: read leases)",
                         self.node, len(keys), item.label, item.node_budget_bytes, refused)
        self.removed_over_budget += removed
        return removed

    def _refused(self) -> int:
        """Removals the Store refused so far, all scopes (``BudgetEnforcer.refused_blocks``; 0 for a fake)."""
        return sum(getattr(self.budget, "refused_blocks", {}).values())

    def collect_orphans(self, tenants: Iterable[str], now: float) -> int:
        """Remove this node's orphans from the Store, per tenant of ``tenants`` (module docstring, step 2);
        returns blocks removed (the ledger forgets them: ``orphan_removed_blocks``)."""
        from agent.datapath.budget import store_remover

        check = self.last_foreign_check is None or now - self.last_foreign_check >= self.foreign_check_interval
        if check:
            self.last_foreign_check = now
        removed = 0
        for tenant_id in sorted(tenants):
            if not check and not self.ledger.orphan_leaves(tenant_id):
                continue
            store = self.store_for(tenant_id)
            if store is None:
                continue
            try:
                if check:
                    self.ledger.check_foreign_parents(store, limit=FOREIGN_PARENT_SAMPLE,
                                                      recheck_after=FOREIGN_RECHECK_AFTER)
                if not self.ledger.orphan_leaves(tenant_id):
                    continue
                self.ledger.confirm_cuts(store, tenant_id)
                remove = store_remover(store, self.ledger, "orphan")
                for _ in range(ORPHAN_ROUNDS):
                    leaves = self.ledger.orphan_leaves(tenant_id)
                    freed = sum(remove(ks, hashes) for ks, hashes in leaves.items())
                    removed += freed
                    if not freed:
                        break
            except Exception as exc:  # the next round retries
                self._problem("orphans", f"collecting orphans of tenant {tenant_id} failed: {exc}")
                continue
            self._problem("orphans", None)
        if removed:
            log.info("node %s: removed %d orphaned block(s) (their parent left the Store)", self.node, removed)
        self.removed_orphans += removed
        return removed

    def reconcile(self, tenants: Iterable[str], sample: int | None, budgets: Iterable[Budget] = (), *,
                  lease_aware: bool = True) -> tuple[int, int]:
        """Check ``sample`` present blocks of each tenant (None: all) against the Store; ``lease_aware`` (module
        docstring), blocks this node's checks leased less than ``lease_ttl - LEASE_MARGIN`` ago and the next
        victims of the tenant's ``budgets`` are left out. Returns ``(checked, missing)`` blocks (missing ones left
        the ledger)."""
        checked = missing = 0
        budgets = list(budgets) if lease_aware else []
        leased_for = max(0.0, self.lease_ttl - LEASE_MARGIN) if lease_aware and self.lease_ttl > 0 else 0.0
        for tenant_id in sorted(tenants):
            store = self.store_for(tenant_id)
            if store is None:
                continue
            try:
                exclude = self.next_victims(tenant_id, budgets)
                result = self.ledger.reconcile(store, sample=sample, leased_for=leased_for, exclude=exclude)
            except Exception as exc:  # the next round retries (a fresh client if this one broke)
                self._problem(f"store:{tenant_id}", f"reconciling tenant {tenant_id} with the Store failed: {exc}")
                if self._on_store_failure is not None:
                    self._on_store_failure(tenant_id)
                continue
            checked += result.checked
            missing += result.missing
            if result.missing:
                log.info("node %s: %d block(s) of tenant %s left the Store (evicted, or their writer's segment went)",
                         self.node, result.missing, tenant_id)
        return checked, missing

    def next_victims(self, tenant_id: str, budgets: Iterable[Budget]) -> set[str]:
        """Primary keys of the blocks the trims of ``tenant_id``'s ``budgets`` will remove within the master's lease:
        each budget's plan to ``BUDGET_LOW_WATER`` plus the bytes this node booked under it in the last
        ``lease_ttl`` seconds (``BudgetEnforcer.next_victims``, ``Ledger.recent_bytes``). Empty without budgets or
        with ``lease_ttl`` 0."""
        out: set[str] = set()
        if self.lease_ttl <= 0 or not hasattr(self.budget, "next_victims"):
            return out
        for item in budgets:
            if item.tenant_id != tenant_id:
                continue
            ahead = self.ledger.recent_bytes(item.scopes, self.lease_ttl)
            out |= self.budget.next_victims(item.scopes, item.node_budget_bytes, low_water=BUDGET_LOW_WATER,
                                            ahead_bytes=ahead)
        return out

    def _problem(self, part: str, message: str | None) -> None:
        if self._on_problem is not None:
            self._on_problem(part, message)
        elif message is not None:
            log.error("node %s: %s", self.node, message)


__all__ = ["BUDGET_LOW_WATER", "DEFAULT_LEASE_TTL", "DEFAULT_SIGNAL_GAP", "Budget", "Maintenance", "document_budgets"]
