"""Chained block hashes exactly as the engines compute them: vLLM 0.33.0, SGLang 0.5.23, and FAST'25 traces.

Every stored KV block is named by a hash of its whole prefix, so the key of block *i* depends on blocks
*0..i-1*: prefix information survives into the store, and the parent of each block is the previous hash of
its chain.

vLLM 0.33.0 (``vllm/v1/core/kv_cache_utils.py``, ``vllm/utils/hashing.py``)
    ``block_hash[i] = hash_fn((block_hash[i-1], tuple(token_ids of block i), extra_keys_i))`` for every *full*
    block (a trailing partial block has no hash), with ``block_hash[-1] = NONE_HASH = hash_fn(seed)``.
    ``hash_fn`` is one of ``sha256`` (SHA-256 of ``pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)``, vLLM's
    default), ``sha256_cbor`` (SHA-256 of ``cbor2.dumps(x, canonical=True)``), ``xxhash`` / ``xxhash_cbor``
    (XXH3-128 over the same two encodings). ``seed`` is ``PYTHONHASHSEED`` when set, else
    ``"vllm-none-hash"`` for the SHA-256 variants; the xxhash variants use a random per-process seed unless
    ``PYTHONHASHSEED`` is set, so this module *requires* an explicit seed for them (a random root can never be
    shared). ``extra_keys`` is ``None`` when empty, else a tuple of tagged tuples in the order
    ``("lora", lora_name, lora_path)`` (every block of a LoRA request) then ``("cache_salt", salt)`` (first
    block only, non-empty salt): the salt changes block 0 and, through the chain, every later block.

SGLang 0.5.23 (``mem_cache/utils.py``)
    ``page_hash[i] = SHA-256(page_hash[i-1] digest bytes (if any) || token ids of page i as little-endian u32)``.
    A storage chain of a request with an ``extra_key`` or ``cache_salt`` starts from a namespace seed instead
    of no prior: ``SHA-256(b"sglang-cache-namespace-v1" || part(extra_key) || part(cache_salt))`` with
    ``part(None) = b"\\x00"`` and ``part(s) = b"\\x01" || len(utf8(s)) as 8-byte LE || utf8(s)``.

FAST'25 traces (Mooncake ``conversation_trace.jsonl``)
    A request's ``hash_ids`` are already prefix-block ids (512 tokens each). :meth:`trace_hashes` hashes them
    through the same chain, letting each id stand in for its block's tokens: the block is the one-token
    block ``(hash_id,)``. For vLLM that is ``hash_fn((parent, (hash_id,), extra_keys))`` (so salts, LoRA
    and the root seed separate namespaces exactly as for real tokens); for SGLang it is
    ``SHA-256(prior || u32le(hash_id))`` with the namespace seed as the first prior.

Speed: the optional compiled module ``agent.datapath._chainhash`` (``agent/datapath/_chainhash.c``, built by
``scripts/build_native.py``; needs a C compiler, OpenSSL's and, for the xxhash variants, xxhash's headers)
assembles each block's message in one reused buffer and hashes it with OpenSSL's SHA-256 or XXH3-128 with the
GIL released. The constant parts of a vLLM message come from ``pickle.dumps`` / ``cbor2.dumps`` of a template
block (:class:`_NativeChain`), and a self-check against the Python encoder at construction turns it off on any
mismatch (:attr:`VllmBlockHasher.native`). Tokens outside its encoders' range (pickle ``[0, 2**31)``, CBOR
``[0, 2**63)``, SGLang ``[0, 2**32)``; never ``bool``) take the Python paths, which give the same digests:
pickle variants run one ``pickle.dumps`` and one digest per block inside ``itertools.accumulate``; CBOR
variants encode all full blocks at once with numpy (:func:`_cbor_uint_blocks`: canonical CBOR unsigned ints take
1/2/3/5/9 bytes by magnitude) and hash ``0x83 || bytes-head || parent || block bytes`` per block; SGLang hashes
slices of one ``array('I')`` buffer. ``python -m bench.connector`` prints tokens/s and milliseconds per
128k-token prompt for both paths.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import cbor2
import numpy as np
import xxhash

try:
    from agent.datapath import _chainhash
except ImportError:  # not built (no compiler or OpenSSL headers): the pure-Python paths below
    _chainhash = None

#: vLLM ``--prefix-caching-hash-algo`` values (vLLM 0.33.0).
VLLM_HASH_ALGOS: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: SGLang 0.5.23 hashes pages with SHA-256 only; the registry calls it ``sha256``, as vLLM's default.
SGLANG_HASH_ALGOS: tuple[str, ...] = ("sha256",)
#: Engine -> the registry's ``hash_algo`` names it accepts; engine and name together pick the hasher.
ENGINE_HASH_ALGOS: dict[str, tuple[str, ...]] = {"vllm": VLLM_HASH_ALGOS, "sglang": SGLANG_HASH_ALGOS}
#: vLLM 0.33.0 ``DEFAULT_NONE_HASH_SEED``: the root seed of the SHA-256 variants when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
#: SGLang 0.5.23 storage namespace seed domain string.
SGLANG_NAMESPACE_DOMAIN = b"sglang-cache-namespace-v1"

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL
logger = logging.getLogger(__name__)
_U32_MAX = 2**32 - 1


def _sha256_pickle(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash_pickle(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


_VLLM_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256_pickle,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash_pickle,
    "xxhash_cbor": _xxhash_cbor,
}
_DIGEST_SIZES = {"sha256": 32, "sha256_cbor": 32, "xxhash": 16, "xxhash_cbor": 16}


def vllm_hash_fn(algo: str) -> Callable[[Any], bytes]:
    """vLLM 0.33.0 ``get_hash_fn_by_name(algo)``: object -> raw digest bytes (32 for SHA-256, 16 for XXH3-128).

    Raises:
        ValueError: ``algo`` is not one of :data:`VLLM_HASH_ALGOS`.
    """
    try:
        return _VLLM_FNS[algo]
    except KeyError:
        raise ValueError(f"hash_algo {algo!r} is not a vLLM algorithm; expected one of "
                         f"{', '.join(VLLM_HASH_ALGOS)}") from None


def resolve_seed(algo: str, seed: str | None) -> str:
    """The root seed vLLM 0.33.0 derives ``NONE_HASH`` from, given the release's pinned ``PYTHONHASHSEED``.

    ``seed`` None or "" means PYTHONHASHSEED unset: ``"vllm-none-hash"`` for ``sha256``/``sha256_cbor``. For
    the xxhash variants vLLM would pick a random seed per process, which no other instance can reproduce.

    Raises:
        ValueError: xxhash variant without a seed (name the release's PYTHONHASHSEED), or unknown ``algo``.
    """
    vllm_hash_fn(algo)
    if seed:
        return seed
    if algo.startswith("xxhash"):
        raise ValueError(f"hash_seed is required for {algo!r}: vLLM seeds xxhash block hashes randomly per "
                         "process unless PYTHONHASHSEED is set, so instances could never share blocks")
    return DEFAULT_NONE_HASH_SEED


def vllm_none_hash(algo: str, seed: str | None = None) -> bytes:
    """vLLM 0.33.0 ``NONE_HASH = hash_fn(seed)``: the parent of block 0 (see :func:`resolve_seed`)."""
    return vllm_hash_fn(algo)(resolve_seed(algo, seed))


@dataclass(frozen=True)
class LoraRef:
    """The LoRA adapter of a request: vLLM 0.33.0 puts ``("lora", name, path)`` in every block's extra keys."""

    name: str
    path: str = ""


def vllm_extra_keys(*, lora: LoraRef | None = None, cache_salt: str | None = None,
                    first_block: bool) -> tuple[tuple[str, ...], ...] | None:
    """vLLM 0.33.0 ``generate_block_hash_extra_keys`` for text requests: tagged tuples, ``None`` when empty.

    ``("lora", name, path)`` on every block of a LoRA request, then ``("cache_salt", salt)`` on the first block
    only when the salt is non-empty. (Multimodal and prompt-embedding keys are not produced by this agent.)
    """
    keys: list[tuple[str, ...]] = []
    if lora is not None:
        keys.append(("lora", lora.name, lora.path))
    if first_block and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def _tokens(token_ids: Iterable[int] | Any) -> Sequence[int]:
    """A sequence of Python ints from a list/tuple, a torch tensor or an ``array`` (``tolist()``)."""
    if isinstance(token_ids, (list, tuple)):
        return token_ids
    tolist = getattr(token_ids, "tolist", None)
    if tolist is not None:
        return tolist()
    return list(token_ids)


#: Largest block/page size accepted (tokens). vLLM and SGLang use 1-1024; FAST'25 trace blocks are 512.
MAX_BLOCK_SIZE = 1 << 20


def _check_block_size(name: str, value: Any) -> None:
    """Raises ValueError unless ``value`` is an int (not bool) in ``[1, MAX_BLOCK_SIZE]`` tokens."""
    if type(value) is not int or not 1 <= value <= MAX_BLOCK_SIZE:
        raise ValueError(f"{name} must be a whole number of tokens from 1 to {MAX_BLOCK_SIZE}, got {value!r}")


def _check_parent(parent: bytes | None, size: int) -> None:
    if parent is not None and (not isinstance(parent, bytes) or len(parent) != size):
        raise ValueError(f"parent must be a {size}-byte block hash or None, got {parent!r:.80}")


#: Canonical CBOR initial byte of an unsigned int by its count of argument bytes (0 = value in the initial byte).
_CBOR_UINT_OP = np.array([0, 0x18, 0x19, 0, 0x1A, 0, 0, 0, 0x1B], dtype=np.uint8)


def _cbor_uint_blocks(vals: np.ndarray, block_size: int, head: bytes, tail: bytes) -> tuple[bytes, list[int]]:
    """Canonical CBOR of ``head || uint... || tail`` for every block of ``vals``, all blocks concatenated.

    ``vals``: int64 array, values in ``[0, 2**63)``, length a multiple of ``block_size``. Each int is encoded as
    cbor2 (and RFC 8949 preferred serialisation) does: the value itself below 24, else ``0x18``/``0x19``/
    ``0x1a``/``0x1b`` followed by 1/2/4/8 big-endian bytes, the shortest that holds it. Returns the bytes and
    the end offset of each block within them.
    """
    n = len(vals)
    nb = n // block_size
    hlen, tlen = len(head), len(tail)
    top = int(vals.max())
    width = 8 if top >= 2**32 else 4 if top >= 65536 else 2 if top >= 256 else 1 if top >= 24 else 0
    row = 1 + width
    nbytes = (vals >= 24).view(np.int8) + (vals >= 256).view(np.int8)  # argument bytes: 0, 1, 2, 4, 8
    if width >= 4:
        nbytes += 2 * (vals >= 65536).view(np.int8)
    if width == 8:
        nbytes += 4 * (vals >= 2**32).view(np.int8)
    # one right-aligned row per int: the encoding is the last 1 + nbytes bytes of its row
    tok = np.empty((n, row), np.uint8)
    if width:
        tok[:, 1:] = vals.astype(">u8").view(np.uint8).reshape(n, 8)[:, 8 - width:]
    op = _CBOR_UINT_OP[nbytes]
    small = nbytes == 0
    op[small] = vals[small]
    tok[np.arange(n), width - nbytes] = op
    cols = hlen + block_size * row + tlen
    full = np.empty((nb, cols), np.uint8)
    full[:, :hlen] = np.frombuffer(head, np.uint8)
    full[:, hlen:cols - tlen] = tok.reshape(nb, block_size * row)
    full[:, cols - tlen:] = np.frombuffer(tail, np.uint8)
    keep = np.ones((nb, cols), bool)
    keep[:, hlen:cols - tlen] = (np.arange(row) >= (width - nbytes)[:, None]).reshape(nb, block_size * row)
    data = full.ravel()[np.flatnonzero(keep)].tobytes()
    ends = np.cumsum(hlen + tlen + block_size + nbytes.reshape(nb, block_size).sum(1, dtype=np.int64))
    return data, ends.tolist()


def _int64_tokens(toks: Sequence[int]) -> np.ndarray | None:
    """``toks`` (Python ints) as an int64 array when every one is an int in ``[0, 2**63)``, else ``None``.

    ``bool`` tokens (an ``int`` subclass that CBOR and pickle encode differently) give ``None`` too.
    """
    arr = array("q")
    try:
        arr.fromlist(toks if isinstance(toks, list) else list(toks))
    except (OverflowError, TypeError):
        return None
    vals = np.frombuffer(arr, dtype=np.int64)
    low = vals <= 1
    if low.any() and (vals.min() < 0 or any(type(toks[i]) is not int for i in np.flatnonzero(low).tolist())):
        return None
    return vals


_ENC_PICKLE, _ENC_CBOR, _ENC_U32LE = 0, 1, 2  # agent.datapath._chainhash token encodings
_DIGEST_SHA256, _DIGEST_XXH3_128 = 0, 1  # agent.datapath._chainhash digests
_PICKLE_FRAME_LIMIT = 60_000  # pickle starts a second FRAME past 64 KiB; longer messages take the Python path
#: Token ids covering every width of both encodings (pickle 2/3/5 bytes, CBOR 1/2/3/5 bytes): the self-check.
_SELF_CHECK_TOKENS = (0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 151_643, 7)


class _NativeChain:
    """How ``agent.datapath._chainhash.hash_chain`` builds the messages of one (algorithm, block size, extra keys).

    The constant parts come from the real encoder: ``pickle.dumps`` / ``cbor2.dumps(canonical=True)`` of
    ``(placeholder parent, (0,) * block_size, extra_keys)`` split around the parent and the token ids; for
    pickle, the FRAME length at bytes 3..10 of the head is rewritten per message by the C code.

    Raises:
        ValueError: no compiled chain for ``algo``, or the template does not have the expected shape (the
            caller then keeps the Python path).
    """

    def __init__(self, algo: str, block_size: int, extra: tuple[Any, ...] | None) -> None:
        if _chainhash is None or algo not in VLLM_HASH_ALGOS or (algo.startswith("xxhash") and not _chainhash.XXH3):
            raise ValueError(f"no compiled chain for {algo!r}")
        self.digest = _DIGEST_XXH3_128 if algo.startswith("xxhash") else _DIGEST_SHA256
        placeholder = b"\xa5" * _DIGEST_SIZES[algo]  # stands in for the parent digest
        block = (0,) * block_size
        if algo.endswith("_cbor"):
            self.encoding, zero = _ENC_CBOR, b"\x00"
            template = cbor2.dumps((placeholder, block, extra), canonical=True)
        else:
            self.encoding, zero = _ENC_PICKLE, b"K\x00"  # BININT1 0
            template = pickle.dumps((placeholder, block, extra), protocol=_PICKLE_PROTOCOL)
            if 5 * block_size + len(template) > _PICKLE_FRAME_LIMIT:
                raise ValueError("block too large for one pickle frame")
        if template.count(placeholder) != 1:
            raise ValueError("ambiguous template")
        at = template.index(placeholder)
        self.head, after = template[:at], template[at + len(placeholder):]
        if self.encoding == _ENC_CBOR:
            self.mid = cbor2.dumps(block, canonical=True)[:-block_size]  # the array head
        else:
            self.mid = after[: after.index(zero * block_size)]  # MEMOIZE (+ MARK above 3 items)
        if not after.startswith(self.mid + zero * block_size):
            raise ValueError("unexpected template layout")
        self.post = after[len(self.mid) + len(zero) * block_size:]
        self.frame_at = -1
        if self.encoding == _ENC_PICKLE and template[2:3] == b"\x95":  # protocol >= 4 FRAME opcode
            if int.from_bytes(template[3:11], "little") != len(template) - 11:
                raise ValueError("unexpected pickle frame")
            self.frame_at = 3
        self.block_size = block_size

    def chain(self, toks: Sequence[int], start: int, count: int, parent: bytes) -> list[bytes] | None:
        """Digests of ``count`` blocks from ``toks[start:]`` chained from ``parent`` (None: a token needs Python)."""
        return _chainhash.hash_chain(toks, start, self.block_size, count, parent, self.head, self.frame_at,
                                     self.mid, self.post, self.encoding, self.digest)


def _native_chain(algo: str, block_size: int, extra: tuple[Any, ...] | None,
                  step: Callable[[bytes, tuple[int, ...]], bytes]) -> _NativeChain | None:
    """A verified :class:`_NativeChain`, or ``None`` when there is none for ``algo`` or it disagrees with ``step``."""
    try:
        native = _NativeChain(algo, block_size, extra)
    except ValueError:
        return None
    toks = [_SELF_CHECK_TOKENS[i % len(_SELF_CHECK_TOKENS)] for i in range(3 * block_size)]
    parent = step(bytes(_DIGEST_SIZES[algo]), (1,))
    expected = list(accumulate(zip(*[iter(toks)] * block_size), step, initial=parent))[1:]
    if native.chain(toks, 0, 3, parent) != expected:  # pragma: no cover - would be a bug in the template split
        logger.warning("agent.datapath._chainhash disagrees with %s for block size %d; using the Python path",
                       algo, block_size)
        return None
    return native


class VllmBlockHasher:
    """Block hashes of one vLLM 0.33.0 namespace: algorithm, root seed, block size, cache_salt, LoRA.

    Args:
        algo: ``sha256`` (vLLM default, pickle), ``sha256_cbor``, ``xxhash`` or ``xxhash_cbor``.
        block_size: tokens per block (vLLM ``--block-size``), > 0.
        seed: the release's PYTHONHASHSEED ("" / None = unset; required for xxhash variants).
        cache_salt: the request group's salt ("" / None = default shared cache); block 0 only.
        lora: the LoRA adapter, if the namespace serves one.
        native: use the compiled chain (``agent.datapath._chainhash``) when it is built: ``None`` (default) = if
            available; ``False`` = never (the Python path, for comparisons); ``True`` = required.

    Raises:
        ValueError: unknown algo, non-positive block size, missing xxhash seed, ``native=True`` without the
            compiled chain for ``algo``.
    """

    engine = "vllm"

    def __init__(self, algo: str = "sha256", *, block_size: int = 16, seed: str | None = None,
                 cache_salt: str | None = None, lora: LoraRef | None = None, native: bool | None = None) -> None:
        self._fn = vllm_hash_fn(algo)
        _check_block_size("block_size", block_size)
        self.algo = algo
        self.block_size = block_size
        self.seed = resolve_seed(algo, seed)
        self.cache_salt = cache_salt or ""
        self.lora = lora
        self.digest_size = _DIGEST_SIZES[algo]
        self.none_hash = self._fn(self.seed)
        self._extra_first = vllm_extra_keys(lora=lora, cache_salt=cache_salt, first_block=True)
        self._extra_rest = vllm_extra_keys(lora=lora, cache_salt=cache_salt, first_block=False)
        self._step_first = self._make_step(self._extra_first)
        self._step_rest = self._make_step(self._extra_rest)
        # fixed parts of a canonical CBOR block triple (see _cbor_block_hashes)
        self._cbor_pre = b"\x83" + cbor2.dumps(bytes(self.digest_size))[: -self.digest_size]
        self._cbor_array_head = cbor2.dumps((0,) * block_size)[:-block_size]
        self._cbor_tail_rest = cbor2.dumps(self._extra_rest, canonical=True)
        self._native = self._native_trace = None
        if native is not False:
            self._native = _native_chain(algo, block_size, self._extra_rest, self._step_rest)
            if block_size != 1:
                self._native_trace = _native_chain(algo, 1, self._extra_rest, self._step_rest)
            else:
                self._native_trace = self._native
            if native and self._native is None:
                raise ValueError(f"native=True but agent.datapath._chainhash is not built or has no chain for {algo!r} "
                                 f"at block size {block_size} (run scripts/build_native.py)")

    @property
    def native(self) -> bool:
        """Whether :meth:`block_hashes` runs the compiled chain (``agent.datapath._chainhash``) for this namespace."""
        return self._native is not None

    def _make_step(self, extra: tuple[Any, ...] | None) -> Callable[[bytes, tuple[int, ...]], bytes]:
        """``(parent, block tuple) -> digest`` with the encoder and digest bound as locals (the hot loop)."""
        dumps_pickle = pickle.dumps
        dumps_cbor = cbor2.dumps
        proto = _PICKLE_PROTOCOL
        sha = hashlib.sha256
        xxh = xxhash.xxh3_128_digest
        if self.algo == "sha256":
            return lambda p, b: sha(dumps_pickle((p, b, extra), proto)).digest()
        if self.algo == "sha256_cbor":
            return lambda p, b: sha(dumps_cbor((p, b, extra), canonical=True)).digest()
        if self.algo == "xxhash":
            return lambda p, b: xxh(dumps_pickle((p, b, extra), proto))
        return lambda p, b: xxh(dumps_cbor((p, b, extra), canonical=True))

    def _chain(self, blocks: Iterable[tuple[int, ...]], parent: bytes | None) -> list[bytes]:
        _check_parent(parent, self.digest_size)
        it = iter(blocks)
        first = next(it, None)
        if first is None:
            return []
        head = self._step_first(self.none_hash, first) if parent is None else self._step_rest(parent, first)
        chain = accumulate(it, self._step_rest, initial=head)
        return list(chain)

    def block_hashes(self, token_ids: Any, parent: bytes | None = None) -> list[bytes]:
        """vLLM 0.33.0 block hashes of every full block of ``token_ids`` (Python ints, or a tensor).

        Returns ``len(token_ids) // block_size`` raw digests; ``parent`` continues an existing chain (its
        first block then carries no salt, as in vLLM where only block 0 of a request is salted).
        """
        toks = _tokens(token_ids)
        if self._native is not None:
            fast = self._native_hashes(self._native, toks, parent)
            if fast is not None:
                return fast
        if self.algo.endswith("_cbor"):
            fast = self._cbor_block_hashes(toks, parent)
            if fast is not None:
                return fast
        blocks = zip(*[iter(toks)] * self.block_size)
        return self._chain(blocks, parent)

    def _native_hashes(self, native: _NativeChain, toks: Sequence[int], parent: bytes | None) -> list[bytes] | None:
        """The chain through ``agent.datapath._chainhash`` (``None``: a token is outside the compiled encoders' range).

        Block 0 of a new chain (salted extra keys) is hashed here in Python; the rest in one compiled call.
        """
        bs = native.block_size
        count = len(toks) // bs
        if count == 0:
            return []
        if not isinstance(toks, (list, tuple)):
            toks = list(toks)
        _check_parent(parent, self.digest_size)
        start = 0
        first: list[bytes] = []
        if parent is None:
            parent = self._step_first(self.none_hash, tuple(toks[:bs]))
            first.append(parent)
            start, count = bs, count - 1
        rest = native.chain(toks, start, count, parent)
        if rest is None:
            return None
        return first + rest if first else rest

    def _cbor_block_hashes(self, toks: Sequence[int], parent: bytes | None) -> list[bytes] | None:
        """The CBOR chain from one vectorised encoding of all full blocks (``None``: tokens need cbor2).

        Block 0 of a new chain (salted extra keys) goes through ``cbor2``; every later block hashes
        ``0x83 || bytes head || parent || array head || ints || cbor2(extra_keys)``, the exact bytes of
        ``cbor2.dumps((parent, tuple(block), extra_keys), canonical=True)``.
        """
        bs = self.block_size
        count = len(toks) // bs
        if count < 2:
            return None
        vals = _int64_tokens(toks[: count * bs])
        if vals is None:
            return None
        _check_parent(parent, self.digest_size)
        out: list[bytes] = []
        if parent is None:
            parent = self._step_first(self.none_hash, tuple(toks[:bs]))
            out.append(parent)
            vals = vals[bs:]
        data, ends = _cbor_uint_blocks(vals, bs, self._cbor_array_head, self._cbor_tail_rest)
        pre = self._cbor_pre
        append = out.append
        start = 0
        if self.algo == "sha256_cbor":
            sha = hashlib.sha256
            for end in ends:
                parent = sha(pre + parent + data[start:end]).digest()
                append(parent)
                start = end
        else:
            xxh = xxhash.xxh3_128_digest
            for end in ends:
                parent = xxh(pre + parent + data[start:end])
                append(parent)
                start = end
        return out

    def trace_hashes(self, hash_ids: Sequence[int], parent: bytes | None = None) -> list[bytes]:
        """FAST'25 ``hash_ids`` chained as one-token blocks: ``hash_fn((parent, (hash_id,), extra_keys))``."""
        ids = _tokens(hash_ids)
        # the Python path hashes int(id); block 0 of the compiled path is hashed as given, so only exact ints
        if self._native_trace is not None and (not ids or type(ids[0]) is int):
            fast = self._native_hashes(self._native_trace, ids, parent)
            if fast is not None:
                return fast
        return self._chain(((int(i),) for i in ids), parent)


def sglang_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """SGLang 0.5.23 ``storage_namespace_seed`` as raw digest bytes (``None`` when both parts are absent).

    ``None`` and ``""`` differ (absent vs present-and-empty), exactly as upstream.
    """
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(SGLANG_NAMESPACE_DOMAIN)
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
            continue
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.digest()


def _u32le(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian u32 bytes (SGLang page hash input)."""
    arr = array("I")
    if arr.itemsize != 4:  # pragma: no cover - every Linux/macOS CPython has a 4-byte "I"
        arr = array("L")
    try:
        arr.fromlist(token_ids if isinstance(token_ids, list) else list(token_ids))
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"SGLang token ids must be integers in [0, 2**32): {exc}") from None
    if sys.byteorder == "big":  # pragma: no cover - little-endian hosts only in practice
        arr.byteswap()
    return arr.tobytes()


class SglangPageHasher:
    """Page hashes of one SGLang 0.5.23 HiCache storage namespace (``extra_key`` and ``cache_salt`` seed).

    Args:
        page_size: tokens per page (SGLang ``--page-size``), > 0.
        extra_key / cache_salt: the request's fields; ``None`` = absent (no namespace seed when both are).
        native: use the compiled chain (``agent.datapath._chainhash``) when built: ``None`` = if available, ``False`` =
            never, ``True`` = required.

    Digests are 32 raw bytes; keys render them as lowercase hex (``digest.hex()``).

    Raises:
        ValueError: non-positive page size, ``native=True`` without the compiled chain.
    """

    engine = "sglang"
    algo = "sha256"
    digest_size = 32

    def __init__(self, page_size: int = 64, *, extra_key: str | None = None,
                 cache_salt: str | None = None, native: bool | None = None) -> None:
        _check_block_size("page_size", page_size)
        if native and _chainhash is None:
            raise ValueError("native=True but agent.datapath._chainhash is not built (run scripts/build_native.py)")
        self.block_size = page_size
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.namespace_seed = sglang_namespace_seed(extra_key, cache_salt)
        self.native = _chainhash is not None and native is not False

    def _native_chain(self, toks: Sequence[int], page: int, count: int, parent: bytes | None) -> list[bytes] | None:
        """The chain through ``agent.datapath._chainhash`` (``None``: a token is not an exact int in ``[0, 2**32)``)."""
        if not isinstance(toks, (list, tuple)):
            toks = list(toks)
        _check_parent(parent, 32)
        prior = self.namespace_seed if parent is None else parent
        first: list[bytes] = []
        start = 0
        if prior is None:  # no namespace seed: the first page hashes its tokens alone
            if any(type(t) is not int for t in toks[:page]):
                return None
            prior = hashlib.sha256(_u32le(toks[:page])).digest()
            first.append(prior)
            start, count = page, count - 1
        rest = _chainhash.hash_chain(toks, start, page, count, prior, b"", -1, b"", b"", _ENC_U32LE, _DIGEST_SHA256)
        if rest is None:
            return None
        return first + rest if first else rest

    def _chain(self, data: bytes, step: int, count: int, parent: bytes | None) -> list[bytes]:
        _check_parent(parent, 32)
        prior = self.namespace_seed if parent is None else parent
        view = memoryview(data)
        sha = hashlib.sha256
        out: list[bytes] = []
        append = out.append
        for off in range(0, count * step, step):
            h = sha() if prior is None else sha(prior)
            h.update(view[off:off + step])
            prior = h.digest()
            append(prior)
        return out

    def block_hashes(self, token_ids: Any, parent: bytes | None = None) -> list[bytes]:
        """SGLang 0.5.23 page hashes of every full page of ``token_ids`` (``len // page_size`` digests)."""
        toks = _tokens(token_ids)
        count = len(toks) // self.block_size
        if count == 0:
            return []
        if self.native:
            fast = self._native_chain(toks, self.block_size, count, parent)
            if fast is not None:
                return fast
        data = _u32le(toks[: count * self.block_size])
        return self._chain(data, 4 * self.block_size, count, parent)

    def trace_hashes(self, hash_ids: Sequence[int], parent: bytes | None = None) -> list[bytes]:
        """FAST'25 ``hash_ids`` chained as one-token pages: ``SHA-256(prior || u32le(hash_id))``."""
        ids = _tokens(hash_ids)
        if not ids:
            return []
        if self.native:
            fast = self._native_chain(ids, 1, len(ids), parent)
            if fast is not None:
                return fast
        return self._chain(_u32le(ids), 4, len(ids), parent)


def make_hasher(engine: str, algo: str, *, block_size: int, seed: str | None = None,
                cache_salt: str | None = None, lora: LoraRef | None = None,
                extra_key: str | None = None) -> VllmBlockHasher | SglangPageHasher:
    """The hasher that ``engine`` and the registry's ``algo`` name together pick: :class:`SglangPageHasher` for
    ``("sglang", "sha256")``, :class:`VllmBlockHasher` for ``("vllm", any of VLLM_HASH_ALGOS)``.

    For SGLang an empty ``cache_salt`` means "no salt" (the registry's default shared cache), i.e. absent,
    and ``seed`` is ignored (SGLang page hashes have no root seed).

    Raises:
        ValueError: unknown engine or an algorithm the engine does not have, bad block size, LoRA given to
            SGLang, extra_key given to vLLM, missing xxhash seed.
    """
    if engine not in ENGINE_HASH_ALGOS:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_HASH_ALGOS)}, got {engine!r}")
    if algo not in ENGINE_HASH_ALGOS[engine]:
        raise ValueError(f"hash_algo {algo!r} is not a {engine} algorithm; expected one of "
                         f"{', '.join(ENGINE_HASH_ALGOS[engine])}")
    if engine == "sglang":
        if lora is not None:
            raise ValueError("lora is a vLLM extra key; SGLang page hashes do not carry it")
        return SglangPageHasher(block_size, extra_key=extra_key, cache_salt=cache_salt or None)
    if extra_key is not None:
        raise ValueError("extra_key is an SGLang request field; vLLM block hashes do not carry it")
    return VllmBlockHasher(algo, block_size=block_size, seed=seed, cache_salt=cache_salt, lora=lora)
