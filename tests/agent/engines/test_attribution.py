"""Attribution of the recorded vLLM 0.32.0 Store events to request groups, Store keys and the real ledger."""

from __future__ import annotations

import msgspec
import pytest

from agent.contract.scope import CacheScope
from agent.datapath.ledger import Ledger
from agent.engines.vllm.attribution import OUTCOMES, Attributor, instance_block_bytes
from agent.engines.vllm.events import BlockStored, EventBatch, decode_message, encode_batch
from tests.support.captures import (
    RUNS,
    frames,
    held_store,
    instance,
    meta,
    store_blocks,
    without_gpu_events,
)
from tests.support.fakes import HoldsEverything

OBJECT_BYTES = 16 * 1024  # 2 layers x K,V x 32 tokens x 2 KV heads x 32 dims x bf16


def run_stream(run: str, msgs=None, *, ledger: Ledger | None = None, **spec) -> tuple[Attributor, Ledger]:
    """Feed the run's messages (or ``msgs``), then confirm the attributed blocks against a Store holding the keys
    the run's master held (events are hints: nothing is booked before that)."""
    ledger = Ledger() if ledger is None else ledger
    att = Attributor(instance(run, **spec), ledger)
    for raw in frames(run) if msgs is None else msgs:
        att.handle_frames(raw)
    att.confirm(held_store(run))
    return att, ledger


def present_keys(ledger: Ledger) -> set[str]:
    return {key for t in ledger.tables() for key in ledger.present_keys(t.scope)}


def scope(run: str, group: str) -> CacheScope:
    m = meta(run)
    return CacheScope(m["tenant_id"], "tiny-llama", m["cache_prefix"], group)


def outcomes(att: Attributor) -> dict[str, int]:
    snap = att.snapshot()
    assert snap["blocks_seen"] == sum(snap[name] for name in OUTCOMES)
    return {name: snap[name] for name in OUTCOMES if snap[name]}


def test_block_bytes_come_from_the_kv_layout() -> None:
    assert instance_block_bytes(instance("embedded-int")) == OBJECT_BYTES


@pytest.mark.parametrize("gpu", [True, False], ids=["with-gpu-events", "store-events-only"])
@pytest.mark.parametrize("run", RUNS)
def test_attribution_reproduces_the_store_keys_byte_for_byte(run: str, gpu: bool) -> None:
    msgs = frames(run) if gpu else without_gpu_events(frames(run))
    att, ledger = run_stream(run, msgs)
    held = meta(run)["store_keys"]["keys_present"]
    assert sorted(present_keys(ledger)) == sorted(held)
    n = store_blocks(run)
    assert n == len(held)
    assert outcomes(att) == {"attributed": n}
    snap = att.snapshot()
    assert snap["decode_errors"] == snap["seq_gaps"] == 0
    # the tenant is charged 16 KiB per object, as the master charged it
    total = sum(row["bytes"] for row in ledger.snapshot())
    assert total == n * OBJECT_BYTES
    quotas = meta(run)["store_keys"]["tenant_quotas"]
    if quotas:  # multi-tenant masters: the writer's tenant was charged exactly that
        charged = {q["tenant_id"]: q["charged_bytes"] for q in quotas["data"]}
        assert charged[meta(run)["tenant_id"]] == total


@pytest.mark.parametrize("gpu", [True, False], ids=["via-gpu-events", "via-recomputation"])
@pytest.mark.parametrize("run", RUNS)
def test_salted_request_lands_in_its_request_group(run: str, gpu: bool) -> None:
    msgs = frames(run) if gpu else without_gpu_events(frames(run))
    att, ledger = run_stream(run, msgs)
    salted = next(r for r in meta(run)["requests"] if r["cache_salt"] == "groupA-salt")
    unsalted = len(meta(run)["store_keys"]["keys_present"]) - 4
    assert att.snapshot()["by_group"] == {"default": unsalted, "group-a": 4}
    rows = {row["request_group"]: row for row in ledger.snapshot()}
    assert rows["group-a"]["blocks"] == 4 and rows["group-a"]["bytes"] == 4 * OBJECT_BYTES
    assert rows["default"]["blocks"] == unsalted
    # the group's keys are exactly the salted request's keys the master held
    store_refs = [ev.block_hashes[0] for raw in msgs for ev in decode_message(raw).batch.events]
    group_a = {att.key_of(ref) for ref in store_refs if att.group_of(ref) == "group-a"}
    assert group_a == ledger.present_keys(scope(run, "group-a"))
    assert len(group_a) == 4 and salted["id"] == "c"


