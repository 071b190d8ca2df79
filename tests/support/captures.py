"""The recorded vLLM 0.32.0 captures of ``tests/data/vllm/`` and config-document instances that match them.

Everything here is real engine output (``*.frames.jsonl``) or a deliberate mutation of it, re-encoded with
:func:`agent.engines.vllm.events.encode_batch` (which gives vLLM's exact bytes, see test_events.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from agent.contract.messages import InstanceSpec
from agent.engines.vllm.events import BlockStored, EventBatch, decode_message, encode_batch
from tests.support.fakes import FakeStore
from tests.support.paths import DATA

VLLM_DATA = DATA / "vllm"
RUNS = ("embedded-int", "embedded-full", "standalone-store")
GROUPS = {"default": "", "group-a": "groupA-salt"}


def meta(run: str) -> dict[str, Any]:
    """The run's ``*.meta.json``."""
    return json.loads((VLLM_DATA / f"{run}.meta.json").read_text())


def frames(run: str) -> list[list[bytes]]:
    """Every recorded multipart message of the run, in order: ``[topic, seq, payload]``."""
    return [[base64.b64decode(f) for f in json.loads(line)]
            for line in (VLLM_DATA / f"{run}.frames.jsonl").read_text().splitlines()]


def instance(run: str, *, groups: dict[str, str] | None = None, instance_id: str = "vllm-0",
             hash_seed: str | None = None, hash_algo: str | None = None, port: int = 8000,
             adapters: list[dict[str, str]] | None = None) -> InstanceSpec:
    """The config document's instance of the run's engine (tenant, model, cache_prefix, seed, layout of the
    tiny Llama: 2 layers, 2 KV heads, head_dim 32, bf16, block 32) with request groups ``groups``
    (name -> cache_salt; default :data:`GROUPS`) and LoRA ``adapters`` (``{"name", "path"}``)."""
    m = meta(run)
    groups = GROUPS if groups is None else groups
    return InstanceSpec(
        instance_id=instance_id, engine="vllm", role="both", port=port, tenant_id=m["tenant_id"],
        served_model_name="tiny-llama", model_path=m["model_arg"], vllm_model_name=m["model_dir_name"],
        namespace=m["cache_prefix"], release_state="active",
        kv_layout={"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "block_size": m["block_size"],
                   "kv_dtype": "bfloat16", "adapters": adapters or []},
        hash_algo=hash_algo or m["hash_algo"],
        hash_seed=(m["PYTHONHASHSEED"] or "") if hash_seed is None else hash_seed,
        request_groups=[{"name": name, "cache_salt": salt} for name, salt in groups.items()])


def without_gpu_events(msgs: list[list[bytes]]) -> list[list[bytes]]:
    """The stream with every GPU prefix-cache event removed (batches left empty are dropped; seq renumbered
    so no gap shows)."""
    out = []
    for topic, _seq, payload in msgs:
        batch = decode_message([topic, _seq, payload]).batch
        events = [ev for ev in batch.events if not (isinstance(ev, BlockStored) and ev.medium == "GPU")]
        if events:
            out.append([topic, len(out).to_bytes(8, "big"),
                        encode_batch(EventBatch(batch.ts, events, batch.data_parallel_rank))])
    return out


def retopic(msgs: list[list[bytes]], topic: str) -> list[list[bytes]]:
    """The stream published under ``topic`` (the instance id the registry renders as the engine's topic)."""
    return [[topic.encode(), seq, payload] for _t, seq, payload in msgs]


def store_blocks(run: str) -> int:
    """Blocks of the run's Store (``medium: "cpu"``) events."""
    return sum(len(ev.block_hashes) for f in frames(run) for ev in decode_message(f).batch.events
               if ev.medium == "cpu")


def held_store(run: str, *, tenant_id: str | None = None, keys: list[str] | None = None) -> FakeStore:
    """A ``FakeStore`` of the run's tenant holding the keys the run's master held (or ``keys``): what
    ``Attributor.confirm`` checks the attributed blocks against."""
    store = FakeStore(tenant_id or meta(run)["tenant_id"])
    store.objects = {key: b"x" for key in (meta(run)["store_keys"]["keys_present"] if keys is None else keys)}
    return store


def forged_store_events(run: str, blocks: int, *, topic: str, seq: int = 1000, per_chain: int = 10,
                        seed: int = 7, keys: list[str] | None = None) -> list[list[bytes]]:
    """What a local process that knows the run's release settings can publish: Store events (``medium: "cpu"``)
    of ``blocks`` blocks in chains of ``per_chain`` that the engine never wrote — random tokens, hashed exactly as
    the release hashes (so attribution accepts them), keys the Store does not hold (appended to ``keys``)."""
    import random

    from agent.contract.keys import vllm_key
    from agent.datapath.hashing import VllmBlockHasher
    from agent.engines.vllm.events import encode_message, external_hash

    m = meta(run)
    bs = m["block_size"]
    hasher = VllmBlockHasher(m["hash_algo"], block_size=bs, seed=m["PYTHONHASHSEED"])
    rng = random.Random(seed)
    out = []
    for start in range(0, blocks, per_chain):
        n = min(per_chain, blocks - start)
        tokens = [rng.randrange(1000) for _ in range(n * bs)]
        digests = hasher.block_hashes(tokens)
        refs = [external_hash(d, True) for d in digests]
        if keys is not None:
            keys += [vllm_key(m["model_dir_name"], d, cache_prefix=m["cache_prefix"]) for d in digests]
        events = [BlockStored(block_hashes=[refs[i]], parent_block_hash=refs[i - 1] if i else None,
                              token_ids=tokens[i * bs:(i + 1) * bs], block_size=bs, lora_id=None, medium="cpu",
                              lora_name=None, group_idx=0) for i in range(n)]
        out.append(encode_message(topic.encode(), seq + len(out), EventBatch(1796134500.0, events, 0)))
    return out
