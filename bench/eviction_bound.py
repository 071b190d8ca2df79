"""How far any class-and-age eviction policy can beat LRU on a trace: the fluid bound.

    python -m bench.eviction_bound [--trace PATH] [--capacity-tokens N [N ...]]

Each request leaves a *state*: its blocks below the shared prefix (blocks that at least 1% of the requests
use, which stay cached under any policy), waiting for the next request that extends it (the next turn of
the conversation), which would hit the blocks it shares with it. A policy that knows only a state's class
(what it can observe: turns so far, prompt length, the previous gap) and its age can do no better than to
hold each class for a fixed time; the bound picks, **with hindsight**, the best holding time per class under
the trace's average occupancy (capacity x duration in block-seconds), on the upper convex hull of each
class's (block-seconds, hits) curve. The request's last block is not counted as occupancy (a policy learns to
drop a block that is never reused). The holding times are fitted to the very trace they are scored on and
occupancy only has to hold on average, so the figure is optimistic: an online policy with the same
information does worse.

Prints, per capacity, the bound as a ratio to LRU's measured hit ratio for several sets of classes, then one
JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.sim.trace import FAST25_BLOCK_TOKENS, TraceError, TraceRequest, read_trace, sorted_by_time
from bench.eviction import DEFAULT_TRACE, simulate

_HOLDS = [0.0] + [2.0 ** (e / 4.0) for e in range(-8, 64)]  # candidate holding times, seconds


@dataclass
class State:
    """What one request leaves behind: ``blocks`` below the shared prefix, ``wait`` seconds until the next
    request extending it (``inf`` if none), ``hits`` blocks that request shares with it, and the observable
    ``turns`` (requests in the chain so far), ``gap`` (seconds since the previous one, ``None`` at turn 1)."""

    blocks: int
    wait: float
    hits: int
    turns: int
    gap: float | None


@dataclass
class Chains:
    """How the requests of a trace (in time order) chain into conversations: ``shared`` blocks (used by at
    least 1% of the requests, and at least twice), and per request ``i``: ``turns[i]`` (requests in its chain
    up to and including it), ``gap[i]`` (seconds since the previous one, ``None`` at turn 1), ``nxt[i]``
    (``(index, blocks it shares with i below the shared prefix)`` of the next request extending it, or
    ``None``), and ``shared_hits`` (hits on shared blocks, which every policy gets)."""

    shared: set[int]
    turns: list[int]
    gap: list[float | None]
    nxt: list[tuple[int, int] | None]
    shared_hits: int


def chains(requests: Sequence[TraceRequest]) -> Chains:
    """The conversation chains of ``requests`` (in time order): a request extends the latest earlier request
    that used the deepest of its leading blocks below the shared prefix, if that one has no next turn yet."""
    freq = Counter(b for r in requests for b in set(r.hash_ids))
    shared = {b for b, n in freq.items() if n >= max(2.0, 0.01 * len(requests))}
    last_user: dict[int, int] = {}
    nxt: list[tuple[int, int] | None] = [None] * len(requests)
    turns = [1] * len(requests)
    gap: list[float | None] = [None] * len(requests)
    shared_hits = 0
    seen: set[int] = set()
    for i, req in enumerate(requests):
        ids = req.hash_ids
        j = 0
        while j < len(ids) and ids[j] in shared:
            shared_hits += ids[j] in seen
            j += 1
        n, prev = 0, None
        for b in ids[j:]:
            if b not in last_user:
                break
            n, prev = n + 1, last_user[b]
        if prev is not None and nxt[prev] is None:
            nxt[prev] = (i, n)
            turns[i] = turns[prev] + 1
            gap[i] = (req.timestamp_ms - requests[prev].timestamp_ms) / 1000.0
        for b in ids:
            last_user[b] = i
            seen.add(b)
    return Chains(shared, turns, gap, nxt, shared_hits)


def states(requests: Sequence[TraceRequest]) -> tuple[list[State], int]:
    """The states of ``requests`` (in time order) and the hits on shared blocks (every policy's)."""
    ch = chains(requests)
    out = []
    for i, req in enumerate(requests):
        own = sum(1 for b in req.hash_ids if b not in ch.shared)
        if own == 0:
            continue
        link = ch.nxt[i]
        wait = (requests[link[0]].timestamp_ms - req.timestamp_ms) / 1000.0 if link else math.inf
        out.append(State(max(1, own - 1), wait, link[1] if link else 0, ch.turns[i], ch.gap[i]))
    return out, ch.shared_hits


def bound(
    items: Sequence[State], classify: Callable[[State], object], budget: float
) -> tuple[float, dict[object, float]]:
    """Most hits over ``items`` with one holding time per class and ``budget`` block-seconds on average, and
    the holding time (seconds) each class gets."""
    classes: dict[object, list[State]] = defaultdict(list)
    for s in items:
        classes[classify(s)].append(s)
    segments: list[tuple[float, float, float, object, float]] = []  # (rate, block-seconds, hits, class, hold)
    for cls, group in classes.items():
        points = sorted(
            (sum(s.blocks * min(s.wait, a) for s in group), float(sum(s.hits for s in group if s.wait <= a)), a)
            for a in _HOLDS
        )
        hull: list[tuple[float, float, float]] = []
        for p in points:
            while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0]) <= (
                p[1] - hull[-2][1]
            ) * (hull[-1][0] - hull[-2][0]):
                hull.pop()
            hull.append(p)
        for (c0, h0, _), (c1, h1, hold) in zip(hull, hull[1:]):
            if c1 > c0 and h1 > h0:
                segments.append(((h1 - h0) / (c1 - c0), c1 - c0, h1 - h0, cls, hold))
    segments.sort(key=lambda t: -t[0])
    hits = 0.0
    holds: dict[object, float] = dict.fromkeys(classes, 0.0)
    for _, cost, gain, cls, hold in segments:
        if budget < cost:
            hits += max(0.0, budget) / cost * gain
            break
        hits += gain
        budget -= cost
        holds[cls] = max(holds[cls], hold)
    return hits, holds