@pytest.mark.parametrize("gpu", [True, False], ids=["with-gpu-events", "store-events-only"])
def test_unregistered_salt_is_counted_not_attributed(gpu: bool) -> None:
    msgs = frames("embedded-int") if gpu else without_gpu_events(frames("embedded-int"))
    att, ledger = run_stream("embedded-int", msgs, groups={"default": ""})
    assert outcomes(att) == {"attributed": 15, "unknown_salt": 4}
    assert sum(row["blocks"] for row in ledger.snapshot()) == 15


def test_salted_groups_only_leave_unsalted_requests_unknown() -> None:
    att, _ = run_stream("embedded-int", groups={"group-a": "groupA-salt"})
    assert outcomes(att) == {"attributed": 4, "unknown_salt": 15}


@pytest.mark.parametrize("change", [{"hash_seed": "7"}, {"hash_algo": "sha256_cbor"}, {"hash_algo": "xxhash",
                                                                                          "hash_seed": "1"}])
@pytest.mark.parametrize("run", RUNS)
def test_unknown_engine_settings_show_as_hash_mismatch(run: str, change: dict[str, str]) -> None:
    att, ledger = run_stream(run, **change)
    n = store_blocks(run)
    assert outcomes(att) == {"hash_mismatch": n}
    assert ledger.snapshot() == [] or all(row["blocks"] == 0 for row in ledger.snapshot())


def test_wrong_seed_without_gpu_events_cannot_tell_salt_from_settings() -> None:
    att, _ = run_stream("embedded-int", without_gpu_events(frames("embedded-int")), hash_seed="7")
    assert outcomes(att) == {"unknown_salt": 19}


def test_ledger_records_every_block_with_its_parent() -> None:
    att, ledger = run_stream("embedded-int")
    m = meta("embedded-int")
    entries = {}
    for t in ledger.tables():
        entries.update(t.entries)
    for req in m["requests"]:
        group = "group-a" if req["cache_salt"] else "default"
        hasher = Attributor(instance("embedded-int"), None)._ctxs[(group, "")].hasher
        parent_key = None
        for digest in hasher.block_hashes(req["token_ids"]):
            key = att.key_of(int.from_bytes(digest[-8:], "big"))
            assert key is not None and key.endswith(digest.hex())
            e = entries[key]
            assert e.owned and e.present and e.size == OBJECT_BYTES and e.parent == parent_key
            assert e.keyspace.scope.request_group == group
            parent_key = key
    # (b) shares (a)'s first 3 blocks: its 4th block's parent is (a)'s 3rd
    a, b = m["requests"][0]["token_ids"], m["requests"][1]["token_ids"]
    hasher = Attributor(instance("embedded-int"), None)._ctxs[("default", "")].hasher
    ha, hb = hasher.block_hashes(a), hasher.block_hashes(b)
    assert ha[:3] == hb[:3] and ha[3] != hb[3]
    b3 = entries[att.key_of(int.from_bytes(hb[3][-8:], "big"))]
    assert b3.parent == att.key_of(int.from_bytes(ha[2][-8:], "big"))
    assert entries[b3.parent].children_count == 2  # (a)'s block 3 and (b)'s block 3
    assert all(row["orphaned_bytes"] == 0 for row in ledger.snapshot())


