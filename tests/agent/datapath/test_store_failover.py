"""What a Mooncake Store client keeps through a failover of HA masters (Mooncake 0.3.13.post1, a real etcd and two
``mooncake_master --enable_ha=true --enable_oplog=true``; ``docs/ha.md``).

The client runs in a child process: Mooncake's etcd client is one per process (a second pool's etcd in the same
process is refused: "Etcd client already connected"), so this test keeps its etcd away from every other test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

#: Seconds before the child counts as hung (a guard, not a speed limit).
HANG_GUARD_S = 240
MIB = 1 << 20

CHILD = r"""
import ctypes, json, time, urllib.request
from agent.datapath.store import open_store
from agent.sim.ha import HAMasterSet

GUARD = 90
KEYS = [f"failover-{i}" for i in range(8)]

def until(step, what):
    deadline = time.monotonic() + GUARD
    while not (value := step()):
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {GUARD} s")
        time.sleep(0.2)
    return value

with HAMasterSet({"alpha": 64 << 20}, default_kv_lease_ttl=120000) as masters:
    old, standby = masters.masters
    client = open_store(masters.endpoints(global_segment_size=64 << 20, local_buffer_size=4 << 20), "alpha")
    size = 64 << 10
    buf = ctypes.create_string_buffer(b"q" * size, size)
    ptr = ctypes.addressof(buf)
    client.register(ptr, size)
    out = {"put": client.put_from(KEYS, [ptr] * len(KEYS), [size] * len(KEYS))}
    out["read"] = client.get_into(KEYS[:1], [ptr], [size])  # a read leases the object (120 s)
    old.set_tenant_quota("alpha", 32 << 20)  # an admin change on the leader
    # the standby replayed the leader's oplog (one entry or more per object)
    until(lambda: standby.metrics().get("ha_oplog_applied_entries_total", 0) >= len(KEYS), "oplog replay")
    out["capacity_before"] = old.metrics()["master_total_capacity_bytes"]
    old.kill()
    new = masters.wait_leader(GUARD, other_than=old)
    out["new_leader_is_the_standby"] = new is standby
    # the client follows the leader through etcd and mounts its segment there again
    until(lambda: new.metrics().get("master_total_capacity_bytes", 0) > 0, "segment on the new leader")
    out["capacity_after"] = new.metrics()["master_total_capacity_bytes"]
    out["exists_after"] = until(lambda: (codes := client.exists(KEYS)) and min(codes) >= 0 and codes, "exists")
    out["remove_leased"] = client.remove(KEYS[:1], force=False)
    out["put_after"] = until(lambda: (codes := client.put_from(["after-0"], [ptr], [size])) == [0] and codes,
                             "a put on the new leader")
    out["quota_after"] = new.tenant_quota("alpha")["requested_quota_bytes"]
    client.close()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.timeout(HANG_GUARD_S + 30)
def test_objects_segments_and_leases_survive_a_failover_admin_quota_changes_do_not():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (done.stdout[-2000:], done.stderr[-3000:])
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["put"] == [0] * 8 and out["read"] == [64 << 10]
    assert out["new_leader_is_the_standby"]
    # objects replayed from the oplog are still there, the client's segment is mounted on the new leader
    assert out["exists_after"] == [1] * 8
    assert out["capacity_after"] == out["capacity_before"] == 64 * MIB
    # the read lease (120 s) outlived the failover: a plain remove is refused (-706 OBJECT_HAS_LEASE)
    assert out["remove_leased"] == [-706]
    assert out["put_after"] == [0]
    # the admin API's change lived in the old leader only: the new one has its own policy file's quota
    assert out["quota_after"] == 64 * MIB
