"""On a real ``mooncake_master`` 0.3.13.post1: a tenant filled past its effective quota, so that every further put
evicts inside it (``mooncake_tenant_evict_bytes_total`` grows; the pinned facts are in
``tests/tenants/test_eviction_point_master.py``). The node-maintenance policy, polling the master's ``/metrics``,
reconciles the tenant within a few rounds while the scheduled reconcile is an hour away: the ledger counts exactly
the blocks the master still holds, the others as ``store_evicted_blocks``."""
from __future__ import annotations

import time

import pytest

from agent.datapath.budget import BudgetEnforcer
from agent.datapath.connector import KVConnector
from agent.datapath.eviction_signal import EvictionWatch
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache
from agent.datapath.ledger import Ledger
from agent.datapath.maintenance import Maintenance
from agent.datapath.store import open_store

pytestmark = pytest.mark.integration

MiB = 1 << 20
LEASE = "20ms"  # short leases: the master may evict an object soon after it was written or checked
GAP = 0.05      # seconds between puts: longer than the lease
POLL = 0.2      # seconds between polls of the master's metrics (and between rounds here)
ROUNDS = 10     # the ledger must follow within this many rounds


def test_the_ledger_follows_the_masters_eviction_within_a_few_rounds(mooncake_master_factory, unique_name):
    master = mooncake_master_factory({"a": 96 * MiB, "b": 32 * MiB}, eviction_high_watermark_ratio=0.5,
                                     eviction_ratio=0.5, default_kv_lease_ttl=LEASE)
    # 1 MiB blocks: 4 layers x (K, V) x 4 heads x 64 x 256 tokens x 2 bytes
    spec = KVCacheSpec(num_layers=4, num_kv_heads=4, head_size=64, block_size=256, num_blocks=2, dtype="float16",
                       layout="cross_layer")
    ns = KeySpace(tenant_id="b", engine="vllm", served_model_name="m", namespace=unique_name("evict"),
                  block_size=256, hash_algo="sha256")
    ledger = Ledger()
    with open_store(master.endpoints(global_segment_size=64 * MiB), "b") as store, \
            KVConnector(store, PagedKVCache.allocate(spec), ns, ledger=ledger) as connector:
        assert connector.block_bytes == MiB
        maintenance = Maintenance("node-a", ledger, BudgetEnforcer(ledger), lambda tenant: store,
                                  reconcile_interval=3600.0, probe_interval=0, signal_gap=POLL,
                                  eviction_watch=EvictionWatch(poll_interval=POLL), lease_ttl=0.02)  # LEASE
        maintenance.set_master_metrics([master.metrics_url])
        maintenance.tick([], ["b"])                     # the first scheduled reconcile, and the counters' baseline
        scheduled = maintenance.last_reconcile
        written = []
        for i in range(24):  # b's effective quota is 16 MiB (64 MiB mounted, quotas scaled): the last 8 evict
            [block] = ns.trace_hashes([i])
            connector.put([0], [block])
            written.append(block)
            time.sleep(GAP)
        table = ledger.table(ns)
        assert table.blocks == 24 and table.master_evicted_blocks == 0  # the ledger has not seen it yet
        rounds = 0
        while table.blocks == 24 and rounds < ROUNDS:  # rounds, as the agent runs them (one poll each)
            time.sleep(POLL)
            maintenance.tick([], ["b"])
            rounds += 1
        assert maintenance.signal_reconciles >= 1 and maintenance.last_reconcile == scheduled, (
            maintenance.eviction_watch.last_error)
        present = [code == 1 for code in store.exists(ns.keys(written))]
        assert 0 < sum(present) < 24
        assert table.blocks == sum(present) and table.master_evicted_blocks == 24 - sum(present)
        row = ledger.snapshot()[0]
        assert row["store_evicted_blocks"] == row["evicted_blocks"] == 24 - sum(present)
        assert rounds <= 3, rounds  # one poll after the eviction round, a second one when the first straddled it
