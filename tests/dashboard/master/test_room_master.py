"""The control plane's room against a real ``mooncake_master`` 0.3.13.post1 (issue 18 item 4): the master probe reads
the mounted capacity, the effective quotas the dashboard computes from it equal the master's own (admin API), and a
segment mounting later (a capacity change) re-renders the nodes whose documents carry implicit budgets, with the
budgets of the new capacity."""
from __future__ import annotations

from unittest import mock

import pytest

from agent.datapath.store import open_store
from agent.sim.master import MasterProcess
from dashboard import tasks
from dashboard.master.room import current_pool_room, effective_budget
from dashboard.rollout.push import render_contents
from tenants.room import MasterEviction
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.integration]
MiB = 1 << 20


def test_capacity_and_effective_quotas_from_the_master_drive_implicit_budgets(settings,
                                                                              django_capture_on_commit_callbacks):
    quotas = {"acme": 48 * MiB, "globex": 32 * MiB}
    acme = make_tenant("acme", quota=quotas["acme"])
    make_tenant("globex", quota=quotas["globex"])
    model = make_model(acme, "chat", "/models/chat")
    release = make_release(model, "v2", state="serving")
    make_release(model, "v1", budget_bytes=8 * MiB)
    node = make_node("node-a")
    make_assignment(node, release, port=8000)
    with MasterProcess(quotas, eviction_high_watermark_ratio=0.9) as master:
        settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
        settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO = 0.9
        first = open_store(master.endpoints(global_segment_size=64 * MiB, local_buffer_size=4 * MiB), "acme")
        second = None
        try:
            pushed = []
            for segments in (1, 2):
                if segments == 2:
                    second = open_store(master.endpoints(global_segment_size=32 * MiB, local_buffer_size=4 * MiB),
                                        "globex")
                with (mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
                      django_capture_on_commit_callbacks(execute=True)):
                    tasks.probe_master()
                pushed.append(sorted(name for call in push.call_args_list for name in call.kwargs["args"][0]))
                capacity = {1: 64 * MiB, 2: 96 * MiB}[segments]  # 80 MiB requested: scaled, then not
                pool = current_pool_room()
                assert pool.capacity_bytes == capacity  # read from the master's /metrics by the probe
                master_effective = {row["tenant_id"]: row["effective_quota_bytes"] for row in master.tenant_quotas()}
                assert {t: r.effective_quota_bytes for t, r in pool.tenants.items()} == master_effective
                room = pool.tenants["acme"]
                watermark = MasterEviction(0.9).watermark_bytes(capacity)
                assert pool.watermark_bytes == watermark
                share = watermark * master_effective["acme"] // sum(master_effective.values())
                assert room.eviction_point_bytes == min(master_effective["acme"], share)
                implicit = room.eviction_point_bytes - 8 * MiB
                assert effective_budget(release).budget_bytes == implicit
                assert render_contents([node])["node-a"]["instances"][0]["node_budget_bytes"] == implicit
            assert pushed == [["node-a"], ["node-a"]]  # unknown -> 64 MiB, then 64 -> 96 MiB mounted
        finally:
            for client in (second, first):
                if client is not None:
                    client.close()
