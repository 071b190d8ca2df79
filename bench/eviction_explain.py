"""Where one eviction policy's prefix hits differ from another's, by what the requests are.

    python -m bench.eviction_explain [--trace PATH] [--capacity-tokens N [N ...]] [--pairs A:B [A:B ...]]

Replays the trace with each policy named in ``--pairs`` (names of ``bench.eviction.POLICIES``; default
``belady:hit-density hit-density:lru``, at 10M tokens), exactly as ``bench.eviction`` does, and keeps every
request's prefix hit. For each pair ``A:B`` the per-request difference (A's hit blocks minus B's) is summed
by three features of the request:

- **turn**: its place in its conversation chain (``bench.eviction_bound.chains``: a request extends the
  latest one whose blocks below the shared prefix it repeats): 1 (a first turn, which can only hit the
  shared prefix), 2, 3-4, 5-8, 9+. Turn 2 is the reuse of a branch entered once, that is of a block whose
  branch has 1 visit when it is kept or evicted;
- **gap**: seconds since the previous turn of its chain (the reuse distance in time of the blocks it could
  hit), in octaves from 60 s;
- **depth**: its length in blocks (what a hit on it is worth).

So ``belady:hit-density`` says what the optimum keeps that the policy evicts, in the terms a policy could
learn. The rows of each table add up to the pair's total difference.

Each pair also gets its **trajectory**: the running sum of the difference at the end of each eighth of the
requests (``--parts``), with the trace's time there. It says *when* one policy pulls ahead, which is what any
online feedback (a shadow LRU, set dueling) could have reacted to: a policy ahead of LRU until the last
eighth gives such feedback nothing to act on before the loss. Prints the tables, then one JSON object on the
last line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence

from agent.sim.trace import FAST25_BLOCK_TOKENS, TraceError, TraceRequest, read_trace, sorted_by_time
from bench.eviction import DEFAULT_TRACE, POLICIES, next_uses, simulate
from bench.eviction_bound import chains

DEFAULT_PAIRS = ("belady:hit-density", "hit-density:lru")
TURNS = ("1", "2", "3-4", "5-8", "9+")
GAPS = ("first", "<60s", "60-120s", "120-240s", "240-480s", "480-960s", "960-1920s", ">=1920s")
DEPTHS = ("<10", "10-29", "30-79", "80+")


def turn_label(turns: int) -> str:
    """Label of a request's turn in its chain (``turns`` >= 1)."""
    if turns <= 2:
        return TURNS[turns - 1]
    return TURNS[min(4, (turns - 1).bit_length())]


def gap_label(gap: float | None) -> str:
    """Label of the seconds since the previous turn (``None`` for a first turn)."""
    if gap is None:
        return GAPS[0]
    if gap < 60.0:
        return GAPS[1]
    return GAPS[min(len(GAPS) - 1, 2 + int(math.log2(gap / 60.0)))]


def depth_label(blocks: int) -> str:
    """Label of a request's length in blocks."""
    return DEPTHS[0] if blocks < 10 else DEPTHS[1] if blocks < 30 else DEPTHS[2] if blocks < 80 else DEPTHS[3]


def request_hits(requests: Sequence[TraceRequest], capacity_blocks: int, policy: str,
                 future: list[list[float]] | None = None) -> list[int]:
    """Prefix-hit blocks of each request (``requests`` in time order) replayed by ``bench.eviction.simulate``
    against ``capacity_blocks`` one-byte blocks, every read and store reported. ``future``: ``next_uses`` of
    the requests (computed for ``belady`` when not given). Raises ``ValueError`` for a capacity < 1."""
    out: list[int] = []
    simulate(requests, capacity_blocks, policy, future=future, hits_out=out)
    return out


def explain(requests: Sequence[TraceRequest], hits_a: Sequence[int], hits_b: Sequence[int]) -> dict:
    """Sum ``hits_a[i] - hits_b[i]`` over the requests (in time order) by turn, gap and depth label.

    Returns ``{"total": int, "turn": {label: int}, "gap": {...}, "depth": {...}}``, every label present."""
    ch = chains(requests)
    by: dict[str, Counter[str]] = {"turn": Counter(), "gap": Counter(), "depth": Counter()}
    for i, req in enumerate(requests):
        d = hits_a[i] - hits_b[i]
        if d:
            by["turn"][turn_label(ch.turns[i])] += d
            by["gap"][gap_label(ch.gap[i])] += d
            by["depth"][depth_label(len(req.hash_ids))] += d
    labels = {"turn": TURNS, "gap": GAPS, "depth": DEPTHS}
    out: dict = {"total": sum(hits_a) - sum(hits_b)}
    for feature, counts in by.items():
        out[feature] = {label: counts.get(label, 0) for label in labels[feature]}
    return out


