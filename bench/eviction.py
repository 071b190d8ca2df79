"""Trace-driven simulator of prefix-cache eviction: LRU vs the prefix-aware policy vs the offline optimum.

    python -m bench.eviction [--trace PATH] [--capacity-tokens N [N ...]] [--suite]

Replays a FAST'25-format trace (see ``agent/sim/trace.py``) in timestamp order against a cache of ``N`` tokens,
that is ``N // block_tokens`` blocks. For each request:

1. prefix hit = the number of leading ``hash_ids`` present (a lookup stops at the first missing block);
2. every block of the request is then read (present) or stored (missing), root first, at the request's time;
3. the policy removes blocks until the cache holds at most its capacity (the request's own new blocks are
   eligible, which lets a policy decline to keep a one-off tail).

Hit ratio = hit blocks / all requested blocks, over the whole trace (no warm-up excluded). Policies:
``lru`` (leaf-restricted LRU, the baseline), ``hit-density`` (the prefix-aware policy), ``belady`` (offline
optimum: farthest next use, leaf-first), and ``plain-lru`` (LRU over all blocks, ignoring prefixes; it orphans
blocks, shown for reference). ``orphans`` counts blocks that removals left without a parent; ``max orph.``
the most present at any time. ``--suite`` also runs the same table on the other traces of
``bench/eviction_traces.py`` (halves, shifted conversations, full blocks only, synthetic chat/docs/mixed).

Prints a table per trace and capacity, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.datapath.eviction import (
    BeladyPolicy,
    EvictionPolicy,
    HitDensityPolicy,
    LeafLRUPolicy,
    PlainLRUPolicy,
)
from agent.sim.trace import (
    FAST25_BLOCK_TOKENS,
    TraceError,
    TraceRequest,
    read_trace,
    sorted_by_time,
)
from bench import eviction_traces

#: The FAST'25 trace in the workspace's ``shared/traces`` folder, next to the repository (``../shared`` from its root).
DEFAULT_TRACE = str(Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "conversation_trace.jsonl")
DEFAULT_CAPACITIES = (1_000_000, 3_000_000, 10_000_000)
POLICIES = ("lru", "hit-density", "belady", "plain-lru")
#: What the online policies are told of each request: ``full`` every block read or stored (``on_request``);
#: ``stores`` only the blocks it stores after its prefix hit (``on_insert``), as an agent fed by engine KV
#: events sees; ``stores-inferred`` the same, with the policies counting a stored block's prefix as read
#: (:attr:`EvictionPolicy.infer_access`).
SIGNALS = ("full", "stores", "stores-inferred")


@dataclass
class SimResult:
    """Outcome of one replay. ``hit_blocks`` / ``total_blocks`` is the hit ratio; ``evicted`` counts removals
    by the policy; ``orphaned`` blocks its removals orphaned; ``max_orphaned`` the peak present at once."""

    policy: str
    capacity_blocks: int
    hit_blocks: int
    total_blocks: int
    evicted: int
    orphaned: int
    max_orphaned: int
    seconds: float

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0


def next_uses(requests: Sequence[TraceRequest]) -> list[list[float]]:
    """For request ``i`` and position ``j``: the index of the next request using ``hash_ids[j]`` (inf if none)."""
    out: list[list[float]] = [[] for _ in requests]
    seen: dict[int, float] = {}
    for i in range(len(requests) - 1, -1, -1):
        ids = requests[i].hash_ids
        out[i] = [seen.get(b, math.inf) for b in ids]
        for b in ids:
            seen[b] = i
    return out


def make_policy(name: str, oracle: dict | None = None) -> EvictionPolicy:
    """A fresh policy by name; ``belady`` reads next uses from ``oracle`` (block id -> next request index)."""
    if name == "lru":
        return LeafLRUPolicy()
    if name == "plain-lru":
        return PlainLRUPolicy()
    if name == "hit-density":
        return HitDensityPolicy()
    if name == "belady":
        table = oracle if oracle is not None else {}
        return BeladyPolicy(lambda key: table.get(key, math.inf))
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


def simulate(
    requests: Sequence[TraceRequest],
    capacity_blocks: int,
    policy: str | EvictionPolicy,
    *,
    future: list[list[float]] | None = None,
    signal: str = "full",
    hits_out: list[int] | None = None,
) -> SimResult:
    """Replay ``requests`` (already in timestamp order) against ``capacity_blocks`` one-byte blocks.

    ``policy``: a name from :data:`POLICIES` or a fresh policy object. ``future``: :func:`next_uses` of the
    requests, computed when ``belady`` needs it and not given. ``signal`` (see :data:`SIGNALS`): what the
    policy is told of each request; ``belady`` is always told everything. ``hits_out``: when given, each
    request's prefix-hit blocks are appended to it, in replay order. Raises ``ValueError`` for a
    capacity < 1 or an unknown signal.
    """
    if capacity_blocks < 1:
        raise ValueError(f"capacity must be at least one block, got {capacity_blocks}")
    if signal not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r}; choose from {', '.join(SIGNALS)}")
    oracle: dict[int, float] = {}
    if isinstance(policy, str):
        if policy == "belady" and future is None:
            future = next_uses(requests)
        pol = make_policy(policy, oracle)
    else:
        pol = policy
    use_oracle = isinstance(pol, BeladyPolicy)
    if use_oracle and future is None:
        raise ValueError("a BeladyPolicy object needs future= (next_uses of the requests)")
    stores_only = signal != "full" and not use_oracle
    if signal == "stores-inferred" and not use_oracle:
        pol.infer_access = True
    start = time.perf_counter()
    hit = total = evicted = orphaned = max_orphaned = 0
    for i, req in enumerate(requests):
        ids = req.hash_ids
        if use_oracle:
            for b, nxt in zip(ids, future[i]):  # type: ignore[index]
                oracle[b] = nxt
        now = req.timestamp_ms / 1000.0
        got = _store_misses(pol, ids, now) if stores_only else pol.on_request(ids, 1, now)
        hit += got
        if hits_out is not None:
            hits_out.append(got)
        total += len(ids)
        over = pol.used_bytes - capacity_blocks
        if over > 0:
            for key in pol.select_victims(over, now):
                orphaned += len(pol.on_remove(key))
                evicted += 1
            if pol.orphaned_blocks > max_orphaned:
                max_orphaned = pol.orphaned_blocks
    return SimResult(
        pol.name, capacity_blocks, hit, total, evicted, orphaned, max_orphaned, time.perf_counter() - start
    )


def _store_misses(pol: EvictionPolicy, ids: Sequence[int], now: float) -> int:
    """What an engine does on a request, told to ``pol`` as stores only: the prefix hit (returned) is read
    without a report; each block after it is stored (``on_insert``, one byte), root first."""
    tree = pol.tree
    hit = 0
    for key in ids:
        node = tree.get(key)
        if node is None or not node.attached:
            break
        hit += 1
    parent = ids[hit - 1] if hit else None
    for key in ids[hit:]:
        pol.on_insert(key, parent, 1, now)
        parent = key
    return hit


def run_trace(
    label: str,
    requests: Sequence[TraceRequest],
    capacities_tokens: Sequence[int],
    block_tokens: int,
    policies: Sequence[str],
    out: Callable[[str], None],
    signal: str = "full",
) -> dict:
    """Simulate every policy at every capacity, print one table per capacity, return the figures."""
    requests = sorted_by_time(requests)
    total_blocks = sum(len(r.hash_ids) for r in requests)
    distinct = len({b for r in requests for b in r.hash_ids})
    ceiling = (total_blocks - distinct) / total_blocks
    out(f"\n== {label}: {len(requests)} requests, {total_blocks} blocks, {distinct} distinct "
        f"(infinite-cache hit ratio {ceiling:.4f})")
    future = next_uses(requests) if "belady" in policies else None
    figures: dict = {"requests": len(requests), "blocks": total_blocks, "infinite_cache": round(ceiling, 4),
                     "capacities": {}}
    for cap_tokens in capacities_tokens:
        cap = max(1, cap_tokens // block_tokens)
        out(f"-- capacity {cap_tokens:,} tokens = {cap:,} blocks")
        out(f"   {'policy':<12} {'hit ratio':>9} {'vs lru':>7} {'evicted':>8} {'orphans':>8} {'max orph.':>9}"
            f" {'seconds':>7}")
        rows: dict[str, SimResult] = {}
        for name in policies:
            rows[name] = simulate(requests, cap, name, future=future, signal=signal)
        base = rows["lru"].hit_ratio if "lru" in rows else None
        cap_fig: dict = {"capacity_blocks": cap}
        for name, res in rows.items():
            ratio = res.hit_ratio / base if base else float("nan")
            out(f"   {name:<12} {res.hit_ratio:>9.4f} {ratio:>6.3f}x {res.evicted:>8} {res.orphaned:>8} "
                f"{res.max_orphaned:>9} {res.seconds:>7.1f}")
            cap_fig[name] = {"hit_ratio": round(res.hit_ratio, 4), "orphaned": res.orphaned,
                             "max_orphaned": res.max_orphaned}
        if base and "hit-density" in rows:
            cap_fig["hit_density_vs_lru"] = round(rows["hit-density"].hit_ratio / base, 4)
        if "belady" in rows and "hit-density" in rows and rows["belady"].hit_ratio:
            cap_fig["hit_density_vs_belady"] = round(rows["hit-density"].hit_ratio / rows["belady"].hit_ratio, 4)
        figures["capacities"][str(cap_tokens)] = cap_fig
    return figures


def suite_traces(base: Sequence[TraceRequest], seed: int) -> list[tuple[str, list[TraceRequest]]]:
    """The robustness traces: transforms of ``base`` and the synthetic kinds."""
    out = [(name, fn(base, seed=seed)) for name, fn in eviction_traces.TRANSFORMS.items()]
    out += [(f"synthetic-{k}", eviction_traces.synthetic(k, seed=seed)) for k in eviction_traces.SYNTHETIC]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eviction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="FAST'25-format JSONL trace (default: %(default)s)")
    parser.add_argument("--capacity-tokens", type=int, nargs="+", default=list(DEFAULT_CAPACITIES), metavar="N",
                        help="cache capacities in tokens (default: 1M 3M 10M)")
    parser.add_argument("--block-tokens", type=int, default=FAST25_BLOCK_TOKENS,
                        help="tokens per block (default: %(default)s)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated subset of " + ", ".join(POLICIES))
    parser.add_argument("--transform", choices=sorted(eviction_traces.TRANSFORMS),
                        help="replay a transform of the trace instead of the trace itself")
    parser.add_argument("--synthetic", choices=eviction_traces.SYNTHETIC,
                        help="replay a synthetic trace instead of --trace")
    parser.add_argument("--suite", action="store_true",
                        help="also replay the transforms and synthetic traces (about 6x longer)")
    parser.add_argument("--signal", choices=SIGNALS, default="full",
                        help="what the online policies are told of each request: every read and store (full), "
                             "only the stores (stores), or the stores with their prefix inferred as read "
                             "(stores-inferred); default: %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="seed for the transforms and the synthetic generators")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        parser.error(f"--policies: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(POLICIES)}")
    if any(c < args.block_tokens for c in args.capacity_tokens):
        parser.error(f"--capacity-tokens: each capacity must hold at least one block ({args.block_tokens} tokens)")
    if args.block_tokens < 1:
        parser.error("--block-tokens must be >= 1")
    started = time.perf_counter()
    out = print
    result: dict = {"bench": "eviction", "hit_ratio": "prefix-hit blocks / requested blocks",
                    "signal": args.signal, "block_tokens": args.block_tokens,
                    "capacities_tokens": args.capacity_tokens, "traces": {}}
    if args.synthetic:
        label = f"synthetic-{args.synthetic}"
        requests = eviction_traces.synthetic(args.synthetic, seed=args.seed, block_tokens=args.block_tokens)
    else:
        try:
            requests = read_trace(args.trace, block_tokens=args.block_tokens)
        except (TraceError, OSError) as exc:
            print(f"bench.eviction: cannot read trace: {exc}", file=sys.stderr)
            return 2
        label = args.trace
        if args.transform:
            label = f"{args.transform}({args.trace})"
            requests = eviction_traces.TRANSFORMS[args.transform](requests, seed=args.seed)
    result["traces"][label] = run_trace(label, requests, args.capacity_tokens, args.block_tokens, policies, out,
                                        args.signal)
    if args.suite:
        for name, reqs in suite_traces(requests, args.seed):
            result["traces"][name] = run_trace(name, reqs, args.capacity_tokens, args.block_tokens, policies, out,
                                               args.signal)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    out(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
