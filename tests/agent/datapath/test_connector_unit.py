"""Connector logic on an in-memory store: call shapes, skipping, failures, prefix rules, namespace swaps.

The same paths run against a real mooncake_master in test_connector_integration.py.
"""

from __future__ import annotations

import threading

import pytest
import torch

from agent.datapath.connector import KVConnector
from agent.datapath.errors import (
    LayoutError,
    QuotaExceeded,
    RpcFailed,
    StoreError,
    TransferFailed,
)
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache
from agent.datapath.ledger import Ledger
from tests.support.fakes import FakeStore

BS = 4
TOKENS = list(range(1000, 1000 + 6 * BS + 2))  # 6 full blocks and a partial one


def cache(layout: str = "per_layer", seed: int = 0) -> PagedKVCache:
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_size=8, block_size=BS, num_blocks=16, dtype="float16",
                       layout=layout)
    c = PagedKVCache.allocate(spec)
    g = torch.Generator().manual_seed(seed)
    for t in c.tensors:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return c


def vllm(**kw) -> KeySpace:
    base = dict(tenant_id="alpha", engine="vllm", served_model_name="m", namespace="r", block_size=BS,
                hash_algo="sha256_cbor")
    base.update(kw)
    return KeySpace(**base)


def sglang(**kw) -> KeySpace:
    base = dict(tenant_id="alpha", engine="sglang", served_model_name="m", namespace="r", block_size=BS,
                hash_algo="sha256")
    base.update(kw)
    return KeySpace(**base)


def same_blocks(a: PagedKVCache, ids_a: list[int], b: PagedKVCache, ids_b: list[int]) -> bool:
    return all(torch.equal(a.block_view(x).view(torch.uint8), b.block_view(y).view(torch.uint8))
               for x, y in zip(ids_a, ids_b))


@pytest.mark.parametrize("layout, make_ns, put_call", [
    ("per_layer", vllm, "put_from_multi"), ("cross_layer", vllm, "put_from"),
    ("per_layer", sglang, "put_from_multi"), ("cross_layer", sglang, "put_from_multi"),
])
def test_round_trip_uses_zero_copy_calls(layout: str, make_ns, put_call: str) -> None:
    store = FakeStore()
    src, dst = cache(layout, 1), cache(layout, 2)
    ns = make_ns()
    c = KVConnector(store, src, ns)
    r = c.save(TOKENS, list(range(7)))
    assert (r.stored, r.existing, r.bytes_written) == (6, 0, 6 * src.spec.block_bytes)
    assert put_call in store.calls and len(store.objects) == 6 * ns.objects_per_block
    assert set(store.registered) == {p for p, _ in src.memory_regions()}
    d = KVConnector(store, dst, ns)
    assert d.load(TOKENS, [10, 11, 12, 13, 14, 15]) == 6
    assert same_blocks(src, list(range(6)), dst, list(range(10, 16)))
    if ns.engine == "sglang":
        config = store.configs[-1]
        assert config["group_ids"][0] == config["group_ids"][1] != config["group_ids"][2]


def test_existing_blocks_are_skipped() -> None:
    store = FakeStore()
    c = KVConnector(store, cache(), vllm())
    c.save(TOKENS[: 3 * BS], [0, 1, 2])
    store.calls.clear()
    r = c.save(TOKENS, list(range(6)))
    assert (r.stored, r.existing) == (3, 3)
    assert c.ledger.table(vllm()).blocks == 6 and c.ledger.table(vllm()).skipped_blocks == 3