def test_corrupted_frames_are_counted_and_the_stream_continues() -> None:
    msgs = frames("embedded-int")
    good = msgs[1]
    obj = msgspec.msgpack.decode(good[2])
    obj[1][0]["block_hashes"] = "not a list"
    corrupt = [good[:2], [good[0], good[1][:3], good[2]], [good[0], good[1], good[2][:40]],
               [good[0], good[1], msgspec.msgpack.encode(obj)], [good[0], good[1], b"\xff" * 9]]
    stream = []
    for i, raw in enumerate(msgs):
        stream.append(raw)
        if i < len(corrupt):
            stream.append(corrupt[i])
    att, ledger = run_stream("embedded-int", stream)
    snap = att.snapshot()
    assert snap["decode_errors"] == len(corrupt) and snap["last_error"]
    assert outcomes(att) == {"attributed": 19}
    assert sorted(present_keys(ledger)) == sorted(meta("embedded-int")["store_keys"]["keys_present"])


def test_a_malformed_hash_inside_a_valid_event_is_unverifiable() -> None:
    msgs = frames("embedded-int")
    obj = msgspec.msgpack.decode(msgs[7][2])
    obj[1][-1]["block_hashes"] = [-5]  # (d)'s last block
    msgs[7] = [msgs[7][0], msgs[7][1], msgspec.msgpack.encode(obj)]
    att, _ = run_stream("embedded-int", msgs)
    assert outcomes(att) == {"attributed": 18, "unverifiable": 1}


def test_a_dropped_store_message_resolves_the_next_parent_from_gpu_events() -> None:
    msgs = frames("embedded-int")
    att, ledger = run_stream("embedded-int", msgs[:1] + msgs[2:])  # (a)'s Store events lost
    snap = att.snapshot()
    assert snap["seq_gaps"] == 1
    # (b)'s block 3 continues (a)'s block 2, known only from the GPU event
    assert outcomes(att) == {"attributed": 15}
    assert len(present_keys(ledger)) == 15


def test_a_parent_never_seen_is_unresolved_not_guessed() -> None:
    msgs = frames("embedded-int")
    att, ledger = run_stream("embedded-int", msgs[2:])  # the agent started after request (a)
    assert outcomes(att) == {"attributed": 13, "unresolved_parent": 2}
    assert len(present_keys(ledger)) == 13


def test_store_events_merged_into_one_multi_block_event_attribute_the_same() -> None:
    msgs = frames("embedded-int")
    merged = []
    for topic, seq, payload in msgs:
        batch = decode_message([topic, seq, payload]).batch
        events = batch.events
        if events[0].medium == "cpu":
            first = events[0]
            events = [BlockStored(
                block_hashes=[h for ev in events for h in ev.block_hashes], parent_block_hash=first.parent_block_hash,
                token_ids=[t for ev in events for t in ev.token_ids], block_size=32, lora_id=None, medium="cpu",
                lora_name=None, group_idx=0)]
        merged.append([topic, seq, encode_batch(EventBatch(batch.ts, events, 0))])
    att, ledger = run_stream("embedded-int", merged)
    assert outcomes(att) == {"attributed": 19}
    assert sorted(present_keys(ledger)) == sorted(meta("embedded-int")["store_keys"]["keys_present"])


def test_a_changed_token_below_an_attributed_parent_is_a_mismatch_and_taints_its_children() -> None:
    msgs = frames("embedded-int")
    obj = msgspec.msgpack.decode(msgs[7][2])
    obj[1][4]["token_ids"][0] += 1  # (d)'s 5th block as the engine would never hash it
    msgs[7] = [msgs[7][0], msgs[7][1], msgspec.msgpack.encode(obj)]
    att, _ = run_stream("embedded-int", msgs)
    assert outcomes(att) == {"attributed": 14, "hash_mismatch": 5}