def trajectory(requests: Sequence[TraceRequest], hits_a: Sequence[int], hits_b: Sequence[int],
               parts: int = 8) -> list[dict]:
    """Running sum of ``hits_a[i] - hits_b[i]`` (requests in time order) at the end of each of ``parts``
    equal slices of the requests: ``[{"requests": n, "seconds": t, "lead": int}, ...]``, ``n`` the requests
    replayed so far, ``t`` the last one's time in seconds from the first request. The last lead is the total.
    Raises ``ValueError`` for ``parts`` < 1."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    n = len(requests)
    ends = sorted({max(1, (n * k) // parts) for k in range(1, parts + 1)}) if n else []
    t0 = requests[0].timestamp_ms if n else 0
    out: list[dict] = []
    lead = 0
    i = 0
    for end in ends:
        while i < end:
            lead += hits_a[i] - hits_b[i]
            i += 1
        out.append({"requests": end, "seconds": round((requests[end - 1].timestamp_ms - t0) / 1000.0, 1),
                    "lead": lead})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eviction_explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="FAST'25-format JSONL trace (default: %(default)s)")
    parser.add_argument("--capacity-tokens", type=int, nargs="+", default=[10_000_000], metavar="N",
                        help="cache capacities in tokens (default: 10M)")
    parser.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), metavar="A:B",
                        help="policy pairs A:B, A's hits minus B's (default: %(default)s)")
    parser.add_argument("--parts", type=int, default=8,
                        help="slices of the requests for each pair's running lead (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.parts < 1:
        parser.error("--parts must be >= 1")
    pairs = [tuple(p.split(":", 1)) for p in args.pairs]
    bad = [":".join(p) for p in pairs if len(p) != 2 or p[0] not in POLICIES or p[1] not in POLICIES]
    if bad:
        parser.error(f"--pairs: bad {', '.join(bad)}; each is A:B with A and B from {', '.join(POLICIES)}")
    if any(c < FAST25_BLOCK_TOKENS for c in args.capacity_tokens):
        parser.error(f"--capacity-tokens: each capacity must hold at least one block ({FAST25_BLOCK_TOKENS} tokens)")
    try:
        requests = sorted_by_time(read_trace(args.trace))
    except (TraceError, OSError) as exc:
        print(f"bench.eviction_explain: cannot read trace: {exc}", file=sys.stderr)
        return 2
    names = sorted({n for p in pairs for n in p})
    future = next_uses(requests) if "belady" in names else None
    total = sum(len(r.hash_ids) for r in requests)
    result: dict = {"bench": "eviction_explain", "trace": args.trace, "capacities": {}}
    for cap_tokens in args.capacity_tokens:
        cap = cap_tokens // FAST25_BLOCK_TOKENS
        hits = {n: request_hits(requests, cap, n, future) for n in names}
        print(f"-- capacity {cap_tokens:,} tokens = {cap:,} blocks; hit ratios "
              + ", ".join(f"{n} {sum(h) / total:.4f}" for n, h in hits.items()))
        cap_fig: dict = {}
        for a, b in pairs:
            fig = explain(requests, hits[a], hits[b])
            fig["trajectory"] = trajectory(requests, hits[a], hits[b], args.parts)
            cap_fig[f"{a}:{b}"] = fig
            print(f"   {a} - {b}: {fig['total']:+,} hit blocks")
            for feature in ("turn", "gap", "depth"):
                cells = "  ".join(f"{label} {v:+,}" for label, v in fig[feature].items())
                print(f"      by {feature:<5} {cells}")
            cells = "  ".join(f"{p['requests']} ({p['seconds']:.0f} s) {p['lead']:+,}" for p in fig["trajectory"])
            print(f"      running lead after requests: {cells}")
        result["capacities"][str(cap_tokens)] = cap_fig
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
