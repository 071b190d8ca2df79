"""Eviction policies: the shared interface, leaf-only plans, orphan accounting under random operations,
LRU on hand-made cases, Belady against brute force, the shadow LRU, and what hit density learns."""

import functools
import itertools
import os
import random

import pytest

import agent.datapath.eviction as eviction_package
from agent.datapath.eviction import BeladyPolicy, HitDensityPolicy, LeafLRUPolicy, PlainLRUPolicy
from agent.datapath.eviction.reuse import age_bucket
from agent.datapath.eviction.shadow import ShadowLRU
from agent.sim.trace import TraceRequest
from bench.eviction import simulate


def belady_random():
    return BeladyPolicy(lambda key: (hash(key) * 2654435761) % 97)


LEAF_FIRST = {
    "lru": LeafLRUPolicy,
    "hit-density": lambda: HitDensityPolicy(min_interval=16, memory_floor=256, ghost_sample=1),
    "belady": belady_random,
}


def check_consistent(policy):
    """Recompute everything the tree keeps from its parent links and compare."""
    tree = policy.tree
    nodes = {b.key: b for b in tree.blocks()}

    def reachable(node):
        while node.parent_key is not None:
            node = nodes.get(node.parent_key)
            if node is None:
                return False
        return True

    detached = [b for b in nodes.values() if not reachable(b)]
    assert tree.orphaned_blocks == len(detached) == policy.orphaned_blocks
    assert tree.orphaned_bytes == sum(b.size for b in detached) == policy.orphaned_bytes
    assert tree.bytes == sum(b.size for b in nodes.values()) == policy.used_bytes
    for b in nodes.values():
        kids = {k for k, c in nodes.items() if c.parent_key == b.key}
        assert set(b.children or {}) == kids
        assert b.attached == reachable(b)
        if b.attached and b.parent is not None:
            assert b.depth == b.parent.depth + 1
            expected_top = b.parent.top if len(b.parent.children) == 1 else b
            assert b.top is expected_top
    leaves = {k for k, b in nodes.items() if b.attached and not b.children}
    if isinstance(policy, HitDensityPolicy):
        filed = [b for bins in policy._bins for group in bins for b in group]
        assert len(filed) == len(set(filed)) and {b.key for b in filed} == leaves
        buckets = len(policy._bins[0])
        for b in filed:
            cls, bucket = divmod(b.slot, buckets)
            assert b in policy._bins[cls][bucket]
    if isinstance(policy, LeafLRUPolicy):
        assert policy._leaves == len(leaves)


def random_universe(rng, n=40):
    """A fixed parent map: key i > 0 hangs under a random earlier key or is a root."""
    parent = {0: None}
    for i in range(1, n):
        parent[i] = None if rng.random() < 0.05 else rng.randrange(i)
    return parent


def path_to(parent, key):
    out = []
    while key is not None:
        out.append(key)
        key = parent[key]
    return out[::-1]


@pytest.mark.parametrize("name", [*LEAF_FIRST, "plain-lru"])
def test_random_operations_keep_accounting_and_plans_orphan_nothing(name):
    rng = random.Random(name)
    policy = PlainLRUPolicy() if name == "plain-lru" else LEAF_FIRST[name]()
    parent = random_universe(rng)
    sizes = {k: rng.randint(1, 5) for k in parent}
    now = 0.0
    for _step in range(600):
        now += rng.random()
        roll = rng.random()
        if roll < 0.6:
            keys = path_to(parent, rng.randrange(len(parent)))
            policy.on_request(keys, [sizes[k] for k in keys], now)
        elif roll < 0.75 and len(policy):
            # External removal (the master evicting): may orphan; the return value says what.
            key = rng.choice([b.key for b in policy.tree.blocks()])
            before = {b.key for b in policy.tree.blocks() if b.attached}
            orphaned = policy.on_remove(key)
            after = {b.key for b in policy.tree.blocks() if b.attached}
            assert set(orphaned) == before - after - {key}
        elif len(policy):
            want = rng.randint(1, 15)
            size_before, bytes_before = len(policy), policy.used_bytes
            victims = policy.select_victims(want, now)
            assert (len(policy), policy.used_bytes) == (size_before, bytes_before)  # planning changes nothing
            assert len(victims) == len(set(victims))
            freed = sum(policy.tree.get(k).size for k in victims)
            assert freed >= want or freed == bytes_before
            for key in victims:
                node = policy.tree.get(key)
                if name != "plain-lru":
                    assert not node.children or not node.attached, f"{key} is not a leaf when removed"
                    assert policy.on_remove(key) == []
                else:
                    policy.on_remove(key)
        check_consistent(policy)
    if name == "plain-lru":
        assert policy.tree.orphaned_total > 0


