"""bench/eviction.py on a slice of the real trace, its CLI, and the other traces of bench/eviction_traces.py.
No timing is asserted."""

import functools
import io
import json
import os
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout

import pytest

from agent.sim.trace import TraceRequest, read_trace, sorted_by_time, write_trace
from bench import eviction as bench
from bench import eviction_traces
from tests.support.paths import CONVERSATION_TRACE

# The FAST'25 trace lives in the shared/ folder beside the repository (as on CI).
REAL_TRACE = str(CONVERSATION_TRACE)
needs_trace = pytest.mark.skipif(not os.path.exists(REAL_TRACE), reason="the shared FAST'25 trace is not here")


@pytest.fixture(scope="module")
def head():
    with open(REAL_TRACE, encoding="utf-8") as fh:
        lines = [next(fh) for _ in range(1500)]
    return sorted_by_time(read_trace(io.StringIO("".join(lines))))


@needs_trace
def test_slice_of_real_trace(head):
    total = sum(len(r.hash_ids) for r in head)
    distinct = len({b for r in head for b in r.hash_ids})
    ceiling = (total - distinct) / total
    cap = 400  # blocks: about 200k tokens
    results = {name: bench.simulate(head, cap, name) for name in bench.POLICIES}
    for name in ("lru", "hit-density", "belady"):
        res = results[name]
        assert res.orphaned == 0 and res.max_orphaned == 0, name
        assert res.total_blocks == total
        assert 0.0 < res.hit_ratio <= ceiling + 1e-12
    assert results["belady"].hit_ratio >= results["hit-density"].hit_ratio
    assert results["belady"].hit_ratio >= results["lru"].hit_ratio
    assert results["plain-lru"].orphaned > 0
    # With room for everything, every policy reaches the infinite-cache ceiling.
    for name in ("lru", "hit-density", "belady"):
        assert bench.simulate(head, distinct, name).hit_ratio == pytest.approx(ceiling)


def test_hit_counts_leading_blocks_only():
    reqs = [
        TraceRequest(0, 0, 0, (1, 2, 3)),
        TraceRequest(1000, 0, 0, (1, 2, 4)),
        TraceRequest(2000, 0, 0, (1, 5, 3)),  # 3 here is another prefix in a real trace; ids are opaque
    ]
    res = bench.simulate(reqs[:2], 100, "lru")
    assert (res.hit_blocks, res.total_blocks) == (2, 6)


def test_capacity_must_hold_a_block():
    with pytest.raises(ValueError, match="at least one block"):
        bench.simulate([TraceRequest(0, 0, 0, (1,))], 0, "lru")
    with pytest.raises(ValueError, match="unknown policy"):
        bench.make_policy("fifo")


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = bench.main(argv)
    return code, out.getvalue(), err.getvalue()


@needs_trace
def test_cli_prints_tables_and_a_json_last_line(tmp_path, head):
    path = tmp_path / "slice.jsonl"
    write_trace(path, head[:400])
    code, out, _ = run_main(["--trace", str(path), "--capacity-tokens", "51200", "204800"])
    assert code == 0
    lines = out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["bench"] == "eviction"
    figures = result["traces"][str(path)]["capacities"]
    assert set(figures) == {"51200", "204800"}
    for cap in figures.values():
        assert cap["lru"]["orphaned"] == cap["hit-density"]["orphaned"] == cap["belady"]["orphaned"] == 0
        assert cap["hit_density_vs_lru"] > 0
    assert any("capacity 51,200 tokens = 100 blocks" in line for line in lines)


