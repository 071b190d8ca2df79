"""KeySpace rules, keys and the binding from a config document's instance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.contract import keys
from agent.contract.scope import CacheScope
from agent.datapath.keyspace import KeySpace, keyspaces_for_instance

pytestmark = pytest.mark.usefixtures("hash_impl")  # every test: compiled chain and pure Python


def vllm_ns(**kw) -> KeySpace:
    base = dict(tenant_id="alpha", engine="vllm", served_model_name="Qwen/Qwen3-8B", namespace="prod-1",
                hash_algo="sha256_cbor")
    base.update(kw)
    return KeySpace(**base)


def test_vllm_keys_and_identity() -> None:
    ns = vllm_ns(request_group="apps", cache_salt="s1", tp_rank=2, kv_group=1)
    h = ns.block_hashes(list(range(64)))
    assert len(h) == 4 and ns.objects_per_block == 1 and ns.digest_size == 32
    key = ns.keys_for(h[0])[0]
    assert key == keys.vllm_key("Qwen3-8B", h[0], cache_prefix="prod-1", tp_rank=2, group=1)
    assert ns.keys(h) == [ns.primary_key(x) for x in h]
    assert ns.scope == CacheScope("alpha", "Qwen/Qwen3-8B", "prod-1", "apps")
    assert ns.scope.release_scope() == CacheScope("alpha", "Qwen/Qwen3-8B", "prod-1") == ("alpha", "Qwen/Qwen3-8B",
                                                                                          "prod-1", None)
    assert (ns.scope.label, ns.scope.release_scope().label) == ("alpha/Qwen/Qwen3-8B/prod-1/apps",
                                                                "alpha/Qwen/Qwen3-8B/prod-1")
    assert ns.owns_key(key) and not vllm_ns(tp_rank=3).owns_key(key)
    assert vllm_ns(vllm_model_name="qwen-local").keys_for(h[0])[0].startswith("prod-1@qwen-local@")


def test_sglang_keys_pairs() -> None:
    ns = KeySpace(tenant_id="alpha", engine="sglang", served_model_name="Qwen/Qwen3-8B", namespace="r",
                   hash_algo="sha256", block_size=4, tp_rank=1, pp_rank=1, pp_size=2)
    h = ns.block_hashes(list(range(8)))
    assert ns.objects_per_block == 2
    assert ns.keys(h)[:2] == list(keys.sglang_keys("Qwen/Qwen3-8B", h[0], extra_backend_tag="r", tp_rank=1, pp_rank=1))
    assert ns.owns_key(ns.keys(h)[1])
    assert not KeySpace(tenant_id="alpha", engine="sglang", served_model_name="Qwen/Qwen3-8B", namespace="r",
                         hash_algo="sha256", block_size=4, tp_rank=1).keys(h)[0].endswith("_1_1_k")


def test_salt_and_release_separate_keys() -> None:
    toks = list(range(160))
    a, b, c = vllm_ns(cache_salt="a"), vllm_ns(cache_salt="b"), vllm_ns(namespace="prod-2")
    assert set(a.keys(a.block_hashes(toks))).isdisjoint(b.keys(b.block_hashes(toks)))
    plain = vllm_ns()
    assert set(plain.keys(plain.block_hashes(toks))).isdisjoint(c.keys(c.block_hashes(toks)))
    assert plain.block_hashes(toks) == c.block_hashes(toks)  # same hashes, different keys: the release is in the key


@pytest.mark.parametrize("changes, field", [
    ({"tenant_id": ""}, "tenant_id"), ({"tenant_id": "_x"}, "tenant_id"), ({"engine": "trt"}, "engine"),
    ({"served_model_name": ""}, "served_model_name"), ({"namespace": "a_b"}, "namespace"),
    ({"namespace": "a@b"}, "namespace"), ({"namespace": "a b"}, "namespace"),
    ({"hash_algo": "md5"}, "hash_algo"), ({"engine": "sglang", "hash_algo": "sha256_cbor"}, "hash_algo"),
    ({"block_size": 0}, "block_size"), ({"tp_rank": -1}, "tp_rank"), ({"pp_rank": 1}, "pp_rank"),
    ({"vllm_model_name": "m@1"}, "vllm_model_name"), ({"hash_algo": "xxhash"}, "hash_algo/hash_seed"),
    ({"sglang_extra_key": "e"}, "sglang_extra_key"),
])
def test_invalid_keyspaces_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        vllm_ns(**changes)


def test_sglang_rules() -> None:
    with pytest.raises(ValueError, match="^hash_algo"):
        KeySpace(tenant_id="a", engine="sglang", served_model_name="m", hash_algo="xxhash")
    with pytest.raises(ValueError, match="^lora_name"):
        KeySpace(tenant_id="a", engine="sglang", served_model_name="m", hash_algo="sha256", lora_name="l")
    # the registry's "sha256" with engine "sglang" is SGLang's page hash, not vLLM's pickle SHA-256
    sglang = KeySpace(tenant_id="a", engine="sglang", served_model_name="m", hash_algo="sha256", block_size=4)
    assert sglang.hasher.engine == "sglang" and sglang.hasher.algo == "sha256"


def test_keyspaces_are_immutable_values() -> None:
    ns = vllm_ns()
    with pytest.raises(AttributeError):
        ns.cache_salt = "x"  # type: ignore[misc]
    other = ns.replace(cache_salt="x", request_group="g")
    assert other.cache_salt == "x" and ns.cache_salt == "" and other != ns and vllm_ns() == ns
    assert len({ns, vllm_ns(), other}) == 2


def test_release_regex_of_namespace() -> None:
    ns = vllm_ns()
    assert ns.release_regex() == keys.release_regex("vllm", "prod-1", "Qwen3-8B")
    assert ns.release_regex(all_models=True) == keys.release_regex("vllm", "prod-1")


def _instance(**kw):
    from agent.contract.messages import InstanceSpec

    data = dict(instance_id="i1", engine="vllm", role="both", port=8000, tenant_id="alpha",
                served_model_name="Qwen/Qwen3-8B", vllm_model_name="Qwen3-8B", namespace="prod-1",
                release_state="serving",
                kv_layout={"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}, hash_algo="sha256",
                hash_seed="42",
                ranks={"tp_rank": 1, "tp_size": 2}, request_groups=[{"name": "apps", "cache_salt": "s-apps"},
                                                                    {"name": "batch", "cache_salt": "s-batch"}])
    data.update(kw)
    return InstanceSpec.model_validate(data)


def _duck(**kw):
    data = dict(engine="vllm", tenant_id="alpha", served_model_name="m", vllm_model_name="", namespace="rel",
                hash_algo="sha256", hash_seed="", kv_layout=SimpleNamespace(block_size_tokens=64), request_groups=[],
                ranks=SimpleNamespace(tp_ranks=[0, 3], pp_rank=0, pcp_rank=0, dcp_rank=0))
    data.update(kw)
    return SimpleNamespace(**data)


def test_keyspaces_for_instance_from_config_document() -> None:
    bound = keyspaces_for_instance(_instance())
    assert set(bound) == {(1, "apps"), (1, "batch")}
    ns = bound[(1, "batch")]
    assert (ns.tp_rank, ns.cache_salt, ns.hash_seed, ns.namespace, ns.block_size) == (1, "s-batch", "42",
                                                                                              "prod-1", 16)
    with pytest.raises(ValueError, match="hash_algo"):
        keyspaces_for_instance(_instance(hash_algo="xxhash", hash_seed=""))


def test_keyspaces_for_duck_typed_instances() -> None:
    default = keyspaces_for_instance(_duck())
    assert set(default) == {(0, ""), (3, "")} and default[(3, "")].cache_salt == ""
    groups = [SimpleNamespace(name="g", cache_salt="s")]
    sg = keyspaces_for_instance(_duck(engine="sglang", hash_algo="sha256", request_groups=groups,
                                       ranks=SimpleNamespace(tp_ranks=[0], pp_rank=1, pcp_rank=0, dcp_rank=0)))
    ns = sg[(0, "g")]
    assert ns.hash_algo == "sha256" and ns.hasher.engine == "sglang" and ns.pp_size == 2
    assert ns.keys([b"\0" * 32])[0].endswith("_0_1_k")
    explicit = keyspaces_for_instance(_duck(engine="sglang", hash_algo="sha256", ranks=SimpleNamespace(
        tp_ranks=[0], pp_rank=0, pp_size=4, pcp_rank=0, dcp_rank=0)))
    assert explicit[(0, "")].keys([b"\0" * 32])[0].endswith("_0_0_k")


def test_keyspaces_pickle_and_copy() -> None:
    import copy
    import pickle

    ns = vllm_ns(cache_salt="s", request_group="g")
    for clone in (pickle.loads(pickle.dumps(ns)), copy.deepcopy(ns), copy.copy(ns)):
        assert clone == ns and clone.block_hashes(list(range(32))) == ns.block_hashes(list(range(32)))
