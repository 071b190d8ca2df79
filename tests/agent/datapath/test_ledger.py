"""Occupancy ledger: counters, prefix tree, orphans, reconciliation (in memory; the real store is in
test_connector_integration.py)."""

from __future__ import annotations

import random

import pytest

from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import Ledger, Outcome
from tests.support.fakes import FakeStore

S, E, F, D = Outcome.STORED, Outcome.EXISTED, Outcome.FAILED, Outcome.DROPPED
SIZE = 1000


def ns(**kw) -> KeySpace:
    base = dict(tenant_id="alpha", engine="vllm", served_model_name="m", namespace="r", block_size=4,
                hash_algo="sha256_cbor", request_group="g", cache_salt="salt")
    base.update(kw)
    return KeySpace(**base)


def chain(n: int, namespace: KeySpace | None = None, start: int = 0) -> list[bytes]:
    return (namespace or ns()).block_hashes(list(range(start, start + 4 * n)))


def broken_above(t, e) -> bool:
    """Brute force: some known ancestor of ``e`` (parent, grandparent, ...) is absent."""
    parent = t.entries.get(e.parent) if e.parent is not None else None
    while parent is not None:
        if not parent.present:
            return True
        parent = t.entries.get(parent.parent) if parent.parent is not None else None
    return False


def recount(ledger: Ledger, n: KeySpace) -> tuple[int, int, int, int]:
    """Brute-force blocks/bytes/orphaned_blocks/orphaned_bytes from the entries (orphan: any ancestor absent)."""
    t = ledger.table(n)
    live = [e for e in t.entries.values() if e.owned and e.present]
    orphans = [e for e in live if broken_above(t, e)]
    return len(live), sum(e.size for e in live), len(orphans), sum(e.size for e in orphans)


def counters(ledger: Ledger, n: KeySpace) -> tuple[int, int, int, int]:
    t = ledger.table(n)
    return t.blocks, t.bytes, t.orphaned_blocks, t.orphaned_bytes


def test_put_builds_the_prefix_tree() -> None:
    led, n = Ledger(), ns()
    h = chain(5)
    led.record_put(n, h, None, [S] * 5, SIZE)
    t = led.table(n)
    assert (t.blocks, t.bytes, t.puts) == (5, 5 * SIZE, 5)
    assert [e.key for e in t.leaves()] == [n.primary_key(h[4])]
    assert [e.key for e in t.ancestors(n.primary_key(h[4]))] == [n.primary_key(x) for x in reversed(h[:4])]
    assert t.get(n.primary_key(h[0])).parent is None and t.get(n.primary_key(h[2])).children_count == 1
    # a branch off block 1
    other = n.block_hashes(list(range(8)) + [99] * 4)
    led.record_put(n, other[2:], other[1], [S], SIZE)
    assert t.get(n.primary_key(h[1])).children_count == 2 and len(list(t.leaves())) == 2


def test_master_eviction_creates_and_clears_orphans() -> None:
    led, n = Ledger(), ns()
    h = chain(5)
    led.record_put(n, h, None, [S] * 5, SIZE)
    keys = [n.primary_key(x) for x in h]
    assert led.mark_evicted(n, [keys[2]]) == 1
    assert counters(led, n) == (4, 4 * SIZE, 2, 2 * SIZE)  # blocks 3 and 4 lost their prefix
    led.mark_evicted(n, [keys[3]])
    assert counters(led, n) == (3, 3 * SIZE, 1, SIZE)  # now block 4 is the only orphan
    led.record_put(n, h[2:4], h[1], [S, S], SIZE)  # parents come back
    assert counters(led, n) == (5, 5 * SIZE, 0, 0)
    led.mark_evicted(n, keys[2:])
    t = led.table(n)
    assert counters(led, n) == (2, 2 * SIZE, 0, 0) and set(t.entries) == set(keys[:2])  # tombstones collected
    assert t.evicted_blocks == t.master_evicted_blocks == 5


