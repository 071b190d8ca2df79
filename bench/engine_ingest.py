"""Attribution rate of vLLM KV events: Store blocks per second per core, against baselines of the same run.

    python -m bench.engine_ingest [--quick] [--requests N] [--blocks B]

Builds a long stream in the layout the recorded vLLM 0.32.0 engine publishes (``tests/data/vllm/``): each
request gives one GPU prefix-cache ``BlockStored`` (all its new blocks, ``extra_keys`` per block, the salt on
a salted request's first block) and then one message of Store events (``medium: "cpu"``, one block per event,
``parent_block_hash`` chained, int hashes = low 64 bits). Requests are re-chained from the captured token
blocks: each has a distinct first block (two token ids changed), every 4th is salted with ``groupA-salt``, and
every 5th shares the first half of the request before it (its events start at the divergence, parent = a block
the stream stored earlier), as request (b) of the captures does. Hashes come from ``agent.datapath.hashing``,
messages from ``agent.engines.vllm.events.encode_message`` (vLLM's exact bytes).

Measured with process CPU time, single thread:

* ``attribution``: ``Attributor.handle_frames`` for every message (decode, group resolution, hash rebuild,
  comparison, Store key, the pending set) and, every ``CONFIRM_EVERY`` messages as the maintenance tick does,
  ``Attributor.confirm`` against an in-memory Store that holds every key, booking into a real ``Ledger``
  (``record_put``): the whole path of an engine-written block;
* ``attribution_no_ledger``: the same, the confirmation counting only;
* ``attribution_hints``: ``handle_frames`` alone (the attribution thread's share; confirmation runs elsewhere);
* ``attribution_agent_gc``: ``attribution`` with the collector thresholds the agent runs with
  (``agent.node.engines.ENGINE_GC_THRESHOLD``; the other figures use Python's defaults);
* ``attribution_budget``: with a ``BudgetEnforcer`` listening on the ledger as well (its prefix-aware policy
  tracks every inserted block), as a node that enforces budgets runs it (reported, not judged);
* baselines: ``decode`` (``decode_message`` alone) and ``hash`` (``VllmBlockHasher.block_hashes`` of the same
  blocks, one call per request: the inherent cost of checking every hash).

Hostile input (issue 16 item 4), measured next to the ratios:

* ``hostile_walk``: one long GPU prefix-cache event (``--hostile-tokens``, 200k tokens by default: 6,250 blocks
  with the release's real hashes) and then single-block Store events (147 bytes each) whose parent is its last
  block, as a local process can publish them: CPU milliseconds per hostile event, events per second, and the
  attributor's GPU-memo lookups per event (an operation count);
* ``hostile_memory`` (a fresh interpreter, so its high-water is its own: ``VmHWM``): ``--hostile-events`` (300) GPU
  events of 200k tokens each, one at a time; the process's resident memory before and after and its high-water
  (MiB), and what the attributor says it holds (``memory_bytes``, when it accounts for it); ``hostile_memory_one_block``
  the same with events that name a single block each (the worst case for a memo bounded by entries);
* ``hostile_roots`` (issue 20 F3): an instance with ``ROOT_GROUPS`` request groups (distinct salts) and
  ``ROOT_ADAPTERS`` LoRA adapters (16,640 (salt, adapter) contexts), fed messages of ``ROOT_EVENTS_PER_MESSAGE``
  single-block Store events that are each a request's first block with a random hash and no GPU event: CPU
  milliseconds per event and block hashes computed per event (``VllmBlockHasher.block_hashes`` outputs counted:
  an operation count), plus the attributor's work units per event (what the inbox's round budget sees).

Goal: attribution ≥ 50,000 Store blocks/s/core. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.engines.vllm.attribution import MAX_MESSAGE_BLOCKS  # noqa: E402
from agent.engines.vllm.events import (  # noqa: E402
    BlockStored,
    EventBatch,
    decode_message,
    encode_message,
    external_hash,
)

GOAL_BLOCKS_PER_S = 50_000
#: Messages between two confirmation steps in the measured loops (a 2 s tick at about 2,000 messages/s).
CONFIRM_EVERY = 4096
DATA = ROOT / "tests" / "data" / "vllm"
RUN = "embedded-int"
SALT = "groupA-salt"
TOPIC = b"vllm-bench"


def captured_blocks(run: str = RUN) -> tuple[dict[str, Any], list[list[int]]]:
    """The run's meta and every distinct full token block of its recorded requests (32 token ids each)."""
    meta = json.loads((DATA / f"{run}.meta.json").read_text())
    bs = meta["block_size"]
    seen: set[tuple[int, ...]] = set()
    blocks: list[list[int]] = []
    for req in meta["requests"]:
        toks = req["token_ids"]
        for i in range(len(toks) // bs):
            block = toks[i * bs:(i + 1) * bs]
            if tuple(block) not in seen:
                seen.add(tuple(block))
                blocks.append(block)
    return meta, blocks


def instance_spec(meta: dict[str, Any], instance_id: str = "vllm-bench") -> Any:
    """The config document's instance for the captured engine, groups default ("") and group-a (salted)."""
    from agent.contract.messages import InstanceSpec

    return InstanceSpec(
        instance_id=instance_id, engine="vllm", role="both", port=8000, tenant_id=meta["tenant_id"],
        served_model_name="tiny-llama", vllm_model_name=meta["model_dir_name"], namespace=meta["cache_prefix"],
        release_state="active",
        kv_layout={"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "block_size": meta["block_size"],
                   "kv_dtype": "bfloat16"},
        hash_algo=meta["hash_algo"], hash_seed=meta["PYTHONHASHSEED"] or "",
        request_groups=[{"name": "default", "cache_salt": ""}, {"name": "group-a", "cache_salt": SALT}])


def build_stream(requests: int, blocks_per_request: int) -> dict[str, Any]:
    """The synthetic stream: ``messages`` (multipart frames), ``store_blocks``, the ``chains`` hashed
    (token lists per request, for the hashing baseline), ``meta`` and ``instance``."""
    from agent.datapath.hashing import VllmBlockHasher

    meta, pool = captured_blocks()
    bs = meta["block_size"]
    seed = meta["PYTHONHASHSEED"]
    hashers = {salt: VllmBlockHasher(meta["hash_algo"], block_size=bs, seed=seed, cache_salt=salt or None)
               for salt in ("", SALT)}
    messages: list[list[bytes]] = []
    chains: list[tuple[str, list[int]]] = []
    store_blocks = 0
    prev: tuple[str, list[int], list[bytes]] | None = None
    ts = 1796134464.0
    for r in range(requests):
        salt = SALT if r % 4 == 3 else ""
        share = prev is not None and r % 5 == 4 and prev[0] == salt
        if share:
            half = blocks_per_request // 2
            toks = prev[1][: half * bs]
        else:
            half = 0
            first = list(pool[r % len(pool)])
            first[0], first[1] = r % 1024, (r // 1024) % 1024 + 1024  # distinct first block per request
            toks = first
        for j in range(len(toks) // bs, blocks_per_request):
            toks = toks + pool[(r * 7 + j) % len(pool)]
        digests = hashers[salt].block_hashes(toks)
        chains.append((salt, toks))
        refs = [external_hash(d, True) for d in digests]
        new = range(half, blocks_per_request)
        parent = refs[half - 1] if half else None
        extra = [None] * len(new)
        if not half and salt:
            extra[0] = [salt]
        gpu = BlockStored(block_hashes=refs[half:], parent_block_hash=parent, token_ids=toks[half * bs:],
                          block_size=bs, lora_id=None, medium="GPU", lora_name=None, extra_keys=extra, group_idx=0,
                          kv_cache_spec_kind="full_attention")
        messages.append(encode_message(TOPIC, len(messages), EventBatch(ts, [gpu], 0)))
        store = [BlockStored(block_hashes=[refs[i]], parent_block_hash=refs[i - 1] if i else None,
                             token_ids=toks[i * bs:(i + 1) * bs], block_size=bs, lora_id=None, medium="cpu",
                             lora_name=None, group_idx=0) for i in new]
        messages.append(encode_message(TOPIC, len(messages), EventBatch(ts + 0.01, store, 0)))
        store_blocks += len(store)
        prev = (salt, toks, digests)
        ts += 0.05
    return {"messages": messages, "store_blocks": store_blocks, "chains": chains, "meta": meta,
            "instance": instance_spec(meta), "hashers": hashers}


def _cpu(fn, items) -> float:
    """CPU seconds of ``fn(item)`` for every item (results dropped at once, as a consumer drops them), from a
    freshly collected heap (the garbage collector's work during the loop is counted)."""
    gc.collect()
    t0 = time.process_time()
    for item in items:
        fn(item)
    return time.process_time() - t0


class _HoldsEverything:
    """An in-memory Store client that holds every key it is asked about (as if every reported write landed)."""

    tenant_id = "bench"

    def exists(self, keys: list[str]) -> list[int]:
        return [1] * len(keys)


def _with_confirm(att: Any, msgs: list[list[bytes]]) -> Any:
    """``handle_frames`` per message, and a confirmation step every ``CONFIRM_EVERY`` messages and at the end."""
    store = _HoldsEverything()
    last = msgs[-1]
    count = 0

    def step(m: list[bytes]) -> None:
        nonlocal count
        att.handle_frames(m)
        count += 1
        if count % CONFIRM_EVERY == 0 or m is last:
            while att.pending.has_work():
                att.confirm(store)
    return step


def measure(stream: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` CPU seconds of attribution (with and without a ledger) and of both baselines."""
    from agent.datapath.budget import BudgetEnforcer
    from agent.datapath.ledger import Ledger
    from agent.engines.vllm.attribution import Attributor
    from agent.node.engines import ENGINE_GC_THRESHOLD
    from agent.node.ledger_file import open_ledger_file

    msgs = stream["messages"]
    n = stream["store_blocks"]
    instance = stream["instance"]
    best = {"attribution": float("inf"), "attribution_agent_gc": float("inf"), "attribution_no_ledger": float("inf"),
            "attribution_hints": float("inf"),
            "attribution_budget": float("inf"), "attribution_persisted": float("inf"), "decode": float("inf"),
            "hash": float("inf")}
    check: dict[str, Any] = {}
    for _ in range(repeats):
        ledger = Ledger()
        att = Attributor(instance, ledger)
        best["attribution"] = min(best["attribution"], _cpu(_with_confirm(att, msgs), msgs))
        snap = att.snapshot()
        check = {"attributed": snap["attributed"], "by_group": snap["by_group"],
                 "ledger_blocks": sum(row["blocks"] for row in ledger.snapshot()),
                 "not_attributed": snap["blocks_seen"] - snap["attributed"], "decode_errors": snap["decode_errors"]}
        thresholds = gc.get_threshold()
        gc.set_threshold(*ENGINE_GC_THRESHOLD)
        try:
            tuned = Attributor(instance, Ledger())
            best["attribution_agent_gc"] = min(best["attribution_agent_gc"], _cpu(_with_confirm(tuned, msgs), msgs))
        finally:
            gc.set_threshold(*thresholds)
        del tuned
        bare = Attributor(instance, None)
        best["attribution_no_ledger"] = min(best["attribution_no_ledger"], _cpu(_with_confirm(bare, msgs), msgs))
        hints = Attributor(instance, None, memory_bytes=1 << 30)
        best["attribution_hints"] = min(best["attribution_hints"], _cpu(hints.handle_frames, msgs))
        budgeted = Ledger()
        BudgetEnforcer(budgeted)
        with_budget = Attributor(instance, budgeted)
        best["attribution_budget"] = min(best["attribution_budget"], _cpu(_with_confirm(with_budget, msgs), msgs))
        del budgeted, with_budget, ledger, att, bare, hints
        with tempfile.TemporaryDirectory(prefix="kvpool-bench-ledger-") as tmp:  # + the agent's ledger file
            persisted = Ledger()
            ledger_file = open_ledger_file(persisted, tmp, flush_interval=3600)
            with_file = Attributor(instance, persisted)
            confirmed = _with_confirm(with_file, msgs)
            best["attribution_persisted"] = min(best["attribution_persisted"], _cpu(
                lambda m, f=ledger_file, c=confirmed: (c(m), f.flush() if m is msgs[-1] else 0), msgs))
            ledger_file.close()
            del persisted, with_file
        best["decode"] = min(best["decode"], _cpu(decode_message, msgs))
        hashers = stream["hashers"]
        best["hash"] = min(best["hash"], _cpu(lambda chain, h=hashers: h[chain[0]].block_hashes(chain[1]),
                                              stream["chains"]))
    hashed_blocks = sum(len(t) // stream["meta"]["block_size"] for _s, t in stream["chains"])
    rates = {name: (hashed_blocks if name == "hash" else n) / max(sec, 1e-9) for name, sec in best.items()}
    return {"seconds": best, "rates": rates, "check": check, "hashed_blocks": hashed_blocks}


HOSTILE_TOKENS = 200_000
HOSTILE_EVENTS = 300
#: CPU seconds the walk case may spend on hostile events (it stops earlier at ``HOSTILE_MAX_EVENTS``).
HOSTILE_CPU_S = 3.0
HOSTILE_MAX_EVENTS = 20_000


class _CountingMemo(OrderedDict):  # type: ignore[type-arg]
    """A dict that counts ``get`` calls (the attributor's GPU-memo lookups: one per parent-walk step)."""

    lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        _CountingMemo.lookups += 1
        return super().get(key, default)


def _long_gpu_message(meta: dict[str, Any], tokens: int, seq: int, rng: random.Random,
                      hashed: bool = True, blocks: int | None = None) -> tuple[list[bytes], list[Any], list[int]]:
    """One GPU prefix-cache message of ``tokens`` tokens (whole blocks; real chained hashes when ``hashed``, else
    random 64-bit ones; ``blocks``: name only that many blocks, random hashes): its frames, the block refs and the
    token ids."""
    from agent.datapath.hashing import VllmBlockHasher

    bs = meta["block_size"]
    n = tokens // bs
    toks = [rng.randrange(1024) for _ in range(n * bs)]
    if blocks is not None:
        n, hashed = blocks, False
    if hashed:
        digests = VllmBlockHasher(meta["hash_algo"], block_size=bs, seed=meta["PYTHONHASHSEED"]).block_hashes(toks)
        refs: list[Any] = [external_hash(d, True) for d in digests]
    else:
        refs = [rng.getrandbits(64) for _ in range(n)]
    gpu = BlockStored(block_hashes=refs, parent_block_hash=None, token_ids=toks, block_size=bs, lora_id=None,
                      medium="GPU", lora_name=None, extra_keys=[None] * n, group_idx=0,
                      kv_cache_spec_kind="full_attention")
    return encode_message(TOPIC, seq, EventBatch(1796134464.0, [gpu], 0)), refs, toks


def hostile_walk(tokens: int = HOSTILE_TOKENS, *, cpu_s: float = HOSTILE_CPU_S,
                 max_events: int = HOSTILE_MAX_EVENTS) -> dict[str, Any]:
    """The crafted long-GPU-event attack (module docstring): CPU per hostile Store event and memo lookups."""
    from agent.engines.vllm.attribution import Attributor

    meta, _pool = captured_blocks()
    rng = random.Random(16)
    att = Attributor(instance_spec(meta), None)
    gpu_frames, refs, toks = _long_gpu_message(meta, tokens, 0, rng)
    t0 = time.process_time()
    att.handle_frames(gpu_frames)
    gpu_cpu = time.process_time() - t0
    memo = _CountingMemo(att._gpu)  # noqa: SLF001 - counting the memo's lookups is the point
    att._gpu = memo  # noqa: SLF001
    bs = meta["block_size"]
    events = 0
    spent = 0.0
    _CountingMemo.lookups = 0
    while spent < cpu_s and events < max_events:
        ev = BlockStored(block_hashes=[rng.getrandbits(64)], parent_block_hash=refs[-1], token_ids=toks[:bs],
                         block_size=bs, lora_id=None, medium="cpu", lora_name=None, group_idx=0)
        raw = encode_message(TOPIC, events + 1, EventBatch(1796134465.0, [ev], 0))
        t0 = time.process_time()
        att.handle_frames(raw)
        spent += time.process_time() - t0
        events += 1
    per_event = spent / max(events, 1)
    return {"tokens": tokens, "gpu_blocks": len(refs), "gpu_event_cpu_ms": round(gpu_cpu * 1e3, 1),
            "events": events, "event_bytes": len(raw[2]), "cpu_ms_per_event": round(per_event * 1e3, 4),
            "events_per_s": round(events / max(spent, 1e-9)),
            "memo_lookups_per_event": round(_CountingMemo.lookups / max(events, 1), 1)}


ROOT_GROUPS = 256
ROOT_ADAPTERS = 64
ROOT_EVENTS_PER_MESSAGE = 20


def hostile_roots(*, cpu_s: float = HOSTILE_CPU_S, max_messages: int = 1000,
                  groups: int = ROOT_GROUPS, adapters: int = ROOT_ADAPTERS,
                  events_per_message: int = ROOT_EVENTS_PER_MESSAGE) -> dict[str, Any]:
    """The blind-root fan-out attack (module docstring): CPU and hashes per hostile first-block event."""
    from agent.contract.messages import InstanceSpec
    from agent.datapath.hashing import VllmBlockHasher
    from agent.engines.vllm.attribution import Attributor

    meta, _pool = captured_blocks()
    spec = InstanceSpec(
        instance_id="vllm-bench", engine="vllm", role="both", port=8000, tenant_id=meta["tenant_id"],
        served_model_name="tiny-llama", vllm_model_name=meta["model_dir_name"], namespace=meta["cache_prefix"],
        release_state="active",
        kv_layout={"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "block_size": meta["block_size"],
                   "kv_dtype": "bfloat16",
                   "adapters": [{"name": f"lora{i}", "path": f"/models/lora{i}"} for i in range(adapters)]},
        hash_algo=meta["hash_algo"], hash_seed=meta["PYTHONHASHSEED"] or "",
        request_groups=[{"name": "default", "cache_salt": ""}]
        + [{"name": f"g{i}", "cache_salt": f"salt-{i}"} for i in range(groups - 1)])
    att = Attributor(spec, None)
    contexts = len(att._ctx_list)  # noqa: SLF001 - the fan-out is the point
    bs = meta["block_size"]
    rng = random.Random(20)
    hashed = [0]
    original = VllmBlockHasher.block_hashes

    def counting(self: Any, token_ids: Any, parent: bytes | None = None) -> list[bytes]:
        out = original(self, token_ids, parent)
        hashed[0] += len(out)
        return out

    VllmBlockHasher.block_hashes = counting  # type: ignore[method-assign]
    try:
        messages = events = 0
        spent = 0.0
        work0 = att.work
        while spent < cpu_s and messages < max_messages:
            evs = [BlockStored(block_hashes=[rng.getrandbits(63)], parent_block_hash=None,
                               token_ids=[rng.randrange(1024) for _ in range(bs)], block_size=bs, lora_id=None,
                               medium="cpu", lora_name=None, group_idx=0) for _ in range(events_per_message)]
            raw = encode_message(TOPIC, messages, EventBatch(1796134466.0, evs, 0))
            t0 = time.process_time()
            att.handle_frames(raw)
            spent += time.process_time() - t0
            messages += 1
            events += len(evs)
        per_event_hashes = hashed[0] / max(events, 1)
        # one message at MAX_MESSAGE_BLOCKS of such events: measured when a message's hashes are bounded (fewer than
        # every context per event), else estimated from the per-event figures (about 15 minutes before the bound)
        big = MAX_MESSAGE_BLOCKS
        if hashed[0] < contexts * events:
            evs = [BlockStored(block_hashes=[rng.getrandbits(63)], parent_block_hash=None,
                               token_ids=[rng.randrange(1024) for _ in range(bs)], block_size=bs, lora_id=None,
                               medium="cpu", lora_name=None, group_idx=0) for _ in range(big)]
            big_raw = encode_message(TOPIC, messages, EventBatch(1796134466.0, evs, 0))
            h0 = hashed[0]
            t0 = time.process_time()
            att.handle_frames(big_raw)
            big_cpu, big_hashes, measured = time.process_time() - t0, hashed[0] - h0, True
        else:
            big_cpu, big_hashes, measured = spent / max(events, 1) * big, per_event_hashes * big, False
    finally:
        VllmBlockHasher.block_hashes = original  # type: ignore[method-assign]
    c = att.counters
    return {"groups": groups, "adapters": adapters, "contexts": contexts, "messages": messages, "events": events,
            "message_bytes": sum(len(f) for f in raw), "cpu_ms_per_event": round(spent / max(events, 1) * 1e3, 4),
            "hashes_per_event": round(hashed[0] / max(events, 1), 1),
            "work_per_event": round((att.work - work0) / max(events, 1), 1),
            "max_message_events": big, "max_message_cpu_s": round(big_cpu, 3),
            "max_message_hashes": round(big_hashes), "max_message_measured": measured,
            "outcomes": {k: getattr(c, k) for k in ("attributed", "unknown_salt", "unverifiable")}}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _high_water_mib() -> float:
    """This process's resident high-water (``VmHWM``: since its ``exec``; ``ru_maxrss`` would include the memory of
    the parent it was forked from)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _hostile_memory_here(events: int, tokens: int, blocks: int | None = None) -> dict[str, Any]:
    """In this process: feed ``events`` long GPU events one at a time (naming ``blocks`` blocks each, default all);
    resident memory before, after, high-water."""
    from agent.engines.vllm.attribution import Attributor

    meta, _pool = captured_blocks()
    rng = random.Random(4)
    att = Attributor(instance_spec(meta), None)
    gc.collect()
    before = _rss_mib()
    for seq in range(events):
        raw, _refs, _toks = _long_gpu_message(meta, tokens, seq, rng, hashed=False, blocks=blocks)
        att.handle_frames(raw)
        del raw, _refs, _toks
    gc.collect()
    after = _rss_mib()
    peak = _high_water_mib()
    snap = att.snapshot()
    return {"events": events, "tokens_per_event": tokens, "rss_before_mib": round(before, 1),
            "rss_after_mib": round(after, 1), "rss_high_water_mib": round(peak, 1),
            "gpu_memo_blocks": snap.get("gpu_memo_blocks"), "memory_bytes": snap.get("memory_bytes")}


def hostile_memory(events: int = HOSTILE_EVENTS, tokens: int = HOSTILE_TOKENS,
                   blocks: int | None = None) -> dict[str, Any]:
    """:func:`_hostile_memory_here` in a fresh interpreter (its own resident high-water)."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from bench.engine_ingest import "
            f"_hostile_memory_here as m; print(json.dumps(m({events}, {tokens}, {blocks})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False, *, requests: int | None = None, blocks: int = 16,
        hostile_tokens: int = HOSTILE_TOKENS, hostile_events: int | None = None) -> dict[str, Any]:
    """Build the stream, measure, print a summary; returns the result dict (the JSON line's content)."""
    requests = requests or (300 if quick else 4000)
    stream = build_stream(requests, blocks)
    result = measure(stream, 2 if quick else 3)
    rates = result["rates"]
    n = stream["store_blocks"]
    ok_attr = result["check"]["attributed"] == n == result["check"]["ledger_blocks"]
    out = {
        "bench": "engine_ingest", "quick": quick, "requests": requests, "blocks_per_request": blocks,
        "messages": len(stream["messages"]), "store_blocks": n,
        "attribution_blocks_per_s": round(rates["attribution"]),
        "attribution_agent_gc_blocks_per_s": round(rates["attribution_agent_gc"]),
        "attribution_no_ledger_blocks_per_s": round(rates["attribution_no_ledger"]),
        "attribution_hints_blocks_per_s": round(rates["attribution_hints"]),
        "attribution_budget_blocks_per_s": round(rates["attribution_budget"]),
        "attribution_persisted_blocks_per_s": round(rates["attribution_persisted"]),
        "decode_blocks_per_s": round(rates["decode"]), "hash_blocks_per_s": round(rates["hash"]),
        "ratio_vs_hash": round(rates["attribution"] / rates["hash"], 3),
        "ratio_vs_decode": round(rates["attribution"] / rates["decode"], 3),
        "all_attributed": ok_attr, "by_group": result["check"]["by_group"],
        "goal_blocks_per_s": GOAL_BLOCKS_PER_S,
        "meets_goal": None if quick else rates["attribution"] >= GOAL_BLOCKS_PER_S,
    }
    print(f"stream: {requests} requests x {blocks} blocks, {len(stream['messages'])} messages, "
          f"{n} Store blocks ({'all' if ok_attr else 'NOT all'} attributed: {result['check']['by_group']})")
    print(f"attribution (ledger)      {rates['attribution']:>12,.0f} blocks/s/core")
    print(f"attribution (agent's GC)  {rates['attribution_agent_gc']:>12,.0f} blocks/s/core (ENGINE_GC_THRESHOLD)")
    print(f"attribution (no ledger)   {rates['attribution_no_ledger']:>12,.0f} blocks/s/core")
    print(f"attribution (hints only)  {rates['attribution_hints']:>12,.0f} blocks/s/core (handle_frames alone)")
    print(f"attribution (+budget)     {rates['attribution_budget']:>12,.0f} blocks/s/core (not judged)")
    print(f"attribution (+ledger file){rates['attribution_persisted']:>12,.0f} blocks/s/core (not judged; "
          "agent.node.ledger_file, its writes included)")
    print(f"baseline: decode only     {rates['decode']:>12,.0f} blocks/s/core")
    print(f"baseline: hashing only    {rates['hash']:>12,.0f} blocks/s/core")
    print(f"ratio attribution/hashing {out['ratio_vs_hash']:.3f}; attribution/decode {out['ratio_vs_decode']:.3f}; "
          f"goal {GOAL_BLOCKS_PER_S:,} blocks/s/core"
          + ("" if quick else f": {'met' if out['meets_goal'] else 'NOT met'}"))
    walk = hostile_walk(hostile_tokens, cpu_s=1.0 if quick else HOSTILE_CPU_S)
    memory = hostile_memory(hostile_events or (30 if quick else HOSTILE_EVENTS), hostile_tokens)
    one = hostile_memory(hostile_events or (30 if quick else HOSTILE_EVENTS), hostile_tokens, blocks=1)
    roots = hostile_roots(cpu_s=1.0 if quick else HOSTILE_CPU_S)
    out["hostile_walk"] = walk
    out["hostile_roots"] = roots
    out["hostile_memory"] = memory
    out["hostile_memory_one_block"] = one
    print(f"hostile: GPU event of {walk['tokens']:,} tokens ({walk['gpu_blocks']:,} blocks, "
          f"{walk['gpu_event_cpu_ms']:,} ms), then {walk['events']:,} Store events of {walk['event_bytes']} bytes "
          f"below its last block: {walk['cpu_ms_per_event']:,} ms CPU/event, {walk['events_per_s']:,} events/s, "
          f"{walk['memo_lookups_per_event']:,} memo lookups/event")
    print(f"hostile: first blocks with unknown hashes, {roots['groups']} groups x {roots['adapters']} adapters "
          f"({roots['contexts']:,} contexts), {roots['events']:,} events in messages of {roots['message_bytes']} "
          f"bytes: {roots['cpu_ms_per_event']:,} ms CPU/event, {roots['hashes_per_event']:,} hashes/event, "
          f"{roots['work_per_event']:,} work units/event; one message of {roots['max_message_events']:,} such events: "
          f"{roots['max_message_cpu_s']} s CPU, {roots['max_message_hashes']:,} hashes "
          f"({'measured' if roots['max_message_measured'] else 'estimated'})")
    print(f"hostile: {memory['events']} GPU events of {memory['tokens_per_event']:,} tokens: resident "
          f"{memory['rss_before_mib']} -> {memory['rss_after_mib']} MiB (high-water {memory['rss_high_water_mib']} "
          f"MiB), attributor holds {memory['memory_bytes']} bytes in {memory['gpu_memo_blocks']} memo blocks")
    print(f"hostile: {one['events']} GPU events of {one['tokens_per_event']:,} tokens naming one block each (a bound "
          f"by entries keeps them all): resident {one['rss_before_mib']} -> {one['rss_after_mib']} MiB (high-water "
          f"{one['rss_high_water_mib']} MiB), attributor holds {one['memory_bytes']} bytes")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short stream (smoke run; goal not judged)")
    parser.add_argument("--requests", type=int, default=None, help="requests in the stream")
    parser.add_argument("--blocks", type=int, default=16, help="full blocks per request")
    parser.add_argument("--hostile-tokens", type=int, default=HOSTILE_TOKENS,
                        help="tokens of each hostile GPU event")
    parser.add_argument("--hostile-events", type=int, default=None,
                        help=f"GPU events of the memory case ({HOSTILE_EVENTS}; 30 with --quick)")
    args = parser.parse_args(argv)
    out = run(args.quick, requests=args.requests, blocks=args.blocks, hostile_tokens=args.hostile_tokens,
              hostile_events=args.hostile_events)
    print(json.dumps(out))
    return 0 if out["all_attributed"] and out["meets_goal"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
