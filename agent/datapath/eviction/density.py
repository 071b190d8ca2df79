"""Prefix-aware hit density: evict the leaf whose expected hits per second of cache it would still take are lowest.

Why (the argument with measurements is in ``docs/eviction.md``):

- A prefix cache is hit along paths. Evicting a leaf, then its parent, gives up the hits of the *branch*
  the leaf ends: the leaf and its one-child ancestors up to the first block another continuation shares.
  Every request that reaches the leaf passes through the top of that branch, so ``branch visits =
  leaf.top.count`` is the reuse of the whole subtree the eviction gives up. A multi-turn conversation's
  branch carries its number of turns; a one-off request's branch has 1. The more often a branch was entered,
  the likelier another visit — learned per class, not assumed. Branch visits survive an eviction of the
  branch top for a while (a ghost entry), so a conversation that comes back after being evicted is
  recognised as a continuing one.
- **Depth**: how long the prefix is, against the typical request of this cache (below half, within a
  factor 2, above twice the geometric mean depth of request ends). Long prompts are more often continued.
- **Tail**: whether the latest request through the block *ended* at it. A request's last block is reused
  when it is a full block the next turn extends, and not when it is a partial one or a one-off's end. The
  policy learns which.
- **Age**: reuse is not memoryless (the next turn comes after the model's answer and the user's think time,
  so the chance of a hit first rises with age, then falls). :class:`ReuseEstimator` (``reuse.py``) learns per
  class the reuse hazard by age from sampled lives followed past eviction, and gives each (class, age) an
  index: the best reuses per block-second that keeping the block any longer can still buy. The lowest index
  goes first.
- **LRU as the tie-breaker**: the index of the policy's choice must be clearly (``lru_margin``) below the index
  of the least recently used leaf, else that leaf goes, as LRU would evict it. An estimate is noisy where its
  data is thin; this keeps the policy on LRU's choice wherever the model does not clearly know better.

Classes: ``count_buckets`` of branch visits (1, 2-3, 4-7, 8+) x 3 of depth x tail. Every ``max(min_interval,
blocks // 8)`` events (reuses and removals) the estimator gives a new index table and ages its counts by
``exp(-events / max(memory_floor, memory * blocks))``, so the estimate covers several horizons of followed
lives and still follows a changing workload. Until the first table the policy is leaf LRU.

Victims: the attached leaves are filed by (class, age bucket) in insertion-ordered bins, oldest first. Bins
move their aged fronts one bucket up once per distinct ``now`` (amortised O(1) per block and bucket crossed);
a victim is the front of the non-empty bin with the lowest index (per class the bins are visited in index
order: O(classes) bin checks usually, O(classes x buckets) at worst), compared with LRU's choice from a lazy
heap (O(log n)). Never a scan of the leaves. The ranking is per block: a cache scope's blocks have one size.
Deterministic: the only random numbers are the estimator's fixed-seed choice of the lives it follows.

Guard: a shadow leaf-LRU (keys only, see ``shadow.py``) replays the same requests at the same occupancy.
Once per window of block accesses the policy compares its hits with the shadow's; when LRU's lead over the
recent windows exceeds its own noise, a share of victims (``lru_share``, in steps) is taken from LRU's
choice, and the share decays again otherwise. Where the learned model is wrong the policy converges to LRU
instead of losing to it; where it is right, nothing changes.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable

from agent.datapath.eviction.base import EvictionPolicy, PlanState
from agent.datapath.eviction.reuse import AGE_BUCKETS, EDGES, ReuseEstimator, age_bucket
from agent.datapath.eviction.shadow import ShadowLRU
from agent.datapath.eviction.tree import Block

_DEPTHS = 3  # depth classes: below half, within a factor 2 of, above twice the typical request's depth


def _by_index(row: list[float]) -> list[int]:
    """Age buckets by index, lowest first; among equal ones the older bucket first."""
    return sorted(range(len(row)), key=lambda b: (row[b], -b))


class HitDensityPolicy(EvictionPolicy):
    """Leaf-first eviction by a learned reuse index per (branch visits, depth, tail) class and age, with LRU as
    the tie-breaker and the guard.

    Parameters (all optional; defaults are the ones measured in ``docs/eviction.md``): ``count_buckets``
    (>= 1) classes of branch visits (1, 2-3, 4-7, ... with the last open-ended); ``min_interval`` (>= 1)
    fewest events between index tables; ``memory`` (> 0) and ``memory_floor`` (>= 1): events of history the
    estimate keeps, as a multiple of the blocks held and at least; ``prior_events`` (>= 0) pseudo-lives
    pulling each class toward the pooled hazard; ``ghost_factor`` (> 0) lives followed and evicted branch
    tops remembered, as a multiple of the blocks held; ``ghost_sample`` (>= 1) one life in this many is
    followed; ``lru_margin`` in [0, 1): how far below the LRU choice's index the policy's choice must be;
    ``guard`` on/off; ``guard_window`` (>= 1) fewest block accesses per guard comparison; ``guard_step`` in
    (0, 1] change of ``lru_share`` per comparison. Raises ``ValueError`` for a value out of range.
    """

    name = "hit-density"

    def __init__(
        self,
        *,
        count_buckets: int = 4,
        min_interval: int = 1024,
        memory: float = 32.0,
        memory_floor: int = 65536,
        prior_events: float = 4.0,
        ghost_factor: float = 4.0,
        ghost_sample: int = 4,
        lru_margin: float = 0.1,
        guard: bool = True,
        guard_window: int = 4096,
        guard_step: float = 0.1,
    ) -> None:
        for label, value, ok in (
            ("count_buckets", count_buckets, count_buckets >= 1),
            ("min_interval", min_interval, min_interval >= 1),
            ("memory", memory, memory > 0.0),
            ("memory_floor", memory_floor, memory_floor >= 1),
            ("prior_events", prior_events, prior_events >= 0.0),
            ("ghost_factor", ghost_factor, ghost_factor > 0.0),
            ("ghost_sample", ghost_sample, ghost_sample >= 1),
            ("lru_margin", lru_margin, 0.0 <= lru_margin < 1.0),
            ("guard_window", guard_window, guard_window >= 1),
            ("guard_step", guard_step, 0.0 < guard_step <= 1.0),
        ):
            if not ok:
                raise ValueError(f"{label} out of range: {value!r}")
        super().__init__()
        self.count_buckets = count_buckets
        self.min_interval = min_interval
        self.memory = memory
        self.memory_floor = memory_floor
        self.ghost_factor = ghost_factor
        self.lru_margin = lru_margin
        self.guard_window = guard_window
        self.guard_step = guard_step
        self.n_classes = 2 * _DEPTHS * count_buckets
        n, nb = self.n_classes, AGE_BUCKETS
        self.reuse = ReuseEstimator(n, sample=ghost_sample, prior=prior_events)
        self._pending: Block | None = None  # the latest block touched: its life starts once its tail flag is final
        self._events = 0
        self._index: list[list[float]] | None = None
        self._order: list[list[int]] = []  # per class: age buckets by index, lowest first
        #: Index tables computed so far.
        self.updates = 0
        self._depth_mean = -1.0  # EWMA of log2(depth + 1) of request ends; < 0 before the first
        self._depth_lo = 0  # depth classes: < lo, < hi, the rest (set at each table)
        self._depth_hi = 1 << 30
        # Attached leaves by class and age bucket (Block.slot = class * buckets + bucket), oldest first.
        self._bins: list[list[OrderedDict[Block, None]]] = [
            [OrderedDict() for _ in range(nb)] for _ in range(n)
        ]
        # Non-empty bins per class as bit masks: by age bucket, and by the bucket's rank in the index order.
        self._occupied = [0] * n
        self._ranked = [0] * n
        self._rank: list[list[int]] = [list(range(nb)) for _ in range(n)]
        self._migrated_at = -math.inf
        self._lru: list[tuple[float, int, int, Block]] = []  # lazy heap of filed leaves by last access
        self._seq = 0
        self._leaves = 0
        self._taken: set[int] = set()  # ids of leaves taken out of their bins by the plan being made
        self._visits_ghost: OrderedDict[Hashable, int] = OrderedDict()  # evicted branch top -> its visits
        self._shadow = ShadowLRU() if guard else None
        #: Share of victims taken from LRU's choice (0 = pure index, 1 = LRU); set by the guard.
        self.lru_share = 0.0
        self._lru_credit = 0.0
        self._lead = 0.0  # decayed sum over windows of (shadow hits - own hits)
        self._lead_sq = 0.0  # decayed sum of its squares: the noise level of _lead
        self._window_own = 0
        self._window_blocks = 0
        self._window_shadow_start = 0

    # -- classes and the index -----------------------------------------------------------------------------
    def block_class(self, node: Block) -> int:
        """Class of ``node``: ``((visit bucket) * 3 + depth bucket) * 2 + tail``, where the visit bucket is
        ``min(floor(log2(branch visits)), count_buckets - 1)`` and the depth bucket compares ``node.depth``
        with the typical request's depth (below half, within a factor 2, above twice)."""
        cb = node.top.count.bit_length() - 1
        if cb >= self.count_buckets:
            cb = self.count_buckets - 1
        depth = node.depth
        db = 0 if depth < self._depth_lo else (1 if depth < self._depth_hi else 2)
        return ((cb * _DEPTHS + db) << 1) + (1 if node.tail else 0)

    def density(self, node: Block, now: float) -> float:
        """The index of ``node`` at ``now`` per byte (higher = keep); ``-age`` before the first table."""
        age = now - node.last
        if age < 0.0:
            age = 0.0
        if self._index is None:
            return -age
        return self._index[self.block_class(node)][age_bucket(age)] / (node.size or 1)

    def _event(self) -> None:
        self._events += 1
        if self._events >= max(self.min_interval, len(self.tree) >> 3):
            self._update()

    def _update(self) -> None:
        """A new index table from the reuse estimator; its counts age with the events since the last one."""
        self._start_pending()
        events, self._events = self._events, 0
        self.updates += 1
        keep = math.exp(-events / max(self.memory_floor, self.memory * len(self.tree)))
        index = self.reuse.table(self.now, keep)
        self._index = index
        self._order = [_by_index(row) for row in index]
        for cls, order in enumerate(self._order):
            rank = self._rank[cls]
            for r, b in enumerate(order):
                rank[b] = r
            occupied, ranked = self._occupied[cls], 0
            while occupied:
                low = occupied & -occupied
                ranked |= 1 << rank[low.bit_length() - 1]
                occupied ^= low
            self._ranked[cls] = ranked
        if self._depth_mean >= 0.0:
            self._depth_lo = int(2.0 ** (self._depth_mean - 1.0))
            self._depth_hi = int(math.ceil(2.0 ** (self._depth_mean + 1.0)))

    def _follow_limit(self) -> int:
        return max(1024, int(self.ghost_factor * len(self.tree)))

    def _start_pending(self) -> None:
        """Start the life of the latest block touched, now that its tail flag is final."""
        node = self._pending
        if node is None:
            return
        self._pending = None
        if not node.attached or (node.children is not None and len(node.children) > 1):
            return  # a branching block is held by its other continuations: its reuse says nothing of a leaf's
        if node.tail:
            x = math.log2(node.depth + 1)
            mean = self._depth_mean
            self._depth_mean = x if mean < 0.0 else mean + (x - mean) / 1024.0
        self.reuse.start(node.key, self.block_class(node), node.last, self._follow_limit())

    # -- filing leaves -------------------------------------------------------------------------------------
    def _file(self, node: Block, cls: int, bucket: int) -> None:
        bins = self._bins[cls][bucket]
        if not bins:
            self._occupied[cls] |= 1 << bucket
            self._ranked[cls] |= 1 << self._rank[cls][bucket]
        bins[node] = None
        node.slot = cls * AGE_BUCKETS + bucket
        node.ver += 1
        self._seq += 1
        heapq.heappush(self._lru, (node.last, self._seq, node.ver, node))
        if len(self._lru) > 2 * self._leaves + 1024:
            taken = self._taken
            self._lru = [e for e in self._lru if e[2] == e[3].ver and (e[3].slot >= 0 or id(e[3]) in taken)]
            heapq.heapify(self._lru)

    def _unfile(self, node: Block) -> None:
        cls, bucket = divmod(node.slot, AGE_BUCKETS)
        bins = self._bins[cls][bucket]
        del bins[node]
        node.slot = -1
        if not bins:
            self._occupied[cls] &= ~(1 << bucket)
            self._ranked[cls] &= ~(1 << self._rank[cls][bucket])

    def _refile(self, node: Block, bucket: int | None = None) -> None:
        """File ``node`` again under its current class (and ``bucket``, default: the one it is in)."""
        if bucket is None:
            bucket = node.slot % AGE_BUCKETS
        self._unfile(node)
        self._file(node, self.block_class(node), bucket)

    def _migrate(self, now: float) -> None:
        """Move each bin's fronts that reached the next age bucket (once per distinct ``now``)."""
        if now == self._migrated_at:
            return
        self._migrated_at = now
        last_bucket = AGE_BUCKETS - 1
        for cls, bins in enumerate(self._bins):
            rank = self._rank[cls]
            b = 0
            while True:
                rest = self._occupied[cls] >> b
                if not rest:
                    break
                b += (rest & -rest).bit_length() - 1
                if b >= last_bucket:
                    break
                src = bins[b]
                edge = now - EDGES[b]
                dst = bins[b + 1]
                moved = False
                while src:
                    front = next(iter(src))
                    if front.last > edge:
                        break
                    del src[front]
                    dst[front] = None
                    front.slot += 1
                    moved = True
                if moved:
                    self._occupied[cls] |= 1 << (b + 1)
                    self._ranked[cls] |= 1 << rank[b + 1]
                    if not src:
                        self._occupied[cls] &= ~(1 << b)
                        self._ranked[cls] &= ~(1 << rank[b])
                b += 1

    # -- events from the tree and the interface ----------------------------------------------------------
    def _access(self, node: Block, now: float) -> None:
        if self.reuse.end(node.key, now):
            self._event()
        super()._access(node, now)

    def _touched(self, node: Block, now: float, inserted: bool) -> None:
        if self._pending is not None and self._pending is not node:
            self._start_pending()  # its tail flag is final: this touch is its child or another request's
        self._pending = node
        if inserted:
            if self._visits_ghost:
                visits = self._visits_ghost.pop(node.key, None)
                if visits is not None:
                    node.count += visits
                    if node.slot >= 0:
                        self._refile(node)
            if self.reuse.end(node.key, now):
                self._event()
        elif node.slot >= 0:
            self._unfile(node)
            self._file(node, self.block_class(node), 0)
        shadow = self._shadow
        if shadow is not None:
            shadow.record(node.key, node.parent_key, node.size)
            if not inserted and node.attached:
                self._window_own += 1
            self._window_blocks += 1

    def _removing(self, node: Block) -> None:
        if self._pending is node:
            self._start_pending()
        if not node.attached:
            return
        self._event()
        if node.top is node:
            visits = self._visits_ghost
            visits[node.key] = node.count
            visits.move_to_end(node.key)
            limit = self._follow_limit()
            while len(visits) > limit:
                visits.popitem(last=False)

    def _leaf_added(self, node: Block) -> None:
        self._leaves += 1
        age = self.now - node.last
        self._file(node, self.block_class(node), age_bucket(age if age > 0.0 else 0.0))

    def _leaf_removed(self, node: Block) -> None:
        self._leaves -= 1
        if node.slot >= 0:
            self._unfile(node)

    def _leaf_rebranched(self, node: Block) -> None:
        if node.slot >= 0 and node.slot // AGE_BUCKETS != self.block_class(node):
            self._refile(node)

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
        self._lead = 0.9 * self._lead + diff
        self._lead_sq = 0.9 * self._lead_sq + diff * diff
        if self._lead > math.sqrt(self._lead_sq):
            self.lru_share = min(1.0, self.lru_share + self.guard_step)
        else:
            self.lru_share = max(0.0, self.lru_share - self.guard_step)
        self._window_own = self._window_blocks = 0
        self._window_shadow_start = shadow.hits

    # -- victims -------------------------------------------------------------------------------------------
    def _pick(self, restore: list[tuple[float, int, int, Block]]) -> Block | None:
        """The filed leaf to evict next: the front of the lowest-index non-empty bin, unless LRU's choice is
        within ``lru_margin`` of it (then LRU's choice; also before the first table and when the guard says
        so). ``restore`` collects heap entries of leaves this plan has taken, to push back afterwards."""
        oldest = self._oldest(restore)
        index = self._index
        if index is None or oldest is None:
            return oldest
        if self.lru_share > 0.0:
            self._lru_credit += self.lru_share
            if self._lru_credit >= 1.0:
                self._lru_credit -= 1.0
                return oldest
        while True:
            best: Block | None = None
            best_v = math.inf
            for cls, ranked in enumerate(self._ranked):
                if not ranked:
                    continue
                b = self._order[cls][(ranked & -ranked).bit_length() - 1]
                v = index[cls][b]
                if v <= best_v:
                    front = next(iter(self._bins[cls][b]))
                    if v < best_v or best is None or front.last < best.last:
                        best, best_v = front, v
            if best is None or best.slot // AGE_BUCKETS == self.block_class(best):
                break
            self._refile(best)  # its class changed without an event that refiles it
        if best is None or best is oldest:
            return best
        cls, bucket = divmod(oldest.slot, AGE_BUCKETS)
        if best_v >= (1.0 - self.lru_margin) * index[cls][bucket]:
            return oldest
        return best

    def _oldest(self, restore: list[tuple[float, int, int, Block]]) -> Block | None:
        """The least recently used filed leaf (what leaf LRU would evict next)."""
        heap = self._lru
        while heap:
            _, _, ver, node = heap[0]
            if ver == node.ver and node.slot >= 0:
                return node
            entry = heapq.heappop(heap)
            if ver == node.ver and id(node) in self._taken:
                restore.append(entry)
        return None

    def _plan(self, need: int, now: float) -> Iterable[Block]:
        self._start_pending()
        self._guard(need)
        self._migrate(now)
        state = PlanState()
        out: list[Block] = []
        taken: list[tuple[Block, int, int]] = []  # (leaf, slot, ver) taken out of its bin, to put back
        virtual: list[Block] = []  # parents filed for this plan (their children are all planned)
        virtual_ids: set[int] = set()
        restore: list[tuple[float, int, int, Block]] = []
        try:
            while need > 0:
                node = self._pick(restore)
                if node is None:
                    break
                slot = node.slot
                self._unfile(node)
                if id(node) not in virtual_ids:  # a parent filed for this plan is not put back
                    taken.append((node, slot, node.ver))
                    self._taken.add(id(node))
                out.append(node)
                need -= node.size
                parent = state.plan(node)
                if parent is not None:
                    age = now - parent.last
                    virtual_ids.add(id(parent))
                    self._file(parent, self.block_class(parent), age_bucket(age if age > 0.0 else 0.0))
                    virtual.append(parent)
        finally:
            for parent in virtual:
                if parent.slot >= 0:
                    self._unfile(parent)
            for node, slot, ver in reversed(taken):
                cls, bucket = divmod(slot, AGE_BUCKETS)
                bins = self._bins[cls][bucket]
                if not bins:
                    self._occupied[cls] |= 1 << bucket
                    self._ranked[cls] |= 1 << self._rank[cls][bucket]
                bins[node] = None
                bins.move_to_end(node, last=False)
                node.slot = slot
                node.ver = ver
            self._taken.clear()
            for entry in restore:
                heapq.heappush(self._lru, entry)
        return out
