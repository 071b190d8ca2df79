"""bench/engine_pressure.py without an engine: the prompts it derives from the trace, the orphan count from
existence probes (a fake store), the ledger error, the command line and the JSON shape. The real run is
``python -m bench.engine_pressure`` (docs/eviction.md)."""
from __future__ import annotations

import json

import pytest

from agent.contract import keys
from agent.datapath.hashing import VllmBlockHasher
from agent.sim.trace import TraceRequest
from bench import engine_pressure as bench
from demo.engine import request_prompt


def _request(line: int, hash_ids: tuple[int, ...], input_length: int | None = None) -> TraceRequest:
    return TraceRequest(timestamp_ms=line * 1000, input_length=input_length or 512 * len(hash_ids),
                        output_length=10, hash_ids=hash_ids, line=line)


def test_prompts_are_the_engine_demos_derivation_with_one_group_per_conversation():
    trace = [_request(1, (0, 11, 12)), _request(2, (0, 21)), _request(3, (0, 11, 12, 13)), _request(4, (7,))]
    prompts = bench.plan_prompts(trace, 10)
    assert [p.line for p in prompts] == [1, 2, 3, 4] and [p.root for p in prompts] == [11, 21, 11, 7]
    assert prompts[0].tokens == tuple(request_prompt(trace[0], 32, 8, max_model_len=1024))
    assert prompts[2].tokens[:96] == prompts[0].tokens  # the later turn starts with the earlier one, block-aligned
    assert prompts[0].group == prompts[2].group and {p.group for p in prompts} <= set(bench.GROUPS)
    assert all(len(p.tokens) <= 1024 - 8 for p in prompts)
    assert len(bench.plan_prompts(trace, 2)) == 2
    # sampling keeps or drops whole conversations, stably
    kept = bench.plan_prompts(trace * 50, 1000, sample=3)
    roots = {p.root for p in kept}
    assert all(bench.sampled(p.root, 3) for p in kept) and roots == {r for r in (11, 21, 7) if bench.sampled(r, 3)}


def test_replay_stats_count_distinct_blocks_per_group_and_the_infinite_cache_ceiling():
    a = bench.Prompt(1, 1, "g1", tuple(range(64)))
    b = bench.Prompt(2, 1, "g1", tuple(range(96)))
    c = bench.Prompt(3, 2, "g2", tuple(range(64)))  # same tokens, another salt: other blocks
    stats = bench.replay_stats([a, b, c])
    assert stats == {"prompts": 3, "blocks": 7, "unique_blocks": 5, "unique_bytes": 5 * bench.BLOCK_BYTES,
                     "infinite_cache_hit_ratio": round(2 / 7, 4)}


class FakeStore:
    """Existence probes against a set of keys (what ``batch_is_exist`` answers)."""

    def __init__(self, held):
        self.held = set(held)

    def exists(self, keys_):
        return [1 if key in self.held else 0 for key in keys_]


def test_orphans_are_present_keys_whose_parent_key_is_absent():
    hasher = VllmBlockHasher("sha256", block_size=32, seed="4242", cache_salt="s")

    class Space:
        def block_hashes(self, tokens):
            return hasher.block_hashes(tokens)

        def keys(self, hashes):
            return [keys.vllm_key("tiny-llama", h, cache_prefix="ns") for h in hashes]

    prompts = [bench.Prompt(1, 1, "g", tuple(range(5 * 32 + 3))),
               bench.Prompt(2, 1, "g", tuple(range(3 * 32)) + tuple(range(500, 564)))]
    chains = bench.chain_keys({"g": Space()}, prompts)
    assert [len(c) for c in chains] == [5, 5] and chains[0][:3] == chains[1][:3]
    # the master evicted block 1 of the shared prefix and block 3 of the second chain's own tail
    held = set(chains[0]) | set(chains[1])
    held -= {chains[0][1], chains[1][3]}
    store = FakeStore(held)
    every = list(dict.fromkeys(k for c in chains for k in c))
    present = {k for k, flag in zip(every, store.exists(every), strict=True) if flag == 1}
    lost = bench.orphans(chains, present)
    # a present key whose parent is absent: block 2 of the shared prefix (under the gap at 1) and the second
    # chain's block 4 (under its gap at 3); blocks 3 and 4 of the first chain have a present parent
    assert lost == sorted([chains[0][2], chains[1][4]])
    assert bench.unreachable(chains, present) == sorted([chains[0][2], chains[0][3], chains[0][4], chains[1][4]])
    assert bench.orphans(chains, set(every)) == [] and bench.orphans(chains, set()) == []
    assert bench.orphans(chains, {chains[0][0]}) == []  # a root alone is never an orphan
    assert bench.unreachable(chains, set(every)) == [] and bench.unreachable(chains, set(every) - {chains[0][0]}) \
        == sorted(set(every) - {chains[0][0]})


