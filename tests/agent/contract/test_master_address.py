"""The master address grammar (agent.contract.master_address): one master or the HA etcd form Mooncake 0.3.13.post1
clients take."""
from __future__ import annotations

import pytest

from agent.contract.master_address import (
    MAX_ENDPOINTS,
    MasterAddress,
    ha_master_address,
    parse_etcd_endpoints,
    parse_master_address,
)
from agent.contract.messages import StoreEndpoints


@pytest.mark.parametrize(("text", "parsed"), [
    ("127.0.0.1:50051", MasterAddress(False, (("127.0.0.1", 50051),))),
    ("[::1]:50051", MasterAddress(False, (("::1", 50051),))),
    ("master.example:1", MasterAddress(False, (("master.example", 1),))),
    ("etcd://10.0.0.1:2379", MasterAddress(True, (("10.0.0.1", 2379),))),
    ("etcd://10.0.0.1:2379;10.0.0.2:2379;[fd00::3]:2379",
     MasterAddress(True, (("10.0.0.1", 2379), ("10.0.0.2", 2379), ("fd00::3", 2379)))),
    ("ETCD://e:2379", MasterAddress(True, (("e", 2379),))),
])
def test_both_forms_parse_and_print_back(text, parsed):
    assert parse_master_address(text) == parsed
    assert parse_master_address(str(parsed)) == parsed
    assert str(parsed) == (text if not text.startswith("ETCD") else "etcd://e:2379")


@pytest.mark.parametrize("bad", ["", "nohost", "host:", ":50051", "host:0", "host:65536", "host:port",
                                 "http://host:50051", "host:50051/x", " host:1", "etcd://", "etcd://e",
                                 "etcd://e:2379;e:2379", "redis://r:6379", "user@host:1"])
def test_malformed_addresses_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="master_server_address"):
        parse_master_address(bad)


def test_etcd_endpoints_take_semicolons_commas_and_etcd_urls():
    assert parse_etcd_endpoints("a:1; b:2,http://c:3/") == ("a:1", "b:2", "c:3")
    assert ha_master_address(["a:1", "b:2"]) == "etcd://a:1;b:2"
    with pytest.raises(ValueError, match="KVPOOL_X: at most"):
        parse_etcd_endpoints(";".join(f"h{i}:1" for i in range(MAX_ENDPOINTS + 1)), "KVPOOL_X")
    with pytest.raises(ValueError, match="at least one"):
        parse_etcd_endpoints(" ; ")


def test_the_agent_accepts_an_ha_address_and_checks_etcd_is_reachable():
    """The agent's Store client opens with an ``etcd://`` master (before: 'expected host:port')."""
    from agent.datapath.errors import StoreUnavailable
    from agent.datapath.store import check_endpoints, check_master_reachable
    from agent.sim.master import free_ports

    endpoints = StoreEndpoints(master_server_address="etcd://127.0.0.1:2379;127.0.0.2:2379",
                               metadata_server="etcd://127.0.0.1:2379", global_segment_size=16 << 20,
                               local_buffer_size=1 << 20)
    check_endpoints(endpoints)
    with pytest.raises(ValueError, match="master_server_address"):
        check_endpoints(endpoints.model_copy(update={"master_server_address": "etcd://nohost"}))
    port = free_ports(1)[0]
    with pytest.raises(StoreUnavailable, match="no etcd endpoint of the HA masters"):
        check_master_reachable(f"etcd://127.0.0.1:{port}", timeout=1)
