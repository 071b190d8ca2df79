"""Prefix-aware hit density: evict the leaf expected to bring the fewest hits per byte and second it stays.

Why (the argument with measurements is in ``docs/eviction.md``):

- A prefix cache is hit along paths. Evicting a leaf, then its parent, gives up the hits of the *branch*
  the leaf ends: the leaf and its one-child ancestors up to the first block another continuation shares.
  Every request that reaches the leaf passes through the top of that branch, so ``branch visits =
  leaf.top.count`` is the reuse of the whole subtree the eviction gives up. A multi-turn conversation's
  branch carries its number of turns; a one-off request's branch has 1; a shared system prompt is never in
  a leaf's branch while continuations hang below it. The more often a branch was entered, the more likely it
  is to be entered again — learned per class, not assumed. Branch visits survive an eviction of the branch
  top for a while (a ghost entry), so a conversation that comes back after being evicted is recognised.
- Whether the latest request through a block *ended* at it (``tail``) is the second structural signal: in a
  conversation the next turn extends the previous prompt, so a request's last block is reused when it is a
  full block and not when it is a partial one or a one-off's end. Which holds depends on the engine and the
  workload, so the policy learns it rather than assuming it.
- Reuse is not memoryless: the next turn comes after the model's answer and the user's think time, so the
  chance of a hit first rises with age, then falls. LRU assumes it only falls. Hit density (LHD, Beckmann et
  al., NSDI'18) ranks a block by ``E[hits] / (size * E[remaining time in cache])`` for its class and age,
  both estimated online from the hits and removals this cache observes.

Classes: branch visits in 3 buckets (1, 2-3, 4+) times ``tail``; ages in half-octave buckets from 1/8 s.
Hits are counted on blocks with at most one child (a branching block is protected by its other
continuations, so its hits say nothing about a leaf's value); removals on every attached block. Every
``max(min_interval, len(tree) // 8)`` events the age histograms give a new density table and then decay
(EWMA), so the policy follows a changing workload; a class with few events is pulled toward the pooled
histogram by ``prior_events`` pseudo-events. Until the first table exists the policy is LRU.

Victims: ``samples`` candidates drawn uniformly from the attached leaves plus the least recently used leaf;
the lowest density goes (ties: least recently used). O(samples + log n) per victim, reproducible by seed.

Guard: a shadow leaf-LRU (keys only, see ``shadow.py``) replays the same requests at the same occupancy.
Once per window of block accesses the policy compares its hits with the shadow's; when LRU's lead over the
recent windows exceeds its own noise, a share of victims (``lru_share``, in steps) is taken from LRU's
choice, and the share decays again otherwise. So where the learned model is wrong the policy converges to
LRU instead of losing to it; where it is right, nothing changes.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from collections.abc import Hashable, Iterable

from agent.datapath.eviction.base import EvictionPolicy, PlanState
from agent.datapath.eviction.shadow import ShadowLRU
from agent.datapath.eviction.tree import Block

_AGE0 = 0.125  # seconds: upper edge of the first age bucket
_AGE_BUCKETS = 64  # half-octaves from 1/8 s; the last starts near 2**31.5 / 8 s (about 12 years)


def age_bucket(age: float) -> int:
    """Age bucket of ``age`` seconds: 0 below 1/8 s, then one per half octave (capped)."""
    if age < _AGE0:
        return 0
    b = int(2.0 * math.log2(age / _AGE0)) + 1
    return b if b < _AGE_BUCKETS else _AGE_BUCKETS - 1


def _bucket_geometry() -> tuple[list[float], list[float]]:
    mids: list[float] = []
    widths: list[float] = []
    for b in range(_AGE_BUCKETS):
        lo = 0.0 if b == 0 else _AGE0 * 2.0 ** ((b - 1) / 2.0)
        hi = _AGE0 * 2.0 ** (b / 2.0)
        mids.append((lo + hi) / 2.0)
        widths.append(hi - lo)
    return mids, widths


_MIDS, _WIDTHS = _bucket_geometry()


class HitDensityPolicy(EvictionPolicy):
    """Leaf-first eviction by learned hit density per (branch visits, tail) class and age, guarded by LRU.

    Parameters (all optional; defaults are the ones measured in ``docs/eviction.md``):
    ``samples`` (>= 1) leaves compared per victim; ``count_buckets`` (>= 1) classes of branch visits
    (1, 2-3, 4-7, ... with the last open-ended); ``min_interval`` (>= 1) fewest events between density
    updates; ``decay`` in (0, 1) weight kept by old events at each update; ``prior_events`` (>= 0) pseudo-events
    pulling each class toward the pooled histogram; ``ghost_factor`` (>= 0) how many evicted branch tops to
    remember, as a multiple of the blocks held (0 = none); ``guard`` on/off; ``guard_window`` (>= 1) fewest
    block accesses per guard comparison; ``guard_step`` in (0, 1] change of ``lru_share`` per comparison;
    ``seed`` for sampling. Raises ``ValueError`` for a value out of range.
    """

    name = "hit-density"

    def __init__(
        self,
        samples: int = 32,
        *,
        count_buckets: int = 3,
        min_interval: int = 512,
        decay: float = 0.9,
        prior_events: float = 16.0,
        ghost_factor: float = 1.0,
        guard: bool = True,
        guard_window: int = 4096,
        guard_step: float = 0.1,
        seed: int = 0,
    ) -> None:
        for label, value, ok in (
            ("samples", samples, samples >= 1),
            ("count_buckets", count_buckets, count_buckets >= 1),
            ("min_interval", min_interval, min_interval >= 1),
            ("decay", decay, 0.0 < decay < 1.0),
            ("prior_events", prior_events, prior_events >= 0.0),
            ("ghost_factor", ghost_factor, ghost_factor >= 0.0),
            ("guard_window", guard_window, guard_window >= 1),
            ("guard_step", guard_step, 0.0 < guard_step <= 1.0),
        ):
            if not ok:
                raise ValueError(f"{label} out of range: {value!r}")
        super().__init__()
        self.samples = samples
        self.count_buckets = count_buckets
        self.min_interval = min_interval
        self.decay = decay
        self.prior_events = prior_events
        self.ghost_factor = ghost_factor
        self.guard_window = guard_window
        self.guard_step = guard_step
        self._rng = random.Random(seed)
        n_classes = 2 * count_buckets
        self._hits = [[0.0] * _AGE_BUCKETS for _ in range(n_classes)]
        self._ends = [[0.0] * _AGE_BUCKETS for _ in range(n_classes)]
        self._events = 0
        self._density: list[list[float]] | None = None
        #: Density tables computed so far.
        self.updates = 0
        self._leaves: list[Block] = []  # attached leaves, for uniform sampling (Block.slot = index)
        self._lru: list[tuple[float, int, int, Block]] = []  # lazy heap of leaves by last access
        self._seq = 0
        self._ghost: OrderedDict[Hashable, int] = OrderedDict()  # evicted branch top -> its visits
        self._shadow = ShadowLRU() if guard else None
        #: Share of victims taken from LRU's choice (0 = pure hit density, 1 = LRU); set by the guard.
        self.lru_share = 0.0
        self._lead = 0.0  # decayed sum over windows of (shadow hits - own hits)
        self._lead_sq = 0.0  # decayed sum of its squares: the noise level of _lead
        self._window_own = 0
        self._window_blocks = 0
        self._window_shadow_start = 0

    # -- classes and densities ---------------------------------------------------------------------------
    def block_class(self, node: Block, now: float | None = None) -> int:
        """Class of ``node``: ``2 * min(floor(log2(branch visits)), count_buckets - 1) + tail``.

        With ``now``, a visit the current request already added to the branch top (the top is another block
        accessed at ``now``) is not counted, so a hit is filed under the class the block had while waiting.
        """
        top = node.top
        visits = top.count
        if now is not None and top is not node and top.last == now and visits > 1:
            visits -= 1
        cb = visits.bit_length() - 1
        if cb >= self.count_buckets:
            cb = self.count_buckets - 1
        return 2 * cb + (1 if node.tail else 0)

    def density(self, node: Block, now: float) -> float:
        """Estimated hits per byte-second of keeping ``node`` (higher = keep); ``-age`` before the first
        density table exists (that is, LRU order)."""
        return self._score(node, now, self._density)

    def _score(self, node: Block, now: float, table: list[list[float]] | None) -> float:
        age = now - node.last
        if age < 0.0:
            age = 0.0
        if table is None:
            return -age
        cb = node.top.count.bit_length() - 1
        if cb >= self.count_buckets:
            cb = self.count_buckets - 1
        if age < _AGE0:
            ab = 0
        else:
            ab = int(2.0 * math.log2(age / _AGE0)) + 1
            if ab >= _AGE_BUCKETS:
                ab = _AGE_BUCKETS - 1
        return table[2 * cb + (1 if node.tail else 0)][ab] / (node.size or 1)

    def _event(self) -> None:
        self._events += 1
        if self._events >= max(self.min_interval, len(self.tree) >> 3):
            self._update()

    def _update(self) -> None:
        """Recompute the density table from the decayed histograms, then decay them.

        For class ``c`` and age bucket ``a``: density = (hits at ages >= a) / (expected remaining lifetime of
        the events at ages >= a), where an event in bucket ``x > a`` lives ``mid[x] - mid[a]`` longer and one
        in bucket ``a`` a quarter of its width.
        """
        self._events = 0
        self.updates += 1
        hits, ends = self._hits, self._ends
        n_classes = len(hits)
        pooled_h = [sum(hits[c][a] for c in range(n_classes)) for a in range(_AGE_BUCKETS)]
        pooled_e = [sum(ends[c][a] for c in range(n_classes)) for a in range(_AGE_BUCKETS)]
        pooled_total = sum(pooled_h) + sum(pooled_e)
        scale = self.prior_events / pooled_total if pooled_total > 0.0 else 0.0
        table: list[list[float]] = []
        for c in range(n_classes):
            row = [0.0] * _AGE_BUCKETS
            hits_above = 0.0  # hits at ages >= a
            events_above = 0.0  # events (hits + ends) at ages > a
            weighted_above = 0.0  # sum over ages > a of events * bucket midpoint
            hc, ec = hits[c], ends[c]
            for a in range(_AGE_BUCKETS - 1, -1, -1):
                h = hc[a] + scale * pooled_h[a]
                ev = h + ec[a] + scale * pooled_e[a]
                hits_above += h
                life = weighted_above - _MIDS[a] * events_above + ev * _WIDTHS[a] * 0.25
                row[a] = hits_above / life if life > 0.0 else 0.0
                events_above += ev
                weighted_above += ev * _MIDS[a]
            table.append(row)
        self._density = table
        d = self.decay
        for c in range(n_classes):
            hc, ec = hits[c], ends[c]
            for a in range(_AGE_BUCKETS):
                hc[a] *= d
                ec[a] *= d

    # -- events from the tree and the interface ----------------------------------------------------------
    def _access(self, node: Block, now: float) -> None:
        children = node.children
        if children is None or len(children) == 1:
            age = now - node.last
            self._hits[self.block_class(node, now)][age_bucket(age if age > 0.0 else 0.0)] += 1.0
            self._event()
        super()._access(node, now)

    def _touched(self, node: Block, now: float, inserted: bool) -> None:
        if inserted:
            if self._ghost:
                visits = self._ghost.pop(node.key, None)
                if visits is not None:
                    node.count += visits
        elif node.slot >= 0:
            self._push_lru(node)
        shadow = self._shadow
        if shadow is not None:
            shadow.record(node.key, node.parent_key, node.size)
            if not inserted and node.attached:
                self._window_own += 1
            self._window_blocks += 1

    def _removing(self, node: Block) -> None:
        if node.attached:
            age = self.now - node.last
            self._ends[self.block_class(node)][age_bucket(age if age > 0.0 else 0.0)] += 1.0
            self._event()
        if self.ghost_factor > 0.0 and node.top is node:
            ghost = self._ghost
            ghost[node.key] = node.count
            ghost.move_to_end(node.key)
            limit = max(1024, int(self.ghost_factor * len(self.tree)))
            while len(ghost) > limit:
                ghost.popitem(last=False)

    def _leaf_added(self, node: Block) -> None:
        node.slot = len(self._leaves)
        self._leaves.append(node)
        self._push_lru(node)

    def _leaf_removed(self, node: Block) -> None:
        node.ver += 1
        leaves = self._leaves
        last = leaves.pop()
        if last is not node:
            leaves[node.slot] = last
            last.slot = node.slot
        node.slot = -1

    def _push_lru(self, node: Block) -> None:
        node.ver += 1
        self._seq += 1
        heapq.heappush(self._lru, (node.last, self._seq, node.ver, node))
        if len(self._lru) > 2 * len(self._leaves) + 1024:
            self._lru = [(b.last, i, b.ver, b) for i, b in enumerate(self._leaves)]
            heapq.heapify(self._lru)

    # -- the guard -----------------------------------------------------------------------------------------
    def _guard(self, need: int) -> None:
        """Trim the shadow LRU to the occupancy this plan leads to; once per window, compare hits and move
        ``lru_share`` up when LRU's decayed lead exceeds its noise (one standard deviation), else down."""
        shadow = self._shadow
        if shadow is None:
            return
        shadow.trim(self.tree.bytes - self.tree.orphaned_bytes - need)
        if self._window_blocks < max(self.guard_window, len(self.tree)):
            return
        diff = (shadow.hits - self._window_shadow_start) - self._window_own
        self._lead = self.decay * self._lead + diff
        self._lead_sq = self.decay * self._lead_sq + diff * diff
        if self._lead > math.sqrt(self._lead_sq):
            self.lru_share = min(1.0, self.lru_share + self.guard_step)
        else:
            self.lru_share = max(0.0, self.lru_share - self.guard_step)
        self._window_own = self._window_blocks = 0
        self._window_shadow_start = shadow.hits

    # -- victims -------------------------------------------------------------------------------------------
    def _plan(self, need: int, now: float) -> Iterable[Block]:
        self._guard(need)
        leaves = self._leaves
        virtual: list[Block] = []  # parents whose children are all planned
        virtual_lru: list[tuple[float, int, Block]] = []
        state = PlanState()
        planned = state.planned
        out: list[Block] = []
        rng = self._rng.random
        table = self._density
        lru = self._lru
        restore: list[tuple[float, int, int, Block]] = []
        while need > 0:
            n_leaves = len(leaves)
            total = n_leaves + len(virtual)
            if total <= len(out):
                break
            oldest = self._oldest(lru, virtual_lru, planned, restore)
            best = oldest
            best_d = self._score(oldest, now, table) if oldest is not None else 0.0
            for _ in range(self.samples):
                i = int(rng() * total)
                cand = leaves[i] if i < n_leaves else virtual[i - n_leaves]
                if id(cand) in planned:
                    continue
                d = self._score(cand, now, table)
                if best is None or d < best_d or (d == best_d and cand.last < best.last):
                    best, best_d = cand, d
            if best is None:
                break
            if oldest is not None and self.lru_share > 0.0 and rng() < self.lru_share:
                best = oldest
            out.append(best)
            need -= best.size
            parent = state.plan(best)
            if parent is not None:
                virtual.append(parent)
                self._seq += 1
                heapq.heappush(virtual_lru, (parent.last, self._seq, parent))
        for entry in restore:
            heapq.heappush(lru, entry)
        return out

    @staticmethod
    def _oldest(lru: list, virtual_lru: list, planned: set[int], restore: list) -> Block | None:
        """The least recently used unplanned leaf, virtual leaves included (what LRU would evict next)."""
        oldest: Block | None = None
        while lru:
            _, _, ver, cand = lru[0]
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
        return oldest
