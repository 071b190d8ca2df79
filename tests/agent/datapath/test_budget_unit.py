"""BudgetEnforcer with an in-memory store: leaf-first victims, refusals that orphan nothing, master evictions as
orphans, SGLang halves removed together (the same paths run on a real master in test_budget_integration.py)."""

from __future__ import annotations

import math

import pytest

from agent.datapath.budget import BudgetEnforcer, connector_remover
from agent.datapath.connector import KVConnector
from agent.datapath.errors import TransferFailed
from agent.datapath.eviction import LeafLRUPolicy
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache
from agent.datapath.ledger import Ledger
from tests.support.fakes import FakeStore

BS = 4


def make(engine: str = "vllm", policy=None):
    store = FakeStore()
    spec = KVCacheSpec(num_layers=2, num_kv_heads=1, head_size=8, block_size=BS, num_blocks=16, dtype="float16",
                       layout="cross_layer")
    ns = KeySpace(tenant_id="alpha", engine=engine, served_model_name="m", namespace="r", block_size=BS,
                   hash_algo="sha256")
    ledger = Ledger()
    connector = KVConnector(store, PagedKVCache.allocate(spec), ns, ledger=ledger)
    enforcer = BudgetEnforcer(ledger, policy) if policy else BudgetEnforcer(ledger)
    return store, ns, ledger, connector, enforcer


def put(connector: KVConnector, ns: KeySpace, hash_ids: list[int]) -> list[bytes]:
    hashes = ns.trace_hashes(hash_ids)
    hit = connector.lookup(block_hashes=hashes)
    if hit < len(hashes):
        connector.put(list(range(len(hashes) - hit)), hashes[hit:], parent=hashes[hit - 1] if hit else None)
    return hashes


def check_no_orphans(ledger: Ledger, ns: KeySpace, store: FakeStore) -> None:
    table = ledger.table(ns)
    assert table.orphaned_bytes == 0
    for entry in table.owned_present():
        assert all(k in store.objects for k in ns.keys_for(entry.block_hash))
        if entry.parent is not None:
            parent = table.get(entry.parent)
            assert parent is not None and parent.present


@pytest.mark.parametrize("policy", [None, LeafLRUPolicy])
def test_over_budget_removes_leaves_only_and_stops_at_the_budget(policy) -> None:
    store, ns, ledger, connector, enforcer = make(policy=policy)
    size = connector.block_bytes
    put(connector, ns, [1, 2, 3, 4, 5])
    put(connector, ns, [1, 2, 3, 9, 10])
    put(connector, ns, [1, 20, 21])
    assert ledger.table(ns).blocks == 9 and enforcer.policy(ns).used_bytes == 9 * size
    assert enforcer.enforce(ns.scope, 9 * size, connector_remover(connector)) == []  # at the budget: nothing
    leaves_before = {e.key for e in ledger.table(ns).leaves()}
    removed = enforcer.enforce(ns.scope, 5 * size, connector_remover(connector))
    assert len(removed) == 4 and ledger.table(ns).bytes == 5 * size
    assert removed[0] in leaves_before  # the first victim was a leaf when chosen
    assert ns.primary_key(ns.trace_hashes([1])[0]) not in removed  # the shared root stays
    check_no_orphans(ledger, ns, store)
    assert len(store.objects) == 5
    assert enforcer.stats(ns)["orphaned_blocks"] == 0 and enforcer.stats(ns)["budget_removed_blocks"] == 4


def test_a_refused_leaf_keeps_its_ancestors_and_the_rest_goes() -> None:
    store, ns, ledger, connector, enforcer = make(policy=LeafLRUPolicy)
    size = connector.block_bytes
    old = put(connector, ns, [1, 2, 3, 4])
    put(connector, ns, [7, 8, 9, 10])
    store.fail[ns.primary_key(old[-1])] = -706  # another client reads the oldest leaf: a read lease
    removed = enforcer.enforce(ns.scope, 4 * size, connector_remover(connector))
    assert ns.primary_key(old[-1]) not in removed
    assert all(ns.primary_key(h) not in removed for h in old)  # its ancestors stay: no orphan
    assert len(removed) == 4 and ledger.table(ns).bytes == 4 * size
    check_no_orphans(ledger, ns, store)
    assert enforcer.stats(ns)["budget_refused_blocks"] >= 1


def test_a_failed_removal_raises_and_still_orphans_nothing() -> None:
    store, ns, ledger, connector, enforcer = make(policy=LeafLRUPolicy)
    size = connector.block_bytes
    hashes = put(connector, ns, [1, 2, 3, 4])
    store.fail[ns.primary_key(hashes[2])] = -800  # the store fails the third block's removal outright
    with pytest.raises(TransferFailed, match="remove"):
        enforcer.enforce(ns.scope, size, connector_remover(connector))
    table = ledger.table(ns)
    assert table.get(ns.primary_key(hashes[3])) is None or not table.get(ns.primary_key(hashes[3])).present
    assert {e.key for e in table.owned_present()} == {ns.primary_key(h) for h in hashes[:3]}
    check_no_orphans(ledger, ns, store)


def test_sglang_halves_are_removed_together() -> None:
    store, ns, ledger, connector, enforcer = make("sglang")
    size = connector.block_bytes
    put(connector, ns, [1, 2, 3, 4])
    assert len(store.objects) == 8
    removed = enforcer.enforce(ns.scope, 2 * size, connector_remover(connector))
    assert len(removed) == 2 and len(store.objects) == 4
    assert all(k[:-2] + "_k" in store.objects and k[:-2] + "_v" in store.objects for k in store.objects)
    check_no_orphans(ledger, ns, store)


