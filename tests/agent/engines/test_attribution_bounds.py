"""Hostile input to the attributor (issue 16 item 4): bounded work per event (operations counted, never timed),
bounded memory in bytes, size limits per message, snapshots that never wait for attribution."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections import OrderedDict
from typing import Any

from agent.datapath.hashing import VllmBlockHasher
from agent.engines.vllm.attribution import Attributor
from agent.engines.vllm.events import BlockStored, EventBatch, encode_message, external_hash
from tests.support.captures import instance, meta

RUN = "embedded-int"
BS = 32


class CountingMemo(OrderedDict):  # type: ignore[type-arg]
    """The GPU memo, counting its lookups (one per step of a walk up a GPU chain)."""

    lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def gpu_message(tokens: list[int], seq: int, *, hashed: bool = True, rng: random.Random | None = None
                ) -> tuple[list[bytes], list[Any]]:
    """A GPU prefix-cache message of a request with these tokens (the release's real hashes, or random ones)."""
    m = meta(RUN)
    n = len(tokens) // BS
    if hashed:
        digests = VllmBlockHasher(m["hash_algo"], block_size=BS, seed=m["PYTHONHASHSEED"]).block_hashes(tokens)
        refs: list[Any] = [external_hash(d, True) for d in digests]
    else:
        refs = [(rng or random.Random(seq)).getrandbits(64) for _ in range(n)]
    ev = BlockStored(block_hashes=refs, parent_block_hash=None, token_ids=tokens, block_size=BS, lora_id=None,
                     medium="GPU", lora_name=None, extra_keys=[None] * n, group_idx=0)
    return encode_message(b"vllm-0", seq, EventBatch(1.0, [ev], 0)), refs


def store_message(parent: Any, tokens: list[int], seq: int, ref: int) -> list[bytes]:
    ev = BlockStored(block_hashes=[ref], parent_block_hash=parent, token_ids=tokens, block_size=BS, lora_id=None,
                     medium="cpu", lora_name=None, group_idx=0)
    return encode_message(b"vllm-0", seq, EventBatch(2.0, [ev], 0))


def test_store_events_below_a_long_gpu_event_walk_it_once() -> None:
    """The measured attack: one GPU event of 200k tokens, then 147-byte Store events whose parent is its last block.
    Before: every event walked 4,096 blocks up (a list search each) — 4,097 memo lookups and 300-400 ms per event."""
    rng = random.Random(16)
    tokens = [rng.randrange(1024) for _ in range(200_000 // BS * BS)]
    att = Attributor(instance(RUN), None)
    frames, refs = gpu_message(tokens, 0)
    att.handle_frames(frames)
    memo = CountingMemo(att._gpu)
    att._gpu = memo
    events = 200
    for seq in range(1, events + 1):
        att.handle_frames(store_message(refs[-1], tokens[:BS], seq, rng.getrandbits(64)))
    assert memo.lookups <= len(refs) + 4 * events  # one walk of the chain, then constant work per event
    snap = att.snapshot()
    assert snap["walk_steps"] <= len(refs) and snap["blocks_seen"] == events
    assert snap["hash_mismatch"] == events  # their own (random) hashes are wrong: nothing waits for the Store
    assert snap["pending"] == 0


def test_a_chain_that_cannot_resolve_is_not_walked_again() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(1024) for _ in range(300 * BS)]
    att = Attributor(instance(RUN), None)
    frames, refs = gpu_message(tokens, 0, hashed=False, rng=rng)  # hashes no setting reproduces
    att.handle_frames(frames)
    memo = CountingMemo(att._gpu)
    att._gpu = memo
    for seq in range(1, 51):
        att.handle_frames(store_message(refs[-1], tokens[:BS], seq, rng.getrandbits(64)))
    assert memo.lookups <= len(refs) + 4 * 50
    assert att.snapshot()["hash_mismatch"] == 50


def test_attribution_state_is_bounded_in_bytes() -> None:
    """300 GPU events of 200k tokens raised an agent from 244 to 706 MiB: the memo was bounded by entries only."""
    bound = 8 << 20
    att = Attributor(instance(RUN), None, memory_bytes=bound)
    rng = random.Random(5)
    messages = [gpu_message([rng.randrange(1024) for _ in range(32_000)], seq, hashed=False, rng=rng)[0]
                for seq in range(40)]  # 40 x 1,000 blocks: about 13 MB without a bound
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for raw in messages:
            att.handle_frames(raw)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert att.memory_used() <= bound
    assert held <= bound * 1.25  # what the accounting says is what the process holds
    assert att.snapshot()["gpu_blocks"] == 40_000 and 0 < att.snapshot()["gpu_memo_blocks"] < 40_000
    att.set_memory_bytes(bound // 4)  # a node that observes more instances shares its bound
    assert att.memory_used() <= bound // 4


def test_messages_over_the_limits_are_dropped_and_counted() -> None:
    from agent.engines.vllm.attribution import MAX_EVENT_TOKENS, MAX_MESSAGE_BLOCKS

    att = Attributor(instance(RUN), None, max_message_bytes=64 << 10)
    big, _ = gpu_message([1000] * (40_000 // BS * BS), 0, hashed=False)
    assert len(big[2]) > 64 << 10
    assert att.handle_frames(big) is None
    many = [BlockStored(block_hashes=list(range(MAX_MESSAGE_BLOCKS // 4 + 1)), parent_block_hash=None,
                        token_ids=[], block_size=BS, lora_id=None, medium="GPU", lora_name=None)] * 4
    wide = Attributor(instance(RUN), None)
    assert wide.handle_frames(encode_message(b"vllm-0", 1, EventBatch(1.0, many, 0))) is None
    long_event = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1] * (MAX_EVENT_TOKENS + 1),
                             block_size=BS, lora_id=None, medium="GPU", lora_name=None)
    assert wide.handle_frames(encode_message(b"vllm-0", 2, EventBatch(1.0, [long_event], 0))) is None
    assert att.snapshot()["decode_errors"] == 1 and "over the limit" in att.snapshot()["last_error"]
    assert wide.snapshot()["decode_errors"] == 2 and wide.snapshot()["gpu_blocks"] == 0


class RefusingLock:
    """A lock no snapshot may take: the attribution thread may hold the real one for a whole message."""

    def __enter__(self) -> None:
        raise AssertionError("snapshot() waited for the attribution lock")

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_snapshot_never_takes_the_attribution_lock() -> None:
    """A 2.9 KB message once held the attributor 5.9 s and every report waited 2.7 s for it."""
    att = Attributor(instance(RUN), None)
    frames, _ = gpu_message([7] * (4 * BS), 0)
    att.handle_frames(frames)
    att._lock = RefusingLock()  # type: ignore[assignment]
    snap = att.snapshot()
    assert snap["messages"] == 1 and snap["gpu_blocks"] == 4
