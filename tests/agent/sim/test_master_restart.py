"""A master restart (no HA: every object lost) on a real ``mooncake_master``: the simulator's idle maintenance
drops the lost blocks from the ledger within seconds, and its store client remounts so traffic goes on."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from agent.contract.messages import ConfigDocument
from agent.datapath.ledger import Ledger
from agent.sim.workload import EngineSimulator, WorkItem, WorkloadBatch

pytestmark = pytest.mark.integration
MIB = 1 << 20
LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}


def applied(master) -> SimpleNamespace:
    return SimpleNamespace(document=ConfigDocument.model_validate({
        "node": "node-a", "version": 1, "issued_at": "2026-11-30T00:00:00Z",
        "store": {"master_server_address": master.rpc_address, "metadata_server": master.metadata_server,
                  "global_segment_size": 16 * MIB, "local_buffer_size": 4 * MIB},
        "instances": [{"instance_id": "1", "engine": "vllm", "role": "prefill", "port": 8100, "tenant_id": "acme",
                       "served_model_name": "model-acme", "namespace": "production-2026-07",
                       "release_state": "serving", "kv_layout": LAYOUT, "hash_algo": "sha256_cbor",
                       "hash_seed": "7", "request_groups": [{"name": "app", "cache_salt": "salt-app"}]}]}))


def batch(batch_id: int, first: int) -> dict:
    items = [WorkItem(request_id=first + i, instance_id="1", request_group="app",
                      hash_ids=[1000 * (first + i) + j for j in range(4)]) for i in range(8)]
    return WorkloadBatch(node="node-a", batch_id=batch_id, items=items).to_wire()


def blocks(ledger: Ledger) -> int:
    return sum(table.blocks for table in ledger.tables())


def test_ledger_follows_a_restarted_master_within_seconds(mooncake_master_factory):
    master = mooncake_master_factory({"acme": 12 * MIB})
    ledger = Ledger()
    sim = EngineSimulator("node-a", ledger, reconcile_seconds=1.0)
    try:
        sim.on_apply(applied(master))
        result = sim.run_batch(batch(1, 0))
        assert result["failed_requests"] == 0, result["errors"]
        assert blocks(ledger) == 32 and master.metrics()["master_key_count"] > 0
        sim.start_maintenance()
        master.restart()  # SIGKILL, then a new empty master on the same ports
        restarted = time.monotonic()
        while blocks(ledger) and time.monotonic() - restarted < 30:
            time.sleep(0.2)
        took = time.monotonic() - restarted
        assert blocks(ledger) == 0, f"the ledger still holds {blocks(ledger)} block(s) 30 s after the restart"
        assert took < 15, took
        deadline = time.monotonic() + 30  # the client remounts its segment into the new master, traffic goes on
        while True:
            result = sim.run_batch(batch(2, 100))
            if result["failed_requests"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert result["failed_requests"] == 0, result["errors"]
        assert blocks(ledger) == 32
        assert master.metrics()["master_key_count"] >= 32
    finally:
        sim.close()