@pytest.mark.parametrize("name", LEAF_FIRST)
def test_orphans_are_planned_first_children_before_parents(name):
    policy = LEAF_FIRST[name]()
    policy.on_request(["r", "a", "b", "c"], 1, 1.0)
    policy.on_request(["r", "x"], 1, 2.0)
    assert policy.on_remove("a") == ["b", "c"]  # from outside: b and c are now unreachable
    assert policy.orphaned_blocks == 2
    assert policy.select_victims(2, 3.0) == ["c", "b"]
    assert policy.select_victims(3, 3.0)[:2] == ["c", "b"]
    policy.on_insert("a", "r", 1, 4.0)  # a stored again: b and c are reachable again
    assert policy.orphaned_blocks == 0
    check_consistent(policy)


def test_leaf_lru_hand_made():
    lru = LeafLRUPolicy()
    assert lru.on_request(["a", "b", "c"], 1, 1.0) == 0
    assert lru.on_request(["a", "d"], 1, 2.0) == 1
    assert lru.select_victims(1) == ["c"]
    # c goes, then b (a leaf once c is gone, used at 1.0), then d, then a (a leaf only after d).
    assert lru.select_victims(4) == ["c", "b", "d", "a"]
    assert lru.on_request(["a", "b", "c"], 1, 3.0) == 3
    assert lru.select_victims(1) == ["d"]
    assert lru.evict(2) == ["d", "c"]
    assert sorted(b.key for b in lru.tree.blocks()) == ["a", "b"]
    assert lru.select_victims(0) == []


def test_plain_lru_orphans_and_reports_them():
    plain = PlainLRUPolicy()
    plain.on_request(["a", "b", "c"], 1, 1.0)
    plain.on_request(["a", "d"], 1, 2.0)
    assert plain.select_victims(1) == ["b"]  # least recently touched, although c hangs below it
    assert plain.on_remove("b") == ["c"]
    assert (plain.orphaned_blocks, plain.orphaned_bytes) == (1, 1)
    assert plain.on_request(["a", "b", "c"], 1, 3.0) == 1  # the lookup stops at the missing b
    assert plain.orphaned_blocks == 0


def test_interface_errors():
    lru = LeafLRUPolicy()
    lru.on_insert("a", None, 1, 0.0)
    with pytest.raises(KeyError):
        lru.on_access("nope", 1.0)
    with pytest.raises(KeyError):
        lru.on_remove("nope")
    with pytest.raises(ValueError, match="block keys must name their whole prefix"):
        lru.on_insert("a", "other", 1, 1.0)
    with pytest.raises(ValueError, match="ghost_sample"):
        HitDensityPolicy(ghost_sample=0)
    with pytest.raises(ValueError, match="lru_margin"):
        HitDensityPolicy(lru_margin=1.0)


def test_on_insert_of_a_present_block_is_an_access():
    lru = LeafLRUPolicy()
    lru.on_insert("a", None, 1, 0.0)
    lru.on_insert("a", None, 1, 5.0)
    assert lru.tree.get("a").count == 2 and lru.tree.get("a").last == 5.0


