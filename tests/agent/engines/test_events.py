"""Decoding of every recorded vLLM 0.32.0 KV-event message, and of deliberate corruptions of them."""

from __future__ import annotations

import msgspec
import pytest

from agent.engines.vllm.events import (
    BlockStored,
    EventBatch,
    EventDecodeError,
    SequenceTracker,
    check_hash,
    decode_message,
    encode_batch,
    encode_message,
    external_hash,
    first_block_salt,
    hash_matches,
    low64,
)
from tests.support.captures import RUNS, frames, meta


@pytest.mark.parametrize("run", RUNS)
def test_every_captured_message_decodes_and_reencodes_byte_for_byte(run: str) -> None:
    msgs = frames(run)
    assert len(msgs) == meta(run)["num_messages"]
    as_int = meta(run)["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] == 1
    for i, raw in enumerate(msgs):
        msg = decode_message(raw)
        assert msg.topic == b"" and msg.seq == i and msg.unknown_events == 0
        assert isinstance(msg.batch, EventBatch) and msg.batch.data_parallel_rank == 0
        assert encode_batch(msg.batch) == raw[2]  # the Structs mirror vLLM's layout exactly
        assert encode_message(msg.topic, msg.seq, msg.batch) == raw
        for ev in msg.batch.events:
            assert isinstance(ev, BlockStored) and ev.block_size == 32
            assert len(ev.token_ids) == 32 * len(ev.block_hashes)
            assert all(type(h) is (int if as_int else bytes) for h in ev.block_hashes)
            if ev.medium == "cpu":  # Store write: one block, no extra keys, no LoRA name
                assert len(ev.block_hashes) == 1 and ev.extra_keys is None and ev.lora_name is None
            else:
                assert ev.medium == "GPU" and len(ev.extra_keys) == len(ev.block_hashes)


def test_salt_is_in_the_gpu_events_first_extra_keys() -> None:
    salts = [first_block_salt(ev.extra_keys[0], ev.lora_name)
             for raw in frames("embedded-int") for ev in decode_message(raw).batch.events
             if ev.medium == "GPU" and ev.parent_block_hash is None]
    assert salts == ["", "groupA-salt", ""]
    assert first_block_salt(["adapter", "s"], "adapter") == "s"
    assert first_block_salt(["adapter"], "adapter") == ""


def test_int_hash_is_low_64_bits_of_the_full_digest() -> None:
    full = bytes.fromhex("b3a30fb8481ae93a956feb866aba06aaf403a0ee1ecbf942bc0981334c00ade5")
    assert low64(full) == 13549503011239276005 == external_hash(full, True)
    assert external_hash(full, False) == full
    assert hash_matches(full, 13549503011239276005) and hash_matches(full, full)
    assert not hash_matches(full, 13549503011239276004)
    assert check_hash(2**64 - 1) == 2**64 - 1 and check_hash(full) == full
    for bad in (-1, 2**64, b"x" * 8, "ab", None, True):
        with pytest.raises(EventDecodeError) as info:
            check_hash(bad)
        assert info.value.what == "block_hash"


def _mutated_payload(raw: list[bytes], change) -> bytes:
    obj = msgspec.msgpack.decode(raw[2])
    change(obj)
    return msgspec.msgpack.encode(obj)


@pytest.mark.parametrize("corrupt, what", [
    (lambda r: r[:2], "frames"),
    (lambda r: r + [b""], "frames"),
    (lambda r: [r[0], r[1][:4], r[2]], "seq"),
    (lambda r: [r[0], r[1], r[2][:-7]], "payload"),
    (lambda r: [r[0], r[1], b"\xc1garbage"], "payload"),
    (lambda r: [r[0], r[1], msgspec.msgpack.encode({"ts": 1.0})], "payload"),
    (lambda r: [r[0], r[1], _mutated_payload(r, lambda o: o[1][0].__setitem__("block_hashes", "x"))], "event"),
    (lambda r: [r[0], r[1], _mutated_payload(r, lambda o: o[1][0].pop("token_ids"))], "event"),
    (lambda r: [r[0], r[1], _mutated_payload(r, lambda o: o[1][0].pop("type"))], "event"),
    (lambda r: [r[0], r[1], None], "frames"),
])
def test_malformed_messages_raise_a_typed_error_naming_the_part(corrupt, what) -> None:
    raw = frames("embedded-int")[1]
    with pytest.raises(EventDecodeError) as info:
        decode_message(corrupt(list(raw)))
    assert info.value.what == what
    assert what in str(info.value)


def test_unknown_fields_are_ignored_and_unknown_event_types_skipped() -> None:
    raw = frames("embedded-int")[1]

    def add(o):
        o[1][0]["future_field"] = [1, 2]
        o[1].insert(1, {"type": "BlockMoved", "block_hashes": [1]})
        o.append("trailing")

    msg = decode_message([raw[0], raw[1], _mutated_payload(raw, add)])
    assert msg.unknown_events == 1
    assert [ev.block_hashes for ev in msg.batch.events] == [
        ev.block_hashes for ev in decode_message(raw).batch.events]


def test_sequence_tracker_counts_gaps_and_restarts() -> None:
    t = SequenceTracker()
    assert [t.observe(s) for s in (0, 1, 4, 5, 0, 1)] == [0, 0, 2, 0, 0, 0]
    assert (t.gaps, t.resets, t.messages) == (2, 1, 6)
