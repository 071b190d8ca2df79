"""Block hashes against independent re-implementations of the upstream encodings (vLLM 0.33.0, SGLang 0.5.23)."""

from __future__ import annotations

import hashlib
import pickle
import random
import struct

import cbor2
import pytest
import torch
import xxhash

from agent.datapath.hashing import (
    DEFAULT_NONE_HASH_SEED,
    LoraRef,
    SglangPageHasher,
    VllmBlockHasher,
    make_hasher,
    sglang_namespace_seed,
    vllm_extra_keys,
    vllm_none_hash,
)

pytestmark = pytest.mark.usefixtures("hash_impl")  # every test: compiled chain and pure Python

# --- independent encoders -------------------------------------------------------------------------------------


def _cbor_head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | extra]) + struct.pack(fmt, n)
    raise ValueError(n)


def my_cbor(x: object) -> bytes:
    """Canonical CBOR (RFC 8949 preferred serialisation) for the types a block-hash input contains."""
    if x is None:
        return b"\xf6"
    if isinstance(x, int):
        return _cbor_head(0, x) if x >= 0 else _cbor_head(1, -1 - x)
    if isinstance(x, bytes):
        return _cbor_head(2, len(x)) + x
    if isinstance(x, str):
        data = x.encode()
        return _cbor_head(3, len(data)) + data
    if isinstance(x, tuple):
        return _cbor_head(4, len(x)) + b"".join(my_cbor(i) for i in x)
    raise TypeError(type(x))


