"""MasterProcess: a real mooncake_master on free loopback ports, its policy file, admin API and metrics."""

from __future__ import annotations

import pytest
import yaml

from agent.sim.master import (
    MasterError,
    MasterProcess,
    find_master_binary,
    free_ports,
    render_quota_policy,
)
from tests.support.mooncake import MASTER_TENANTS


def test_policy_rendering_and_validation() -> None:
    doc = yaml.safe_load(render_quota_policy({"a b": 1, "t:1": 2**63 - 1}))
    assert doc == {"version": 1, "tenants": [{"name": "a b", "quota": 1}, {"name": "t:1", "quota": 2**63 - 1}]}
    assert yaml.safe_load(render_quota_policy({})) == {"version": 1, "tenants": []}
    for bad in ({"": 1}, {"_x": 1}, {"a\nb": 1}, {"a": 0}, {"a": 2**63}, {"a": "8MB"}):
        with pytest.raises(ValueError):
            render_quota_policy(bad)


def test_binary_and_ports() -> None:
    assert find_master_binary().endswith("mooncake_master")
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


@pytest.mark.integration
def test_running_master_exposes_endpoints_quotas_and_metrics(mooncake_master) -> None:
    m = mooncake_master
    assert m.running and m.rpc_address.startswith("127.0.0.1:")
    assert m.metadata_server == f"http://127.0.0.1:{m.metadata_port}/metadata"
    ep = m.endpoints(global_segment_size="32MB")
    assert ep.master_server_address == m.rpc_address and ep.global_segment_size == 32 << 20
    quotas = {q["tenant_id"]: q["requested_quota_bytes"] for q in m.tenant_quotas()}
    assert quotas == MASTER_TENANTS
    assert yaml.safe_load(m.quota_file.read_text())["version"] == 1
    assert "master_key_count" in m.metrics()
    assert "--enable_multi_tenants=true" in m.command()


@pytest.mark.integration
def test_quota_changes_and_eviction_flags(mooncake_master_factory) -> None:
    m = mooncake_master_factory({"t1": 8 << 20}, eviction_high_watermark_ratio=0.5, eviction_ratio=0.25,
                                default_kv_lease_ttl="50ms", client_ttl=5)
    argv = m.command()
    for flag in ("--eviction_high_watermark_ratio=0.5", "--eviction_ratio=0.25", "--default_kv_lease_ttl=50ms",
                 "--client_ttl=5"):
        assert flag in argv
    assert m.set_tenant_quota("t2", 1 << 20)["requested_quota_bytes"] == 1 << 20
    names = {t["name"]: t["quota"] for t in yaml.safe_load(m.quota_file.read_text())["tenants"]}
    assert names == {"t1": 8 << 20, "t2": 1 << 20}  # the master rewrote its policy file
    assert m.tenant_quota("t2")["has_explicit_policy"] is True
    m.stop()
    assert not m.running


@pytest.mark.integration
def test_start_failure_reports_the_log() -> None:
    master = MasterProcess({"t": 1}, extra_args=["--no_such_flag=1"], startup_timeout=5)
    with pytest.raises(MasterError, match="no_such_flag|exited|not ready"):
        master.start(attempts=1)
    master.stop()
