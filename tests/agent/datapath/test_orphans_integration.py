"""Cross-node orphans on a real mooncake_master (0.3.13.post1): node-b's blocks continue node-a's chain; node-a
removes its leaf (the parent of node-b's); node-b's ledger finds that foreign parent gone, counts its subtree as
orphaned and removes it by exact key, leaves first, without force."""

from __future__ import annotations

import time

import pytest

from agent.datapath.budget import store_remover
from agent.datapath.connector import KVConnector
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache
from agent.datapath.ledger import Ledger
from agent.datapath.store import open_store

pytestmark = pytest.mark.integration


def test_a_foreign_parent_removed_by_its_writer_orphans_and_collects_the_other_nodes_blocks(
        mooncake_master_factory, unique_name) -> None:
    master = mooncake_master_factory({"alpha": 1 << 30}, default_kv_lease_ttl=1)
    spec = KVCacheSpec(num_layers=2, num_kv_heads=1, head_size=16, block_size=16, num_blocks=8,
                       dtype="bfloat16", layout="cross_layer")
    ns = KeySpace(tenant_id="alpha", engine="vllm", served_model_name="org/Model", request_group="g",
                  namespace=unique_name("orphans"), block_size=16, hash_algo="sha256")
    h = ns.block_hashes(list(range(16 * 7)))
    with open_store(master.endpoints(), "alpha") as store_a, open_store(master.endpoints(), "alpha") as store_b:
        led_a, led_b = Ledger(), Ledger()
        with KVConnector(store_a, PagedKVCache.allocate(spec), ns, ledger=led_a) as a, \
                KVConnector(store_b, PagedKVCache.allocate(spec), ns, ledger=led_b) as b:
            a.put([0, 1, 2, 3], h[:4])
            b.put([0, 1, 2], h[4:7], parent=h[3])  # node-b continues node-a's chain
            tb = led_b.table(ns)
            assert (tb.blocks, tb.orphaned_blocks) == (3, 0)
            assert led_b.check_foreign_parents(store_b, recheck_after=0).missing == 0
            assert tb.orphaned_blocks == 0
            time.sleep(1.2)  # the check's read lease on h[3] (1 s here) ends
            assert store_remover(store_a, led_a)(ns, [h[3]]) == 1  # node-a trims its leaf
            assert led_b.check_foreign_parents(store_b, recheck_after=0).missing == 1
            assert tb.orphaned_blocks == 3 and led_b.confirm_cuts(store_b) == 0
            remove = store_remover(store_b, led_b)
            removed = 0
            while leaves := led_b.orphan_leaves("alpha"):
                assert list(leaves.values()) == [[h[6 - removed]]]  # leaves first
                removed += sum(remove(k, v) for k, v in leaves.items())
            assert removed == 3 and (tb.blocks, tb.orphaned_blocks) == (0, 0)
            assert store_a.exists(ns.keys(h[:7])) == [1, 1, 1, 0, 0, 0, 0]
            store_a.remove(ns.keys(h[:3]), force=False)