def test_wrong_block_size_is_unverifiable() -> None:
    msgs = frames("embedded-int")
    obj = msgspec.msgpack.decode(msgs[1][2])
    obj[1][3]["token_ids"] = obj[1][3]["token_ids"][:16]
    msgs[1] = [msgs[1][0], msgs[1][1], msgspec.msgpack.encode(obj)]
    att, _ = run_stream("embedded-int", msgs)
    # (a)'s last block cannot be checked; (b) continues (a)'s block 2 and is attributed
    assert outcomes(att) == {"attributed": 18, "unverifiable": 1}


def test_reapplied_instance_keeps_known_blocks_and_counters() -> None:
    msgs = frames("embedded-int")
    ledger = Ledger()
    first = Attributor(instance("embedded-int"), ledger)
    for raw in msgs[:2]:
        first.handle_frames(raw)
    groups = {"default": "", "group-a": "groupA-salt", "group-b": "groupB-salt"}
    second = Attributor(instance("embedded-int", groups=groups), ledger, previous=first)
    for raw in msgs[2:]:
        second.handle_frames(raw)
    assert outcomes(second) == {"attributed": 19}
    assert second.snapshot()["seq_gaps"] == 0 and second.snapshot()["messages"] == 8


def test_non_vllm_instances_are_refused() -> None:
    spec = instance("embedded-int").model_copy(update={"engine": "sglang"})
    with pytest.raises(ValueError, match="engine"):
        Attributor(spec, None)