def test_orphans_are_every_descendant_of_a_missing_block_three_levels_down() -> None:
    led, n = Ledger(), ns()
    h = chain(4)  # root -> b1 -> b2 -> b3
    led.record_put(n, h, None, [S] * 4, SIZE)
    keys = [n.primary_key(x) for x in h]
    branch = n.block_hashes(list(range(8)) + [77] * 4)[2]  # a second child of b1
    led.record_put(n, [branch], h[1], [S], 2 * SIZE)
    t = led.table(n)
    led.mark_evicted(n, [keys[0]])  # the root goes: its children, grandchildren and great-grandchild orphan
    assert counters(led, n) == (4, 5 * SIZE, 4, 5 * SIZE) == recount(led, n)
    assert all(t.is_orphan(t.get(k)) for k in keys[1:])
    assert led.snapshot()[0]["orphaned_bytes"] == 5 * SIZE
    led.mark_evicted(n, [keys[2]])  # a second gap below the first changes nothing for b3
    assert counters(led, n) == (3, 4 * SIZE, 3, 4 * SIZE) == recount(led, n)
    led.record_put(n, h[:1], None, [S], SIZE)  # the root returns: b1, the branch are reachable again, b3 is not
    assert counters(led, n) == (4, 5 * SIZE, 1, SIZE) == recount(led, n)
    assert t.is_orphan(t.get(keys[3])) and not t.is_orphan(t.get(keys[1]))
    led.record_put(n, h[2:3], h[1], [S], SIZE)  # the gap fills: nothing orphaned below any more
    assert counters(led, n) == (5, 6 * SIZE, 0, 0) == recount(led, n)


def test_an_absent_foreign_ancestor_orphans_the_owned_blocks_below_it() -> None:
    led, n = Ledger(), ns()
    h = chain(4)
    led.record_put(n, h, None, [E, S, E, S], SIZE)  # another instance wrote blocks 0 and 2
    keys = [n.primary_key(x) for x in h]
    led.mark_evicted(n, [keys[0]])  # its first block vanished: both our blocks are unreachable
    assert counters(led, n) == (2, 2 * SIZE, 2, 2 * SIZE) == recount(led, n)
    assert led.table(n).evicted_blocks == 0


def test_existing_blocks_are_foreign_parents_not_counted() -> None:
    led, n = Ledger(), ns()
    h = chain(4)
    led.record_put(n, h, None, [E, E, S, E], SIZE)
    t = led.table(n)
    assert (t.blocks, t.skipped_blocks) == (1, 3)
    keys = [n.primary_key(x) for x in h]
    assert set(t.entries) == set(keys[:3])  # the foreign leaf after our block is dropped, its parents kept
    assert not t.get(keys[0]).owned and t.get(keys[2]).owned
    led.mark_evicted(n, [keys[1]])  # another node's block vanished: ours is orphaned
    assert counters(led, n) == (1, SIZE, 1, SIZE) and t.evicted_blocks == 0


def test_failed_and_dropped_blocks_are_never_claimed() -> None:
    led, n = Ledger(), ns()
    h = chain(5)
    led.record_put(n, h, None, [S, S, F, D, D], SIZE)
    t = led.table(n)
    assert (t.blocks, t.puts, t.failed_blocks, t.dropped_blocks) == (2, 2, 1, 2)
    assert led.present_keys(n) == {n.primary_key(x) for x in h[:2]}


def test_lookup_counts_hits_and_detects_evictions() -> None:
    led, n = Ledger(clock=iter(range(100)).__next__), ns()
    h = chain(4)
    led.record_put(n, h, None, [S] * 4, SIZE)
    assert led.record_lookup(n, h, [True, True, False, True]) == 2
    t = led.table(n)
    assert (t.hit_blocks, t.miss_blocks, t.master_evicted_blocks) == (2, 2, 1)
    e0, e3 = t.get(n.primary_key(h[0])), t.get(n.primary_key(h[3]))
    assert e0.hit_count == 1 and e3.hit_count == 0 and e0.last_access > e0.created_at
    assert counters(led, n) == (3, 3 * SIZE, 1, SIZE)
    led.record_get(n, h[:2], [True, True])
    assert t.gets == 2


