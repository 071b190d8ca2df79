"""Forged engine events against a real mooncake_master (0.3.13.post1): a local process that knows a release's seed
publishes Store events whose hashes recompute but whose keys the Store does not hold (or holds only in another
tenant). They are never booked, never count against the release's budget, and no real key is removed; the
engine's real blocks are booked once the Store confirms them under the instance's tenant."""

from __future__ import annotations

import ctypes

import pytest

from agent.datapath.ledger import Ledger
from agent.datapath.store import open_store
from agent.node.engines import NodeEngines
from agent.sim.master import free_ports
from tests.agent.node.test_engines import RUN, document, present_keys, spec
from tests.support.captures import forged_store_events, frames, meta, retopic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

BLOCK = 16 << 10
TENANT = meta(RUN)["tenant_id"]


def put_all(store, keys: list[str]) -> None:
    """Write one 16 KiB object per key, as the engine's connector does."""
    buf = ctypes.create_string_buffer(BLOCK)
    store.register(ctypes.addressof(buf), BLOCK)
    codes = store.put_from(keys, [ctypes.addressof(buf)] * len(keys), [BLOCK] * len(keys))
    assert codes == [0] * len(keys)
    store.unregister(ctypes.addressof(buf))


def test_forged_events_are_never_booked_nor_budgeted_and_remove_no_real_key(mooncake_master_factory, tmp_path):
    master = mooncake_master_factory({TENANT: 1 << 30, "other": 1 << 30})
    real = sorted(meta(RUN)["store_keys"]["keys_present"])
    forged_keys: list[str] = []
    forged = forged_store_events(RUN, 200, topic="7", keys=forged_keys)
    (port,) = free_ports(1)
    doc = document([spec("7", budget=19 * BLOCK)], port)
    doc = doc.model_copy(update={"store": master.endpoints()})
    engines = NodeEngines("node-a", Ledger(), tmp_path / "instances", state_dir=tmp_path, interval=0,
                          metrics_interval=0, observer_options={"poll_ms": 20})
    engine = open_store(master.endpoints(), TENANT)             # the engine's writes (its segment holds them)
    other = open_store(master.endpoints(), "other")             # another tenant holding some of the forged keys
    probe = open_store(master.endpoints(global_segment_size=0), TENANT)
    try:
        put_all(engine, real)
        put_all(other, forged_keys[:5])
        engines.on_apply(doc)
        for raw in forged + retopic(frames(RUN), "7"):
            engines.observer.handle_instance_frames("7", raw)
        att = engines.observer.attributor("7")
        wait_for(lambda: att.snapshot()["attributed"] == 219, what="219 attributed blocks")
        assert present_keys(engines.ledger) == set()  # hints: nothing booked before the Store is asked

        counts = engines.tick(full=True)  # confirm, then budgets, orphans, reconcile
        assert present_keys(engines.ledger) == set(real)  # the real blocks, confirmed under the tenant
        assert counts["removed"] == 0 and counts["missing"] == 0
        att.pending.grace = 0.0  # the forged ones' grace is over
        engines.tick(full=True)
        (stats,) = engines.instance_stats()
        assert (stats.attributed, stats.confirmed, stats.unconfirmed, stats.pending) == (219, 19, 200, 0)
        assert sum(row["bytes"] for row in engines.ledger.snapshot()) == 19 * BLOCK
        assert engines.removed_over_budget == 0 and engines.removed_orphans == 0
        assert probe.exists(real) == [1] * 19  # no real key removed
        assert other.exists(forged_keys[:5]) == [1] * 5  # nor the other tenant's
        assert master.metrics()["master_key_count"] == 19 + 5
        assert master.tenant_quota(TENANT)["charged_bytes"] == 19 * BLOCK
    finally:
        engines.close()
        probe.close()
        other.close()
        engine.close()