@pytest.mark.parametrize("run", RUNS)
def test_pure_python_hashing_attributes_the_same(run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.datapath.hashing as hashing
    import agent.datapath.keyspace as keyspace

    monkeypatch.setattr(hashing, "_chainhash", None)
    monkeypatch.setattr(keyspace, "_native_hex_keys", None)
    att, ledger = run_stream(run)
    assert not att._ctx_list[0].hasher.native
    assert sorted(present_keys(ledger)) == sorted(meta(run)["store_keys"]["keys_present"])
    assert outcomes(att) == {"attributed": store_blocks(run)}


def _as_lora_request(msgs: list[list[bytes]], name: str, path: str) -> list[list[bytes]]:
    """Request (a)'s messages (GPU event, Store events) re-hashed as a request for LoRA adapter ``name``: the
    hashes the project's hasher gives under ``("lora", name, path)``, the GPU event naming the adapter in
    ``lora_name`` and every block's extra keys, the Store events without it (as the Mooncake connector sends)."""
    from agent.datapath.hashing import LoraRef, VllmBlockHasher

    a = meta("embedded-int")["requests"][0]["token_ids"]
    digests = VllmBlockHasher("sha256", block_size=32, lora=LoraRef(name, path)).block_hashes(a)
    refs = [int.from_bytes(d[-8:], "big") for d in digests]
    out = []
    for topic, seq, payload in msgs[:2]:
        batch = decode_message([topic, seq, payload]).batch
        events = []
        for ev in batch.events:
            if ev.medium == "GPU":
                events.append(BlockStored(block_hashes=refs, parent_block_hash=None, token_ids=ev.token_ids,
                                          block_size=32, lora_id=1, medium="GPU", lora_name=name,
                                          extra_keys=[[name]] * 4, group_idx=0, kv_cache_spec_kind="full_attention"))
            else:
                k = len(events)
                events.append(BlockStored(block_hashes=[refs[k]], parent_block_hash=refs[k - 1] if k else None,
                                          token_ids=ev.token_ids, block_size=32, lora_id=None, medium="cpu",
                                          lora_name=None, group_idx=0))
        out.append([topic, seq, encode_batch(EventBatch(batch.ts, events, 0))])
    return out


@pytest.mark.parametrize("gpu", [True, False], ids=["via-gpu-events", "via-recomputation"])
def test_lora_request_is_attributed_to_its_release_scope(gpu: bool) -> None:
    spec = instance("embedded-int", adapters=[{"name": "sql", "path": "/models/sql-lora"}])
    msgs = _as_lora_request(frames("embedded-int"), "sql", "/models/sql-lora")
    if not gpu:
        msgs = without_gpu_events(msgs)
    ledger = Ledger()
    att = Attributor(spec, ledger)
    for raw in msgs:
        att.handle_frames(raw)
    att.confirm(HoldsEverything(spec.tenant_id))
    assert outcomes(att) == {"attributed": 4}
    assert ledger.snapshot()[0]["request_group"] == "default" and ledger.snapshot()[0]["blocks"] == 4
    # an instance that does not list the adapter cannot reproduce the blocks
    att2, _ = run_stream("embedded-int", msgs)
    assert outcomes(att2) == ({"unknown_adapter": 4} if gpu else {"unknown_salt": 4})


def test_bounded_maps_forget_the_oldest_blocks() -> None:
    msgs = frames("embedded-int")
    small = Attributor(instance("embedded-int"), Ledger(), known_blocks=1, gpu_memo_blocks=64)
    for raw in msgs:
        small.handle_frames(raw)
    # (a)'s block 2 left the known map, (b) finds it through the GPU memo
    assert outcomes(small) == {"attributed": 19}
    assert small.snapshot()["known_blocks"] == 1
    tiny = Attributor(instance("embedded-int"), Ledger(), known_blocks=1, gpu_memo_blocks=2)
    for raw in msgs:
        tiny.handle_frames(raw)
    assert outcomes(tiny) == {"attributed": 17, "unresolved_parent": 2}
    assert tiny.snapshot()["gpu_memo_blocks"] <= 2


@pytest.mark.parametrize("gpu", [True, False], ids=["with-gpu-events", "store-events-only"])
def test_store_events_without_token_ids_take_them_from_gpu_events(gpu: bool) -> None:
    """vLLM's Mooncake connector sends ``token_ids: []`` when a request's tokens are gone at save time."""
    msgs = []
    for topic, seq, payload in frames("embedded-int"):
        batch = decode_message([topic, seq, payload]).batch
        for ev in batch.events:
            if ev.medium == "cpu":
                ev.token_ids = []
        msgs.append([topic, seq, encode_batch(batch)])
    att, ledger = run_stream("embedded-int", msgs if gpu else without_gpu_events(msgs))
    if gpu:
        assert outcomes(att) == {"attributed": 19}
        assert sorted(present_keys(ledger)) == sorted(meta("embedded-int")["store_keys"]["keys_present"])
    else:
        assert outcomes(att) == {"unverifiable": 19}


def test_store_block_removed_is_a_hint_the_store_confirms_and_cleared_is_counted() -> None:
    from agent.engines.vllm.events import AllBlocksCleared, BlockRemoved

    msgs = frames("embedded-int")
    last = decode_message(msgs[7]).batch.events[-1].block_hashes
    extra = EventBatch(1796134480.0, [BlockRemoved(block_hashes=last, medium="cpu"),
                                      BlockRemoved(block_hashes=last, medium="GPU"), AllBlocksCleared()], 0)
    att, ledger = run_stream("embedded-int", msgs + [[b"", (8).to_bytes(8, "big"), encode_batch(extra)]])
    snap = att.snapshot()
    assert (snap["removed_blocks"], snap["cleared"], snap["events"]) == (1, 1, 26)
    assert len(present_keys(ledger)) == 19  # the Store still holds it: the removal was not true
    store = held_store("embedded-int")
    store.evict([att.key_of(last[0])])
    again = EventBatch(1796134481.0, [BlockRemoved(block_hashes=last, medium="cpu")], 0)
    att.handle_frames([b"", (9).to_bytes(8, "big"), encode_batch(again)])
    assert len(present_keys(ledger)) == 19  # a hint until the Store is asked
    assert att.confirm(store).rechecked_gone == 1
    assert len(present_keys(ledger)) == 18
    row = next(r for r in ledger.snapshot(detail=True) if r["request_group"] == "default")
    assert row["master_evicted_blocks"] == 1
