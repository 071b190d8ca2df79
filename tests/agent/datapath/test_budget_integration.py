"""A namespace held under its byte budget on a real mooncake_master (0.3.13.post1) while a slice of the FAST'25
trace runs through a KVConnector: the agent's BudgetEnforcer (HitDensityPolicy) removes leaves without force."""

from __future__ import annotations

import time

import pytest

from agent.datapath.budget import BudgetEnforcer, connector_remover
from agent.datapath.connector import KVConnector
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache
from agent.datapath.ledger import Ledger
from agent.datapath.store import open_store
from agent.sim.trace import read_trace, sorted_by_time
from tests.support.paths import CONVERSATION_TRACE

pytestmark = pytest.mark.integration

#: The workspace's shared traces, next to the repository (never an absolute path).
TRACE = CONVERSATION_TRACE
REQUESTS = 200
BUDGET_BLOCKS = 64
CACHE_BLOCKS = 32


@pytest.mark.skipif(not TRACE.exists(), reason=f"FAST'25 trace not found at {TRACE}")
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_trace_slice_stays_under_budget_without_orphans(mooncake_master_factory, unique_name, engine: str) -> None:
    # every batch_is_exist / get grants a read lease (5 s by default), and the agent never forces a removal: a
    # short lease lets a trace replayed in seconds be trimmed at once (the lease path is in the unit tests)
    master = mooncake_master_factory({"alpha": 1 << 30}, default_kv_lease_ttl=1)
    with open_store(master.endpoints(), "alpha") as store:
        _replay(store, unique_name, engine)


def _replay(store, unique_name, engine: str) -> None:
    spec = KVCacheSpec(num_layers=2, num_kv_heads=1, head_size=16, block_size=16, num_blocks=CACHE_BLOCKS,
                       dtype="bfloat16", layout="cross_layer")
    ns = KeySpace(tenant_id="alpha", engine=engine, served_model_name="org/Model", request_group="g",
                   namespace=unique_name("budget"), block_size=16,
                   hash_algo="sha256")
    ledger = Ledger()
    enforcer = BudgetEnforcer(ledger)
    requests = sorted_by_time(read_trace(TRACE))[:REQUESTS]
    hits = removed = retries = 0
    with KVConnector(store, PagedKVCache.allocate(spec), ns, ledger=ledger, max_batch_blocks=CACHE_BLOCKS) as c:
        budget = BUDGET_BLOCKS * c.block_bytes
        remove = connector_remover(c)
        for req in requests:
            hashes = ns.trace_hashes(req.hash_ids)
            hit = c.lookup(block_hashes=hashes)
            hits += hit
            for start in range(hit, len(hashes), CACHE_BLOCKS):
                chunk = hashes[start:start + CACHE_BLOCKS]
                c.put(list(range(len(chunk))), chunk, parent=hashes[start - 1] if start else None)
            removed += len(enforcer.enforce(ns.scope, budget, remove))
            if ledger.table(ns).bytes > budget:  # a block was still under a read lease: the next call retries it
                time.sleep(0.05)
                retries += 1
                removed += len(enforcer.enforce(ns.scope, budget, remove))
            table = ledger.table(ns)
            assert table.bytes <= budget, (table.blocks, str(enforcer.stats(ns)))
            present = [e for e in table.owned_present()]
            keys = [k for e in present for k in ns.keys_for(e.block_hash)]
            assert all(code == 1 for code in store.exists(keys))  # the master holds what the ledger counts
            assert table.orphaned_bytes == 0
            for e in present:  # every counted block is reachable: its parent is present too
                if e.parent is not None:
                    assert table.get(e.parent) is not None and table.get(e.parent).present
        stats = enforcer.stats(ns)
        assert hits > 0 and removed > 0 and retries < REQUESTS // 4
        assert stats["orphaned_blocks"] == 0 and stats["policy_bytes"] == ledger.table(ns).bytes
        # the master's view of the whole namespace: exactly the objects the ledger counts, nothing left behind
        counted = sum(len(ns.keys_for(e.block_hash)) for e in ledger.table(ns).owned_present())
        assert counted * c.block_bytes // ns.objects_per_block <= budget
        assert store.remove_by_regex(ns.release_regex()) == counted
