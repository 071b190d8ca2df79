"""``tenants.room``: the master's eviction points (measured in ``test_eviction_point_master.py``) and the implicit
budgets and advice built on them, checked by brute force on small numbers."""
from __future__ import annotations

import itertools

import pytest

from tenants.capacity import effective_quotas
from tenants.room import MasterEviction, TenantRoom, eviction_points, implicit_budgets, lowered_budgets, pool_room

MiB = 1 << 20
KiB = 1 << 10


@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 1.0])
def test_watermark_is_the_last_allocation_that_does_not_trigger_a_round(ratio):
    """The master evicts once ``allocated / capacity > ratio`` in doubles: brute force over every allocation."""
    eviction = MasterEviction(ratio)
    for capacity in [*range(1, 200), 32 * MiB, 64 * MiB + 1, 2**62 + 3]:
        if capacity < 10**6:
            expected = max(a for a in range(capacity + 1) if not a / capacity > ratio)
        else:
            expected = eviction.watermark_bytes(capacity)  # the master divides doubles (uint64 -> double first)
            assert not float(expected) / capacity > ratio
            assert expected == capacity or float(expected + 1) / capacity > ratio
        assert eviction.watermark_bytes(capacity) == expected, capacity
    assert eviction.watermark_bytes(0) == 0


def test_round_objects_match_the_measured_rounds():
    """Rounds seen on the master (256 KiB and 1 MiB objects in a 32 MiB pool)."""
    assert MasterEviction(0.9, 0.1).round_objects(116, 116 * 256 * KiB, 32 * MiB) == 13
    assert MasterEviction(0.7, 0.3).round_objects(90, 90 * 256 * KiB, 32 * MiB) == 28
    assert MasterEviction(0.9, 0.1).round_objects(29, 29 * MiB, 32 * MiB) == 4
    assert MasterEviction(0.9, 0.1).round_objects(28, 28 * MiB, 32 * MiB) == 0  # 28 MiB <= 28.8 MiB


def test_flags_are_validated_and_rendered():
    assert MasterEviction().argv() == ["--eviction_high_watermark_ratio=0.9", "--eviction_ratio=0.05"]
    for bad in (0, -0.5, 1.01, float("nan"), True, "0.9"):
        with pytest.raises(ValueError, match="eviction_high_watermark_ratio"):
            MasterEviction(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="eviction_ratio"):
            MasterEviction(0.9, bad)  # type: ignore[arg-type]


def test_eviction_points_brute_force():
    eviction = MasterEviction(0.5)
    for capacity in range(1, 13):
        watermark = eviction.watermark_bytes(capacity)
        for quotas in itertools.product(range(0, 9), repeat=3):
            effective = dict(zip("abc", quotas))
            points = eviction_points(effective, capacity, eviction)
            assert all(0 <= points[t] <= effective[t] for t in effective)
            if sum(quotas) <= watermark:
                assert points == effective
            else:
                assert sum(points.values()) <= watermark
                # proportional: no tenant could get a byte more without another losing one (floor of the share)
                for t in effective:
                    assert points[t] * sum(quotas) <= watermark * effective[t] < (points[t] + 1) * sum(quotas)


def test_implicit_budgets_brute_force():
    for point, budgeted, count in itertools.product(range(0, 25), range(0, 30), range(0, 5)):
        releases = [f"r{i}" for i in range(count)]
        shares = implicit_budgets(point, budgeted, releases)
        assert set(shares) == set(releases)
        assert len(set(shares.values())) <= 1  # even split
        total = budgeted + sum(shares.values())
        assert total <= max(point, budgeted)  # never past the eviction point (unless the explicit ones already are)
        if count and budgeted <= point:
            assert point - total < count  # only the rounding is left over


def test_lowered_budgets_brute_force():
    for budgets in itertools.product(range(0, 7), repeat=3):
        named = dict(zip(("x", "y", "z"), budgets))
        for limit in range(-1, 20):
            lowered = lowered_budgets(named, limit)
            assert all(0 <= lowered[k] <= named[k] for k in named)
            if sum(budgets) <= limit:
                assert lowered == named
            else:
                assert sum(lowered.values()) <= max(0, limit)
                assert sum(lowered.values()) > limit - len(named)  # lowered no more than the rounding needs