def test_ledger_error_and_cpu_seconds():
    assert bench.ledger_error(90, 100) == pytest.approx(0.1 * 100 / max(100, bench.BLOCK_BYTES))
    assert bench.ledger_error(0, 0) == 0 and bench.ledger_error(2 * bench.BLOCK_BYTES, 0) == 2
    assert bench.ledger_error(110 << 20, 100 << 20) == pytest.approx(0.1)
    import os

    assert bench.cpu_seconds(os.getpid()) > 0 and bench.cpu_seconds(2 ** 22 + 1) == 0.0


def test_agent_log_counts():
    text = ("x INFO kvpool.agent.maintenance: node node-1: removed 12 block(s) of bench/tiny/tiny-2026-12 over its "
            "budget of 9437184 bytes (5 refused: read leases)\n"
            "x INFO kvpool.agent.maintenance: node node-1: removed 3 block(s) of bench/tiny/tiny-2026-12 over its "
            "budget of 9437184 bytes (0 refused: read leases)\n"
            "x INFO kvpool.agent.maintenance: node node-1: removed 4 orphaned block(s) (their parent left the Store)\n"
            "x WARNING kvpool.agent.engines: node node-1: instance 1 reported 7 Store write(s) the Store does not hold "
            "(forged events, writes the master dropped, or blocks evicted before the check)\n")
    assert bench.log_counts(text) == (15, 4, 7, 5)


def _arm(hits: int) -> dict:
    return {"hit_tokens": hits, "lookup_tokens": 1000, "store_evictions": 0, "orphans": 0, "orphan_bytes": 0,
            "ledger_error_max": 0.01}


def test_the_json_shape():
    hits = (100, 150, 120, 140, 130)
    result = bench.result_json({"bench": "engine_pressure"},
                               {name: _arm(h) for name, h in zip(bench.DEFAULT_ARMS, hits, strict=True)})
    assert list(result) == ["bench", "arms", "prefix_vs_store", "prefix_vs_lru"]
    assert set(result["arms"]) == {"store", "prefix", "lru", "prefix_keep_orphans", "prefix_eager_orphans"}
    assert all(set(bench.ARM_KEYS) <= set(arm) for arm in result["arms"].values())
    assert (result["prefix_vs_store"], result["prefix_vs_lru"]) == (1.5, 1.25)
    assert json.loads(json.dumps(result)) == result
    partial = bench.result_json({}, {"prefix": _arm(10), "store": _arm(0)})
    assert (partial["prefix_vs_store"], partial["prefix_vs_lru"]) == (None, None)


def test_command_line():
    args = bench.parse_args(["--quick"])
    assert (args.requests, args.nodes, args.quota_mib, args.arms) == (240, 1, 12, list(bench.DEFAULT_ARMS))
    args = bench.parse_args([])
    assert (args.requests, args.nodes, args.quota_mib, args.segment_mib) == (720, 2, 24, 16)
    assert bench.parse_args(["--arms", "store,prefix"]).arms == ["store", "prefix"]
    for bad in (["--arms", "fifo"], ["--budget-share", "0"], ["--sample", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_arms_match_the_agent_flags():
    from agent.datapath.budget import BUDGET_POLICIES

    assert all(arm["policy"] in BUDGET_POLICIES for arm in bench.ARMS.values())
    assert not bench.ARMS["store"]["budget"] and bench.ARMS["lru"]["policy"] == "lru"
    from agent.datapath.maintenance import DEFAULT_ORPHAN_RULE, ORPHAN_RULES

    assert all(arm["orphans"] in ORPHAN_RULES for arm in bench.ARMS.values())
    assert bench.ARMS["prefix"]["orphans"] == DEFAULT_ORPHAN_RULE
    assert [bench.ARMS[a]["orphans"] for a in ("prefix_keep_orphans", "prefix_eager_orphans")] == ["off", "eager"]


def test_send_times_follow_the_trace_pace():
    prompts = [bench.Prompt(i, 1, "g", (1,), t) for i, t in enumerate((100.0, 105.0, 130.0))]
    assert bench.send_times(prompts, 5) == [0.0, 1.0, 6.0]
    assert bench.send_times(prompts, 0) == [0.0, 0.0, 0.0] and bench.send_times([], 5) == []
    trace = [_request(1, (0, 11)), _request(3, (0, 11, 12))]
    assert [p.time_s for p in bench.plan_prompts(trace, 2)] == [1.0, 3.0]


def test_settle_times_measure_each_eviction_round_until_the_ledger_matches_the_store():
    block = bench.BLOCK_BYTES
    samples = [(0.0, 100 * block, 100 * block, 0.0),
               (2.0, 100 * block, 80 * block, 20.0 * block),   # a round: the ledger still holds what went
               (4.0, 90 * block, 80 * block, 20.0 * block),
               (6.0, 81 * block, 80 * block, 20.0 * block),    # within 4 blocks: settled 4 s after
               (8.0, 81 * block, 60 * block, 40.0 * block)]    # a second round, never settled
    assert bench.settle_times(samples) == [4.0, None]
    assert bench.settle_times(samples[:1]) == [] and bench.settle_times([]) == []
    assert bench.settle_times([(0.0, 0, 0, 0.0), (2.0, 10 * block, 10 * block, 1.0)]) == [0.0]
