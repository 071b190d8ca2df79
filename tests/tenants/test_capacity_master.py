"""``tenants.capacity.effective_quotas`` against a real ``mooncake_master`` 0.3.13.post1: one 64 MiB segment is
mounted, requested quotas are set through the admin API, and every tenant's ``effective_quota_bytes`` must equal
the rule's value — including the proportional scaling, the largest-remainder rounding with its tie-break, the
2^63-1 request that starves every other tenant, and capacity changes when a second segment mounts."""
from __future__ import annotations

import time

import pytest

from agent.datapath.store import open_store
from tenants.capacity import effective_quotas

pytestmark = pytest.mark.integration

MiB = 1 << 20
C = 64 * MiB
MAX = 2**63 - 1

#: Requested-quota combinations (tenant -> bytes) applied in order to one master with capacity ``C``.
COMBINATIONS = [
    {"zeta": 64 * MiB, "alpha": 32 * MiB, "mid": 1},          # proportional, remainder to the largest fraction
    {"zeta": 32 * MiB, "alpha": 16 * MiB, "mid": 16 * MiB},   # sum == capacity: effective == requested
    {"zeta": C, "alpha": C, "mid": C},                        # equal remainders: ascending tenant id wins
    {"zeta": 2 * C, "alpha": C, "mid": C},
    {"zeta": MAX, "alpha": 32 * MiB, "mid": 16 * MiB},        # the request: every other tenant gets 0
    {"zeta": 7, "alpha": 11, "mid": C - 17},                  # one byte over: the big one loses a byte
    {"zeta": 10 * MiB, "alpha": 100 * MiB, "mid": 3},
    {"zeta": 2**62 + 1, "alpha": 2**62, "mid": 2**62},        # exact arithmetic: 2^62+1 beats 2^62
    {"zeta": MAX, "alpha": MAX, "mid": MAX},
]


def _effective(master) -> dict[str, int]:
    return {row["tenant_id"]: row["effective_quota_bytes"] for row in master.tenant_quotas()}


def _requested(master) -> dict[str, int]:
    return {row["tenant_id"]: row["requested_quota_bytes"] for row in master.tenant_quotas()}


def _capacity(master) -> int:
    return int(master.metrics().get("master_total_capacity_bytes", 0))


def _wait_capacity(master, expected: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _capacity(master) != expected:
        assert time.monotonic() < deadline, f"capacity {_capacity(master)} never became {expected}"
        time.sleep(0.1)


def test_effective_quotas_match_the_master(mooncake_master_factory):
    master = mooncake_master_factory({"zeta": C, "alpha": C, "mid": C})
    assert _capacity(master) == 0
    assert set(_effective(master).values()) == {0} == set(effective_quotas(_requested(master), 0).values())
    first = open_store(master.endpoints(global_segment_size=C), "alpha")
    try:
        _wait_capacity(master, C)
        for combination in COMBINATIONS:
            for tenant_id, quota in combination.items():
                master.set_tenant_quota(tenant_id, quota)
            observed = _effective(master)
            assert observed == effective_quotas(combination, C), combination
            if sum(combination.values()) > C:
                assert sum(observed.values()) == C
        second = open_store(master.endpoints(global_segment_size=32 * MiB), "zeta")
        try:
            _wait_capacity(master, C + 32 * MiB)
            requested = _requested(master)
            assert _effective(master) == effective_quotas(requested, C + 32 * MiB)
            master.set_tenant_quota("beta", 5)  # a fourth tenant, added through the admin API
            assert _effective(master) == effective_quotas({**requested, "beta": 5}, C + 32 * MiB)
        finally:
            second.close()
    finally:
        first.close()
