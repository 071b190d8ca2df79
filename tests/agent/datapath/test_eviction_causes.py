"""Evictions by cause per cache scope (``agent.datapath.ledger``): the master's (``store_evicted_blocks``), the
agent's over a budget (``budget_evicted_blocks``, ``Maintenance.enforce_budgets``) and as orphans
(``orphan_removed_blocks``, ``Maintenance.collect_orphans``); ``evicted_blocks`` is their sum; a purge is none of
them. The report row carries the three (``ScopeOccupancy``; 0 from older agents)."""
from __future__ import annotations

import pytest

from agent.contract.messages import ScopeOccupancy
from agent.datapath.ledger import Ledger
from agent.datapath.maintenance import Budget, Maintenance
from tests.agent.datapath.test_budget_unit import make, put


def _row(ledger: Ledger) -> dict:
    (row,) = ledger.snapshot()
    return row


def test_budget_orphan_and_store_evictions_are_counted_apart_and_sum_to_evicted_blocks():
    store, ns, ledger, connector, enforcer = make()
    hashes = put(connector, ns, list(range(1, 9)))
    for start in (100, 200):
        put(connector, ns, [1, 2, *range(start, start + 4)])
    size = ledger.table(ns).bytes // ledger.table(ns).blocks
    maintenance = Maintenance("node-a", ledger, enforcer, lambda tenant: store)
    removed = maintenance.enforce_budgets([Budget([ns.scope], 14 * size, "alpha")])
    assert removed > 0
    for key in ns.keys_for(hashes[2]):                  # the master evicts a block mid-chain
        del store.objects[key]
    maintenance.reconcile(["alpha"], None)
    orphans = maintenance.collect_orphans(["alpha"], now=0.0)
    assert orphans > 0
    row = _row(ledger)
    assert (row["budget_evicted_blocks"], row["orphan_removed_blocks"], row["store_evicted_blocks"]) == (
        removed, orphans, 1)
    assert row["evicted_blocks"] == removed + orphans + 1
    assert ScopeOccupancy.model_validate(row).budget_evicted_blocks == removed


def test_a_purge_is_not_an_eviction():
    store, ns, ledger, connector, enforcer = make()
    put(connector, ns, [1, 2, 3])
    connector.purge_release()
    row = ledger.snapshot(detail=True)[0]
    assert row["evicted_blocks"] == 0 and row["purged_blocks"] == 3 and row["agent_evicted_blocks"] == 3


def test_record_removed_knows_its_causes_only():
    store, ns, ledger, connector, enforcer = make()
    hashes = put(connector, ns, [1, 2, 3])
    assert ledger.record_removed(ns, hashes[2:], "orphan") == 1
    assert ledger.record_removed(ns, hashes[1:2]) == 1   # the default: over a budget (the connector's remover)
    with pytest.raises(ValueError):
        ledger.record_removed(ns, hashes[:1], "purge")  # type: ignore[arg-type]
    row = _row(ledger)
    assert (row["orphan_removed_blocks"], row["budget_evicted_blocks"]) == (1, 1)


def test_older_agents_rows_validate_with_zero_causes():
    row = ScopeOccupancy.model_validate({"tenant_id": "t", "evicted_blocks": 7})
    assert (row.evicted_blocks, row.store_evicted_blocks, row.budget_evicted_blocks,
            row.orphan_removed_blocks) == (7, 0, 0, 0)
