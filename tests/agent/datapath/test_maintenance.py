"""The one node-maintenance policy (``agent.datapath.maintenance``): budgets from a document, leaf-first trims,
orphan collection below an evicted block, and the reconcile/probe schedule; the simulator and the real-engine path
run this same object (``EngineSimulator.maintenance``, ``NodeEngines.maintenance``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.contract.scope import CacheScope
from agent.datapath.budget import BudgetEnforcer
from agent.datapath.ledger import Ledger
from agent.datapath.maintenance import PRESSURE_WINDOW, PROBE_SAMPLE, Budget, Maintenance, document_budgets, orphan_rule
from tests.agent.datapath.test_budget_unit import check_no_orphans, make, put


def _spec(namespace: str, budget: int | None, groups: dict[str, int | None]) -> SimpleNamespace:
    return SimpleNamespace(tenant_id="t", served_model_name="m", namespace=namespace, node_budget_bytes=budget,
                           request_groups=[SimpleNamespace(name=n, node_budget_bytes=b) for n, b in groups.items()])


def test_document_budgets_group_budgets_first_then_each_release_over_the_scopes_held():
    held = [CacheScope("t", "m", "r1", "a"), CacheScope("t", "m", "r1", "b"), CacheScope("t", "m", "r2", "a")]
    budgets = document_budgets([_spec("r1", 100, {"a": 10, "b": None}), _spec("r2", None, {"a": None}),
                                _spec("r3", 0, {})], held)
    assert budgets == [Budget([CacheScope("t", "m", "r1", "a")], 10, "t"),
                       Budget(held[:2], 100, "t"),
                       Budget([CacheScope("t", "m", "r3", "")], 0, "t")]  # a share of 0 keeps nothing


def _policy(ledger, store, enforcer=None, **kwargs):
    return Maintenance("node-a", ledger, enforcer or BudgetEnforcer(ledger), lambda tenant: store, **kwargs)


def test_a_round_trims_a_release_over_its_budget_leaf_first_then_reconciles():
    store, ns, ledger, connector, enforcer = make()
    for start in (0, 100, 200):
        put(connector, ns, [1, 2, 3, *range(start + 10, start + 14)])  # three chains under a shared prefix
    size = ledger.table(ns).bytes // ledger.table(ns).blocks
    # lease_ttl 0: the reconcile checks every block (lease-aware ones leave the trim's next victims out: the
    # eviction-signal tests)
    maintenance = _policy(ledger, store, enforcer, lease_ttl=0)
    budget = [Budget([ns.scope], 8 * size, "alpha")]
    counts = maintenance.tick(budget, ["alpha"], now=100.0)
    assert counts["removed"] > 0 and ledger.table(ns).bytes <= 8 * size and counts["checked"] > 0
    check_no_orphans(ledger, ns, store)
    assert maintenance.removed_over_budget == counts["removed"]
    # inside the reconcile interval, no budget over: a probe of PROBE_SAMPLE blocks once the probe interval passed
    assert maintenance.tick(budget, ["alpha"], now=101.0)["checked"] == 0
    assert maintenance.tick(budget, ["alpha"], now=106.0)["checked"] == PROBE_SAMPLE


def test_orphans_below_a_block_the_master_evicted_are_collected_leaves_first():
    store, ns, ledger, connector, enforcer = make()
    hashes = put(connector, ns, list(range(1, 9)))
    for key in ns.keys_for(hashes[3]):  # the master evicts a block mid-chain: 4 blocks below it cannot be hit
        del store.objects[key]
    maintenance = _policy(ledger, store, enforcer, orphan_collection="eager")
    counts = maintenance.tick([], ["alpha"], now=0.0, full=True)
    assert counts["missing"] == 1
    counts = maintenance.tick([], ["alpha"], now=1.0)
    assert counts["orphans_removed"] == 4 and maintenance.removed_orphans == 4
    assert {k for h in hashes[:3] for k in ns.keys_for(h)} == set(store.objects)
    check_no_orphans(ledger, ns, store)


def test_a_store_failure_is_reported_and_the_client_dropped():
    store, ns, ledger, connector, enforcer = make()
    put(connector, ns, [1, 2, 3])
    problems, dropped = [], []

    class Broken:
        tenant_id = "alpha"

        def exists(self, keys):
            raise ConnectionError("master gone")

        batch_is_exist = exists

    maintenance = Maintenance("node-a", ledger, enforcer, lambda tenant: Broken(),
                              on_problem=lambda part, message: problems.append((part, message)),
                              on_store_failure=dropped.append)
    assert maintenance.tick([], ["alpha"], now=0.0, enforce=False) == {"checked": 0, "missing": 0, "removed": 0,
                                                                       "orphans_removed": 0}
    assert dropped == ["alpha"] and problems[0][0] == "store:alpha" and "master gone" in problems[0][1]


def test_the_simulator_and_the_engine_path_run_this_policy():
    from agent.node.engines import NodeEngines
    from agent.sim.workload import EngineSimulator

    assert isinstance(EngineSimulator("node-a", Ledger()).maintenance, Maintenance)
    assert isinstance(NodeEngines("node-a", Ledger(), "/nonexistent", interval=0).maintenance, Maintenance)


def test_orphan_collection_off_leaves_the_orphans_to_the_master():
    store, ns, ledger, connector, enforcer = make()
    hashes = put(connector, ns, list(range(1, 9)))
    for key in ns.keys_for(hashes[3]):
        del store.objects[key]
    maintenance = _policy(ledger, store, enforcer, orphan_collection=False)
    assert maintenance.tick([], ["alpha"], now=0.0, full=True)["missing"] == 1
    for now in (1.0, 10.0, 100.0):  # past every foreign-check and orphan interval: still nothing removed
        assert maintenance.tick([], ["alpha"], now=now)["orphans_removed"] == 0
    assert maintenance.removed_orphans == 0
    assert {k for h in hashes[:3] + hashes[4:] for k in ns.keys_for(h)} == set(store.objects)


def test_the_budget_policy_is_chosen_by_name():
    from agent.datapath.budget import BUDGET_POLICIES, DEFAULT_BUDGET_POLICY, budget_policy_factory
    from agent.datapath.eviction import HitDensityPolicy, LeafLRUPolicy
    from agent.node.engines import NodeEngines

    assert budget_policy_factory("lru") is LeafLRUPolicy and budget_policy_factory(DEFAULT_BUDGET_POLICY) is \
        HitDensityPolicy is BudgetEnforcer(Ledger()).policy_factory
    inferred = budget_policy_factory("hit-density-inferred")()
    assert isinstance(inferred, HitDensityPolicy) and inferred.infer_access and not HitDensityPolicy().infer_access
    with pytest.raises(ValueError, match="hit-density, hit-density-inferred, lru"):
        budget_policy_factory("belady")
    engines = NodeEngines("node-a", Ledger(), "/nonexistent", interval=0, budget_policy="lru",
                          orphan_collection=False)
    assert engines.budget.policy_factory is LeafLRUPolicy and engines.maintenance.orphan_collection == "off"
    default = NodeEngines("node-a", Ledger(), "/nonexistent", interval=0)
    assert default.budget.policy_factory is BUDGET_POLICIES["hit-density"] and \
        default.maintenance.orphan_collection == "pressure"


def _orphaned_chain():
    """Eight blocks of one chain, the fourth evicted by the master: blocks 5-8 are orphans (4 blocks)."""
    store, ns, ledger, connector, enforcer = make()
    hashes = put(connector, ns, list(range(1, 9)))
    for key in ns.keys_for(hashes[3]):
        del store.objects[key]
    return store, ns, ledger, enforcer, hashes


def test_under_the_pressure_rule_orphans_stay_while_the_tenant_is_under_its_budgets():
    store, ns, ledger, enforcer, hashes = _orphaned_chain()
    maintenance = _policy(ledger, store, enforcer)  # the default rule
    assert maintenance.orphan_collection == "pressure"
    size = ledger.table(ns).bytes // ledger.table(ns).blocks
    roomy = [Budget([ns.scope], 100 * size, "alpha")]
    assert maintenance.tick(roomy, ["alpha"], now=0.0, full=True)["missing"] == 1
    for now in (1.0, 10.0, 100.0):  # a parent recomputed later would make them reachable again: kept
        assert maintenance.tick(roomy, ["alpha"], now=now)["orphans_removed"] == 0
    assert len(store.objects) == 7 * len(ns.keys_for(hashes[0]))


def test_under_pressure_orphans_go_before_any_reachable_block():
    store, ns, ledger, enforcer, hashes = _orphaned_chain()
    maintenance = _policy(ledger, store, enforcer)
    size = ledger.table(ns).bytes // ledger.table(ns).blocks
    maintenance.tick([], ["alpha"], now=0.0, full=True)
    # 7 blocks held, budget of 5: removing the 4 orphans suffices; not one of the 3 reachable blocks goes
    counts = maintenance.tick([Budget([ns.scope], 5 * size, "alpha")], ["alpha"], now=1.0)
    assert (counts["orphans_removed"], counts["removed"]) == (4, 0)
    assert {k for h in hashes[:3] for k in ns.keys_for(h)} == set(store.objects)
    check_no_orphans(ledger, ns, store)


def test_a_master_eviction_inside_the_tenant_is_pressure_for_a_while():
    store, ns, ledger, enforcer, hashes = _orphaned_chain()
    signals = []

    class Watch:  # the master's counters: the tenant's eviction counter grew once, at the first poll
        active = True
        last_error = None

        def due(self, now):
            return True

        def poll(self, now):
            signals.append(now)
            tenants = {"alpha"} if len(signals) == 1 else set()
            return SimpleNamespace(affected=lambda names: sorted(set(names) & tenants), restarted=False)

    maintenance = _policy(ledger, store, enforcer, eviction_watch=Watch())
    assert maintenance.tick([], ["alpha"], now=0.0)["missing"] == 1  # the signal's full reconcile finds the cut
    assert maintenance.tick([], ["alpha"], now=1.0)["orphans_removed"] == 4
    store2, ns2, ledger2, enforcer2, _ = _orphaned_chain()
    later = _policy(ledger2, store2, enforcer2, eviction_watch=Watch())
    signals.clear()
    later.tick([], ["alpha"], now=0.0)
    assert later.tick([], ["alpha"], now=PRESSURE_WINDOW + 1.0)["orphans_removed"] == 0  # the pressure has passed


def test_the_orphan_rule_names():
    assert [orphan_rule(v) for v in ("pressure", "eager", "off", True, False)] == \
        ["pressure", "eager", "off", "eager", "off"]
    with pytest.raises(ValueError, match="pressure, eager, off"):
        orphan_rule("sometimes")