def test_removed_by_agent_counts_separately() -> None:
    led, n = Ledger(), ns()
    h = chain(3)
    led.record_put(n, h, None, [S] * 3, SIZE)
    assert led.record_removed(n, [h[2]]) == 1
    t = led.table(n)
    assert (t.agent_evicted_blocks, t.master_evicted_blocks, t.evicted_blocks, t.blocks) == (1, 0, 1, 2)


def test_snapshot_matches_report_schema() -> None:
    from agent.contract.messages import ScopeOccupancy

    led = Ledger()
    a, b = ns(), ns(request_group="other", cache_salt="x")
    led.record_put(a, chain(3, a), None, [S] * 3, SIZE)
    led.record_put(b, chain(1, b), None, [S], SIZE)
    rows = led.snapshot()
    assert len(rows) == 2
    for row in rows:
        ScopeOccupancy.model_validate(row)  # extra="forbid": exactly the report fields
    assert {(r["request_group"], r["blocks"], r["bytes"]) for r in rows} == {("g", 3, 3 * SIZE), ("other", 1, SIZE)}
    assert "orphaned_blocks" in led.snapshot(detail=True)[0]


def test_reconcile_samples_then_sweeps() -> None:
    led, n = Ledger(), ns()
    store = FakeStore("alpha")
    h = chain(200)
    for key in n.keys(h):
        store.objects[key] = b"x"
    led.record_put(n, h, None, [S] * 200, SIZE)
    assert led.reconcile(store, sample=16) == led.reconcile(store, sample=16)  # nothing missing: sample only
    assert led.reconcile(store, sample=16).checked == 16
    gone = random.Random(3).sample(range(200), 80)
    store.evict([n.primary_key(h[i]) for i in gone])
    res = led.reconcile(store, sample=16, rng=random.Random(1))
    assert res.full and res.missing == 80
    assert led.present_keys(n) == set(store.objects)
    assert counters(led, n) == recount(led, n) and led.table(n).master_evicted_blocks == 80
    other_tenant = FakeStore("beta")
    assert led.reconcile(other_tenant).checked == 0


def test_reconcile_removes_lone_sglang_halves() -> None:
    led = Ledger()
    n = KeySpace(tenant_id="alpha", engine="sglang", served_model_name="m", hash_algo="sha256", block_size=4)
    store = FakeStore("alpha")
    h = n.block_hashes(list(range(12)))
    for key in n.keys(h):
        store.objects[key] = b"x"
    led.record_put(n, h, None, [S] * 3, SIZE)
    k_key, v_key = n.keys_for(h[1])
    del store.objects[v_key]
    assert led.reconcile(store, sample=None).missing == 1
    assert k_key not in store.objects
    assert (led.table(n).blocks, led.table(n).orphaned_blocks) == (2, 1)


def test_property_counters_equal_recount_under_random_operations() -> None:
    rng = random.Random(2024)
    led, n = Ledger(), ns()
    prompts = [chain(rng.randrange(1, 8), start=rng.randrange(3) * 1000) for _ in range(12)]
    for _ in range(400):
        h = rng.choice(prompts)
        op = rng.randrange(5)
        if op == 0:
            cut = rng.randrange(len(h))
            outcomes = [rng.choice([S, S, E, F]) for _ in h[cut:]]
            led.record_put(n, h[cut:], h[cut - 1] if cut else None, outcomes, rng.choice([SIZE, 2 * SIZE]))
        elif op == 1:
            led.mark_evicted(n, [n.primary_key(x) for x in rng.sample(h, rng.randrange(1, len(h) + 1))])
        elif op == 2:
            led.record_lookup(n, h, [rng.random() < 0.7 for _ in h])
        elif op == 3:
            led.record_removed(n, [h[-1]])
        else:
            led.record_get(n, h, [rng.random() < 0.8 for _ in h])
        assert counters(led, n) == recount(led, n)
        t = led.table(n)
        for e in t.entries.values():
            assert e.children_count == sum(1 for c in e.children if c in t.entries and t.entries[c].present)
            assert e.present or e.children, "absent childless entries must be collected"


def test_record_put_rejects_mismatched_outcomes() -> None:
    with pytest.raises(ValueError):
        Ledger().record_put(ns(), chain(2), None, [S], SIZE)