def test_cli_reports_a_bad_trace_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{oops\n')
    code, out, err = run_main(["--trace", str(path)])
    assert code == 2 and out == ""
    assert f"{path}:2: invalid JSON" in err


def test_cli_rejects_bad_arguments():
    with pytest.raises(SystemExit):
        run_main(["--policies", "lru,fifo"])
    with pytest.raises(SystemExit):
        run_main(["--capacity-tokens", "100"])


def test_cli_runs_a_synthetic_trace(monkeypatch):
    # 1,500 requests instead of the CLI's 12,000: still about 24 times the capacity in blocks, so both policies evict
    monkeypatch.setattr(eviction_traces, "synthetic", functools.partial(eviction_traces.synthetic, n_requests=1500))
    code, out, _ = run_main(["--synthetic", "docs", "--capacity-tokens", "1000000", "--policies", "lru,hit-density"])
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    trace = result["traces"]["synthetic-docs"]
    assert trace["requests"] == 1500
    for name in ("lru", "hit-density"):
        figures = trace["capacities"]["1000000"][name]
        assert figures["orphaned"] == 0 and 0 < figures["hit_ratio"] <= trace["infinite_cache"]


@pytest.mark.parametrize("kind", eviction_traces.SYNTHETIC)
def test_synthetic_traces_are_valid_prefix_traces(tmp_path, kind):
    reqs = eviction_traces.synthetic(kind, n_requests=1500, seed=2)
    assert len(reqs) == 1500
    assert [r.timestamp_ms for r in reqs] == sorted(r.timestamp_ms for r in reqs)
    path = tmp_path / f"{kind}.jsonl"
    write_trace(path, reqs)
    assert len(read_trace(path)) == 1500  # checks lengths and that every id has one parent
    assert eviction_traces.synthetic(kind, n_requests=1500, seed=2) == reqs  # reproducible
    assert eviction_traces.synthetic(kind, n_requests=1500, seed=3) != reqs
    with pytest.raises(ValueError, match="unknown synthetic trace"):
        eviction_traces.synthetic("nope")


@needs_trace
def test_transforms_keep_prefix_structure(head):
    first = eviction_traces.first_half(head)
    second = eviction_traces.second_half(head)
    assert len(first) + len(second) == len(head)
    assert first[0].timestamp_ms == 0 and second[0].timestamp_ms == 0
    shifted = eviction_traces.shift_conversations(head, seed=1)
    assert Counter(r.hash_ids for r in shifted) == Counter(r.hash_ids for r in head)
    key = eviction_traces.conversation_key(head)
    gaps = {}
    for r in shifted:
        gaps.setdefault(key(r), []).append(r.timestamp_ms)
    orig = {}
    for r in head:
        orig.setdefault(key(r), []).append(r.timestamp_ms)
    for k, times in orig.items():
        assert [t - times[0] for t in times] == [t - gaps[k][0] for t in gaps[k]]
    full = eviction_traces.full_blocks(head)
    assert all(len(r.hash_ids) == r.input_length // 512 for r in full)
    assert all(r.input_length % 512 == 0 for r in full)


@needs_trace
def test_cli_signal_stores_tells_the_policies_only_the_stores(tmp_path, head):
    path = tmp_path / "slice.jsonl"
    write_trace(path, head[:400])
    runs = {}
    for signal in ("full", "stores", "stores-inferred"):
        code, out, _ = run_main(["--trace", str(path), "--capacity-tokens", "51200", "--signal", signal,
                                 "--policies", "lru,hit-density,belady"])
        assert code == 0
        result = json.loads(out.strip().splitlines()[-1])
        assert result["signal"] == signal
        runs[signal] = result["traces"][str(path)]["capacities"]["51200"]
    assert runs["stores"]["belady"] == runs["full"]["belady"]  # the offline optimum is always told everything
    for cap in runs.values():
        assert cap["hit-density"]["orphaned"] == cap["lru"]["orphaned"] == 0
    with pytest.raises(SystemExit):
        run_main(["--signal", "reads"])


@needs_trace
def test_bound_refined_classes_never_bound_lower(tmp_path, head):
    from bench import eviction_bound

    path = tmp_path / "slice.jsonl"
    write_trace(path, head)
    out = io.StringIO()
    with redirect_stdout(out):
        assert eviction_bound.main(["--trace", str(path), "--capacity-tokens", "102400", "204800"]) == 0
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    for row in result["capacities"].values():
        # each set refines the one before it, and the holding times are chosen with hindsight
        assert row["age only"] <= row["visits"] <= row["visits+depth"] <= row["visits+depth+gap"]
        assert row["age only"] <= row["oracle: continues?"]
        assert set(row["holding_s_by_visit_class"]) <= {"0", "1", "2", "3"}


def test_explain_attributes_each_request_difference_by_turn_gap_and_depth():
    from bench import eviction_explain as ex

    # Shared block 0 in every request; conversation A: 3 turns (gaps 30 s, 200 s), B: 2 turns (gap 2000 s),
    # C and D one-offs, then 400 one-offs so that no conversation's block is in 1% of the requests (shared).
    reqs = [
        TraceRequest(0, 0, 0, (0, 1, 2)),  # A turn 1
        TraceRequest(1_000, 0, 0, (0, 10, 11, 12)),  # B turn 1
        TraceRequest(30_000, 0, 0, (0, 1, 2, 3)),  # A turn 2, gap 30 s
        TraceRequest(40_000, 0, 0, (0, 20)),  # C
        TraceRequest(230_000, 0, 0, (0, 1, 2, 3, 4)),  # A turn 3, gap 200 s
        TraceRequest(500_000, 0, 0, (0, 30)),  # D
        TraceRequest(2_001_000, 0, 0, (0, 10, 11, 12, 13)),  # B turn 2, gap 2000 s
    ] + [TraceRequest(3_000_000 + i, 0, 0, (0, 1000 + i)) for i in range(400)]
    ch = ex.chains(reqs)
    assert ch.turns == [1, 1, 2, 1, 3, 1, 2] + [1] * 400
    assert ch.gap[2] == 30.0 and ch.gap[4] == 200.0 and ch.gap[6] == 2000.0 and ch.gap[0] is None
    a = [0, 0, 2, 1, 4, 1, 4] + [1] * 400
    b = [0, 1, 1, 1, 1, 0, 1] + [1] * 400
    fig = ex.explain(reqs, a, b)
    assert fig["total"] == sum(a) - sum(b) == 7
    for feature in ("turn", "gap", "depth"):
        assert sum(fig[feature].values()) == fig["total"], feature
    # brute force: the expected cells, request by request
    assert fig["turn"] == {"1": -1 + 1, "2": 1 + 3, "3-4": 3, "5-8": 0, "9+": 0}
    assert fig["gap"]["first"] == 0 and fig["gap"]["<60s"] == 1 and fig["gap"]["120-240s"] == 3
    assert fig["gap"][">=1920s"] == 3
    assert fig["depth"] == {"<10": 7, "10-29": 0, "30-79": 0, "80+": 0}
    # the running lead: brute force at each slice end, the last one the total
    traj = ex.trajectory(reqs, a, b, parts=4)
    ends = [max(1, len(reqs) * k // 4) for k in range(1, 5)]
    assert [p["requests"] for p in traj] == ends
    assert [p["lead"] for p in traj] == [sum(a[:e]) - sum(b[:e]) for e in ends]
    assert traj[-1]["lead"] == fig["total"]
    assert traj[0]["seconds"] == round((reqs[ends[0] - 1].timestamp_ms - reqs[0].timestamp_ms) / 1000.0, 1)
    assert ex.trajectory(reqs[:3], a[:3], b[:3], parts=8)[-1] == {"requests": 3, "seconds": 30.0, "lead": 0}
    assert ex.trajectory([], [], []) == []
    with pytest.raises(ValueError):
        ex.trajectory(reqs, a, b, parts=0)
    assert [ex.turn_label(t) for t in (1, 2, 3, 4, 5, 8, 9, 100)] == ["1", "2", "3-4", "3-4", "5-8", "5-8", "9+", "9+"]
    assert [ex.depth_label(n) for n in (1, 9, 10, 29, 30, 79, 80)] == ["<10", "<10", "10-29", "10-29", "30-79",
                                                                      "30-79", "80+"]


@needs_trace
def test_explain_per_request_hits_add_up_to_the_simulator_totals(tmp_path, head):
    from bench import eviction_explain as ex

    cap = 300
    for name in ("lru", "hit-density", "belady"):
        per = ex.request_hits(head, cap, name)
        assert len(per) == len(head)
        assert sum(per) == bench.simulate(head, cap, name).hit_blocks, name
    path = tmp_path / "slice.jsonl"
    write_trace(path, head)
    out = io.StringIO()
    with redirect_stdout(out):
        assert ex.main(["--trace", str(path), "--capacity-tokens", "153600"]) == 0
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    pairs = result["capacities"]["153600"]
    assert set(pairs) == {"belady:hit-density", "hit-density:lru"}
    for fig in pairs.values():
        assert sum(fig["turn"].values()) == sum(fig["gap"].values()) == sum(fig["depth"].values()) == fig["total"]
        assert len(fig["trajectory"]) == 8 and fig["trajectory"][-1]["lead"] == fig["total"]
    assert pairs["belady:hit-density"]["total"] >= 0  # the optimum is never behind
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()):
        ex.main(["--trace", str(path), "--pairs", "belady-lru"])
