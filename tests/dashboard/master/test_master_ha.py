"""The dashboard against a real HA master set (etcd + two ``mooncake_master --enable_ha``, ``agent.sim.ha``): health
of each master, the admin API on the leader only, failover detection on Checks and ``/metrics``, the quota sync
following the new leader (``dashboard.master.leader`` / ``health`` / ``quota_sync``)."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.sim.ha import HAMasterSet
from dashboard.checklist import run_checks
from dashboard.master.health import probe_master
from dashboard.master.leader import leader_admin_url, read_masters
from dashboard.master.quota_sync import MasterAdminClient, MasterUnavailable, sync_quotas
from dashboard.telemetry.metrics import render
from tests.dashboard.master.test_master_health import metric
from tests.support.factories import make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

#: Seconds a failover may take here before the test counts it as hung (measured: elected ~5 s, serving ~10 s).
HANG_GUARD_S = 90


def _until(step, what: str):
    """Call ``step()`` until it returns something truthy (HANG_GUARD_S at most)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        value = step()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {HANG_GUARD_S} s"
        time.sleep(0.5)


def _probe_until(condition, what: str):
    """``probe_master()`` until its row meets ``condition``; returns ``(row, event)`` of that probe."""
    return _until(lambda: (result := probe_master()) and (result if condition(result[0]) else None), what)


def _master_check():
    return next(c for c in run_checks() if c.key == "master_healthy")


def test_the_dashboard_follows_the_leader_through_a_failover(settings, tmp_path):
    with HAMasterSet({}, count=2, workdir=tmp_path / "masters") as masters:
        first, second = masters.masters
        settings.KVPOOL_MASTER_HA_ETCD_ENDPOINTS = masters.etcd.endpoint
        settings.KVPOOL_MASTER_HA_ADDRESSES = [m.rpc_address for m in masters.masters]
        settings.KVPOOL_MASTER_HA_ADMIN_URLS = [m.admin_url for m in masters.masters]
        settings.KVPOOL_TENANT_QUOTAS_PATH = str(tmp_path / "tenant_quotas.yaml")
        make_tenant("acme", quota="8MB")

        # the leader takes the quota calls; a standby refuses them (HTTP 503, -1011)
        assert leader_admin_url() == first.admin_url
        assert sync_quotas()["put"] == 1
        with pytest.raises(MasterUnavailable, match="standby"):
            MasterAdminClient(second.admin_url).list_quotas()
        view = read_masters()
        assert [(m.role, m.serving_leader) for m in view.masters] == [("leader", True), ("standby", False)]

        row, event = probe_master()
        assert row.up and not event and row.leader_address == first.rpc_address and row.standbys == 1
        assert _master_check().passed
        text = render().decode()
        assert (metric(text, "kvpool_master_failovers_total"), metric(text, "kvpool_master_standbys")) == (0, 1)

        first.kill()
        row, event = _probe_until(lambda r: r.failovers, "failover seen")
        assert event.startswith(f"failover: master {second.rpc_address} took over from {first.rpc_address}")
        check = _master_check()
        assert not check.passed and any("failover" in d for d in check.details)
        text = render().decode()
        assert (metric(text, "kvpool_master_failovers_total"), metric(text, "kvpool_master_standbys")) == (1, 0)

        # the new leader's policy file never had acme: the sync gives it the registry's quota once it serves
        def synced():
            try:
                return sync_quotas()
            except MasterUnavailable:
                return None
        assert _until(synced, "sync to the new leader")["put"] == 1
        assert leader_admin_url() == second.admin_url
        assert {q["tenant_id"]: q["requested_quota_bytes"] for q in masters.tenant_quotas()} == {"acme": 8 << 20}
        row, _ = _probe_until(lambda r: r.up, "new leader up")
        assert row.leader_address == second.rpc_address and row.failovers == 1
        assert any("no standby master answers" in d for d in _master_check().details)

        first.start(keep_ports=True)  # back as a standby: only the failover flag is left
        row, _ = _probe_until(lambda r: r.standbys == 1, "standby back")
        assert row.failovers == 1 and row.leader_address == second.rpc_address
        assert [d for d in _master_check().details if "standby" in d] == []
    settings.KVPOOL_MASTER_FAILOVER_FLAG_SECONDS = 60
    later = timezone.now() + timedelta(seconds=61)
    row.checked_at = later
    row.save()
    assert next(c for c in run_checks(later) if c.key == "master_healthy").passed
