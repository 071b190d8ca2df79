"""Paged KV cache description, tensors and block memory regions."""

from __future__ import annotations

import ctypes

import pytest
import torch

from agent.datapath.errors import LayoutError
from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache, parse_dtype


def spec(**kw) -> KVCacheSpec:
    base = dict(num_layers=3, num_kv_heads=2, head_size=8, block_size=4, num_blocks=5, dtype="bfloat16")
    base.update(kw)
    return KVCacheSpec(**base)


def test_sizes() -> None:
    s = spec()
    assert s.element_size == 2
    assert s.half_bytes_per_layer == 4 * 2 * 8 * 2 == 128
    assert s.block_bytes_per_layer == 256 and s.block_bytes == 768 and s.total_bytes == 5 * 768
    assert spec(dtype="fp8").block_bytes == 384 and spec(dtype=torch.float32).block_bytes == 1536


@pytest.mark.parametrize("field, value", [("num_layers", 0), ("block_size", -1), ("num_blocks", True),
                                          ("dtype", "float7"), ("layout", "paged")])
def test_invalid_spec_names_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        spec(**{field: value})


@pytest.mark.parametrize("layout", ["per_layer", "cross_layer"])
def test_regions_address_the_right_bytes(layout: str) -> None:
    s = spec(layout=layout, dtype="float32")
    cache = PagedKVCache.allocate(s)
    if layout == "per_layer":
        for layer, t in enumerate(cache.tensors):
            t.copy_(torch.arange(t.numel(), dtype=torch.float32).view(t.shape) + 1000 * layer)
    else:
        cache.tensors[0].copy_(torch.arange(cache.tensors[0].numel(), dtype=torch.float32).view(cache.tensors[0].shape))
    block = cache.block_view(3)
    assert block.shape == (3, 2, 4, 2, 8)

    def raw(regions: list[tuple[int, int]]) -> bytes:
        return b"".join(ctypes.string_at(p, n) for p, n in regions)

    def tensor_bytes(t: torch.Tensor) -> bytes:
        return bytes(t.contiguous().view(torch.uint8).flatten().tolist())

    assert raw(cache.block_regions(3)) == tensor_bytes(block)
    assert raw(cache.half_regions(3, 0)) == tensor_bytes(block[:, 0])
    assert raw(cache.half_regions(3, 1)) == tensor_bytes(block[:, 1])
    assert raw(cache.block_regions(3)) != raw(cache.block_regions(2))
    assert len(cache.block_regions(0)) == (3 if layout == "per_layer" else 1)
    assert sum(n for _, n in cache.memory_regions()) == s.total_bytes
    with pytest.raises(LayoutError):
        cache.block_regions(5)


def test_from_tensors_derives_the_spec() -> None:
    per = [torch.zeros(5, 2, 4, 2, 8, dtype=torch.float16) for _ in range(3)]
    c = PagedKVCache.from_tensors(per)
    assert c.spec == spec(dtype=torch.float16)
    cross = PagedKVCache.from_tensors(torch.zeros(5, 3, 2, 4, 2, 8, dtype=torch.float16))
    assert cross.spec.layout == "cross_layer" and cross.spec.block_bytes == c.spec.block_bytes
    with pytest.raises(LayoutError, match="block_size"):
        PagedKVCache.from_tensors(per, block_size=16)
    with pytest.raises(LayoutError, match="K/V"):
        PagedKVCache.from_tensors([torch.zeros(5, 3, 4, 2, 8)])
    with pytest.raises(LayoutError, match="contiguous"):
        PagedKVCache(spec(dtype=torch.float16), [t.transpose(2, 3).contiguous().transpose(2, 3) for t in per])
    with pytest.raises(LayoutError, match="shape"):
        PagedKVCache(spec(dtype=torch.float16, num_blocks=6), per)
    with pytest.raises(LayoutError, match="tensor"):
        PagedKVCache(spec(dtype=torch.float16), per[:2])


def test_parse_dtype() -> None:
    assert parse_dtype("torch.bfloat16") is torch.bfloat16 and parse_dtype("FP16") is torch.float16
    with pytest.raises(ValueError, match="dtype"):
        parse_dtype("int3")


def test_spec_from_config_layout() -> None:
    from types import SimpleNamespace

    layout = SimpleNamespace(num_layers=3, num_kv_heads=2, head_dim=8, block_size=4, kv_dtype="auto")
    assert KVCacheSpec.from_layout(layout, 5) == spec()
    fp8 = SimpleNamespace(num_layers=3, num_kv_heads=2, head_dim=8, block_size=4, kv_dtype="fp8_e4m3")
    assert KVCacheSpec.from_layout(fp8, 5, layout="cross_layer").dtype is torch.float8_e4m3fn