def test_failure_mid_chain_raises_typed_error_and_drops_the_unreachable_tail() -> None:
    store = FakeStore()
    ns = vllm()
    keys = ns.keys(ns.block_hashes(TOKENS))
    store.fail[keys[2]] = -1700
    c = KVConnector(store, cache(), ns)
    with pytest.raises(QuotaExceeded) as info:
        c.save(TOKENS, list(range(6)))
    err = info.value
    assert err.code == -1700 and err.keys == (keys[2],) and keys[2] in str(err) and "TENANT_QUOTA_EXCEEDED" in str(err)
    assert err.tenant_id == "alpha" and "'alpha'" in str(err)
    assert (err.result.stored, err.result.failed, err.result.dropped) == (2, 1, 3)
    assert set(store.objects) == set(keys[:2])  # blocks 3..5 could never be hit: removed again
    assert c.ledger.present_keys(ns) == set(keys[:2])
    assert c.ledger.table(ns).failed_blocks == 1


def test_sglang_half_failure_claims_nothing() -> None:
    store = FakeStore()
    ns = sglang()
    keys = ns.keys(ns.block_hashes(TOKENS))
    store.fail[keys[1]] = -800  # block 0's _v
    c = KVConnector(store, cache(), ns)
    with pytest.raises(TransferFailed):
        c.save(TOKENS, list(range(6)))
    assert store.objects == {} and c.ledger.table(ns).blocks == 0


def test_lookup_is_a_prefix() -> None:
    store = FakeStore()
    ns = vllm()
    c = KVConnector(store, cache(), ns)
    c.save(TOKENS, list(range(6)))
    keys = ns.keys(ns.block_hashes(TOKENS))
    store.evict([keys[3]])
    assert c.lookup(TOKENS) == 3
    assert c.lookup(block_hashes=ns.block_hashes(TOKENS)[:2]) == 2
    assert c.lookup([]) == 0
    t = c.ledger.table(ns)
    assert (t.hit_blocks, t.miss_blocks, t.master_evicted_blocks, t.orphaned_blocks) == (5, 3, 1, 2)  # blocks 4, 5
    with pytest.raises(ValueError):
        c.lookup()


def test_get_stops_at_a_block_evicted_after_lookup() -> None:
    store = FakeStore()
    ns = vllm()
    src, dst = cache(seed=1), cache(seed=2)
    KVConnector(store, src, ns).save(TOKENS, list(range(6)))
    hashes = ns.block_hashes(TOKENS)
    store.evict([ns.primary_key(hashes[2])])
    d = KVConnector(store, dst, ns)
    assert d.get(list(range(6)), hashes) == 2
    assert same_blocks(src, [0, 1], dst, [0, 1])


def test_get_of_another_layout_is_a_layout_error_and_other_codes_raise() -> None:
    store = FakeStore()
    ns = vllm()
    KVConnector(store, cache(), ns).save(TOKENS, list(range(6)))
    small = PagedKVCache.allocate(KVCacheSpec(num_layers=2, num_kv_heads=2, head_size=8, block_size=BS,
                                              num_blocks=8, dtype="float16"))
    store_small = store
    hashes = ns.block_hashes(TOKENS)
    with pytest.raises(LayoutError, match="another KV layout"):
        KVConnector(store_small, small, ns).get([0], hashes[:1])
    store.fail[ns.primary_key(hashes[0])] = -900
    with pytest.raises(RpcFailed):
        KVConnector(store, cache(), ns).get([0], hashes[:1])


def test_ids_and_hashes_must_agree() -> None:
    c = KVConnector(FakeStore(), cache(), vllm())
    with pytest.raises(LayoutError):
        c.put([0], vllm().block_hashes(TOKENS))
    with pytest.raises(LayoutError):
        c.save(TOKENS, [0, 1])
    with pytest.raises(LayoutError, match="outside"):
        c.put([99], vllm().block_hashes(TOKENS)[:1])


def test_namespace_swap_rules() -> None:
    c = KVConnector(FakeStore(), cache(), vllm())
    with pytest.raises(LayoutError, match="block_size"):
        c.keyspace = vllm(block_size=8)
    with pytest.raises(ValueError, match="tenant_id"):
        c.keyspace = vllm(tenant_id="beta")
    with pytest.raises(TypeError):
        c.keyspace = "r2"  # type: ignore[assignment]
    c.keyspace = vllm(namespace="r2")
    assert c.keyspace.namespace == "r2"