def test_master_evictions_are_reported_as_orphans_and_planned_first() -> None:
    store, ns, ledger, connector, enforcer = make()
    size = connector.block_bytes
    hashes = put(connector, ns, [1, 2, 3, 4, 5])
    store.evict(ns.keys([hashes[1]]))  # the master evicts an inner block: it knows no prefixes
    assert connector.lookup(block_hashes=hashes) == 1  # the lookup sees the gap; the ledger records it
    stats = enforcer.stats(ns)
    assert stats["orphaned_blocks"] == 3 and stats["orphaned_bytes"] == 3 * size
    assert ledger.table(ns).orphaned_bytes > 0  # the ledger reports it too (blocks whose parent is gone)
    removed = enforcer.enforce(ns.scope, 1 * size, connector_remover(connector))
    assert removed == [ns.primary_key(h) for h in (hashes[4], hashes[3], hashes[2])]  # orphans, deepest first
    assert enforcer.stats(ns)["orphaned_blocks"] == 0 and ledger.table(ns).orphaned_bytes == 0


def test_a_release_budget_spans_its_request_groups() -> None:
    store, ns, ledger, connector, enforcer = make(policy=LeafLRUPolicy)
    size = connector.block_bytes
    other = ns.replace(cache_salt="s2", request_group="g2")
    put(connector, ns, [1, 2, 3, 4])
    hashes = other.trace_hashes([1, 2, 3, 4])
    connector.put(list(range(4)), hashes, keyspace=other)
    removed = enforcer.enforce([ns.scope, other.scope], 4 * size, connector_remover(connector))
    assert len(removed) == 4
    assert ledger.table(ns).bytes == 2 * size and ledger.table(other).bytes == 2 * size  # in proportion
    check_no_orphans(ledger, ns, store)
    with pytest.raises(ValueError, match="budget_bytes"):
        enforcer.enforce(ns.scope, -1, connector_remover(connector))


def test_the_enforcer_adopts_blocks_stored_before_it_existed() -> None:
    store, ns, ledger, connector, _ = make()
    put(connector, ns, [1, 2, 3])
    late = BudgetEnforcer(ledger)
    assert len(late.policy(ns)) == 3 and late.stats(ns)["orphaned_blocks"] == 0


@pytest.mark.parametrize("budget_blocks", [3, 9, 13, 16, 17, 19])
@pytest.mark.parametrize("low_water", [0.9, 0.75, 1.0])
def test_the_trim_ends_at_the_low_water_mark_in_whole_blocks_across_groups(budget_blocks, low_water) -> None:
    """Two request groups of a release, 10 blocks each, over a budget of whole blocks and a byte more: the trim
    ends on the whole-block amount at or above ``ceil(low_water * budget)`` (at most the budget), the same for
    any split between the groups — never a block per group below it, as a per-group rounding would."""
    store, ns, ledger, connector, enforcer = make(policy=LeafLRUPolicy)
    size = connector.block_bytes
    other = ns.replace(cache_salt="s2", request_group="g2")
    put(connector, ns, [1, 2, 3, 4, 5])
    put(connector, ns, [1, 2, 6, 7, 8, 9])
    connector.put(list(range(10)), other.trace_hashes(list(range(20, 30))), keyspace=other)
    for budget in (budget_blocks * size, budget_blocks * size + 1):
        mark = min(budget, math.ceil(budget * low_water))
        expected = min(budget // size, -(-mark // size))  # brute force: the whole blocks in [mark, budget]
        held = ledger.table(ns).blocks + ledger.table(other).blocks
        removed = enforcer.enforce([ns.scope, other.scope], budget, connector_remover(connector),
                                   low_water=low_water)
        after = ledger.table(ns).blocks + ledger.table(other).blocks
        if held * size <= budget:
            assert removed == [] and after == held
        else:
            assert after == expected, (budget / size, low_water, after, expected)
            assert len(removed) == held - after
        assert len(store.objects) == after
        check_no_orphans(ledger, ns, store)
        check_no_orphans(ledger, other, store)


def test_next_victims_is_the_coming_trim_and_removes_nothing():
    """``BudgetEnforcer.next_victims`` plans what ``enforce`` would remove (the same blocks) without removing any;
    ``ahead_bytes`` extends the plan by that much more (the trims of the coming lease); under its mark: nothing."""
    store, ns, ledger, connector, enforcer = make()
    for start in (10, 20, 30, 40):
        put(connector, ns, list(range(start, start + 4)))
    size = connector.block_bytes
    table = ledger.table(ns)
    assert enforcer.next_victims(ns.scope, 16 * size) == set()
    planned = enforcer.next_victims(ns.scope, 12 * size, low_water=0.9)
    ahead = enforcer.next_victims(ns.scope, 12 * size, low_water=0.9, ahead_bytes=4 * size)
    assert table.blocks == 16 and len(planned) == 5 and planned < ahead and len(ahead) >= len(planned) + 4
    removed = enforcer.enforce(ns.scope, 12 * size, connector_remover(connector), low_water=0.9)
    assert set(removed) == planned
    check_no_orphans(ledger, ns, store)
    with pytest.raises(ValueError):
        enforcer.next_victims(ns.scope, 12 * size, ahead_bytes=-1)
