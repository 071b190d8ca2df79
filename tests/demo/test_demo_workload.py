"""The simulated engine traffic on a real ``mooncake_master``: prefill on one simulator, decode on another (two
store clients, two mounted segments), real bytes through zero-copy transfers."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.contract.messages import ConfigDocument
from agent.datapath.ledger import Ledger
from agent.sim.trace import read_trace
from agent.sim.workload import EngineSimulator, LaunchOverride, WorkItem, WorkloadBatch
from demo.cli import DEFAULT_TRACE

pytestmark = pytest.mark.integration
MIB = 1 << 20
LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}
BLOCK = 2 * 2 * 2 * 64 * 16 * 2


def applied(node: str, master, instances: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(document=ConfigDocument.model_validate({
        "node": node, "version": 1, "issued_at": "2026-11-30T00:00:00Z",
        "store": {"master_server_address": master.rpc_address, "metadata_server": master.metadata_server,
                  "global_segment_size": 16 * MIB, "local_buffer_size": 4 * MIB},
        "instances": instances}))


def spec(instance_id: str, role: str, port: int, tenant: str, engine: str, budget: int) -> dict:
    return {"instance_id": instance_id, "engine": engine, "role": role, "port": port, "tenant_id": tenant,
            "served_model_name": f"model-{tenant}", "namespace": "production-2026-07", "release_state": "serving",
            "kv_layout": LAYOUT, "hash_algo": "sha256_cbor" if engine == "vllm" else "sha256", "hash_seed": "7",
            "request_groups": [{"name": "app", "cache_salt": "salt-app"}] if tenant == "acme" else [],
            "node_budget_bytes": budget}


@pytest.fixture
def nodes(mooncake_master_factory):
    master = mooncake_master_factory({"acme": 12 * MIB, "globex": 12 * MIB}, eviction_high_watermark_ratio=0.9,
                                     eviction_ratio=0.1)
    decode = EngineSimulator("node-b", Ledger(), overrides={8203: LaunchOverride(namespace="production-2026-7")})
    prefill = EngineSimulator("node-a", Ledger(), handoff=lambda node, batch: decode.run_batch(batch))
    try:
        prefill.on_apply(applied("node-a", master, [spec("1", "prefill", 8100, "acme", "vllm", 6 * MIB),
                                                    spec("3", "prefill", 8102, "globex", "sglang", 6 * MIB)]))
        decode.on_apply(applied("node-b", master, [spec("2", "decode", 8200, "acme", "vllm", 6 * MIB),
                                                   spec("4", "decode", 8202, "globex", "sglang", 6 * MIB),
                                                   spec("9", "decode", 8203, "acme", "vllm", 6 * MIB)]))
        yield SimpleNamespace(master=master, prefill=prefill, decode=decode)
    finally:
        prefill.close()  # before the master stops: a client of a dead master takes long to close
        decode.close()


def snapshot(sim: EngineSimulator) -> dict:
    return {(r["tenant_id"], r["namespace"], r["request_group"]): r for r in sim.snapshot()}


def test_trace_requests_flow_from_prefill_to_decode_through_the_store(nodes):
    # both simulators mounted their segment when the config was applied, before any traffic
    assert nodes.master.metrics()["master_total_capacity_bytes"] == 32 * MIB
    requests = read_trace(DEFAULT_TRACE)[:240]
    items = []
    for i, req in enumerate(requests):
        acme = req.hash_ids[-1] % 3 != 0
        decode = "2" if not acme or i % 5 else "9"  # every fifth acme request decodes on the mistyped instance
        items.append(WorkItem(request_id=i, instance_id="1" if acme else "3", request_group="app" if acme else "",
                              hash_ids=list(req.hash_ids), decode_node="node-b",
                              decode_instance_id=decode if acme else "4"))
    results = [nodes.prefill.run_batch(WorkloadBatch(node="node-a", batch_id=n, items=items[n:n + 16]).to_wire())
               for n in range(0, len(items), 16)]
    assert sum(r["failed_requests"] for r in results) == 0, [r["errors"] for r in results]
    assert sum(r["handed_off"] for r in results) == len(items)
    stored = snapshot(nodes.prefill)
    loaded = snapshot(nodes.decode)
    for tenant, group in (("acme", "app"), ("globex", "")):
        assert stored[(tenant, "production-2026-07", group)]["bytes"] > 0
        # the decode node found and read what the prefill node stored, and every byte matched
        assert loaded[(tenant, "production-2026-07", group)]["hit_blocks"] > 0
        # the agent's budget keeper trims leaves: under budget, nothing orphaned
        assert stored[(tenant, "production-2026-07", group)]["bytes"] <= 6 * MIB
        assert stored[(tenant, "production-2026-07", group)]["orphaned_bytes"] == 0
        assert stored[(tenant, "production-2026-07", group)]["evicted_blocks"] > 0
    typo = loaded[("acme", "production-2026-7", "app")]
    assert typo["hit_blocks"] == 0 and typo["miss_blocks"] > 0
    assert nodes.decode.batches == len(items)
    quotas = {q["tenant_id"]: q for q in nodes.master.tenant_quotas()}
    assert quotas["acme"]["charged_bytes"] == stored[("acme", "production-2026-07", "app")]["bytes"]
    assert quotas["globex"]["charged_bytes"] == stored[("globex", "production-2026-07", "")]["bytes"]
