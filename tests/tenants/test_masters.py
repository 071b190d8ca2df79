"""The pool's masters, alone or as an HA set (tenants.masters), and everything rendered from them: the masters'
launch lines, every client's master address (engines, the node's mooncake_client, the config document)."""
from __future__ import annotations

import json

import pytest

from tenants.masters import MasterNode, MasterTopology
from tenants.rendering import RenderTarget, render_assignment, render_master, render_masters, render_store_client
from tests.support.factories import make_assignment, make_node, make_release

HA = {"KVPOOL_MASTER_HA_ETCD_ENDPOINTS": "10.0.0.1:2379;10.0.0.2:2379",
      "KVPOOL_MASTER_HA_ADDRESSES": ["10.0.0.11:50051", "10.0.0.12:50051"],
      "KVPOOL_MASTER_HA_ADMIN_URLS": ["http://10.0.0.11:9003", "http://10.0.0.12:9004/"],
      "KVPOOL_METADATA_SERVER": "etcd://10.0.0.1:2379"}


@pytest.fixture
def ha(settings):
    for name, value in HA.items():
        setattr(settings, name, value)
    return settings


def test_without_etcd_endpoints_the_one_master_of_the_settings(settings):
    settings.KVPOOL_MASTER_HA_ETCD_ENDPOINTS = ""
    settings.KVPOOL_MASTER_ADDRESS, settings.KVPOOL_MASTER_ADMIN_URL = "m:1", "http://m:3"
    topology = MasterTopology.from_settings()
    assert (topology.ha, topology.client_master_address, topology.admin_urls) == (False, "m:1", ("http://m:3",))
    assert topology.ha_argv() == []


def test_ha_settings_make_the_set_and_the_etcd_master_address(ha):
    topology = MasterTopology.from_settings()
    assert topology.ha and topology.client_master_address == "etcd://10.0.0.1:2379;10.0.0.2:2379"
    assert topology.masters == (MasterNode("10.0.0.11:50051", "http://10.0.0.11:9003"),
                                MasterNode("10.0.0.12:50051", "http://10.0.0.12:9004"))
    assert topology.ha_argv() == ["--enable_ha=true", "--ha_backend_type=etcd",
                                  "--etcd_endpoints=10.0.0.1:2379;10.0.0.2:2379", "--enable_oplog=true"]
    ha.KVPOOL_MASTER_HA_OPLOG = False
    assert "--enable_oplog=true" not in MasterTopology.from_settings().ha_argv()


@pytest.mark.parametrize(("changes", "message"), [
    ({"KVPOOL_MASTER_HA_ADMIN_URLS": ["http://10.0.0.11:9003"]}, "2 master RPC address"),
    ({"KVPOOL_MASTER_HA_ADDRESSES": [], "KVPOOL_MASTER_HA_ADMIN_URLS": []}, "needs the masters"),
    ({"KVPOOL_MASTER_HA_ADDRESSES": ["10.0.0.11:50051", "nohost"]}, "HA master 1 .*'nohost'"),
    ({"KVPOOL_MASTER_HA_ADMIN_URLS": ["http://10.0.0.11:9003", "ftp://x:1"]}, "HA master 1 .*http"),
    ({"KVPOOL_MASTER_HA_ADDRESSES": ["10.0.0.11:50051", "10.0.0.11:50051"]}, "share the rpc address"),
    ({"KVPOOL_MASTER_HA_ETCD_ENDPOINTS": "10.0.0.1"}, "KVPOOL_MASTER_HA_ETCD_ENDPOINTS: endpoint"),
])
def test_malformed_ha_settings_are_refused_with_the_setting_named(ha, changes, message):
    for name, value in changes.items():
        setattr(ha, name, value)
    with pytest.raises(ValueError, match=message):
        MasterTopology.from_settings()


def test_several_masters_need_etcd():
    with pytest.raises(ValueError, match="need HA mode"):
        MasterTopology((MasterNode("a:1", "http://a:2"), MasterNode("b:1", "http://b:2")))