def feature_sets(items: Sequence[State]) -> dict[str, Callable[[State], object]]:
    """The class sets compared: observable ones, and one no online policy has (whether a next turn comes)."""
    mean_depth = math.exp(sum(math.log(s.blocks + 1) for s in items) / max(1, len(items)))

    def visits(s: State) -> int:
        return min(s.turns.bit_length() - 1, 3)

    def depth(s: State) -> int:
        return 0 if s.blocks < mean_depth / 2 else (1 if s.blocks < 2 * mean_depth else 2)

    def gap(s: State) -> int:
        return -1 if s.gap is None else min(int(math.log2(s.gap + 1.0)) // 2, 5)

    return {
        "age only": lambda s: 0,
        "visits": visits,
        "visits+depth": lambda s: (visits(s), depth(s)),
        "visits+depth+gap": lambda s: (visits(s), depth(s), gap(s)),
        "oracle: continues?": lambda s: s.wait < math.inf,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eviction_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="FAST'25-format JSONL trace (default: %(default)s)")
    parser.add_argument("--capacity-tokens", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000],
                        metavar="N", help="cache capacities in tokens (default: 1M 3M 10M)")
    args = parser.parse_args(argv)
    try:
        requests = sorted_by_time(read_trace(args.trace))
    except (TraceError, OSError) as exc:
        print(f"bench.eviction_bound: cannot read trace: {exc}", file=sys.stderr)
        return 2
    items, shared_hits = states(requests)
    span = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000.0
    sets = feature_sets(items)
    result: dict = {"bench": "eviction_bound", "trace": args.trace, "capacities": {}}
    print(f"fluid bound / LRU, classes with hindsight holding times ({len(items)} states, span {span:.0f} s)")
    print(f"   {'capacity':>10} {'LRU':>7} " + " ".join(f"{name:>19}" for name in sets))
    for cap_tokens in args.capacity_tokens:
        cap = max(1, cap_tokens // FAST25_BLOCK_TOKENS)
        lru = simulate(requests, cap, "lru").hit_blocks
        row = {name: round((bound(items, fn, cap * span)[0] + shared_hits) / lru, 3) for name, fn in sets.items()}
        print(f"   {cap_tokens:>10,} {lru / sum(len(r.hash_ids) for r in requests):>7.4f} "
              + " ".join(f"{v:>18.3f}x" for v in row.values()))
        holds = bound(items, sets["visits"], cap * span)[1]
        row["holding_s_by_visit_class"] = {str(k): round(v) for k, v in sorted(holds.items(), key=str)}
        result["capacities"][str(cap_tokens)] = row
    print("holding times by visit class (0: 1 visit, 1: 2-3, 2: 4-7, 3: 8+), seconds:")
    for cap_tokens, row in result["capacities"].items():
        print(f"   {int(cap_tokens):>10,} {row['holding_s_by_visit_class']}")
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
