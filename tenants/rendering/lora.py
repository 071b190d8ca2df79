"""Launch flags that load a release's LoRA adapters: vLLM 0.33.0 ``--lora-modules``, SGLang 0.5.23 ``--lora-paths``.

Each adapter is passed as one JSON argument rather than the ``name=path`` shorthand: both engines parse that
shorthand by splitting at the first ``=`` (and vLLM only when the item has no ``,``), while the JSON form
carries any path unchanged. The path reaches the engine byte for byte, which matters for the cache: vLLM
0.33.0 puts ``("lora", name, path)`` into every block hash of an adapter request, and SGLang 0.5.23 gives each
``--lora-paths`` adapter the id ``uuid5(NAMESPACE_URL, name + "\\0" + path)``, appended to the request's
``extra_key`` that seeds its page-hash chain.

Adapters stored without a path (before migration 0005) are not rendered; ``instance_meta`` lists them.
"""
from __future__ import annotations

from tenants.rendering.common import compact_json
from tenants.validators import VLLM_MAX_LORA_RANKS, LoraAdapter, lora_adapters

#: SGLang 0.5.23 default ``--max-loras-per-batch`` (adapters in one running batch, the base model counted).
SGLANG_DEFAULT_MAX_LORAS_PER_BATCH = 8


def launch_adapters(release) -> list[LoraAdapter]:
    """The release's LoRA adapters an engine can load (those with a path), sorted by name."""
    return sorted(
        (adapter for adapter in lora_adapters(release.adapters) if adapter.path is not None),
        key=lambda adapter: adapter.name,
    )


def vllm_max_lora_rank(adapters: list[LoraAdapter]) -> int | None:
    """Smallest vLLM ``--max-lora-rank`` choice that fits every declared rank; ``None`` when none is declared."""
    ranks = [adapter.rank for adapter in adapters if adapter.rank is not None]
    if not ranks:
        return None
    return next(choice for choice in VLLM_MAX_LORA_RANKS if choice >= max(ranks))


def vllm_lora_args(release) -> list[str]:
    """``--enable-lora --lora-modules {"name","path"}... [--max-loras N] [--max-lora-rank R]``, or ``[]``.

    ``--max-loras`` (vLLM default 1) is the number of adapters when more than one, so requests for different
    adapters can share a batch; ``--max-lora-rank`` (vLLM default 16) is rendered when some adapter declares
    its rank, as the smallest allowed value that fits the largest (vLLM refuses to load a larger adapter).
    """
    adapters = launch_adapters(release)
    if not adapters:
        return []
    argv = ["--enable-lora", "--lora-modules"]
    argv += [compact_json({"name": adapter.name, "path": adapter.path}) for adapter in adapters]
    if len(adapters) > 1:
        argv += ["--max-loras", str(len(adapters))]
    rank = vllm_max_lora_rank(adapters)
    if rank is not None:
        argv += ["--max-lora-rank", str(rank)]
    return argv


def sglang_lora_args(release) -> list[str]:
    """``--enable-lora --lora-paths {"lora_name","lora_path"}... [--max-loras-per-batch N]``, or ``[]``.

    SGLang infers ``--max-lora-rank`` and the target modules from the adapters it loads at start-up.
    ``--max-loras-per-batch`` (default 8, the base model counted) is raised to adapters + 1 when they would
    not fit.
    """
    adapters = launch_adapters(release)
    if not adapters:
        return []
    argv = ["--enable-lora", "--lora-paths"]
    argv += [compact_json({"lora_name": adapter.name, "lora_path": adapter.path}) for adapter in adapters]
    if len(adapters) + 1 > SGLANG_DEFAULT_MAX_LORAS_PER_BATCH:
        argv += ["--max-loras-per-batch", str(len(adapters) + 1)]
    return argv
