"""Namespaces of LoRA adapter requests: vLLM ``("lora", name, path)`` extra keys, SGLang adapter ids."""

from __future__ import annotations

import hashlib
import pickle
from types import SimpleNamespace

import pytest

from agent.contract.messages import InstanceSpec, KVLayout, LoraAdapterSpec
from agent.datapath.hashing import LoraRef, SglangPageHasher, VllmBlockHasher
from agent.datapath.keyspace import KeySpace, adapter_keyspaces, sglang_lora_id

pytestmark = pytest.mark.usefixtures("hash_impl")  # every test: compiled chain and pure Python

TOKENS = list(range(48))


def vllm_ns(**kw) -> KeySpace:
    base = {"tenant_id": "alpha", "engine": "vllm", "served_model_name": "Qwen/Qwen3-8B",
            "namespace": "prod-1", "hash_algo": "sha256", "hash_seed": "42", "request_group": "apps",
            "cache_salt": "s1"}
    base.update(kw)
    return KeySpace(**base)


def sglang_ns(**kw) -> KeySpace:
    base = {"tenant_id": "alpha", "engine": "sglang", "served_model_name": "Qwen/Qwen3-8B",
            "namespace": "prod-1", "hash_algo": "sha256", "block_size": 16}
    base.update(kw)
    return KeySpace(**base)


def test_sglang_lora_id_is_sglangs_deterministic_id() -> None:
    # SGLang 0.5.23 LoRARef.deterministic_id("sql-lora", "/adapters/sql-v1"): uuid5(NAMESPACE_URL, name\0path).hex
    assert sglang_lora_id("sql-lora", "/adapters/sql-v1") == "e6a4cb36ab2e5cea858fb044c1c3394b"
    assert sglang_lora_id("sql-lora", "/adapters/sql-v2") != sglang_lora_id("sql-lora", "/adapters/sql-v1")


