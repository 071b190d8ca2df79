"""The compatibility fingerprint: SHA-256 over a canonical encoding of the cache settings."""
from __future__ import annotations

import hashlib

import pytest

from tenants.fingerprint import (
    CACHE_SETTING_FIELDS,
    canonical_settings,
    compute_fingerprint,
)

SETTINGS = {
    "weights_revision": "main",
    "num_layers": 36,
    "num_kv_heads": 8,
    "head_dim": 128,
    "block_size": 16,
    "kv_dtype": "auto",
    "quantization": "",
    "adapters": ["b", "a"],
    "engine": "vllm",
    "engine_version": "0.33.0",
    "hash_algo": "sha256",
    "hash_seed": "42",
}


def test_canonical_encoding_is_fixed():
    expected = (
        b'{"adapters":["a","b"],"block_size":16,"engine":"vllm","engine_version":"0.33.0","hash_algo":"sha256",'
        b'"hash_seed":"42","head_dim":128,"kv_dtype":"auto","num_kv_heads":8,"num_layers":36,"quantization":"",'
        b'"schema":1,"weights_revision":"main"}'
    )
    assert canonical_settings(SETTINGS) == expected
    assert compute_fingerprint(SETTINGS) == hashlib.sha256(expected).hexdigest()


def test_adapter_order_and_extra_keys_do_not_matter():
    assert compute_fingerprint({**SETTINGS, "adapters": ["a", "b"], "namespace": "x"}) == compute_fingerprint(SETTINGS)


@pytest.mark.parametrize("field", CACHE_SETTING_FIELDS)
def test_every_setting_changes_the_fingerprint(field):
    value = SETTINGS[field]
    changed = value + 1 if isinstance(value, int) else (["c"] if isinstance(value, list) else value + "x")
    assert compute_fingerprint({**SETTINGS, field: changed}) != compute_fingerprint(SETTINGS)


def test_release_stores_its_fingerprint(release):
    release.refresh_from_db()
    assert release.fingerprint == compute_fingerprint(release.cache_settings())
    assert len(release.fingerprint) == 64
