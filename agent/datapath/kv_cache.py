"""The paged KV cache the connector moves blocks out of and into: its description and its torch tensors.

Two layouts, on any torch device (CPU here, CUDA on a GPU node):

``per_layer``
    one tensor per layer, shape ``[num_blocks, 2, block_size, num_kv_heads, head_size]`` (K at index 0, V at 1),
    as vLLM's FlashAttention-style caches hold it. Block ``b`` of layer ``l`` is ``tensors[l][b]``, contiguous.
``cross_layer``
    one tensor of shape ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_size]``: a whole block,
    all layers, is one contiguous region.

One stored object is one block across all layers (vLLM 0.33.0 ``MooncakeStoreConnector``) -- or, for SGLang
0.5.23 keys, one ``_k`` and one ``_v`` object per page, each across all layers. :meth:`PagedKVCache.block_regions`
lists the ``(pointer, bytes)`` pieces of each object in a fixed order (layer-major), which is what
``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers`` (or ``batch_put_from`` / ``batch_get_into``
for a single contiguous piece) take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agent.datapath.errors import LayoutError

Layout = Literal["per_layer", "cross_layer"]
LAYOUTS: tuple[str, ...] = ("per_layer", "cross_layer")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2, "fp8_e5m2": torch.float8_e5m2,
    "uint8": torch.uint8, "int8": torch.int8,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a torch dtype or its name (``"bfloat16"``, ``"fp8"``, ``"torch.float16"``, ...).

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.").lower()
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: unknown KV dtype {dtype!r}; expected one of {sorted(_DTYPES)}") from None


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of a paged KV cache.

    Attributes:
        num_layers: attention layers whose KV is stored.
        num_kv_heads: KV heads on this rank.
        head_size: elements per head.
        block_size: tokens per block (vLLM block / SGLang page).
        num_blocks: blocks in the cache (slots the engine addresses by block id).
        dtype: element type (torch dtype or name).
        layout: ``per_layer`` or ``cross_layer`` (module docstring).

    Raises:
        ValueError: naming the field, for a non-positive size or unknown dtype/layout.
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_blocks: int
    dtype: torch.dtype | str = torch.bfloat16
    layout: Layout = "per_layer"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_size", "block_size", "num_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: must be one of {LAYOUTS}, got {self.layout!r}")

    @classmethod
    def from_layout(cls, kv_layout: Any, num_blocks: int, *, layout: Layout = "per_layer",
                    auto_dtype: torch.dtype | str = torch.bfloat16) -> KVCacheSpec:
        """A spec from a config document's KV layout (duck-typed on ``agent.contract.messages.KVLayout``: num_layers,
        num_kv_heads, head_dim, block_size, kv_dtype; ``kv_dtype`` "auto"/"" takes ``auto_dtype``, the model's
        dtype)."""
        dtype = getattr(kv_layout, "kv_dtype", "") or "auto"
        return cls(num_layers=kv_layout.num_layers, num_kv_heads=kv_layout.num_kv_heads,
                   head_size=kv_layout.head_dim, block_size=kv_layout.block_size, num_blocks=num_blocks,
                   dtype=auto_dtype if dtype == "auto" else dtype, layout=layout)

    @property
    def element_size(self) -> int:
        """Bytes per element of :attr:`dtype`."""
        return torch.empty((), dtype=parse_dtype(self.dtype)).element_size()

    @property
    def half_bytes_per_layer(self) -> int:
        """Bytes of K (or of V) of one block in one layer: ``block_size * num_kv_heads * head_size * elem``."""
        return self.block_size * self.num_kv_heads * self.head_size * self.element_size

    @property
    def block_bytes_per_layer(self) -> int:
        """Bytes of one block (K and V) in one layer."""
        return 2 * self.half_bytes_per_layer

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers (K and V): the size of one vLLM object."""
        return self.num_layers * self.block_bytes_per_layer

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole cache."""
        return self.num_blocks * self.block_bytes

    def layer_shape(self) -> tuple[int, ...]:
        """Per-layer tensor shape ``[num_blocks, 2, block_size, num_kv_heads, head_size]``."""
        return (self.num_blocks, 2, self.block_size, self.num_kv_heads, self.head_size)

    def cross_layer_shape(self) -> tuple[int, ...]:
        """Cross-layer tensor shape ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_size]``."""
        return (self.num_blocks, self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_size)


class PagedKVCache:
    """The KV cache tensors of one rank, and the memory regions of each block.

    Build it with :meth:`allocate` or wrap an engine's tensors with :meth:`from_tensors`.

    Raises:
        LayoutError: tensors whose count, shape, dtype, device or contiguity differ from ``spec``.
    """

    def __init__(self, spec: KVCacheSpec, tensors: Sequence[torch.Tensor]) -> None:
        self.spec = spec
        self.tensors: tuple[torch.Tensor, ...] = tuple(tensors)
        self._check()
        self.device = self.tensors[0].device
        self._base = [t.data_ptr() for t in self.tensors]
        self._stride = spec.block_bytes_per_layer if spec.layout == "per_layer" else spec.block_bytes

    def _check(self) -> None:
        spec = self.spec
        if spec.layout == "per_layer":
            want_count, shape = spec.num_layers, spec.layer_shape()
        else:
            want_count, shape = 1, spec.cross_layer_shape()
        if len(self.tensors) != want_count:
            raise LayoutError(f"{spec.layout} cache needs {want_count} tensor(s), got {len(self.tensors)}")
        devices = {t.device for t in self.tensors}
        if len(devices) != 1:
            raise LayoutError(f"cache tensors must share one device, got {sorted(map(str, devices))}")
        for i, t in enumerate(self.tensors):
            if tuple(t.shape) != shape:
                raise LayoutError(f"tensor {i}: shape {tuple(t.shape)} != expected {shape}")
            if t.dtype != spec.dtype:
                raise LayoutError(f"tensor {i}: dtype {t.dtype} != expected {spec.dtype}")
            if not t.is_contiguous():
                raise LayoutError(f"tensor {i}: must be contiguous")

    @classmethod
    def allocate(cls, spec: KVCacheSpec, device: str | torch.device = "cpu", *, fill: float | None = 0.0,
                 pin_memory: bool = False) -> PagedKVCache:
        """Allocate the tensors of ``spec`` on ``device`` (zeros, or uninitialised with ``fill=None``).

        ``pin_memory`` page-locks CPU tensors (faster host<->GPU copies; needs a CUDA build).
        """
        shapes = ([spec.layer_shape()] * spec.num_layers if spec.layout == "per_layer"
                  else [spec.cross_layer_shape()])
        tensors = []
        for shape in shapes:
            t = torch.empty(shape, dtype=parse_dtype(spec.dtype), device=device, pin_memory=pin_memory)
            if fill is not None:
                t.view(torch.uint8).fill_(0) if fill == 0 else t.fill_(fill)
            tensors.append(t)
        return cls(spec, tensors)

    @classmethod
    def from_tensors(cls, tensors: Sequence[torch.Tensor] | torch.Tensor, *, block_size: int | None = None,
                     layout: Layout | None = None) -> PagedKVCache:
        """Wrap existing tensors, deriving the spec from their shapes.

        A single 6-D tensor is ``cross_layer``; a sequence of 5-D tensors is ``per_layer``.

        Raises:
            LayoutError: shapes that are neither layout, or disagree with ``block_size``/``layout``.
        """
        seq = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if not seq:
            raise LayoutError("from_tensors needs at least one tensor")
        first = seq[0]
        if len(seq) == 1 and first.dim() == 6:
            found: Layout = "cross_layer"
            nb, nl, two, bs, heads, hd = first.shape
        elif first.dim() == 5:
            found = "per_layer"
            nb, two, bs, heads, hd = first.shape
            nl = len(seq)
        else:
            raise LayoutError(f"cannot derive a KV layout from tensor shape {tuple(first.shape)}")
        if two != 2:
            raise LayoutError(f"K/V dimension must be 2, got {two} in shape {tuple(first.shape)}")
        if layout is not None and layout != found:
            raise LayoutError(f"tensors have layout {found}, expected {layout}")
        if block_size is not None and block_size != bs:
            raise LayoutError(f"tensors have block_size {bs}, expected {block_size}")
        spec = KVCacheSpec(num_layers=int(nl), num_kv_heads=int(heads), head_size=int(hd), block_size=int(bs),
                           num_blocks=int(nb), dtype=first.dtype, layout=found)
        return cls(spec, seq)

    # --- memory regions -------------------------------------------------------------------------------------

    def memory_regions(self) -> list[tuple[int, int]]:
        """``(pointer, bytes)`` of every tensor: what to register with the store once."""
        return [(t.data_ptr(), t.numel() * t.element_size()) for t in self.tensors]

    def _check_block(self, block_id: int) -> None:
        if not 0 <= block_id < self.spec.num_blocks:
            raise LayoutError(f"block id {block_id} outside the cache's {self.spec.num_blocks} blocks")

    def block_regions(self, block_id: int) -> list[tuple[int, int]]:
        """``(pointer, bytes)`` pieces of block ``block_id`` across all layers, layer-major (K then V per layer).

        ``per_layer``: one piece per layer; ``cross_layer``: one contiguous piece.
        """
        self._check_block(block_id)
        if self.spec.layout == "cross_layer":
            return [(self._base[0] + block_id * self._stride, self._stride)]
        off = block_id * self._stride
        size = self._stride
        return [(base + off, size) for base in self._base]

    def half_regions(self, block_id: int, kv: int) -> list[tuple[int, int]]:
        """``(pointer, bytes)`` of the K (``kv=0``) or V (``kv=1``) half of a block in every layer, layer-major."""
        self._check_block(block_id)
        half = self.spec.half_bytes_per_layer
        if self.spec.layout == "cross_layer":
            start = self._base[0] + block_id * self._stride + kv * half
            step = self.spec.block_bytes_per_layer
            return [(start + layer * step, half) for layer in range(self.spec.num_layers)]
        off = block_id * self._stride + kv * half
        return [(base + off, half) for base in self._base]

    def block_view(self, block_id: int) -> torch.Tensor:
        """Block ``block_id`` across all layers as one ``[num_layers, 2, block_size, heads, head_size]`` tensor
        (a copy for ``per_layer``, a view for ``cross_layer``)."""
        self._check_block(block_id)
        if self.spec.layout == "cross_layer":
            return self.tensors[0][block_id]
        return torch.stack([t[block_id] for t in self.tensors])