def small_trace(rng, n_req=7, n_conv=3):
    """Conversations under one root that grow by one or two blocks, sometimes replaying a shorter prefix."""
    convs = [[0] for _ in range(n_conv)]
    next_id = itertools.count(1)
    reqs = []
    for t in range(n_req):
        c = rng.randrange(n_conv)
        p = convs[c]
        if len(p) < 2 or rng.random() < 0.7:
            p = p + [next(next_id)]
            if rng.random() < 0.5:
                p = p + [next(next_id)]
        convs[c] = p
        ids = p[: rng.randint(1, len(p))] if rng.random() < 0.2 else p
        reqs.append(TraceRequest(t * 1000, 0, 0, tuple(ids)))
    return reqs


def brute_force_optimum(reqs, cap):
    """Most prefix-hit blocks any orphan-free policy can get (insert, then keep any prefix-closed set)."""
    parent = {}
    for r in reqs:
        for a, b in zip((None,) + r.hash_ids, r.hash_ids):
            parent[b] = a

    @functools.lru_cache(None)
    def best(i, present):
        if i == len(reqs):
            return 0
        ids = reqs[i].hash_ids
        hit = next((j for j, b in enumerate(ids) if b not in present), len(ids))
        full = present | frozenset(ids)
        if len(full) <= cap:
            return hit + best(i + 1, full)
        options = (
            frozenset(keep)
            for keep in itertools.combinations(sorted(full), cap)
            if all(parent[b] is None or parent[b] in keep for b in keep)
        )
        return hit + max(best(i + 1, keep) for keep in options)

    return best(0, frozenset())


def test_belady_matches_brute_force_on_small_traces():
    rng = random.Random(7)
    for _ in range(60):
        reqs = small_trace(rng)
        cap = rng.randint(2, 4)
        optimum = brute_force_optimum(reqs, cap)
        assert simulate(reqs, cap, "belady").hit_blocks == optimum
        assert simulate(reqs, cap, "lru").hit_blocks <= optimum
        assert simulate(reqs, cap, "hit-density").hit_blocks <= optimum


def test_shadow_lru_hits_exactly_what_leaf_lru_hits():
    rng = random.Random(11)
    parent = random_universe(rng, 80)
    reqs = [
        TraceRequest(i * 100, 0, 0, tuple(path_to(parent, rng.randrange(len(parent))))) for i in range(800)
    ]
    for cap in (5, 20, 60):
        shadow = ShadowLRU()
        for req in reqs:
            prev = None
            for key in req.hash_ids:
                shadow.record(key, prev, 1)
                prev = key
            shadow.trim(cap)
        assert shadow.hits == simulate(reqs, cap, "lru").hit_blocks
        assert len(shadow) <= cap


def scan_with_hot_branches(n=3000, seed=0):
    """A quarter of the requests revisit one of 20 hot branches (5 blocks under a shared root, about 80
    requests apart on average); the rest are one-off 5-block requests. LRU's residence (about 30 requests at
    150 blocks) catches only the revisits that come soon."""
    rng = random.Random(seed)
    reqs, uid = [], itertools.count(1000)
    for i in range(n):
        if rng.random() < 0.25:
            h = rng.randrange(20)
            ids = (0,) + tuple(10 + 5 * h + k for k in range(5))
        else:
            ids = (0,) + tuple(next(uid) for _ in range(5))
        reqs.append(TraceRequest(i * 250, 0, 0, ids))
    return reqs


def test_hit_density_keeps_reused_branches_through_one_off_traffic():
    reqs = scan_with_hot_branches()
    lru = simulate(reqs, 150, "lru").hit_ratio
    density = simulate(reqs, 150, "hit-density")
    belady = simulate(reqs, 150, "belady").hit_ratio
    assert density.orphaned == 0
    assert 1.1 * lru < density.hit_ratio <= belady


def test_hit_density_falls_back_toward_lru_when_lru_hits_more():
    # Two-block chains under one root, popularity falling exponentially with the chain number and no
    # other structure: recency is all there is. The guard must keep hit density close to LRU.
    rng = random.Random(5)
    reqs = []
    for i in range(4000):
        c = int(rng.expovariate(1 / 15)) % 120
        reqs.append(TraceRequest(i * 200, 0, 0, (0, 1000 + c, 2000 + c)))
    lru = simulate(reqs, 60, "lru").hit_ratio
    density = simulate(reqs, 60, "hit-density").hit_ratio
    assert density >= 0.97 * lru


