"""Reuse-time estimation for the hit-density policy: how soon a block of a class is used again, and what keeping
it is worth at each age.

A *life* of a block runs from one access to its next. :class:`ReuseEstimator` follows a sample of lives (one in
``sample`` on average, drawn by a fixed-seed generator so that runs repeat exactly and no periodic pattern of
the workload can hide a class from it) **whether or not the block stays in the cache**: a life ends in a reuse
when the key is read again or stored again after an eviction, and is lost from view (censored) when the
estimator's bounded table of lives drops it, oldest first. So the estimate sees reuse beyond the eviction
ages of the policy that uses it — without that, a policy can never learn that keeping a class longer would pay.

Per class and age bucket it counts lives that reached the bucket and lives that ended there in a reuse; the
reuse hazard of a bucket is their ratio (Kaplan-Meier, with each class pulled toward the pooled hazard by
``prior`` pseudo-lives). From the hazards, :func:`index_row` gives each age its **index**: the largest ratio of
expected reuses to expected block-seconds over any stay from that age on (a Gittins index for a one-shot
reward). Keeping the blocks with the highest index is what the optimal holding time per class does in the
fluid limit (``docs/eviction.md`` §4).

Ages are in half-octave buckets from 1/8 s, so one table covers milliseconds to years with no time scale to
tune. Counts are aged by ``keep`` at each table, so the estimate follows a changing workload.

Costs: O(1) to start or end a life (plus the buckets a life crossed since the last table), O(classes x buckets
+ lives that crossed a bucket edge) per table. Memory: one entry per followed life, at most ``limit``.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Hashable

AGE0 = 0.125  # seconds: upper edge of the first age bucket
AGE_BUCKETS = 64  # half-octaves from 1/8 s; the last starts near 2**31.5 / 8 s (about 12 years)


def age_bucket(age: float) -> int:
    """Age bucket of ``age`` seconds: 0 below 1/8 s, then one per half octave (capped)."""
    if age < AGE0:
        return 0
    b = int(2.0 * math.log2(age / AGE0)) + 1
    return b if b < AGE_BUCKETS else AGE_BUCKETS - 1


def _bucket_geometry() -> tuple[list[float], list[float]]:
    edges: list[float] = []  # upper edge of each bucket (seconds)
    widths: list[float] = []
    for b in range(AGE_BUCKETS):
        lo = 0.0 if b == 0 else AGE0 * 2.0 ** ((b - 1) / 2.0)
        hi = AGE0 * 2.0 ** (b / 2.0)
        edges.append(hi)
        widths.append(hi - lo)
    return edges, widths


#: Upper edge and width of each age bucket, in seconds.
EDGES, WIDTHS = _bucket_geometry()


def index_row(hazard: list[float]) -> list[float]:
    """Index per age bucket from per-bucket reuse hazards.

    ``hazard[b]``: probability in [0, 1] that a life still running at the start of bucket ``b`` ends in a reuse
    within it (at a constant rate within the bucket). For bucket ``a`` the index is the largest ratio, over
    the buckets ``a..t`` for any ``t >= a``, of expected reuses to expected seconds in the cache (both for a
    life running at ``a``), in reuses per second. O(buckets) amortised: the upper convex hull of the
    cumulative (seconds, reuses) curve, built from the right, answers each bucket with a tangent.
    """
    n = len(hazard)
    xs = [0.0] * (n + 1)  # cumulative expected seconds from age 0
    ys = [0.0] * (n + 1)  # cumulative expected reuses
    alive = 1.0
    for b in range(n):
        h = hazard[b]
        ys[b + 1] = ys[b] + alive * h
        # expected seconds in the bucket, the reuse rate being constant within it
        stay = WIDTHS[b] if h <= 0.0 else WIDTHS[b] * h / -math.log1p(-min(h, 1.0 - 1e-12))
        xs[b + 1] = xs[b] + alive * stay
        alive *= 1.0 - h
        if alive < 1e-12:
            alive = 1e-12
    row = [0.0] * n
    hull: list[int] = []  # point indices, leftmost last: the upper hull of points a+1..n
    for a in range(n - 1, -1, -1):
        p = a + 1
        px, py = xs[p], ys[p]
        while len(hull) >= 2:
            q, r = hull[-1], hull[-2]
            if (ys[q] - py) * (xs[r] - px) <= (ys[r] - py) * (xs[q] - px):
                hull.pop()  # q is not above the segment p -> r
            else:
                break
        hull.append(p)
        qx, qy = xs[a], ys[a]
        j = len(hull) - 1
        best = (ys[hull[j]] - qy) / (xs[hull[j]] - qx)
        while j > 0:
            slope = (ys[hull[j - 1]] - qy) / (xs[hull[j - 1]] - qx)
            if slope < best:
                break
            best = slope
            j -= 1
        row[a] = best if best > 0.0 else 0.0
    return row


class ReuseEstimator:
    """Sampled lives per class, their reuse hazards by age, and the index table they give.

    Args:
        n_classes: number of classes (``>= 1``); callers number them ``0..n_classes-1``.
        sample: one life in ``sample`` is followed (``>= 1``).
        prior: pseudo-lives pulling each class toward the pooled hazard (``>= 0``).
        z: how many standard deviations a class's evidence must stand out before it gets its own index.

    The caller bounds memory by passing ``limit`` (the most lives followed) to :meth:`start`.
    """

    def __init__(self, n_classes: int, sample: int = 4, prior: float = 4.0, z: float = 2.0) -> None:
        if n_classes < 1 or sample < 1 or prior < 0.0 or z < 0.0:
            raise ValueError(f"bad estimator settings: {n_classes=}, {sample=}, {prior=}, {z=}")
        self.n_classes = n_classes
        self.sample = sample
        self.prior = prior
        self.z = z
        nb = AGE_BUCKETS
        self.entered = [[0.0] * nb for _ in range(n_classes)]  # lives that reached the bucket
        self.reused = [[0.0] * nb for _ in range(n_classes)]  # lives that ended there in a reuse
        self._lives: OrderedDict[Hashable, tuple[int, float]] = OrderedDict()  # key -> (slot, start)
        # The same lives by (class, bucket reached so far), oldest first: key -> start.
        self._bins: list[list[OrderedDict[Hashable, float]]] = [
            [OrderedDict() for _ in range(nb)] for _ in range(n_classes)
        ]
        self._pick = random.Random(sample).random  # fixed seed: which lives are followed repeats exactly
        self._rate = 1.0 / sample
        #: Lives that ended in a reuse since the estimator was made.
        self.reuses = 0

    def __len__(self) -> int:
        return len(self._lives)

    def start(self, key: Hashable, cls: int, now: float, limit: int) -> None:
        """A life of ``key`` in class ``cls`` starts at ``now`` (followed if it is the sample's turn).

        At most ``limit`` lives are followed: the oldest beyond it are dropped (censored at their age).
        """
        if self.sample > 1 and self._pick() >= self._rate:
            return
        lives = self._lives
        old = lives.pop(key, None)
        if old is not None:
            slot, _ = old
            del self._bins[slot // AGE_BUCKETS][slot % AGE_BUCKETS][key]
        lives[key] = (cls * AGE_BUCKETS, now)
        self._bins[cls][0][key] = now
        self.entered[cls][0] += 1.0
        while len(lives) > limit:
            dropped, (slot, begun) = lives.popitem(last=False)
            cls_d, bucket = divmod(slot, AGE_BUCKETS)
            del self._bins[cls_d][bucket][dropped]
            self._credit(cls_d, bucket, age_bucket(max(0.0, now - begun)))

    def end(self, key: Hashable, now: float) -> bool:
        """``key`` was read or stored again at ``now``: its followed life (if any) ends in a reuse.

        Returns whether a followed life ended.
        """
        entry = self._lives.pop(key, None)
        if entry is None:
            return False
        slot, begun = entry
        cls, bucket = divmod(slot, AGE_BUCKETS)
        del self._bins[cls][bucket][key]
        reached = max(bucket, age_bucket(max(0.0, now - begun)))
        self._credit(cls, bucket, reached)
        self.reused[cls][reached] += 1.0
        self.reuses += 1
        return True

    def _credit(self, cls: int, bucket: int, reached: int) -> None:
        entered = self.entered[cls]
        for b in range(bucket + 1, reached + 1):
            entered[b] += 1.0

    def advance(self, now: float) -> None:
        """Count the followed lives that reached a later age bucket by ``now``."""
        last = AGE_BUCKETS - 1
        lives = self._lives
        for cls, bins in enumerate(self._bins):
            entered = self.entered[cls]
            for b in range(last):
                src = bins[b]
                if not src:
                    continue
                edge = now - EDGES[b]
                dst = bins[b + 1]
                moved = 0
                while src:
                    key, begun = next(iter(src.items()))
                    if begun > edge:
                        break
                    del src[key]
                    dst[key] = begun
                    lives[key] = (cls * AGE_BUCKETS + b + 1, begun)
                    moved += 1
                entered[b + 1] += moved

    def table(self, now: float, keep: float) -> list[list[float]]:
        """The index per class and age bucket (reuses per second) as of ``now``; then every count is multiplied
        by ``keep`` in (0, 1] (older evidence weighs less).

        A class gets its own index at an age only where its lives from that age on differ significantly from
        the pooled lives (likelihood ratio of the two hazard curves over those ages, ``z`` standard deviations
        above its chi-square mean); elsewhere it gets the pooled index, so a class is never ranked on noise.
        """
        self.advance(now)
        n, nb = self.n_classes, AGE_BUCKETS
        entered, reused = self.entered, self.reused
        pooled = [0.0] * nb
        for a in range(nb):
            e = sum(entered[c][a] for c in range(n))
            pooled[a] = min(1.0, sum(reused[c][a] for c in range(n)) / e) if e > 0.0 else 0.0
        pooled_row = index_row(pooled)
        prior, z = self.prior, self.z
        out: list[list[float]] = []
        for c in range(n):
            ec, rc = entered[c], reused[c]
            hazard = [0.0] * nb
            llr = [0.0] * nb
            for a in range(nb):
                denom = ec[a] + prior
                if denom > 0.0:
                    h = min(1.0, (rc[a] + prior * pooled[a]) / denom)
                    hazard[a] = h
                    llr[a] = _log_ratio(rc[a], ec[a], h, pooled[a])
            own = index_row(hazard)
            row = [0.0] * nb
            total = 0.0
            df = 0
            for a in range(nb - 1, -1, -1):
                total += llr[a]
                if ec[a] > 0.0:
                    df += 1
                significant = df > 0 and 2.0 * total > df + z * math.sqrt(2.0 * df)
                row[a] = own[a] if significant else pooled_row[a]
            out.append(row)
            if keep < 1.0:
                for a in range(nb):
                    ec[a] *= keep
                    rc[a] *= keep
        return out


def _log_ratio(reused: float, entered: float, h: float, h0: float) -> float:
    """Log-likelihood of ``reused`` reuses among ``entered`` lives under hazard ``h`` against ``h0``."""
    out = 0.0
    if reused > 0.0 and h > 0.0:
        out += reused * math.log(h / h0) if h0 > 0.0 else 50.0
    rest = entered - reused
    if rest > 0.0 and h < 1.0:
        out += rest * math.log((1.0 - h) / (1.0 - h0)) if h0 < 1.0 else 50.0
    return out