def my_pickle_no_extra(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    """pickle protocol 5 of ``(parent, tokens, None)`` for 4 <= len(tokens), tokens in [0, 2**31)."""
    body = b"C" + bytes([len(parent)]) + parent + b"\x94("
    for t in tokens:
        body += b"K" + bytes([t]) if t < 256 else (b"M" + struct.pack("<H", t) if t < 65536
                                                     else b"J" + struct.pack("<i", t))
    body += b"t\x94N\x87\x94."
    return b"\x80\x05\x95" + struct.pack("<Q", len(body)) + body


def ref_chain(fn, none_hash: bytes, tokens: list[int], bs: int, extra_first, extra_rest) -> list[bytes]:
    """vLLM's loop, written plainly: hash_fn((parent, tuple(block), extra_keys)) per full block."""
    out, parent = [], none_hash
    for i in range(len(tokens) // bs):
        extra = extra_first if i == 0 else extra_rest
        parent = fn((parent, tuple(tokens[i * bs:(i + 1) * bs]), extra))
        out.append(parent)
    return out


REF_FNS = {
    "sha256": lambda x: hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest(),
    "sha256_cbor": lambda x: hashlib.sha256(my_cbor(x)).digest(),
    "xxhash": lambda x: xxhash.xxh3_128_digest(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)),
    "xxhash_cbor": lambda x: xxhash.xxh3_128_digest(my_cbor(x)),
}
TOKENS = [random.Random(7).randrange(0, 200_000) for _ in range(1000)] + [0, 23, 24, 255, 256, 65535, 65536]


# --- vLLM ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [None, "", "1234"])
def test_none_hash_is_hash_fn_of_seed(seed: str | None) -> None:
    expected_seed = seed or DEFAULT_NONE_HASH_SEED
    assert vllm_none_hash("sha256", seed) == REF_FNS["sha256"](expected_seed)
    assert vllm_none_hash("sha256_cbor", seed) == hashlib.sha256(my_cbor(expected_seed)).digest()
    assert VllmBlockHasher("sha256_cbor", seed=seed).none_hash == vllm_none_hash("sha256_cbor", seed)


def test_xxhash_needs_a_seed_because_vllm_randomises_it() -> None:
    for algo in ("xxhash", "xxhash_cbor"):
        with pytest.raises(ValueError, match="hash_seed is required"):
            VllmBlockHasher(algo)
        h = VllmBlockHasher(algo, seed="0")
        assert h.digest_size == 16 and len(h.block_hashes(TOKENS)[0]) == 16
        assert h.none_hash == REF_FNS[algo]("0")


@pytest.mark.parametrize("algo", sorted(REF_FNS))
@pytest.mark.parametrize("bs", [1, 16, 17])
def test_chain_matches_plain_reference(algo: str, bs: int) -> None:
    seed = "99"
    h = VllmBlockHasher(algo, block_size=bs, seed=seed)
    fn = REF_FNS[algo]
    expected = ref_chain(fn, fn(seed), TOKENS, bs, None, None)
    assert h.block_hashes(TOKENS) == expected
    assert len(expected) == len(TOKENS) // bs  # the trailing partial block has no hash


def test_sha256_default_is_pickle_protocol_5_of_the_triple() -> None:
    h = VllmBlockHasher("sha256", block_size=8)
    toks = [1, 300, 70000, 2**31 - 1, 0, 255, 256, 65535]
    assert h.block_hashes(toks) == [hashlib.sha256(my_pickle_no_extra(h.none_hash, tuple(toks))).digest()]


def test_salt_only_in_first_block_changes_every_later_hash() -> None:
    plain = VllmBlockHasher("sha256_cbor", block_size=16)
    salted = VllmBlockHasher("sha256_cbor", block_size=16, cache_salt="group-a")
    other = VllmBlockHasher("sha256_cbor", block_size=16, cache_salt="group-b")
    fn = REF_FNS["sha256_cbor"]
    salt_key = (("cache_salt", "group-a"),)
    assert salted.block_hashes(TOKENS) == ref_chain(fn, plain.none_hash, TOKENS, 16, salt_key, None)
    a, b, p = salted.block_hashes(TOKENS), other.block_hashes(TOKENS), plain.block_hashes(TOKENS)
    assert all(x != y for x, y in zip(a, b)) and all(x != y for x, y in zip(a, p))
    # the same salt shares everything
    assert a == VllmBlockHasher("sha256_cbor", block_size=16, cache_salt="group-a").block_hashes(TOKENS)
    # an empty salt is the default shared cache
    assert VllmBlockHasher("sha256_cbor", block_size=16, cache_salt="").block_hashes(TOKENS) == p


def test_lora_on_every_block_then_salt_on_the_first() -> None:
    lora = LoraRef("adapter-x", "/loras/x")
    assert vllm_extra_keys(lora=lora, cache_salt="s", first_block=True) == (("lora", "adapter-x", "/loras/x"),
                                                                           ("cache_salt", "s"))
    assert vllm_extra_keys(lora=lora, cache_salt="s", first_block=False) == (("lora", "adapter-x", "/loras/x"),)
    assert vllm_extra_keys(first_block=True) is None
    h = VllmBlockHasher("sha256", block_size=16, cache_salt="s", lora=lora)
    fn = REF_FNS["sha256"]
    expected = ref_chain(fn, h.none_hash, TOKENS, 16, (("lora", "adapter-x", "/loras/x"), ("cache_salt", "s")),
                         (("lora", "adapter-x", "/loras/x"),))
    assert h.block_hashes(TOKENS) == expected


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_incremental_hashing_continues_the_chain(algo: str) -> None:
    h = VllmBlockHasher(algo, block_size=16, cache_salt="salt")
    whole = h.block_hashes(TOKENS)
    head = h.block_hashes(TOKENS[:160])
    tail = h.block_hashes(TOKENS[160:], parent=head[-1])
    assert head + tail == whole
    with pytest.raises(ValueError, match="parent"):
        h.block_hashes(TOKENS, parent=b"short")


def test_tensor_and_tuple_inputs_hash_like_lists() -> None:
    h = VllmBlockHasher("sha256", block_size=16)
    assert h.block_hashes(torch.tensor(TOKENS)) == h.block_hashes(TOKENS) == h.block_hashes(tuple(TOKENS))
    assert h.block_hashes(TOKENS[:15]) == []


def test_trace_ids_stand_in_for_block_tokens() -> None:
    ids = [0, 1, 2, 3, 97, 98]
    h = VllmBlockHasher("sha256_cbor", block_size=512, cache_salt="g")
    fn = REF_FNS["sha256_cbor"]
    expected, parent = [], h.none_hash
    for i, hid in enumerate(ids):
        parent = fn((parent, (hid,), (("cache_salt", "g"),) if i == 0 else None))
        expected.append(parent)
    assert h.trace_hashes(ids) == expected
    # a shared prefix of ids shares hashes; salts and seeds separate namespaces
    assert h.trace_hashes([0, 1, 2, 9])[:3] == expected[:3]
    assert set(VllmBlockHasher("sha256_cbor", block_size=512, cache_salt="h").trace_hashes(ids)).isdisjoint(expected)
    assert set(VllmBlockHasher("sha256_cbor", block_size=512, seed="5",
                               cache_salt="g").trace_hashes(ids)).isdisjoint(expected)


# --- SGLang --------------------------------------------------------------------------------------------------

def ref_sglang(tokens: list[int], page: int, prior_hex: str | None) -> list[str]:
    """SGLang's get_hash_str loop: sha256(bytes.fromhex(prior) + u32le tokens), hex out."""
    out, prior = [], prior_hex
    for i in range(len(tokens) // page):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in tokens[i * page:(i + 1) * page]:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = h.hexdigest()
        out.append(prior)
    return out


def test_sglang_pages_match_reference() -> None:
    h = SglangPageHasher(64)
    assert h.namespace_seed is None
    assert [d.hex() for d in h.block_hashes(TOKENS)] == ref_sglang(TOKENS, 64, None)


def test_sglang_namespace_seed_encoding() -> None:
    def seed(extra: str | None, salt: str | None) -> str:
        d = hashlib.sha256(b"sglang-cache-namespace-v1")
        for part in (extra, salt):
            d.update(b"\x00" if part is None else b"\x01" + len(part.encode()).to_bytes(8, "little") + part.encode())
        return d.hexdigest()

    assert sglang_namespace_seed(None, None) is None
    assert sglang_namespace_seed("ek", None).hex() == seed("ek", None)
    assert sglang_namespace_seed(None, "s\u00e9l").hex() == seed(None, "s\u00e9l")
    assert sglang_namespace_seed("", None) != sglang_namespace_seed(None, "")  # presence is encoded
    assert sglang_namespace_seed("a", "bc") != sglang_namespace_seed("ab", "c")  # lengths are encoded
    salted = SglangPageHasher(16, cache_salt="grp")
    assert [d.hex() for d in salted.block_hashes(TOKENS)] == ref_sglang(TOKENS, 16, seed(None, "grp"))


def test_sglang_continuation_trace_and_bounds() -> None:
    h = SglangPageHasher(16, extra_key="x")
    whole = h.block_hashes(TOKENS)
    assert h.block_hashes(TOKENS[:32]) + h.block_hashes(TOKENS[32:], parent=whole[1]) == whole
    assert h.trace_hashes([5, 6]) == [bytes.fromhex(x) for x in ref_sglang([5, 6], 1, h.namespace_seed.hex())]
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        h.block_hashes([-1] * 16)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        h.trace_hashes([2**32])


def test_make_hasher_dispatch_and_errors() -> None:
    # the registry's algorithm name and the engine pick the hasher together: no engine-specific names
    assert isinstance(make_hasher("sglang", "sha256", block_size=64, cache_salt=""), SglangPageHasher)
    assert make_hasher("sglang", "sha256", block_size=64, cache_salt="").namespace_seed is None  # "" = no salt
    assert isinstance(make_hasher("vllm", "sha256", block_size=16), VllmBlockHasher)
    assert isinstance(make_hasher("vllm", "sha256_cbor", block_size=16), VllmBlockHasher)
    with pytest.raises(ValueError, match="not a vllm algorithm"):
        make_hasher("vllm", "md5", block_size=16)
    with pytest.raises(ValueError, match="not a sglang algorithm"):
        make_hasher("sglang", "sha256_cbor", block_size=16)
    with pytest.raises(ValueError, match="engine"):
        make_hasher("trt", "sha256", block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        make_hasher("vllm", "sha256", block_size=0)
    with pytest.raises(ValueError, match="lora"):
        make_hasher("sglang", "sha256", block_size=16, lora=LoraRef("a"))
    with pytest.raises(ValueError, match="extra_key"):
        make_hasher("vllm", "sha256", block_size=16, extra_key="e")


def test_cbor2_canonical_agrees_with_independent_encoder() -> None:
    value = (b"\x01" * 32, tuple(TOKENS[:40]), (("lora", "n", "p"), ("cache_salt", "\u00fc")))
    assert cbor2.dumps(value, canonical=True) == my_cbor(value)
