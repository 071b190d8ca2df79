"""Compatibility fingerprint of a release: SHA-256 over a canonical encoding of its cache-affecting settings.

Two releases may share KV cache entries only when everything that shapes the stored bytes or the block hashes
is equal: weights revision, KV layout (layers, KV heads, head dim, block size in tokens), KV dtype,
quantization, LoRA adapters (name and path: both are block-hash inputs), engine and engine version (vLLM
changed its block-hash input between versions), and the prefix-caching hash algorithm with its seed (vLLM
0.33.0 ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED``). The fingerprint is stable across processes,
machines and Python versions.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tenants.validators import lora_adapters

#: Fields of a release that affect its KV cache, in the order the fingerprint document lists them.
CACHE_SETTING_FIELDS: tuple[str, ...] = (
    "weights_revision",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "block_size",
    "kv_dtype",
    "quantization",
    "adapters",
    "engine",
    "engine_version",
    "hash_algo",
    "hash_seed",
)

#: Version of the canonical document; bump it when the encoding changes (every fingerprint changes with it).
FINGERPRINT_SCHEMA = 1


def canonical_adapters(value: Any) -> list[Any]:
    """The fingerprint form of ``Release.adapters``: sorted by name; a name-only adapter is its name, one with a
    path is ``{"name", "path"}``. ``rank`` is left out: it sizes vLLM's LoRA slots, not the cached KV.

    A release whose adapters have no path (recorded before paths were required) therefore keeps the fingerprint
    it had, and adding or changing a path changes it. Raises ``TypeError`` for malformed values.
    """
    adapters = sorted(lora_adapters(value), key=lambda adapter: adapter.name)
    return [
        adapter.name if adapter.path is None else {"name": adapter.name, "path": adapter.path}
        for adapter in adapters
    ]


def canonical_settings(settings: Mapping[str, Any]) -> bytes:
    """UTF-8 JSON of the cache settings: sorted keys, no spaces, adapters as ``canonical_adapters``, plus the
    schema version.

    Raises ``KeyError`` when a field of ``CACHE_SETTING_FIELDS`` is missing from ``settings``.
    """
    document: dict[str, Any] = {name: settings[name] for name in CACHE_SETTING_FIELDS}
    document["adapters"] = canonical_adapters(document["adapters"])
    document["schema"] = FINGERPRINT_SCHEMA
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def compute_fingerprint(settings: Mapping[str, Any]) -> str:
    """Lower-case hex SHA-256 (64 characters) of ``canonical_settings(settings)``."""
    return hashlib.sha256(canonical_settings(settings)).hexdigest()
