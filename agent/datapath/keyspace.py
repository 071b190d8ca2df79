"""The key space a connector reads and writes in: an immutable value decided by the registry.

A :class:`KeySpace` fixes everything that makes two blocks shareable or not (the seed's isolation
boundaries): the Mooncake tenant (client ``tenant_id``), the engine and its key grammar, the model, the release
namespace (vLLM ``cache_prefix`` / SGLang ``extra_backend_tag``), the request group and its ``cache_salt``, the
parallel ranks, and the block-hash algorithm with its root seed and block size. From it follow the block hashes
(:mod:`agent.datapath.hashing`), the object keys (:mod:`agent.contract.keys`) and the ledger identity, its
:class:`agent.contract.scope.CacheScope` (tenant_id, served_model_name, namespace, request_group).

Key spaces are frozen dataclasses: a daemon changes what a connector uses by *replacing* the object (one
reference assignment, see :class:`agent.datapath.connector.KVConnector`), never by mutating it.

LoRA adapters: a release may load several adapters (``kv_layout.adapters``, each a name and the path the
engine loads it from). A request for an adapter hashes differently from a base-model request: vLLM 0.33.0 adds
``("lora", name, path)`` to every block's extra keys, SGLang 0.5.23 appends the adapter's id
(:func:`sglang_lora_id`) to the request's ``extra_key``, which seeds its page chain. That is the only thing
that separates the adapters' keys: they share the release namespace's key prefix, its ledger identity
(occupancy and budget are per release namespace and request group, all adapters together) and its purge regex.
:meth:`KeySpace.for_adapter` and :func:`adapter_keyspaces` give the key space of each adapter.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.contract import keys as keygrammar
from agent.contract.scope import CacheScope
from agent.datapath.hashing import (
    ENGINE_HASH_ALGOS,
    LoraRef,
    SglangPageHasher,
    VllmBlockHasher,
    make_hasher,
)

try:  # the compiled key builder (scripts/build_native.py); the same strings as the Python below
    from agent.datapath._chainhash import hex_keys as _native_hex_keys
except ImportError:
    _native_hex_keys = None

ENGINES = ("vllm", "sglang")
_FORBIDDEN_IN_RELEASE = "@_"


def _require(cond: bool, field_name: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{field_name}: {message}")


@dataclass(frozen=True)
class KeySpace:
    """Where one engine instance rank stores its KV blocks, and how their hashes and keys are made.

    Attributes:
        tenant_id: Mooncake tenant (the store client's ``tenant_id``; never part of a key).
        engine: ``"vllm"`` or ``"sglang"``.
        served_model_name: the registry's model name (SGLang key component with ``/`` -> ``-``; ledger key).
        vllm_model_name: vLLM key model name; "" derives it from ``served_model_name`` (last path component).
        namespace: the release namespace, vLLM ``cache_prefix`` / SGLang ``extra_backend_tag`` ("" = none). No
            ``@``, ``_`` or whitespace (the registry's charset, which keeps both key grammars unambiguous).
        request_group: name of the request group ("" = none: an instance whose document has no request groups,
            ``agent.contract.scope.NO_REQUEST_GROUP``).
        cache_salt: the group's salt ("" = none); vLLM salts block 0, SGLang seeds the chain.
        hash_algo: the registry's name, which with ``engine`` picks the hasher: vLLM ``sha256`` |
            ``sha256_cbor`` | ``xxhash`` | ``xxhash_cbor``; SGLang ``sha256`` (its page hash).
        hash_seed: the release's PYTHONHASHSEED ("" = unset; required for xxhash).
        block_size: tokens per block (vLLM block / SGLang page).
        tp_rank, pcp_rank, dcp_rank, pp_rank: parallel ranks of this connector.
        kv_group: vLLM KV-cache group id (key field ``group:<g>``).
        pp_size: pipeline-parallel size; SGLang keys carry ``_<pp_rank>`` only when it is > 1.
        lora_name, lora_path: the LoRA adapter of the requests ("" = base model) and the path the engine loaded
            it from, byte for byte as on its command line. vLLM: ``("lora", name, path)`` in every block's extra
            keys. SGLang: the page chain's extra key is ``sglang_extra_key`` followed by
            ``sglang_lora_id(name, path)`` (both required).
        sglang_extra_key: SGLang request ``extra_key`` (None = absent); seeds the page chain with the salt.

    Raises:
        ValueError: naming the offending field, for any value outside the rules above.
    """

    tenant_id: str
    engine: str
    served_model_name: str
    vllm_model_name: str = ""
    namespace: str = ""
    request_group: str = ""
    cache_salt: str = ""
    hash_algo: str = "sha256"
    hash_seed: str = ""
    block_size: int = 16
    tp_rank: int = 0
    pcp_rank: int = 0
    dcp_rank: int = 0
    pp_rank: int = 0
    kv_group: int = 0
    pp_size: int = 1
    lora_name: str = ""
    lora_path: str = ""
    sglang_extra_key: str | None = None
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        _require(isinstance(self.tenant_id, str) and bool(self.tenant_id), "tenant_id", "must be a non-empty string")
        _require(not self.tenant_id.startswith("_"), "tenant_id", "must not start with '_' (Mooncake rule)")
        _require(self.engine in ENGINES, "engine", f"must be one of {ENGINES}, got {self.engine!r}")
        _require(isinstance(self.served_model_name, str) and bool(self.served_model_name), "served_model_name",
                 "must be a non-empty string")
        algos = ENGINE_HASH_ALGOS[self.engine]
        _require(self.hash_algo in algos, "hash_algo",
                 f"{self.engine} key spaces hash with one of {algos}, got {self.hash_algo!r}")
        if self.engine == "sglang":
            _require(not self.lora_name or bool(self.lora_path), "lora_name",
                     "an SGLang adapter's id is made from its name and path: lora_path is required")
        else:
            _require(self.sglang_extra_key is None, "sglang_extra_key", "is an SGLang request field")
            _require("@" not in self.key_model, "vllm_model_name",
                     f"{self.key_model!r} contains '@', which the vLLM key grammar uses as separator")
        rel = self.namespace
        _require(isinstance(rel, str) and not any(c in rel for c in _FORBIDDEN_IN_RELEASE)
                 and not any(c.isspace() for c in rel), "namespace",
                 f"{rel!r} must not contain '@', '_' or whitespace")
        for name in ("block_size", "pp_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, name, f"must be a positive integer, got {value!r}")
        for name in ("tp_rank", "pcp_rank", "dcp_rank", "pp_rank", "kv_group"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 0, name, f"must be a non-negative integer, got {value!r}")
        _require(self.pp_rank < self.pp_size, "pp_rank", f"{self.pp_rank} is not below pp_size {self.pp_size}")
        _require(isinstance(self.lora_name, str) and isinstance(self.lora_path, str), "lora_name",
                 "lora_name and lora_path must be strings")
        _require(bool(self.lora_name) or not self.lora_path, "lora_path", "is set without a lora_name")
        try:
            self._cache["hasher"] = make_hasher(
                self.engine, self.hash_algo, block_size=self.block_size, seed=self.hash_seed or None,
                cache_salt=self.cache_salt or None,
                lora=LoraRef(self.lora_name, self.lora_path) if self.lora_name and self.engine == "vllm" else None,
                extra_key=self.sglang_chain_extra_key)
        except ValueError as exc:
            raise ValueError(f"hash_algo/hash_seed: {exc}") from None
        if self.engine == "vllm":
            self._cache["prefix"] = keygrammar.vllm_key_prefix(
                self.key_model, cache_prefix=self.namespace or None, tp_rank=self.tp_rank,
                pcp_rank=self.pcp_rank, dcp_rank=self.dcp_rank, pp_rank=self.pp_rank, group=self.kv_group)
        else:
            self._cache["prefix"], self._cache["suffixes"] = keygrammar.sglang_key_parts(
                self.served_model_name, self.namespace or None, tp_rank=self.tp_rank,
                pp_rank=self.pp_rank if self.pp_size > 1 else None)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by field values (the cached hasher holds closures); unpickling validates again."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return (_rebuild_keyspace, (values,))

    # --- identity -------------------------------------------------------------------------------------------

    @property
    def key_model(self) -> str:
        """The model component of this key space's keys (vLLM model name / SGLang ``/``->``-`` name)."""
        return keygrammar.key_model(self.engine, self.served_model_name, self.vllm_model_name)

    @property
    def scope(self) -> CacheScope:
        """Ledger identity: (tenant_id, served_model_name, namespace, request_group)."""
        return CacheScope(self.tenant_id, self.served_model_name, self.namespace, self.request_group)

    @property
    def sglang_chain_extra_key(self) -> str | None:
        """The ``extra_key`` SGLang 0.5.23 seeds this key space's page chains with (``None`` for vLLM or none).

        A LoRA request's is ``(extra_key or "") + lora_id`` (``Req.__init__``), the adapter id last.
        """
        if self.engine != "sglang":
            return None
        if not self.lora_name:
            return self.sglang_extra_key
        return (self.sglang_extra_key or "") + sglang_lora_id(self.lora_name, self.lora_path)

    def for_adapter(self, name: str, path: str) -> KeySpace:
        """This key space for requests of LoRA adapter ``name`` loaded from ``path`` (validated again).

        Same tenant, key prefix, ledger identity and purge regex; only the block hashes differ (see the module
        docstring). ``for_adapter("", "")`` gives the base-model key space back.
        """
        return self.replace(lora_name=name, lora_path=path)

    def replace(self, **changes: Any) -> KeySpace:
        """A new key space with ``changes`` applied (validated again); this one is left as it is."""
        return dataclasses.replace(self, **changes)

    # --- hashes ---------------------------------------------------------------------------------------------

    @property
    def hasher(self) -> VllmBlockHasher | SglangPageHasher:
        """The block hasher of this key space (built once, at construction)."""
        return self._cache["hasher"]

    @property
    def digest_size(self) -> int:
        """Bytes per block hash (32 for SHA-256 algorithms, 16 for xxhash)."""
        return self.hasher.digest_size

    def block_hashes(self, token_ids: Any, parent: bytes | None = None) -> list[bytes]:
        """Chained hashes of every full block of ``token_ids`` (see :mod:`agent.datapath.hashing`)."""
        return self.hasher.block_hashes(token_ids, parent)

    def trace_hashes(self, hash_ids: Sequence[int], parent: bytes | None = None) -> list[bytes]:
        """Chained hashes of FAST'25 trace block ids (each id stands in for its block's tokens)."""
        return self.hasher.trace_hashes(hash_ids, parent)

    # --- keys -----------------------------------------------------------------------------------------------

    @property
    def objects_per_block(self) -> int:
        """Store objects per block: 1 for vLLM (all layers, K and V), 2 for SGLang (``_k`` and ``_v``)."""
        return 1 if self.engine == "vllm" else 2

    def keys_for(self, block_hash: bytes) -> tuple[str, ...]:
        """The object key(s) of one block: ``(key,)`` for vLLM, ``(k_key, v_key)`` for SGLang."""
        prefix = self._cache["prefix"]
        if self.engine == "vllm":
            return (prefix + block_hash.hex(),)
        hexed = block_hash.hex()
        sk, sv = self._cache["suffixes"]
        return (prefix + hexed + sk, prefix + hexed + sv)

    def primary_key(self, block_hash: bytes) -> str:
        """The first object key of a block (its identity in the ledger)."""
        return self.keys_for(block_hash)[0]

    def keys(self, block_hashes: Iterable[bytes]) -> list[str]:
        """Flat object keys of many blocks, block-major: ``[b0, b1, ...]`` or ``[b0_k, b0_v, b1_k, ...]``."""
        prefix = self._cache["prefix"]
        suffixes: tuple[str, ...] = () if self.engine == "vllm" else self._cache["suffixes"]
        if _native_hex_keys is not None:
            if not isinstance(block_hashes, (list, tuple)):
                block_hashes = list(block_hashes)
            fast = _native_hex_keys(prefix, block_hashes, suffixes)  # None for a non-ASCII prefix
            if fast is not None:
                return fast
        if self.engine == "vllm":
            return list(map(prefix.__add__, map(bytes.hex, block_hashes)))
        sk, sv = suffixes
        out: list[str] = []
        for h in block_hashes:
            base = prefix + h.hex()
            out.append(base + sk)
            out.append(base + sv)
        return out

    def release_regex(self, *, all_models: bool = False) -> str:
        """Regex of every key of this release namespace and model (all ranks and groups) for purging.

        ``all_models=True`` widens it to every model under the release namespace (needs a non-empty one).
        """
        model = None if all_models else (self.key_model if self.engine == "vllm" else self.served_model_name)
        return keygrammar.release_regex(self.engine, self.namespace, model)

    def owns_key(self, key: str) -> bool:
        """Whether ``key`` is an object of this exact key space (same grammar, model, release, ranks)."""
        parsed = keygrammar.parse(key, known_models=(self.served_model_name,))
        if self.engine == "vllm":
            return (isinstance(parsed, keygrammar.VllmKey) and key.startswith(self._cache["prefix"])
                    and len(parsed.block_hash) == 2 * self.digest_size)
        return (isinstance(parsed, keygrammar.SglangKey) and key.startswith(self._cache["prefix"])
                and key.endswith(self._cache["suffixes"]))


def sglang_lora_id(name: str, path: str) -> str:
    """SGLang 0.5.23 ``LoRARef.deterministic_id``: the id of a ``--lora-paths`` adapter, 32 lowercase hex digits.

    ``uuid5(NAMESPACE_URL, name + "\\0" + path).hex``: stable across processes and nodes, so instances that
    load the same adapter from the same path share its page hashes.
    """
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{name}\0{path}").hex


def _rebuild_keyspace(values: dict[str, Any]) -> KeySpace:
    return KeySpace(**values)


def _block_size(layout: Any) -> int:
    size = getattr(layout, "block_size", None)
    if size is None:
        size = getattr(layout, "block_size_tokens", None)
    if size is None:
        raise ValueError("kv_layout.block_size: missing from the instance's KV layout")
    return int(size)


def keyspaces_for_instance(instance: Any) -> dict[tuple[int, str], KeySpace]:
    """Every key space of one configured engine instance, keyed by ``(tp_rank, request group name)``.

    ``instance`` is duck-typed on ``agent.contract.messages.InstanceSpec`` (engine, tenant_id, served_model_name,
    vllm_model_name, namespace, hash_algo, hash_seed, kv_layout.block_size, ranks.tp_ranks /
    pp_rank / pcp_rank / dcp_rank [/ pp_size], request_groups[].name / .cache_salt). An instance without
    request groups gets the default group ``""`` (no salt) only. ``hash_algo`` is the registry's name (with
    ``engine`` it picks the hasher). Without ``ranks.pp_size`` the PP size is taken as ``pp_rank + 1``, which is
    exact for SGLang keys except PP rank 0 of a PP > 1 instance.

    Raises:
        ValueError: naming the field, when the instance's values do not make a valid key space.
    """
    ranks = instance.ranks
    groups = [(g.name, g.cache_salt) for g in instance.request_groups] or [("", "")]
    # InstanceSpec has no pp_size: a rank > 0 implies PP > 1; an explicit ``ranks.pp_size`` wins.
    pp_size = getattr(ranks, "pp_size", 0) or ranks.pp_rank + 1
    out: dict[tuple[int, str], KeySpace] = {}
    for tp in ranks.tp_ranks:
        for name, salt in groups:
            out[(tp, name)] = KeySpace(
                tenant_id=instance.tenant_id, engine=instance.engine,
                served_model_name=instance.served_model_name,
                vllm_model_name=getattr(instance, "vllm_model_name", "") or "",
                namespace=instance.namespace or "", request_group=name, cache_salt=salt or "",
                hash_algo=instance.hash_algo, hash_seed=instance.hash_seed or "",
                block_size=_block_size(instance.kv_layout), tp_rank=tp, pcp_rank=ranks.pcp_rank,
                dcp_rank=ranks.dcp_rank, pp_rank=ranks.pp_rank, pp_size=pp_size)
    return out


def adapter_keyspaces(instance: Any) -> dict[tuple[int, str, str], KeySpace]:
    """Every key space of one instance including its LoRA adapters, keyed ``(tp_rank, request group, adapter)``.

    The base-model key spaces of :func:`keyspaces_for_instance` have adapter ``""``; each adapter of
    ``instance.kv_layout.adapters`` (objects with ``name`` and ``path``) adds one key space per rank and group
    (:meth:`KeySpace.for_adapter`). Adapters without a path (recorded before the registry held paths, or a bare
    name) are left out: the hash input the engine uses is not known for them.

    Raises:
        ValueError: naming the field, when the instance's values do not make a valid key space.
    """
    base = keyspaces_for_instance(instance)
    adapters = []
    for adapter in getattr(instance.kv_layout, "adapters", None) or []:
        name, path = getattr(adapter, "name", ""), getattr(adapter, "path", "")
        if name and path:
            adapters.append((name, path))
    out: dict[tuple[int, str, str], KeySpace] = {}
    for (tp, group), ks in base.items():
        out[(tp, group, "")] = ks
        for name, path in adapters:
            out[(tp, group, name)] = ks.for_adapter(name, path)
    return out
