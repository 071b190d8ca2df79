"""The connector and ledger on a real multi-tenant mooncake_master (0.3.13.post1) on free loopback ports.

Checks the issue's list: bit-exact round trips, releases and salts isolated, prefill/decode sharing, tenants
isolated, over-quota refusal with a typed error, and the ledger equal to the store after the master evicted.
"""

from __future__ import annotations

import time

import pytest
import torch

from agent.contract.messages import StoreEndpoints
from agent.datapath.connector import KVConnector
from agent.datapath.errors import NoSpace, QuotaExceeded, StoreUnavailable, UnknownTenant
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache
from agent.datapath.ledger import Ledger
from agent.datapath.store import open_store

pytestmark = pytest.mark.integration

BS = 16
N_BLOCKS = 12
TOKENS = [(i * 7919) % 150_000 for i in range(N_BLOCKS * BS + 5)]


def make_cache(layout: str = "per_layer", seed: int = 0, num_blocks: int = 32, num_layers: int = 4) -> PagedKVCache:
    spec = KVCacheSpec(num_layers=num_layers, num_kv_heads=2, head_size=64, block_size=BS, num_blocks=num_blocks,
                       dtype="bfloat16", layout=layout)
    cache = PagedKVCache.allocate(spec)
    g = torch.Generator().manual_seed(seed)
    for t in cache.tensors:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return cache


def ns(release: str, engine: str = "vllm", **kw) -> KeySpace:
    base = dict(tenant_id="alpha", engine=engine, served_model_name="org/Model-1.5", namespace=release,
                block_size=BS, hash_algo="sha256")
    base.update(kw)
    return KeySpace(**base)


def same_blocks(a: PagedKVCache, ids_a, b: PagedKVCache, ids_b) -> bool:
    return all(torch.equal(a.block_view(x).view(torch.uint8), b.block_view(y).view(torch.uint8))
               for x, y in zip(ids_a, ids_b))


@pytest.fixture
def alpha(mooncake_master, store_client_factory):
    return store_client_factory(mooncake_master, "alpha", "prefill")


