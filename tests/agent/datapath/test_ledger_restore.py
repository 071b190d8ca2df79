"""Ledger.restore: blocks an earlier agent process owned come back as owned present entries, with their prefix tree,
whatever order they are given in (the file behind it: tests/agent/node/test_ledger_file.py)."""
from __future__ import annotations

import random

from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import Ledger, Outcome, RestoredBlock

KS = KeySpace(tenant_id="alpha", engine="vllm", served_model_name="m", namespace="r", block_size=4)


def tree() -> list[RestoredBlock]:
    """Two chains sharing a 3-block prefix: a - b - c - (d - e | f)."""
    h = KS.block_hashes(list(range(4 * 5)))
    f = KS.block_hashes(list(range(4 * 3)) + [99, 98, 97, 96])[-1]
    keys = [None, *[KS.primary_key(x) for x in h]]
    rows = [RestoredBlock(KS, x, keys[i], 100 * (i + 1)) for i, x in enumerate(h)]
    rows.append(RestoredBlock(KS, f, KS.primary_key(h[2]), 50))
    return rows


def test_restore_rebuilds_the_tree_in_any_order():
    reference = Ledger()
    reference.restore(tree())
    for seed in range(5):
        rows = tree()
        random.Random(seed).shuffle(rows)
        ledger = Ledger()
        events: list[tuple[str, str]] = []
        ledger.add_listener(lambda event, table, entry, seen=events: seen.append((event, entry.key)))
        assert ledger.restore(rows) == 6
        t = ledger.table(KS)
        assert (t.blocks, t.bytes, t.orphaned_bytes) == (6, 100 + 200 + 300 + 400 + 500 + 50, 0)
        assert {e.key: e.children_count for e in t.owned_present()} == \
            {e.key: e.children_count for e in reference.table(KS).owned_present()}
        leaf_e = next(r.block_hash for r in rows if r.size == 500)
        leaf_f = next(r.block_hash for r in rows if r.size == 50)
        assert {e.key for e in t.leaves()} == {KS.primary_key(leaf_e), KS.primary_key(leaf_f)}
        # every listener sees each block once, its parent first (a budget enforcer's tree needs that)
        order = [key for _event, key in events]
        assert {event for event, _key in events} == {"insert"} and len(order) == 6
        for e in t.owned_present():
            if e.parent is not None:
                assert order.index(e.parent) < order.index(e.key)


def test_restore_leaves_known_blocks_alone_and_removal_works_after_it():
    ledger = Ledger()
    rows = tree()
    ledger.record_put(KS, [rows[0].block_hash], None, [Outcome.STORED], 7)
    assert ledger.restore(rows) == 5                    # the first block was known: kept as it was
    t = ledger.table(KS)
    assert t.get(KS.primary_key(rows[0].block_hash)).size == 7
    assert t.get(KS.primary_key(rows[0].block_hash)).children_count == 1
    # the master evicted b while the agent was down: c, d, e, f are orphans now
    assert ledger.mark_evicted(KS, [KS.primary_key(rows[1].block_hash)]) == 1
    assert t.orphaned_bytes == 300 + 400 + 500 + 50