def test_tenant_room_and_advice_name_only_the_tenant_itself():
    room = TenantRoom("acme", requested_quota_bytes=100 * MiB, effective_quota_bytes=64 * MiB,
                      watermark_share_bytes=57 * MiB, budgeted_bytes=80 * MiB, unbudgeted=(7,),
                      budgets={("release", "v2"): 60 * MiB, ("request group", "gold"): 20 * MiB},
                      charged_bytes=50 * MiB)
    assert room.eviction_point_bytes == 57 * MiB and room.eviction_point_source == "watermark share"
    assert room.implicit_budgets == {7: 0} and room.held_bytes == 80 * MiB
    assert room.quota_excess_bytes == 16 * MiB and room.watermark_excess_bytes == 7 * MiB
    assert room.quota_room_bytes == 14 * MiB and room.watermark_room_bytes == 7 * MiB
    advice = room.advice()
    assert "16 MiB (16777216 bytes) above its effective quota of 64 MiB" in advice
    assert "release 'v2' from 60 MiB to 48 MiB" in advice and "request group 'gold' from 20 MiB to 16 MiB" in advice
    assert "mount more memory" in advice
    assert "7 MiB" in room.advice("watermark") and "share of the pool's eviction watermark" in room.advice("watermark")
    fits = TenantRoom("acme", 100 * MiB, 64 * MiB, 64 * MiB, 40 * MiB, unbudgeted=(1, 2, 3))
    assert fits.implicit_budgets == {1: 8 * MiB, 2: 8 * MiB, 3: 8 * MiB} and fits.held_bytes == 64 * MiB
    assert not fits.advice() and not fits.advice("watermark")
    unknown = TenantRoom("acme", 100 * MiB, None, None, 40 * MiB, unbudgeted=(1,))
    assert unknown.eviction_point_bytes == 100 * MiB and unknown.eviction_point_source == "requested quota"
    assert unknown.implicit_budgets == {1: 60 * MiB} and unknown.quota_room_bytes is None


def test_pool_room_splits_the_watermark_and_counts_tenants_only_the_master_holds():
    eviction = MasterEviction(0.9)
    tenants = {"a": {"budgeted_bytes": 0, "unbudgeted": ("a1",)},
               "b": {"budgeted_bytes": 40 * MiB, "budgets": {("release", "b1"): 40 * MiB}}}
    pool = pool_room({"a": 60 * MiB, "b": 40 * MiB, "outside": 20 * MiB}, 100 * MiB, eviction, tenants)
    assert pool.watermark_bytes == 90 * MiB
    effective = effective_quotas({"a": 60 * MiB, "b": 40 * MiB, "outside": 20 * MiB}, 100 * MiB)
    assert {t: r.effective_quota_bytes for t, r in pool.tenants.items()} == {"a": effective["a"], "b": effective["b"]}
    assert pool.others == {"outside": effective["outside"]}
    a, b = pool.tenants["a"], pool.tenants["b"]
    assert a.eviction_point_bytes == 90 * MiB * effective["a"] // sum(effective.values())
    assert a.implicit_budgets == {"a1": a.eviction_point_bytes}
    assert b.quota_excess_bytes == 40 * MiB - effective["b"] > 0  # 40 MiB of budgets, 33.3 MiB effective quota
    assert pool.held_bytes == a.eviction_point_bytes + effective["b"] + effective["outside"]
    assert pool.watermark_excess_bytes == max(0, pool.held_bytes - 90 * MiB)
    nothing = pool_room({"a": 60 * MiB}, 0, eviction, {"a": {"budgeted_bytes": 0, "unbudgeted": ("a1",)}})
    assert nothing.capacity_bytes is None and nothing.tenants["a"].implicit_budgets == {"a1": 60 * MiB}