@pytest.mark.parametrize("layout", ["per_layer", "cross_layer"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_round_trip_is_bit_exact(alpha, unique_name, layout: str, engine: str) -> None:
    keyspace = ns(unique_name("rt"), engine)
    src, dst = make_cache(layout, 1), make_cache(layout, 2)
    with KVConnector(alpha, src, keyspace) as put_side, KVConnector(alpha, dst, keyspace) as get_side:
        result = put_side.save(TOKENS, list(range(N_BLOCKS + 1)))
        assert (result.stored, result.failed) == (N_BLOCKS, 0)
        assert not same_blocks(src, range(N_BLOCKS), dst, range(N_BLOCKS, 2 * N_BLOCKS))
        assert get_side.load(TOKENS, list(range(N_BLOCKS, 2 * N_BLOCKS))) == N_BLOCKS
        assert same_blocks(src, range(N_BLOCKS), dst, range(N_BLOCKS, 2 * N_BLOCKS))
        again = put_side.save(TOKENS, list(range(N_BLOCKS)))
        assert (again.stored, again.existing) == (0, N_BLOCKS)
        row = put_side.ledger.snapshot()[0]
        assert (row["blocks"], row["bytes"], row["puts"]) == (N_BLOCKS, N_BLOCKS * src.spec.block_bytes, N_BLOCKS)


def test_two_releases_never_see_each_other(alpha, unique_name) -> None:
    tag = unique_name("rel.v1+(a)")  # regex metacharacters are literal in the purge regex
    r1, r2, decoy = ns(tag), ns(unique_name("rel")), ns(tag.replace(".", "X"))
    src = make_cache(seed=3)
    with KVConnector(alpha, src, r1) as c:
        c.save(TOKENS, list(range(N_BLOCKS)))
        assert c.lookup(TOKENS, keyspace=r2) == 0
        assert c.lookup(TOKENS, keyspace=ns(tag, served_model_name="org/Other")) == 0  # another model, same tag
        c.save(TOKENS, list(range(N_BLOCKS)), keyspace=r2)
        c.save(TOKENS, list(range(N_BLOCKS)), keyspace=decoy)
        assert c.lookup(TOKENS) == c.lookup(TOKENS, keyspace=r2) == N_BLOCKS
        assert c.purge_release() == N_BLOCKS  # remove_by_regex on the master: only r1's keys
        assert c.lookup(TOKENS) == 0
        assert c.lookup(TOKENS, keyspace=r2) == c.lookup(TOKENS, keyspace=decoy) == N_BLOCKS
        assert c.ledger.table(r1).blocks == 0 and c.ledger.table(r2).blocks == N_BLOCKS


def test_sglang_release_purge_removes_k_and_v(alpha, unique_name) -> None:
    r1, r2 = ns(unique_name("sg"), "sglang"), ns(unique_name("sg"), "sglang")
    with KVConnector(alpha, make_cache(), r1) as c:
        c.save(TOKENS, list(range(N_BLOCKS)))
        c.save(TOKENS, list(range(N_BLOCKS)), keyspace=r2)
        assert c.purge_release() == 2 * N_BLOCKS
        assert c.lookup(TOKENS) == 0 and c.lookup(TOKENS, keyspace=r2) == N_BLOCKS


def test_two_salts_never_share_a_block(alpha, unique_name) -> None:
    release = unique_name("salt")
    a, b = ns(release, request_group="a", cache_salt="salt-a"), ns(release, request_group="b", cache_salt="salt-b")
    assert set(a.keys(a.block_hashes(TOKENS))).isdisjoint(b.keys(b.block_hashes(TOKENS)))
    with KVConnector(alpha, make_cache(), a) as c:
        c.save(TOKENS, list(range(N_BLOCKS)))
        assert c.lookup(TOKENS, keyspace=b) == 0
        # not even a later block matches: the salt in block 0 changed every hash of the chain
        present = alpha.exists(b.keys(b.block_hashes(TOKENS)))
        assert present == [0] * N_BLOCKS
        assert c.lookup(TOKENS, keyspace=a.replace(request_group="a2")) == N_BLOCKS  # same salt, same blocks
        result = c.save(TOKENS, list(range(N_BLOCKS)), keyspace=b)
        assert result.stored == N_BLOCKS


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_prefill_and_decode_clients_share_everything(mooncake_master, store_client_factory, unique_name,
                                                     engine: str) -> None:
    prefill = store_client_factory(mooncake_master, "alpha", "prefill")
    decode = store_client_factory(mooncake_master, "alpha", "decode")
    keyspace = ns(unique_name("pd"), engine)
    src, dst = make_cache("per_layer", 5), make_cache("cross_layer", 6)
    with KVConnector(prefill, src, keyspace) as p, KVConnector(decode, dst, keyspace) as d:
        p.save(TOKENS, list(range(N_BLOCKS)))
        assert d.lookup(TOKENS) == N_BLOCKS  # 100% of the prefix
        assert d.load(TOKENS, list(range(N_BLOCKS))) == N_BLOCKS
        assert same_blocks(src, range(N_BLOCKS), dst, range(N_BLOCKS))  # layouts differ, bytes agree
        result = d.save(TOKENS, list(range(N_BLOCKS)))
        assert (result.stored, result.existing) == (0, N_BLOCKS)
        assert d.ledger.table(keyspace).blocks == 0  # blocks the prefill wrote are not the decode's to count


def test_tenants_do_not_see_each_other(mooncake_master, store_client_factory, unique_name) -> None:
    alpha = store_client_factory(mooncake_master, "alpha", "prefill")
    beta = store_client_factory(mooncake_master, "beta")
    release = unique_name("ten")
    with KVConnector(alpha, make_cache(), ns(release)) as a, \
            KVConnector(beta, make_cache(), ns(release, tenant_id="beta")) as b:
        a.save(TOKENS, list(range(N_BLOCKS)))
        assert b.lookup(TOKENS) == 0
        assert beta.remove_by_regex(ns(release).release_regex()) == 0  # beta cannot even remove alpha's keys
        assert a.lookup(TOKENS) == N_BLOCKS


def test_tenant_over_quota_is_refused_with_a_clear_error(mooncake_master, store_client_factory, unique_name) -> None:
    tiny = store_client_factory(mooncake_master, "tiny")  # quota 64 KiB
    cache = make_cache()  # 32 KiB blocks: two fit, the third does not
    keyspace = ns(unique_name("quota"), tenant_id="tiny")
    with KVConnector(tiny, cache, keyspace) as c:
        with pytest.raises(QuotaExceeded) as info:
            c.save(TOKENS, list(range(N_BLOCKS)))
        err = info.value
        keys = keyspace.keys(keyspace.block_hashes(TOKENS))
        assert err.code == -1700 and err.code_name == "TENANT_QUOTA_EXCEEDED" and err.tenant_id == "tiny"
        assert err.keys[0] == keys[err.result.stored] and err.keys[0] in str(err) and "-1700" in str(err)
        assert err.result.stored * cache.spec.block_bytes <= 64 << 10 and err.result.failed >= 1
        stored = set(keys[: err.result.stored])
        assert {k for k, present in zip(keys, tiny.exists(keys)) if present} == stored
        assert c.ledger.present_keys(keyspace) == stored  # the failed blocks are not claimed
        quota = mooncake_master.tenant_quota("tiny")
        assert quota["charged_bytes"] == len(stored) * cache.spec.block_bytes


def test_unregistered_tenant_is_refused(mooncake_master, store_client_factory, unique_name) -> None:
    nobody = store_client_factory(mooncake_master, "nobody")
    with KVConnector(nobody, make_cache(), ns(unique_name("x"), tenant_id="nobody")) as c:
        with pytest.raises(UnknownTenant, match="TENANT_NOT_REGISTERED") as info:
            c.save(TOKENS, list(range(N_BLOCKS)))
        assert info.value.code == -1701 and c.ledger.table(c.keyspace).blocks == 0


def test_unreachable_master_fails_fast() -> None:
    from agent.sim.master import free_ports

    (port,) = free_ports(1)
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match="not reachable"):
        open_store(StoreEndpoints(master_server_address=f"127.0.0.1:{port}", metadata_server="http://127.0.0.1:1/metadata",
                                  global_segment_size=64 << 20, local_buffer_size=16 << 20), "alpha", connect_timeout=1)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("pressure", ["memory", "quota"])
def test_ledger_equals_store_after_master_eviction(mooncake_master_factory, unique_name, pressure: str) -> None:
    """The master evicts (pool over its high watermark, or the tenant at its quota with leases lapsed); after
    ``reconcile`` the ledger holds exactly what the store holds, and counts the orphans the master made."""
    if pressure == "memory":  # 12 chains x 40 blocks x 64 KiB = 30 MiB into a 16 MiB pool
        tenants, segment, prompts = {"evt": 1 << 30}, 16 << 20, 12
    else:  # 6 x 40 x 64 KiB = 15 MiB under a 4 MiB quota in a 64 MiB pool
        tenants, segment, prompts = {"evt": 4 << 20}, 64 << 20, 6
    master = mooncake_master_factory(tenants, eviction_high_watermark_ratio=0.7, eviction_ratio=0.3,
                                     default_kv_lease_ttl=20)
    store = open_store(master.endpoints(global_segment_size=segment), "evt")
    try:
        cache = make_cache(num_blocks=40, num_layers=8)  # 64 KiB blocks
        ledger = Ledger()
        keyspace = ns(unique_name("ev"), tenant_id="evt")
        connector = KVConnector(store, cache, keyspace, ledger=ledger)
        all_hashes: list[list[bytes]] = []
        for prompt in range(prompts):
            tokens = [prompt * 1_000_000 + i for i in range(40 * BS)]
            hashes = keyspace.block_hashes(tokens)
            all_hashes.append(hashes)
            try:
                connector.put(list(range(40)), hashes)
            except (NoSpace, QuotaExceeded):
                pass  # refused before the master evicted: a valid outcome, the ledger must still agree
            time.sleep(0.05)  # let leases lapse so the master may evict
        result = ledger.reconcile(store, sample=32)
        assert result.full and result.missing > 0, result
        stored_keys = [keyspace.primary_key(h) for hs in all_hashes for h in hs]
        for _ in range(3):  # a background eviction round could land between reconcile and our own check
            in_store = {k for k, c in zip(stored_keys, store.exists(stored_keys)) if c == 1}
            if ledger.present_keys(keyspace) == in_store:
                break
            ledger.reconcile(store, sample=None)
        table = ledger.table(keyspace)
        assert ledger.present_keys(keyspace) == in_store
        assert table.blocks == len(in_store) and table.bytes == len(in_store) * cache.spec.block_bytes
        assert table.evicted_blocks == table.puts - table.blocks > 0
        assert master.metrics()["master_key_count"] == len(in_store)
        assert master.tenant_quota("evt")["charged_bytes"] == table.bytes
        # orphans: present blocks below any block the master evicted (it knows no prefixes)
        orphans = 0
        for hashes in all_hashes:
            keys = [keyspace.primary_key(h) for h in hashes]
            gap = next((i for i, key in enumerate(keys) if key not in in_store), len(keys))
            orphans += sum(1 for key in keys[gap + 1:] if key in in_store)
        assert table.orphaned_blocks == orphans and table.orphaned_bytes == orphans * cache.spec.block_bytes
        row = next(r for r in ledger.snapshot() if r["namespace"] == keyspace.namespace)
        assert row["blocks"] == len(in_store) and row["evicted_blocks"] == table.evicted_blocks
    finally:
        store.close()  # before the master stops: a client whose master is gone takes 10 s or more to close


def test_soft_pinned_puts(mooncake_master, alpha, unique_name) -> None:
    keyspace = ns(unique_name("pin"))
    before = mooncake_master.metrics().get("master_soft_pin_key_count", 0)
    with KVConnector(alpha, make_cache(), keyspace) as c:
        hashes = keyspace.block_hashes(TOKENS)
        assert c.put(list(range(2)), hashes[:2], soft_pin=True).stored == 2
        assert c.put(list(range(2, N_BLOCKS)), hashes[2:], parent=hashes[1]).stored == N_BLOCKS - 2
        assert c.lookup(TOKENS) == N_BLOCKS
        assert mooncake_master.metrics()["master_soft_pin_key_count"] - before == 2
        table = c.ledger.table(keyspace)
        assert table.get(keyspace.primary_key(hashes[2])).parent == keyspace.primary_key(hashes[1])
