"""When a real ``mooncake_master`` 0.3.13.post1 evicts (``--enable_multi_tenants=true``): the facts ``tenants.room``
budgets against, pinned so that a wheel that changes them fails here (``docs/eviction.md``, "When the master
evicts").

* Inside a tenant: the tenant fills its whole *effective* quota (not a watermark share of it: the flags here are
  0.5 and would have stopped it at half), then every put evicts just its own bytes from that tenant
  (``mooncake_tenant_evict_bytes_total``), with no global round (``master_evicted_key_count`` stays 0).
* Across the pool: no round while the allocated bytes stay at or below ``MasterEviction.watermark_bytes``; the put
  that passes it starts one, which evicts ``MasterEviction.round_objects`` objects, oldest first, and is not
  counted against the tenant.
"""
from __future__ import annotations

import ctypes
import time

import pytest

from agent.datapath.store import open_store
from tenants.capacity import effective_quotas
from tenants.room import MasterEviction

pytestmark = pytest.mark.integration

KiB, MiB = 1 << 10, 1 << 20
#: Lease of every object (ms): short, so that eviction may take an object soon after it was written or read.
LEASE = "20ms"
#: Seconds between puts: longer than the lease.
GAP = 0.05


def _state(master, tenant_id: str) -> dict[str, int]:
    metrics = master.metrics()
    quota = master.tenant_quota(tenant_id)
    return {"charged": quota["charged_bytes"], "effective": quota["effective_quota_bytes"],
            "keys": int(metrics.get("master_key_count", 0)),
            "allocated": int(metrics.get("master_allocated_bytes", 0)),
            "tenant_evicted": int(metrics.get(f'mooncake_tenant_evict_bytes_total{{tenant_id="{tenant_id}"}}', 0)),
            "evicted_keys": int(metrics.get("master_evicted_key_count", 0)),
            "rounds": int(metrics.get("master_successful_evictions_total", 0))}


class _Writer:
    """Puts objects of ``size`` bytes from one registered buffer (the Store reads the bytes, not their value)."""

    def __init__(self, store, size: int) -> None:
        self.store, self.size = store, size
        self.buffer = ctypes.create_string_buffer(size)
        store.register(ctypes.addressof(self.buffer), size)

    def put(self, key: str, size: int | None = None) -> int:
        [code] = self.store.put_from([key], [ctypes.addressof(self.buffer)], [size or self.size])
        time.sleep(GAP)
        return code


def test_a_tenant_fills_its_effective_quota_then_the_master_evicts_inside_it(mooncake_master_factory):
    eviction = MasterEviction(0.5, 0.5)
    master = mooncake_master_factory({"a": 96 * MiB, "b": 32 * MiB}, eviction_high_watermark_ratio=0.5,
                                     eviction_ratio=0.5, default_kv_lease_ttl=LEASE)
    store = open_store(master.endpoints(global_segment_size=64 * MiB), "b")
    try:
        effective = effective_quotas({"a": 96 * MiB, "b": 32 * MiB}, 64 * MiB)["b"]
        assert effective == 16 * MiB  # scaled down: the requested quotas (128 MiB) exceed the 64 MiB mounted
        writer = _Writer(store, 4 * MiB)
        for i in range(16):  # up to 100 % of the effective quota, past 0.5 of it and past b's watermark share
            assert writer.put(f"k{i:02d}", MiB) == 0
            state = _state(master, "b")
            assert (state["charged"], state["tenant_evicted"], state["evicted_keys"]) == ((i + 1) * MiB, 0, 0)
        assert state["effective"] == effective and state["allocated"] <= eviction.watermark_bytes(64 * MiB)
        for i in range(16, 20):  # full: each put evicts exactly its own bytes inside the tenant
            assert writer.put(f"k{i:02d}", MiB) == 0
            state = _state(master, "b")
            assert state["charged"] == effective and state["keys"] == 16
            assert state["tenant_evicted"] == (i - 15) * MiB and state["evicted_keys"] == state["rounds"] == 0
        assert writer.put("three", 3 * MiB) == 0  # a bigger put takes just as many bytes more
        state = _state(master, "b")
        assert state["tenant_evicted"] == 7 * MiB and state["charged"] == effective and state["evicted_keys"] == 0
        snapshot = master.tenant_quota("b")
        assert snapshot["over_quota"] is False and snapshot["admission_closed"] is False
    finally:
        store.close()


def test_the_pool_evicts_once_allocation_passes_the_watermark_oldest_first(mooncake_master_factory):
    eviction = MasterEviction(0.7, 0.3)
    capacity, size = 32 * MiB, 256 * KiB
    master = mooncake_master_factory({"t": 1 << 30}, eviction_high_watermark_ratio=0.7, eviction_ratio=0.3,
                                     default_kv_lease_ttl=LEASE)
    store = open_store(master.endpoints(global_segment_size=capacity), "t")
    try:
        writer = _Writer(store, size)
        watermark = eviction.watermark_bytes(capacity)
        keys: list[str] = []
        while (len(keys) + 1) * size <= watermark:  # up to the watermark: no round
            keys.append(f"k{len(keys):03d}")
            assert writer.put(keys[-1]) == 0
            assert _state(master, "t")["evicted_keys"] == 0
        assert len(keys) == 89  # 22.25 MiB <= 0.7 * 32 MiB = 22.4 MiB
        keys.append(f"k{len(keys):03d}")
        assert writer.put(keys[-1]) == 0  # 22.5 MiB: past the watermark
        deadline = time.monotonic() + 30  # a hang guard: the background round comes within milliseconds
        while (state := _state(master, "t"))["evicted_keys"] == 0:
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        time.sleep(0.2)
        state = _state(master, "t")
        n = len(keys)
        # ceil(max(r, u - w + r) * n) of the n objects; n - 1 when the round ran while the last put was in flight
        expected = {eviction.round_objects(n, n * size, capacity), eviction.round_objects(n - 1, n * size, capacity)}
        assert state["evicted_keys"] in expected and state["rounds"] == 1, (state, expected)
        assert state["tenant_evicted"] == 0 and state["keys"] == n - state["evicted_keys"]
        present = [code == 1 for code in store.exists(keys)]
        assert present == [False] * state["evicted_keys"] + [True] * (n - state["evicted_keys"])  # oldest first
        assert state["charged"] == state["allocated"] == (n - state["evicted_keys"]) * size
    finally:
        store.close()