def test_swap_during_a_batch_applies_to_the_next_batch_only() -> None:
    old, new = vllm(namespace="old"), vllm(namespace="new")

    class SwappingStore(FakeStore):
        connector: KVConnector | None = None

        def exists(self, keys: list[str]) -> list[int]:
            if self.connector is not None and self.connector.keyspace is old:
                self.connector.keyspace = new  # the daemon swaps while this batch runs
            return super().exists(keys)

    store = SwappingStore()
    c = KVConnector(store, cache(), old)
    store.connector = c
    c.save(TOKENS, list(range(6)))
    assert all(k.startswith("old@") for k in store.objects)
    assert c.keyspace is new
    c.save(TOKENS, list(range(6)))
    assert sum(k.startswith("new@") for k in store.objects) == 6


def test_concurrent_swaps_never_mix_namespaces_in_a_batch() -> None:
    a, b = vllm(namespace="a"), vllm(namespace="b")
    store = FakeStore()
    c = KVConnector(store, cache(), a)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            c.keyspace = b if c.keyspace is a else a

    t = threading.Thread(target=flip)
    t.start()
    try:
        for i in range(40):
            toks = [i] * (6 * BS)
            before = set(store.objects)
            c.save(toks, list(range(6)))
            new = set(store.objects) - before
            assert len({k.split("@", 1)[0] for k in new}) <= 1, new
    finally:
        stop.set()
        t.join()


def test_per_call_namespace_for_several_request_groups() -> None:
    store = FakeStore()
    c = KVConnector(store, cache(), vllm())
    g1, g2 = vllm(request_group="g1", cache_salt="1"), vllm(request_group="g2", cache_salt="2")
    c.save(TOKENS, list(range(6)), keyspace=g1)
    assert c.lookup(TOKENS, keyspace=g1) == 6 and c.lookup(TOKENS, keyspace=g2) == 0
    assert {r["request_group"] for r in c.ledger.snapshot()} == {"g1", "g2"}


def test_remove_and_purge() -> None:
    store = FakeStore()
    ns = vllm()
    ledger = Ledger()
    c = KVConnector(store, cache(), ns, ledger=ledger)
    c.save(TOKENS, list(range(6)))
    hashes = ns.block_hashes(TOKENS)
    assert c.remove(hashes[5:]) == 1 and len(store.objects) == 5
    assert c.remove(hashes[5:]) == 0  # already gone: -704 is not an error
    store.fail[ns.primary_key(hashes[4])] = -706
    with pytest.raises(StoreError, match="OBJECT_HAS_LEASE"):
        c.remove(hashes[4:5])
    del store.fail[ns.primary_key(hashes[4])]
    other = vllm(namespace="keep")
    c.save(TOKENS, list(range(6)), keyspace=other)
    assert c.purge_release() == 5
    assert all(k.startswith("keep@") for k in store.objects) and len(store.objects) == 6
    assert ledger.table(ns).blocks == 0 and ledger.table(other).blocks == 6


def test_close_unregisters() -> None:
    store = FakeStore()
    with KVConnector(store, cache(), vllm()):
        assert store.registered
    assert store.registered == {}


def test_chunks_after_a_failed_chunk_are_not_sent() -> None:
    store = FakeStore()
    ns = vllm()
    keys = ns.keys(ns.block_hashes(TOKENS))
    store.fail[keys[1]] = -200
    c = KVConnector(store, cache(), ns, max_batch_blocks=2)
    with pytest.raises(StoreError, match="NO_AVAILABLE_HANDLE") as info:
        c.save(TOKENS, list(range(6)))
    assert store.calls.count("put_from_multi") == 1
    assert (info.value.result.stored, info.value.result.failed, info.value.result.dropped) == (1, 1, 4)
    assert set(store.objects) == {keys[0]} and c.ledger.present_keys(ns) == {keys[0]}