def test_each_ha_master_renders_its_own_launch_with_the_set_flags(ha, db, tenant):
    """Before: one master line only, with the HTTP metadata server and no HA flags."""
    endpoints = RenderTarget.from_settings()
    configs = render_masters([tenant], endpoints)
    assert len(configs) == 2
    for index, (config, (host, metrics)) in enumerate(zip(configs, [("10.0.0.11", 9003), ("10.0.0.12", 9004)],
                                                          strict=True)):
        argv = list(config.argv)
        assert argv[:3] == ["mooncake_master", f"--rpc_address={host}", "--rpc_port=50051"]
        assert f"--metrics_port={metrics}" in argv
        assert argv[-4:] == ["--enable_ha=true", "--ha_backend_type=etcd",
                             "--etcd_endpoints=10.0.0.1:2379;10.0.0.2:2379", "--enable_oplog=true"]
        assert not any(a.startswith("--enable_http_metadata_server") for a in argv)
        assert config.meta["master_index"] == index and config.meta["masters"] == 2
        (policy,) = config.files.values()
        assert f"name: {tenant.tenant_id}" in policy
    with pytest.raises(ValueError, match="render_masters"):
        render_master([tenant], endpoints, topology=MasterTopology.from_settings())


def test_one_master_renders_as_before(settings, db, endpoints):
    settings.KVPOOL_MASTER_HA_ETCD_ENDPOINTS = ""
    assert [c.argv for c in render_masters([], endpoints)] == [render_master([], endpoints).argv]


def test_every_client_gets_the_etcd_address_in_ha_mode(ha, db, served_model):
    """vLLM's MOONCAKE_CONFIG_PATH, the node's mooncake_client and the config document's Store endpoints all carry
    ``etcd://…`` (before: the one master's host:port)."""
    endpoints = RenderTarget.from_settings()
    assert endpoints.master_server_address == "etcd://10.0.0.1:2379;10.0.0.2:2379"
    node = make_node(hostname="10.0.0.21", device="cpu", store_mode="standalone-store",
                     store_segment_bytes=256 << 20)
    config = render_assignment(make_assignment(node, make_release(served_model, block_size=32), port=8100),
                               endpoints)
    (mooncake_json,) = config.files.values()
    document = json.loads(mooncake_json)
    assert document["master_server_address"] == "etcd://10.0.0.1:2379;10.0.0.2:2379"
    assert document["metadata_server"] == "etcd://10.0.0.1:2379"
    client = render_store_client(node, endpoints)
    assert client is not None
    assert "--master_server_address=etcd://10.0.0.1:2379;10.0.0.2:2379" in client.argv
    assert endpoints.store_endpoints().master_server_address == "etcd://10.0.0.1:2379;10.0.0.2:2379"


def test_render_config_writes_one_launch_per_master(ha, db, tmp_path):
    from django.core.management import call_command

    call_command("render_config", "--master", "--out", str(tmp_path))
    scripts = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("launch.sh"))
    assert scripts == ["master-0/launch.sh", "master-1/launch.sh"]
    assert "--rpc_address=10.0.0.12" in (tmp_path / "master-1" / "launch.sh").read_text()


def test_master_config_endpoint_renders_the_chosen_ha_master(ha, admin_api, tenant):
    first = admin_api.get("/api/v1/tenants/master-config/").json()
    second = admin_api.get("/api/v1/tenants/master-config/?master=1").json()
    assert (first["master_index"], second["master_index"], second["masters"]) == (0, 1, 2)
    assert "--rpc_address=10.0.0.12" in second["argv"] and "--enable_ha=true" in second["argv"]
    for bad in ("2", "x", "-1", "\u00b2", "99999999999999999999"):
        response = admin_api.get(f"/api/v1/tenants/master-config/?master={bad}")
        assert response.status_code == 400 and "from 0 to 1" in response.json()["master"][0]
