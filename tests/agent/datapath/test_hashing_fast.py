"""The vectorised CBOR block encoding against cbor2 and against the one-``cbor2.dumps``-per-block chain.

The fast path (vLLM 0.33.0 ``sha256_cbor`` / ``xxhash_cbor``) must produce byte-identical encodings and hence
identical hashes for every int magnitude class, block size, salt/LoRA extra keys and trailing partial block.
"""

from __future__ import annotations

import hashlib
import random
from itertools import accumulate

import cbor2
import numpy as np
import pytest
import xxhash

from agent.datapath.hashing import (
    LoraRef,
    VllmBlockHasher,
    _cbor_uint_blocks,
    _int64_tokens,
    vllm_extra_keys,
)

pytestmark = pytest.mark.usefixtures("hash_impl")  # every test: compiled chain and pure Python

BOUNDARIES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]


def _tokens(n: int, seed: int, top: int = 2**33) -> list[int]:
    rng = random.Random(seed)
    pool = BOUNDARIES + [b + d for b in BOUNDARIES for d in (-1, 1) if 0 <= b + d < 2**63]
    return [rng.choice(pool) if rng.random() < 0.5 else rng.randrange(top) for _ in range(n)]


def _slow(algo: str, bs: int, toks: list[int], parent: bytes | None, salt: str | None,
          lora: LoraRef | None, seed: str | None) -> list[bytes]:
    """Reference chain: one ``cbor2.dumps(..., canonical=True)`` per full block, as vLLM 0.33.0 does."""
    h = VllmBlockHasher(algo, block_size=bs, seed=seed, cache_salt=salt, lora=lora)
    digest = (lambda b: hashlib.sha256(b).digest()) if algo == "sha256_cbor" else xxhash.xxh3_128_digest
    blocks = [tuple(toks[i:i + bs]) for i in range(0, len(toks) // bs * bs, bs)]
    out, prev = [], parent if parent is not None else h.none_hash
    for i, block in enumerate(blocks):
        extra = vllm_extra_keys(lora=lora, cache_salt=salt, first_block=(i == 0 and parent is None))
        prev = digest(cbor2.dumps((prev, block, extra), canonical=True))
        out.append(prev)
    return out


@pytest.mark.parametrize("bs", [1, 16, 64])
@pytest.mark.parametrize("tail", [b"\xf6", cbor2.dumps((("lora", "ad", "/p"),), canonical=True)])
def test_encoding_is_cbor2_canonical_for_every_magnitude(bs: int, tail: bytes) -> None:
    toks = _tokens(bs * 40, seed=bs)
    head = cbor2.dumps((0,) * bs)[:-bs]
    data, ends = _cbor_uint_blocks(np.array(toks, dtype=np.int64), bs, head, tail)
    starts = [0] + ends[:-1]
    for i, (a, b) in enumerate(zip(starts, ends)):
        expected = cbor2.dumps(tuple(toks[i * bs:(i + 1) * bs]), canonical=True) + tail
        assert data[a:b] == expected, i
    assert ends[-1] == len(data)


@pytest.mark.parametrize("top", [24, 256, 65536, 2**32, 2**33])
def test_encoding_each_width_class(top: int) -> None:
    """Blocks whose largest int sits in each width class (the encoder picks the row width from the max)."""
    toks = [v for v in BOUNDARIES if v < top] + [top - 1] * 3
    toks = toks[: len(toks) // 4 * 4]
    data, ends = _cbor_uint_blocks(np.array(toks, dtype=np.int64), 4, b"\x84", b"")
    assert data == b"".join(cbor2.dumps(tuple(toks[i:i + 4]), canonical=True) for i in range(0, len(toks), 4))


@pytest.mark.parametrize("algo,seed", [("sha256_cbor", None), ("xxhash_cbor", "0")])
@pytest.mark.parametrize("bs", [1, 16, 64])
@pytest.mark.parametrize("salt,lora", [(None, None), ("grp", None), (None, LoraRef("ad", "/a")),
                                       ("grp", LoraRef("ad", "ad"))])
def test_fast_chain_equals_cbor2_chain(algo: str, seed: str | None, bs: int, salt: str | None,
                                       lora: LoraRef | None) -> None:
    toks = _tokens(bs * 9 + bs // 2 + 1, seed=bs + 7)  # a trailing partial block has no hash
    h = VllmBlockHasher(algo, block_size=bs, seed=seed, cache_salt=salt, lora=lora)
    got = h.block_hashes(toks)
    assert len(got) == len(toks) // bs
    assert got == _slow(algo, bs, toks, None, salt, lora, seed)
    # continuing a chain: no salt on its first block
    assert h.block_hashes(toks, parent=got[0]) == _slow(algo, bs, toks, got[0], salt, lora, seed)
    cut = 3 * bs
    assert h.block_hashes(toks[:cut]) + h.block_hashes(toks[cut:], parent=got[2]) == got
    assert h.block_hashes(np.array(toks, dtype=np.int64)) == got
    assert h.block_hashes(tuple(toks)) == got


def test_unusual_tokens_fall_back_to_cbor2() -> None:
    h = VllmBlockHasher("sha256_cbor", block_size=2)
    for toks in ([5, -1, 7, 8], [5, 2**64 - 1, 2**63, 8], [True, 2, 3, 0], [1, 2, 3, False], [1, 2.0, 3, 4]):
        assert _int64_tokens(toks) is None
        assert h.block_hashes(toks) == _slow("sha256_cbor", 2, toks, None, None, None, None)
    assert _int64_tokens([1, 2, 0, 3]) is not None
    # bool tokens encode as CBOR booleans, so they must not hash like 1/0
    assert h.block_hashes([True, 2, 3, 4]) != h.block_hashes([1, 2, 3, 4])
    assert h.block_hashes([1, 2.0, 3, 4]) != h.block_hashes([1, 2, 3, 4])


def test_bad_parent_still_rejected_on_the_fast_path() -> None:
    h = VllmBlockHasher("sha256_cbor", block_size=1)
    with pytest.raises(ValueError, match="parent"):
        h.block_hashes([1, 2, 3], parent=b"short")


def test_accumulate_reference_agrees_with_step_functions() -> None:
    """The module's own per-block step (cbor2) and the fast path agree on a long random prompt."""
    rng = random.Random(3)
    toks = [rng.randrange(150_000) for _ in range(16 * 200)]
    h = VllmBlockHasher("sha256_cbor", block_size=16, cache_salt="s")
    blocks = list(zip(*[iter(toks)] * 16))
    ref = list(accumulate(blocks[1:], h._step_rest, initial=h._step_first(h.none_hash, blocks[0])))
    assert h.block_hashes(toks) == ref