def victims_of(policy, reqs, cap, key=lambda k: k):
    """Replay ``reqs`` (keys mapped by ``key``) at ``cap`` one-byte blocks; every victim, in order."""
    out = []
    for req in reqs:
        now = req.timestamp_ms / 1000.0
        policy.on_request([key(k) for k in req.hash_ids], 1, now)
        over = policy.used_bytes - cap
        if over > 0:
            plan = policy.select_victims(over, now)
            for k in plan:
                assert policy.on_remove(k) == []
            out.extend(plan)
    return out


def test_hit_density_is_deterministic_whatever_the_keys():
    # No sampling, no random numbers, no order taken from key hashes: the same requests give the same
    # victims on every run, and the same victims again when the keys are strings (whose hashes vary per run).
    reqs = scan_with_hot_branches(800)
    runs = [victims_of(HitDensityPolicy(), reqs, 60) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) > 1000
    as_text = victims_of(HitDensityPolicy(), reqs, 60, key=lambda k: f"block-{k}")
    assert as_text == [f"block-{k}" for k in runs[0]]


def test_density_learns_that_request_tails_are_not_reused():
    # Conversations of three turns, 2 s apart; each turn extends the previous prompt's full blocks and ends
    # in a block (a "partial" one) that is never asked for again. After learning, at the same age, a tail
    # block of a branch entered once must rank below (go before) a block that the next turn reuses.
    policy = HitDensityPolicy(min_interval=64, memory_floor=4096, guard=False)
    turns = []
    for conv in range(300):
        base = ("c", conv)
        turns.append((conv * 1.0, [0, base, (base, "p1")]))
        turns.append((conv * 1.0 + 2.0, [0, base, (base, "b"), (base, "p2")]))
        turns.append((conv * 1.0 + 4.0, [0, base, (base, "b"), (base, "c"), (base, "p3")]))
    for now, blocks in sorted(turns, key=lambda t: t[0]):
        policy.on_request(blocks, 1, now)
        policy.evict(policy.used_bytes - 60, now)
    assert policy.updates > 0 and policy.orphaned_blocks == 0
    reused = policy.reuse.reused
    tails = [c for c in range(policy.n_classes) if c & 1]
    assert sum(sum(reused[c]) for c in tails) == 0  # no tail block was ever used again
    assert sum(sum(reused[c]) for c in range(policy.n_classes) if not c & 1) > 0
    one_second = age_bucket(1.0)
    waiting = [c for c in range(policy.n_classes) if not c & 1 and sum(reused[c]) > 0]
    for c in waiting:  # the same class but for the tail flag
        assert policy._index[c | 1][one_second] < policy._index[c][one_second]


@pytest.mark.parametrize("name", LEAF_FIRST)
def test_any_prefix_of_a_plan_orphans_nothing_and_planning_changes_nothing(name):
    # The caller may stop anywhere in a plan (a refused removal) and ask again; the master may evict any block
    # in between. Whatever prefix is removed, nothing is orphaned by it, and planning twice gives one plan.
    rng = random.Random(f"prefix:{name}")
    policy = LEAF_FIRST[name]()
    parent = random_universe(rng, 60)
    now = 0.0
    for _step in range(800):
        now += rng.random()
        keys = path_to(parent, rng.randrange(len(parent)))
        policy.on_request(keys, 1, now)
        if rng.random() < 0.1 and len(policy):
            policy.on_remove(rng.choice([b.key for b in policy.tree.blocks()]))  # the master, prefix-blind
        over = policy.used_bytes - 20
        if over > 0:
            plan = policy.select_victims(over, now)
            assert policy.select_victims(over, now) == plan
            orphans_first = [k for k in plan if not policy.tree.get(k).attached]
            assert plan[: len(orphans_first)] == orphans_first
            for key in plan[: rng.randint(0, len(plan))]:
                was_attached = policy.tree.get(key).attached
                orphaned = policy.on_remove(key)
                assert orphaned == [] or not was_attached
        check_consistent(policy)


