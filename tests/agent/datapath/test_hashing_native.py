"""The compiled chain (agent.datapath._chainhash) against the pure-Python paths and the upstream encoders.

Every digest it returns must be byte-identical to ``hash_fn((parent, tuple(block), extra_keys))`` with vLLM
0.33.0's pickle/CBOR encodings, and to SGLang 0.5.23's ``SHA-256(prior || u32le tokens)``; tokens it cannot
encode must take the Python path, never a different hash.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import threading

import cbor2
import numpy as np
import pytest
import torch
import xxhash

import agent.datapath.hashing
from agent.datapath.hashing import LoraRef, SglangPageHasher, VllmBlockHasher, vllm_extra_keys
from agent.datapath.keyspace import KeySpace
from tests.support.agent import native_expected

native = (pytest.importorskip("agent.datapath._chainhash") if not native_expected()
          else agent.datapath.hashing._chainhash)

BOUNDARIES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**32 - 1]
DIGEST = {"sha256": lambda b: hashlib.sha256(b).digest(), "sha256_cbor": lambda b: hashlib.sha256(b).digest(),
          "xxhash": xxhash.xxh3_128_digest, "xxhash_cbor": xxhash.xxh3_128_digest}


def _tokens(n: int, seed: int, top: int = 2**31) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice(BOUNDARIES) if rng.random() < 0.4 else rng.randrange(top) for _ in range(n)]


def _upstream(algo: str, bs: int, toks: list, parent: bytes | None, seed: str | None, salt: str | None,
              lora: LoraRef | None) -> list[bytes]:
    """One encoder call and one digest per block, exactly as vLLM 0.33.0's hash_block_tokens."""
    encode = ((lambda x: cbor2.dumps(x, canonical=True)) if algo.endswith("_cbor")
              else (lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)))
    prev = parent if parent is not None else DIGEST[algo](encode(VllmBlockHasher(algo, seed=seed).seed))
    out = []
    for i in range(len(toks) // bs):
        extra = vllm_extra_keys(lora=lora, cache_salt=salt, first_block=(i == 0 and parent is None))
        prev = DIGEST[algo](encode((prev, tuple(toks[i * bs:(i + 1) * bs]), extra)))
        out.append(prev)
    return out


def test_module_is_built_where_it_can_be() -> None:
    """make install builds it (scripts/build_native.py); a silent fallback would hide a 3x slowdown."""
    assert agent.datapath.hashing._chainhash is not None
    assert native.XXH3 is True or not __import__("pathlib").Path("/usr/include/xxhash.h").exists()


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
@pytest.mark.parametrize("bs", [1, 2, 3, 4, 16, 64, 512])
@pytest.mark.parametrize("salt,lora", [(None, None), ("group-a", None), ("g", LoraRef("ad", "/m/ad")),
                                       (None, LoraRef("same", "same"))])
def test_native_chain_is_byte_identical(algo: str, bs: int, salt: str | None, lora: LoraRef | None) -> None:
    seed = "7" if algo.startswith("xx") else None
    h = VllmBlockHasher(algo, block_size=bs, seed=seed, cache_salt=salt, lora=lora, native=True)
    toks = _tokens(bs * 6 + bs // 2, seed=bs)
    got = h.block_hashes(toks)
    assert h.native and len(got) == 6
    assert got == _upstream(algo, bs, toks, None, seed, salt, lora)
    assert got == VllmBlockHasher(algo, block_size=bs, seed=seed, cache_salt=salt, lora=lora,
                                  native=False).block_hashes(toks)
    assert h.block_hashes(toks[2 * bs:], parent=got[1]) == got[2:]  # continuing a chain: no salt
    assert h.block_hashes(torch.tensor(toks)) == got
    assert h.block_hashes(np.array(toks, dtype=np.int64)) == got
    assert h.trace_hashes(toks[:9]) == _upstream(algo, 1, toks[:9], None, seed, salt, lora)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("odd", [2**31, 2**32, 2**63 - 1, 2**64, -1, True, False, 3.0])
def test_tokens_outside_the_compiled_range_take_the_python_path(algo: str, odd: object) -> None:
    """Pickle's BININT stops at 2**31 (then LONG1), CBOR's uint at 2**64, bool encodes as a boolean."""
    h = VllmBlockHasher(algo, block_size=4, cache_salt="s", native=True)
    for where in (1, 6):  # in the salted first block, and in a later one
        toks = [5, 9, 300, 70000, 11, 12, 13, 14, 15, 16, 17, 18]
        toks[where] = odd
        assert h.block_hashes(toks) == _upstream(algo, 4, toks, None, None, "s", None)
    assert h.block_hashes([True, 2, 3, 4]) != h.block_hashes([1, 2, 3, 4])


def test_pickle_blocks_past_one_frame_stay_on_the_python_path() -> None:
    """A block whose pickle exceeds 64 KiB spans two FRAMEs; the compiled chain only writes one."""
    h = VllmBlockHasher("sha256", block_size=13_000, native=None)
    assert not h.native
    with pytest.raises(ValueError, match="native=True"):
        VllmBlockHasher("sha256", block_size=13_000, native=True)
    toks = _tokens(26_000, seed=3)
    assert h.block_hashes(toks) == _upstream("sha256", 13_000, toks, None, None, None, None)
    assert VllmBlockHasher("sha256_cbor", block_size=13_000, native=True).block_hashes(toks) == \
        _upstream("sha256_cbor", 13_000, toks, None, None, None, None)


def test_native_true_without_the_module_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent.datapath.hashing, "_chainhash", None)
    with pytest.raises(ValueError, match="scripts/build_native.py"):
        VllmBlockHasher("sha256", native=True)
    with pytest.raises(ValueError, match="scripts/build_native.py"):
        SglangPageHasher(16, native=True)
    assert not VllmBlockHasher("sha256").native and not SglangPageHasher(16).native


def _sglang_upstream(page: int, toks: list[int], prior: bytes | None) -> list[bytes]:
    out = []
    for i in range(len(toks) // page):
        data = b"".join(t.to_bytes(4, "little") for t in toks[i * page:(i + 1) * page])
        prior = hashlib.sha256((prior or b"") + data).digest()
        out.append(prior)
    return out


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("extra_key,salt", [(None, None), (None, "grp"), ("lora-x", None)])
def test_sglang_native_chain_is_byte_identical(page: int, extra_key: str | None, salt: str | None) -> None:
    h = SglangPageHasher(page, extra_key=extra_key, cache_salt=salt, native=True)
    toks = _tokens(page * 5 + 3, seed=page, top=2**32)
    got = h.block_hashes(toks)
    assert got == _sglang_upstream(page, toks, h.namespace_seed)
    assert got == SglangPageHasher(page, extra_key=extra_key, cache_salt=salt, native=False).block_hashes(toks)
    assert h.block_hashes(toks[page:], parent=got[0]) == got[1:]
    assert h.trace_hashes(toks[:7]) == _sglang_upstream(1, toks[:7], h.namespace_seed)


def test_sglang_out_of_range_tokens_still_rejected() -> None:
    h = SglangPageHasher(2, native=True)
    for bad in ([1, 2, 2**32, 4], [2**32, 1, 2, 3], [1, -1]):
        with pytest.raises(ValueError, match="2\\*\\*32"):
            h.block_hashes(bad)
    assert h.block_hashes([True, 2]) == _sglang_upstream(2, [1, 2], None)  # array('I') takes bools as ints


def test_bad_arguments_raise_instead_of_hashing() -> None:
    with pytest.raises(ValueError, match="parent length"):
        native.hash_chain([1, 2], 0, 1, 2, b"short", b"", -1, b"", b"", 0, 0)
    with pytest.raises(ValueError, match="fewer tokens"):
        native.hash_chain([1, 2], 1, 2, 1, bytes(32), b"", -1, b"", b"", 0, 0)
    with pytest.raises(ValueError, match="encoding"):
        native.hash_chain([1, 2], 0, 1, 2, bytes(32), b"", -1, b"", b"", 9, 0)
    with pytest.raises(TypeError):
        native.hash_chain(12, 0, 1, 2, bytes(32), b"", -1, b"", b"", 0, 0)


def test_hex_keys_match_python_and_decline_non_ascii() -> None:
    digests = [bytes(range(i, i + 32)) for i in range(0, 200, 7)]
    assert native.hex_keys("m@", digests, ()) == ["m@" + d.hex() for d in digests]
    assert native.hex_keys("t_m_", digests, ("_0_k", "_0_v")) == [
        f"t_m_{d.hex()}{s}" for d in digests for s in ("_0_k", "_0_v")]
    assert native.hex_keys("modèle@", digests, ()) is None
    assert native.hex_keys("m@", digests, ("_0_ké",)) is None
    with pytest.raises(TypeError):
        native.hex_keys("m@", ["not bytes"], ())


@pytest.mark.parametrize("engine,algo", [("vllm", "sha256"), ("sglang", "sha256")])
def test_namespace_keys_agree_between_paths(engine: str, algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = KeySpace(tenant_id="t", engine=engine, served_model_name="org/Model-7B", namespace="r1",
                   hash_algo=algo, block_size=16)
    hashes = ns.block_hashes(_tokens(16 * 9, seed=1))
    fast = ns.keys(hashes)
    monkeypatch.setattr(agent.datapath.keyspace, "_native_hex_keys", None)
    assert fast == ns.keys(hashes) == [k for h in hashes for k in ns.keys_for(h)]


def test_chain_runs_while_other_threads_hold_the_interpreter() -> None:
    """The GIL is released around the hashing loop: two threads hashing at once give the same digests."""
    h = VllmBlockHasher("sha256", block_size=16, native=True)
    toks = _tokens(16 * 4000, seed=5)
    expected = h.block_hashes(toks)
    results: list[list[bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(h.block_hashes(toks))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


@pytest.mark.parametrize("ids", [[True, 2, 3], [np.int64(1), 2, 3], [1, np.int64(2), True], [2**40, 5]])
@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_trace_ids_hash_as_int_on_both_paths(ids: list, algo: str) -> None:
    """The trace path hashes ``int(id)``: bools and numpy scalars give the digests of the equal ints."""
    expected = VllmBlockHasher(algo, block_size=16, native=False).trace_hashes([int(i) for i in ids])
    assert VllmBlockHasher(algo, block_size=16).trace_hashes(ids) == expected
    assert VllmBlockHasher(algo, block_size=16, native=False).trace_hashes(ids) == expected


@pytest.mark.parametrize("size", [True, 0, -1, 1.0, "16", (1 << 20) + 1, 2**62])
def test_block_size_must_be_a_sane_int(size: object) -> None:
    for build in (lambda: VllmBlockHasher("sha256", block_size=size), lambda: SglangPageHasher(size)):
        with pytest.raises(ValueError, match="whole number of tokens"):
            build()
    assert VllmBlockHasher("sha256", block_size=1 << 20, native=None).block_size == 1 << 20
