"""Prefix-aware hit density: evict the leaf expected to deliver the fewest hits per byte and second it stays.

Why (the full argument with measurements is in ``docs/eviction.md``):

- A prefix cache is hit along paths. Evicting a leaf gives up the hits of the *branch* it ends: the leaf and
  its one-child ancestors up to the first block shared with another continuation. Every request that reaches
  the leaf passes through the top of that branch, so ``branch visits = leaf.top.count`` measures the reuse of
  the whole subtree the eviction touches. A shared system prompt is never inside a leaf's branch while other
  continuations hang below it (it stays until they are gone); the branch of a multi-turn conversation
  carries the number of turns so far; a one-off request's tail has 1. The more often a branch has been
  entered, the more likely it is to be entered again (turn-taking continues with rising probability).
- Whether the latest request through a block *ended* at it (``tail``) is the other structural signal: in a
  multi-turn conversation the next turn extends the previous prompt, so an end block whose contents are
  complete is reused, and one that is a partial last block (or a one-off request's end) is not. Which of
  the two holds depends on the engine and the trace, so the policy does not assume it: it learns it.
- Reuse is not memoryless: a conversation's next turn comes after the model's answer and the user's think
  time, so the chance of a hit rises then falls with age. LRU assumes it only falls. Hit density (Beckmann
  et al., LHD, NSDI'18) ranks a block by ``E[hits] / (size * E[remaining time in cache])`` given its class
  and age, both estimated online from the hits and evictions this cache itself observes.

Classes: ``log2(branch visits)`` in 5 buckets (1, 2-3, 4-7, 8-15, 16+) times the ``tail`` flag; ages in
half-octave buckets from 1/8 s. Every ``interval`` events (hits + removals) the per-class age histograms give
a new density table, then decay (EWMA) so the policy follows a changing workload. A class with few events is
shrunk toward the pooled histogram (``prior_events`` pseudo-events), so a rare class behaves like the whole
cache rather than like noise. Until the first table exists the policy is LRU.

Victim choice samples ``samples`` candidates uniformly from the attached leaves and takes the lowest density
(ties: least recently used), as LHD and Redis do: O(samples) per victim, independent of the cache size;
a seeded generator keeps runs reproducible.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from typing import Iterable

from agent.eviction.base import EvictionPolicy, PlanState
from agent.eviction.shadow import ShadowLRU
from agent.eviction.tree import Block

_COUNT_BUCKETS = 5
_CLASSES = 2 * _COUNT_BUCKETS
_AGE0 = 0.125  # seconds: upper edge of the first age bucket
_AGE_BUCKETS = 64  # half-octaves from 1/8 s: the last one starts near 2**31 / 8 s (8.5 years)


def _age_bucket(age: float) -> int:
    if age < _AGE0:
        return 0
    b = int(2.0 * math.log2(age / _AGE0)) + 1
    return b if b < _AGE_BUCKETS else _AGE_BUCKETS - 1


def _bucket_edges() -> tuple[list[float], list[float]]:
    mids: list[float] = []
    widths: list[float] = []
    for b in range(_AGE_BUCKETS):
        lo = 0.0 if b == 0 else _AGE0 * 2.0 ** ((b - 1) / 2.0)
        hi = _AGE0 * 2.0 ** (b / 2.0)
        mids.append((lo + hi) / 2.0)
        widths.append(hi - lo)
    return mids, widths


_MIDS, _WIDTHS = _bucket_edges()


class HitDensityPolicy(EvictionPolicy):
    """Leaf-first eviction by learned hit density per (branch visits, tail) class and age.

    ``samples``: candidates compared per victim (>= 1). ``min_interval``: fewest events between density
    updates; the interval grows with the tree (``len(tree) // 8``) so one update sees a fair share of a
    cache lifetime. ``decay``: weight kept by old events at each update (0 < decay < 1).
    ``prior_events``: pseudo-events pulling each class toward the pooled histogram. ``seed``: sampling seed.
    Raises ``ValueError`` for out-of-range parameters.
    """

    name = "hit-density"

    def __init__(
        self,
        samples: int = 32,
        *,
        min_interval: int = 512,
        decay: float = 0.9,
        prior_events: float = 16.0,
        seed: int = 0,
        ghost_factor: float = 1.0,
        ghost_tops_only: bool = True,
        with_oldest: bool = True,
        count_buckets: int = 3,
        use_tail: bool = True,
        interval_factor: float = 0.125,
        guard: bool = True,
        guard_window: int = 4096,
        guard_step: float = 0.1,
        guard_memory: float = 0.9,
        leaf_hits_only: bool = False,
    ) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if min_interval < 1:
            raise ValueError(f"min_interval must be >= 1, got {min_interval}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if prior_events < 0:
            raise ValueError(f"prior_events must be >= 0, got {prior_events}")
        super().__init__()
        self.samples = samples
        self.min_interval = min_interval
        self.decay = decay
        self.prior_events = prior_events
        self._rng = random.Random(seed)
        self._leaves: list[Block] = []
        self.count_buckets = count_buckets
        self.use_tail = use_tail
        self._n_classes = 2 * count_buckets
        self._hits = [[0.0] * _AGE_BUCKETS for _ in range(self._n_classes)]
        self._ends = [[0.0] * _AGE_BUCKETS for _ in range(self._n_classes)]
        self._events = 0
        self._density: list[list[float]] | None = None
        self.updates = 0
        self.ghost_factor = ghost_factor
        self.with_oldest = with_oldest
        self.leaf_hits_only = leaf_hits_only
        self.interval_factor = interval_factor
        self.guard_window = guard_window
        self.guard_step = guard_step
        self.guard_memory = guard_memory
        self._lru: list = []
        self._seq = 0
        self._shadow = ShadowLRU() if guard else None
        self.lru_share = 0.0
        self._lead = 0.0
        self._lead_sq = 0.0
        self._window_real = 0
        self._window_shadow = 0
        self._window_blocks = 0
        self.ghost_tops_only = ghost_tops_only
        self._ghost: OrderedDict = OrderedDict()

    # -- classification ----------------------------------------------------------------------------------
    def block_class(self, node: Block, now: float | None = None) -> int:
        """Class index of ``node``: ``2 * min(log2(branch visits), 4) + tail``.

        With ``now``, visits the current request already added to the branch top (its ``last == now`` and it
        is not ``node``) are not counted, so a hit is filed under the class the block had while waiting.
        """
        visits = node.top.count
        if now is not None and node.top is not node and node.top.last == now and visits > 1:
            visits -= 1
        cb = visits.bit_length() - 1
        if cb >= self.count_buckets:
            cb = self.count_buckets - 1
        return 2 * cb + (1 if node.tail and self.use_tail else 0)

    def density(self, node: Block, now: float) -> float:
        """Current estimate of hits per byte-second for ``node`` (higher = keep); ``-age`` before the first
        density update."""
        age = now - node.last
        if age < 0.0:
            age = 0.0
        table = self._density
        if table is None:
            return -age
        return table[self.block_class(node)][_age_bucket(age)] / (node.size or 1)

    # -- events ------------------------------------------------------------------------------------------
    def _access(self, node: Block, now: float) -> None:
        children = node.children
        if children is None or len(children) == 1:
            age = now - node.last
            self._hits[self.block_class(node, now)][_age_bucket(age if age > 0.0 else 0.0)] += 1.0
            self._event()
        super()._access(node, now)

    def _touched(self, node: Block, now: float, inserted: bool) -> None:
        shadow = self._shadow
        if shadow is not None:
            shadow.record(node.key, node.parent_key, node.size)
            if not inserted and node.attached:
                self._window_real += 1
            self._window_blocks += 1
        if not inserted and node.slot >= 0:
            self._push_lru(node)
        if inserted and self._ghost:
            old = self._ghost.pop(node.key, None)
            if old is not None:
                node.count += old

    def _removing(self, node: Block) -> None:
        if self.ghost_factor > 0 and (node.top is node or not self.ghost_tops_only):
            ghost = self._ghost
            ghost[node.key] = node.count
            limit = max(1024, int(self.ghost_factor * len(self.tree)))
            while len(ghost) > limit:
                ghost.popitem(last=False)
        if node.attached:
            age = self.now - node.last
            self._ends[self.block_class(node)][_age_bucket(age if age > 0.0 else 0.0)] += 1.0
            self._event()

    def _leaf_added(self, node: Block) -> None:
        node.slot = len(self._leaves)
        self._leaves.append(node)
        self._push_lru(node)

    def _push_lru(self, node: Block) -> None:
        node.ver += 1
        self._seq += 1
        heapq.heappush(self._lru, (node.last, self._seq, node.ver, node))
        if len(self._lru) > 2 * len(self._leaves) + 1024:
            self._lru = [(b.last, i, b.ver, b) for i, b in enumerate(self._leaves)]
            heapq.heapify(self._lru)

    def _leaf_removed(self, node: Block) -> None:
        node.ver += 1
        leaves = self._leaves
        last = leaves.pop()
        if last is not node:
            leaves[node.slot] = last
            last.slot = node.slot
        node.slot = -1

    def _event(self) -> None:
        self._events += 1
        if self._events >= max(self.min_interval, int(len(self.tree) * self.interval_factor)):
            self._update()

    def _update(self) -> None:
        """Recompute the density table from the decayed histograms, then decay them."""
        self._events = 0
        self.updates += 1
        hits, ends = self._hits, self._ends
        pooled_h = [sum(hits[c][a] for c in range(self._n_classes)) for a in range(_AGE_BUCKETS)]
        pooled_e = [sum(ends[c][a] for c in range(self._n_classes)) for a in range(_AGE_BUCKETS)]
        pooled_total = sum(pooled_h) + sum(pooled_e)
        scale = self.prior_events / pooled_total if pooled_total > 0 else 0.0
        table: list[list[float]] = []
        for c in range(self._n_classes):
            row = [0.0] * _AGE_BUCKETS
            hits_above = 0.0  # hits at ages >= a
            ev_above = 0.0  # events (hits + ends) at ages > a
            weighted_above = 0.0  # sum of event count * bucket midpoint over ages > a
            hc, ec = hits[c], ends[c]
            for a in range(_AGE_BUCKETS - 1, -1, -1):
                h = hc[a] + scale * pooled_h[a]
                ev = h + ec[a] + scale * pooled_e[a]
                hits_above += h
                life = weighted_above - _MIDS[a] * ev_above + ev * _WIDTHS[a] * 0.25
                row[a] = hits_above / life if life > 0.0 else 0.0
                ev_above += ev
                weighted_above += ev * _MIDS[a]
            table.append(row)
        self._density = table
        d = self.decay
        for c in range(self._n_classes):
            hc, ec = hits[c], ends[c]
            for a in range(_AGE_BUCKETS):
                hc[a] *= d
                ec[a] *= d

    # -- victims -----------------------------------------------------------------------------------------
    def _guard(self, need: int) -> None:
        """Trim the shadow LRU to the occupancy this plan leads to; once per window of block accesses,
        move the share of LRU choices toward whichever hit more in that window."""
        shadow = self._shadow
        if shadow is None:
            return
        shadow.trim(self.tree.bytes - need)
        if self._window_blocks >= max(self.guard_window, len(self.tree)):
            window_shadow = shadow.hits - self._window_shadow
            diff = window_shadow - self._window_real
            g = self.guard_memory
            self._lead = g * self._lead + diff
            self._lead_sq = g * self._lead_sq + diff * diff
            if self._lead > math.sqrt(self._lead_sq):
                self.lru_share = min(1.0, self.lru_share + self.guard_step)
            else:
                self.lru_share = max(0.0, self.lru_share - self.guard_step)
            self._window_real = self._window_blocks = 0
            self._window_shadow = shadow.hits

    def _plan(self, need: int, now: float) -> Iterable[Block]:
        self._guard(need)
        leaves = self._leaves
        virtual: list[Block] = []
        virtual_lru: list = []
        state = PlanState()
        planned = state.planned
        out: list[Block] = []
        rng = self._rng.random
        table = self._density
        samples = self.samples
        lru = self._lru
        restore: list = []
        while need > 0:
            n_leaves = len(leaves)
            total = n_leaves + len(virtual)
            if total - len(out) <= 0:
                break
            # The least recently used leaf (what LRU would evict), virtual leaves included.
            oldest: Block | None = None
            while lru:
                last, _, ver, cand = lru[0]
                if ver != cand.ver or cand.slot < 0:
                    heapq.heappop(lru)
                elif id(cand) in planned:
                    restore.append(heapq.heappop(lru))
                else:
                    oldest = cand
                    break
            while virtual_lru and id(virtual_lru[0][2]) in planned:
                heapq.heappop(virtual_lru)
            if virtual_lru and (oldest is None or virtual_lru[0][0] < oldest.last):
                oldest = virtual_lru[0][2]
            best = oldest
            best_d = self._score(oldest, now, table) if oldest is not None else 0.0
            for _ in range(samples):
                i = int(rng() * total)
                cand = leaves[i] if i < n_leaves else virtual[i - n_leaves]
                if id(cand) in planned:
                    continue
                d = self._score(cand, now, table)
                if best is None or d < best_d or (d == best_d and cand.last < best.last):
                    best, best_d = cand, d
            if best is None:
                # Nearly everything is planned already: scan for what is left.
                for cand in leaves + virtual:
                    if id(cand) in planned:
                        continue
                    d = self._score(cand, now, table)
                    if best is None or d < best_d or (d == best_d and cand.last < best.last):
                        best, best_d = cand, d
                if best is None:
                    break
            victim = best
            if oldest is not None and self.lru_share > 0.0 and rng() < self.lru_share:
                victim = oldest
            out.append(victim)
            need -= victim.size
            parent = state.plan(victim)
            if parent is not None:
                virtual.append(parent)
                self._seq += 1
                heapq.heappush(virtual_lru, (parent.last, self._seq, parent))
        for entry in restore:
            heapq.heappush(lru, entry)
        return out

    def _score(self, node: Block, now: float, table: list[list[float]] | None) -> float:
        age = now - node.last
        if age < 0.0:
            age = 0.0
        if table is None:
            return -age
        top = node.top
        cb = top.count.bit_length() - 1
        if cb >= self.count_buckets:
            cb = self.count_buckets - 1
        cls = 2 * cb + (1 if node.tail and self.use_tail else 0)
        if age < _AGE0:
            ab = 0
        else:
            ab = int(2.0 * math.log2(age / _AGE0)) + 1
            if ab >= _AGE_BUCKETS:
                ab = _AGE_BUCKETS - 1
        return table[cls][ab] / (node.size or 1)