def test_vllm_adapter_puts_name_and_path_in_every_block() -> None:
    base = vllm_ns()
    ns = base.for_adapter("sql-lora", "/adapters/sql-v1")
    assert ns.hasher.lora == LoraRef("sql-lora", "/adapters/sql-v1")
    expected = VllmBlockHasher("sha256", block_size=16, seed="42", cache_salt="s1",
                               lora=LoraRef("sql-lora", "/adapters/sql-v1")).block_hashes(TOKENS)
    assert ns.block_hashes(TOKENS) == expected
    # block 0 by hand: sha256(pickle((NONE_HASH, tokens, (("lora", name, path), ("cache_salt", salt)))))
    none_hash = hashlib.sha256(pickle.dumps("42", protocol=pickle.HIGHEST_PROTOCOL)).digest()
    first = (none_hash, tuple(TOKENS[:16]), (("lora", "sql-lora", "/adapters/sql-v1"), ("cache_salt", "s1")))
    assert expected[0] == hashlib.sha256(pickle.dumps(first, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert set(ns.block_hashes(TOKENS)).isdisjoint(base.block_hashes(TOKENS))
    assert ns.for_adapter("sql-lora", "/adapters/sql-v2").block_hashes(TOKENS) != expected  # new path, new hashes


def test_sglang_adapter_seeds_the_chain_with_its_id() -> None:
    base = sglang_ns(sglang_extra_key="tenant-x", cache_salt="s1")
    ns = base.for_adapter("sql-lora", "/adapters/sql-v1")
    chain_key = "tenant-x" + sglang_lora_id("sql-lora", "/adapters/sql-v1")  # SGLang Req: extra_key + lora_id
    assert ns.sglang_chain_extra_key == chain_key and ns.hasher.extra_key == chain_key
    assert ns.block_hashes(TOKENS) == SglangPageHasher(16, extra_key=chain_key, cache_salt="s1").block_hashes(TOKENS)
    assert set(ns.block_hashes(TOKENS)).isdisjoint(base.block_hashes(TOKENS))
    no_extra = sglang_ns().for_adapter("sql-lora", "/adapters/sql-v1")
    assert no_extra.hasher.extra_key == sglang_lora_id("sql-lora", "/adapters/sql-v1")
    assert sglang_ns().sglang_chain_extra_key is None and vllm_ns().sglang_chain_extra_key is None


@pytest.mark.parametrize("make", [vllm_ns, sglang_ns])
def test_adapters_share_the_release_namespace_keys_and_identity(make) -> None:
    base = make()
    ns = base.for_adapter("sql-lora", "org/sql-lora")
    digest = b"\x07" * base.digest_size
    assert ns.keys_for(digest) == base.keys_for(digest) and ns.scope == base.scope
    assert ns.release_regex() == base.release_regex() and base.owns_key(ns.keys_for(digest)[0])
    assert ns.for_adapter("sql-lora", "org/sql-lora") == ns  # idempotent: the adapter is replaced, not stacked
    assert ns.for_adapter("", "") == base
    assert pickle.loads(pickle.dumps(ns)).block_hashes(TOKENS) == ns.block_hashes(TOKENS)


def test_adapter_fields_refused() -> None:
    with pytest.raises(ValueError, match="^lora_name: an SGLang adapter's id is made from its name and path"):
        sglang_ns(lora_name="sql-lora")
    with pytest.raises(ValueError, match="^lora_path: is set without a lora_name"):
        vllm_ns(lora_path="/adapters/sql-v1")
    with pytest.raises(ValueError, match="^lora_name: lora_name and lora_path must be strings"):
        vllm_ns(lora_name="sql-lora", lora_path=None)


def test_config_layout_reads_adapters_and_old_name_lists() -> None:
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16,
                      adapters=[{"name": "sql-lora", "path": "/adapters/sql-v1"}, "old-lora"])
    assert layout.adapters == [LoraAdapterSpec(name="sql-lora", path="/adapters/sql-v1"),
                               LoraAdapterSpec(name="old-lora", path="")]
    with pytest.raises(ValueError, match="unknown"):
        KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16,
                 adapters=[{"name": "a", "path": "/a", "unknown": 1}])


def _spec(engine: str, adapters: list) -> InstanceSpec:
    return InstanceSpec.model_validate({
        "instance_id": "i1", "engine": engine, "role": "both", "port": 8000, "tenant_id": "alpha",
        "served_model_name": "Qwen/Qwen3-8B", "namespace": "prod-1", "release_state": "serving",
        "hash_algo": "sha256",
        "kv_layout": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "adapters": adapters},
        "ranks": {"tp_rank": 1, "tp_size": 2}, "request_groups": [{"name": "apps", "cache_salt": "s-apps"}]})


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_keyspaces_of_an_instance(engine) -> None:
    spec = _spec(engine, [{"name": "chat-lora", "path": "org/chat-lora"}, {"name": "old-lora", "path": ""}])
    bound = adapter_keyspaces(spec)
    assert set(bound) == {(1, "apps", ""), (1, "apps", "chat-lora")}  # old-lora: path unknown, hashes unknown
    base, chat = bound[(1, "apps", "")], bound[(1, "apps", "chat-lora")]
    assert base.lora_name == "" and (chat.lora_name, chat.lora_path) == ("chat-lora", "org/chat-lora")
    assert chat == base.for_adapter("chat-lora", "org/chat-lora") and chat.cache_salt == "s-apps"


def test_adapter_keyspaces_of_a_duck_typed_instance_without_adapters() -> None:
    instance = SimpleNamespace(engine="vllm", tenant_id="alpha", served_model_name="m", vllm_model_name="",
                               namespace="rel", hash_algo="sha256", hash_seed="", request_groups=[],
                               kv_layout=SimpleNamespace(block_size_tokens=16),
                               ranks=SimpleNamespace(tp_ranks=[0], pp_rank=0, pcp_rank=0, dcp_rank=0))
    assert set(adapter_keyspaces(instance)) == {(0, "", "")}
