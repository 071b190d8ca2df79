"""The reuse-time estimator of the hit-density policy: age buckets, the index of a hazard curve, lives followed
past eviction, censoring by the bounded table, and the fallback to the pooled lives."""

import math

import pytest

from agent.datapath.eviction.reuse import AGE_BUCKETS, EDGES, WIDTHS, ReuseEstimator, age_bucket, index_row


def test_age_buckets_are_half_octaves_from_an_eighth_of_a_second():
    assert age_bucket(0.0) == 0 and age_bucket(0.124) == 0
    assert age_bucket(0.13) == 1 and age_bucket(0.2) == 2
    assert age_bucket(1e12) == AGE_BUCKETS - 1
    for b in range(1, AGE_BUCKETS - 1):
        assert age_bucket(EDGES[b] * 0.999) == b
        assert EDGES[b] == pytest.approx(EDGES[b - 1] * math.sqrt(2.0))
    assert sum(WIDTHS[:10]) == pytest.approx(EDGES[9])


def test_index_of_a_constant_rate_is_that_rate():
    rate = 0.01  # reuses per second, memoryless
    hazard = [-math.expm1(-rate * w) for w in WIDTHS]
    row = index_row(hazard)
    for b in range(age_bucket(1000.0)):  # until nearly every life has ended (then only rounding is left)
        assert row[b] == pytest.approx(rate, rel=1e-6)


def test_index_looks_ahead_to_reuse_that_comes_later():
    # Every life is reused between 64 and 128 s, none before: young blocks are worth their wait, and once the
    # window has passed a block is worth nothing.
    hazard = [0.0] * AGE_BUCKETS
    for b in range(age_bucket(64.0), age_bucket(127.0) + 1):
        hazard[b] = 0.5
    hazard[age_bucket(127.0)] = 1.0
    row = index_row(hazard)
    assert row[0] > 0.0 and row[age_bucket(10.0)] > row[0] * 0.5
    assert row[age_bucket(100.0)] > row[age_bucket(10.0)]  # closer to the reuse, less time left to pay for
    assert row[age_bucket(200.0)] == 0.0


def test_lives_are_followed_past_the_cache_and_censored_by_the_table_bound():
    est = ReuseEstimator(2, sample=1, prior=0.0)
    est.start("a", 0, 0.0, limit=10)
    assert est.end("a", 100.0)  # stored again after an eviction: a reuse at 100 s
    assert est.reused[0][age_bucket(100.0)] == 1.0
    assert all(est.entered[0][b] == 1.0 for b in range(age_bucket(100.0) + 1))
    assert not est.end("a", 101.0)  # that life is over
    for i in range(20):
        est.start(("b", i), 1, float(i), limit=10)
    assert len(est) == 10  # the oldest ten were dropped: observed up to their age, never reused
    assert est.entered[1][0] == 20.0 and sum(est.reused[1]) == 0.0
    assert not est.end(("b", 0), 30.0) and est.end(("b", 19), 30.0)


def test_sampled_lives_repeat_exactly():
    def followed(seed_keys):
        est = ReuseEstimator(1, sample=4)
        for i, key in enumerate(seed_keys):
            est.start(key, 0, float(i), limit=1000)
        return len(est)

    keys = [f"k{i}" for i in range(400)]
    assert followed(keys) == followed(keys)
    assert 60 < followed(keys) < 140


def test_a_class_gets_its_own_index_only_where_its_lives_differ_from_the_pool():
    est = ReuseEstimator(3, sample=1, prior=4.0, z=2.0)
    t = 0.0
    for i in range(3000):
        t += 0.01
        for cls in (0, 1, 2):
            est.start((cls, i), cls, t, limit=100_000)
    for i in range(3000):  # classes 0 and 1 alike (reused at 30 s), class 2 reused at 300 s
        est.end((0, i), 30.0 + i * 0.01)
        est.end((1, i), 30.0 + i * 0.01)
        est.end((2, i), 300.0 + i * 0.01)
    table = est.table(400.0, keep=1.0)
    young = age_bucket(1.0)
    assert table[0][young] == table[1][young]  # no evidence that they differ: the pooled index for both
    assert table[2][young] != table[0][young]
    assert table[0][young] > table[2][young]  # reused sooner: worth more per second held
    with pytest.raises(ValueError):
        ReuseEstimator(0)
