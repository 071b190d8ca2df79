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


# --- issue 20 F3: first blocks that no GPU event names are hashed under every (salt, adapter) context ----------

def fanout_instance(instance_id: str = "vllm-0", groups: int = 64, adapters: int = 16) -> Any:
    """An instance with ``groups`` request groups (distinct salts) and ``adapters`` LoRA adapters:
    ``groups * (adapters + 1)`` contexts (64 x 17 = 1,088 by default)."""
    return instance(RUN, instance_id=instance_id,
                    groups={"default": ""} | {f"g{i}": f"salt-{i}" for i in range(groups - 1)},
                    adapters=[{"name": f"lora{i}", "path": f"/models/lora{i}"} for i in range(adapters)])


def blind_roots(count: int, seq: int, rng: random.Random, topic: bytes = b"vllm-0") -> list[bytes]:
    """One message of ``count`` single-block Store events, each a request's first block with a random hash."""
    evs = [BlockStored(block_hashes=[rng.getrandbits(63)], parent_block_hash=None,
                       token_ids=[rng.randrange(1024) for _ in range(BS)], block_size=BS, lora_id=None,
                       medium="cpu", lora_name=None, group_idx=0) for _ in range(count)]
    return encode_message(topic, seq, EventBatch(3.0, evs, 0))


class CountingHashes:
    """Counts the block hashes ``VllmBlockHasher.block_hashes`` computes (an operation count)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.count = 0
        original = VllmBlockHasher.block_hashes

        def counting(hasher: Any, token_ids: Any, parent: bytes | None = None) -> list[bytes]:
            out = original(hasher, token_ids, parent)
            self.count += len(out)
            return out

        monkeypatch.setattr(VllmBlockHasher, "block_hashes", counting)


def test_blind_roots_hash_at_most_the_root_budget_per_message(monkeypatch: Any) -> None:
    """The review's F3: 20 events of a 3 KiB message, each a first block with an unknown hash, were each hashed under
    every context (here 1,088: 21,760 hashes; 332,800 with 256 groups x 64 adapters) for one work unit each. Now one
    message hashes at most ``MAX_ROOT_HASHES``, every hash is a work unit, and the untried rest is counted."""
    from agent.engines.vllm import attribution

    monkeypatch.setattr(attribution, "MAX_ROOT_HASHES", 2000, raising=False)
    hashes = CountingHashes(monkeypatch)
    att = Attributor(fanout_instance(), None)
    contexts = len(att._ctx_list)
    assert contexts == 1088
    work0 = att.work
    att.handle_frames(blind_roots(20, 0, random.Random(1)))
    c = att.counters
    assert hashes.count <= 2000  # before: 21,760
    assert c.root_hashes == hashes.count
    assert att.work - work0 >= hashes.count  # the inbox's round budget sees the hashes
    assert c.unknown_salt == 1 and c.roots_over_budget == 19 and c.unverifiable == 19  # 1,088 + 912 tried, then none
    assert c.blocks_seen == 20
    # the next message has a budget again: a real first block of the base model still resolves
    m = meta(RUN)
    toks = [random.Random(2).randrange(1024) for _ in range(BS)]
    digest = VllmBlockHasher(m["hash_algo"], block_size=BS, seed=m["PYTHONHASHSEED"]).block_hashes(toks)[0]
    ev = BlockStored(block_hashes=[external_hash(digest, True)], parent_block_hash=None, token_ids=toks,
                     block_size=BS, lora_id=None, medium="cpu", lora_name=None, group_idx=0)
    att.handle_frames(encode_message(b"vllm-0", 1, EventBatch(4.0, [ev], 0)))
    assert c.attributed == 1


def test_a_root_that_resolved_to_no_context_is_not_hashed_again(monkeypatch: Any) -> None:
    hashes = CountingHashes(monkeypatch)
    att = Attributor(fanout_instance(groups=8, adapters=2), None)  # 24 contexts
    raw = blind_roots(1, 0, random.Random(3))
    att.handle_frames(raw)
    assert hashes.count == 24 and att.counters.unknown_salt == 1
    for seq in range(1, 50):  # the same first block again and again
        att.handle_frames([raw[0], seq.to_bytes(8, "big"), raw[2]])
    assert hashes.count == 24  # before: 24 more per message
    assert att.counters.unknown_salt == 50 and att.counters.roots_remembered == 49


def test_blind_roots_of_one_instance_cannot_hold_a_round_for_long(monkeypatch: Any) -> None:
    """One attribution thread serves every instance: within one round the hostile instance hashes at most its round
    budget plus one message's ``MAX_ROOT_HASHES``, and the other instance's message is handled in that round."""
    from agent.engines.vllm import attribution
    from agent.engines.vllm.observer import EngineObserver
    from tests.support.captures import frames, retopic

    hashes = CountingHashes(monkeypatch)
    obs = EngineObserver(None, metrics_interval=0, inbox_options={"round_work": 512})
    obs.apply([fanout_instance("a"), instance(RUN, instance_id="b")])
    obs.inbox.open()
    rng = random.Random(4)
    for seq in range(50):  # 50 messages x 20 blind roots x 1,088 contexts: 1,088,000 hashes before
        raw = blind_roots(20, seq, rng, b"a")
        assert obs.handle_instance_frames("a", raw)
    for raw in retopic(frames(RUN), "b"):
        assert obs.handle_instance_frames("b", raw)
    before = hashes.count
    obs.inbox.run_round()
    # b's 8 messages hash fewer than 100 blocks; before: 1,088,000 hashes in this one round
    assert hashes.count - before <= 512 + getattr(attribution, "MAX_ROOT_HASHES", 4096) + 100
    assert obs.attributor("a").counters.root_hashes <= 512 + attribution.MAX_ROOT_HASHES
    assert obs.inbox.queued("b") < 8 and obs.inbox.queued("a") > 0