def conversations(n_requests, n_live, seed=0, gap=1.0):
    """Chat-like requests: ``n_live`` conversations in flight under one root, each turn extending its whole
    previous prompt by one or two blocks and ending in a block never reused; a conversation ends with
    probability 0.3 after a turn and a new one takes its place."""
    rng = random.Random(seed)
    ids = itertools.count(1)
    live = [[0, next(ids)] for _ in range(n_live)]
    reqs = []
    for i in range(n_requests):
        c = rng.randrange(n_live)
        prompt = live[c]
        reqs.append(TraceRequest(int(i * gap * 1000), 0, 0, tuple(prompt + [next(ids)])))
        if rng.random() < 0.3:
            live[c] = [0, next(ids)]
        else:
            live[c] = prompt + [next(ids) for _ in range(rng.randint(1, 2))]
    return reqs


def lines_run(policy, reqs, cap, traced_from):
    """Replay ``reqs`` at ``cap`` blocks; lines executed in the eviction package from request ``traced_from``
    on, and the block operations (accesses, stores, removals) they served."""
    import sys

    package = os.path.dirname(eviction_package.__file__)
    counts = {"lines": 0}

    def local(frame, event, arg):
        if event == "line":
            counts["lines"] += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(package) else None

    ops = 0
    for i, req in enumerate(reqs):
        if i == traced_from:
            sys.settrace(tracer)
        now = req.timestamp_ms / 1000.0
        policy.on_request(list(req.hash_ids), 1, now)
        removed = 0
        over = policy.used_bytes - cap
        if over > 0:
            for key in policy.select_victims(over, now):
                policy.on_remove(key)
                removed += 1
        if i >= traced_from:
            ops += len(req.hash_ids) + removed
    sys.settrace(None)
    return counts["lines"], ops


def test_hit_density_work_per_block_operation_does_not_grow_with_the_cache():
    # Amortised O(log n) per access, store and removal: with 8x the blocks held (and 8x the conversations in
    # flight, so the cache stays full), the lines executed per block operation stay about the same. A scan
    # of the leaves per victim would multiply them by about 8.
    small_reqs = conversations(3000, 40)
    large_reqs = conversations(3000, 320)
    small, small_ops = lines_run(HitDensityPolicy(), small_reqs, 150, 1500)
    large, large_ops = lines_run(HitDensityPolicy(), large_reqs, 1200, 1500)
    assert small_ops > 10_000 and large_ops > 10_000
    assert large / large_ops < 1.6 * (small / small_ops)


def test_stores_with_inferred_reads_give_the_full_signal_when_every_request_stores():
    # An agent fed by engine KV events sees only the blocks a request stores. When every request stores at
    # least one block (its partial last block, as in the FAST'25 trace), a store under a present parent says
    # which prefix the request read: inferring those reads replays exactly what full reports give.
    reqs = conversations(1500, 60, seed=3)
    for name in ("lru", "hit-density"):
        full = simulate(reqs, 120, name)
        inferred = simulate(reqs, 120, name, signal="stores-inferred")
        assert (inferred.hit_blocks, inferred.evicted) == (full.hit_blocks, full.evicted)
        assert inferred.orphaned == 0
    with pytest.raises(ValueError, match="unknown signal"):
        simulate(reqs, 120, "lru", signal="reads")


def test_inferred_reads_touch_each_prefix_block_once_per_request():
    policy = LeafLRUPolicy()
    policy.infer_access = True
    policy.on_insert("a", None, 1, 1.0)
    policy.on_insert("b", "a", 1, 1.0)
    policy.on_insert("c", "b", 1, 2.0)  # a later request stored c under b: it read a and b
    assert [policy.tree.get(k).count for k in "abc"] == [2, 2, 1]
    assert [policy.tree.get(k).last for k in "abc"] == [2.0, 2.0, 2.0]
    policy.on_insert("d", "c", 1, 2.0)  # the same request goes on: nothing read twice
    assert [policy.tree.get(k).count for k in "abcd"] == [2, 2, 1, 1]
    assert policy.select_victims(1, 3.0) == ["d"]
