"""Node settings the engine launches need (device, KV-events port, store mode and the node's mooncake_client):
model rules, REST API and filters."""
from __future__ import annotations

import pytest

from tenants.models import InstanceAssignment, Node
from tests.support.factories import make_assignment, make_node, refused, refused_save

pytestmark = pytest.mark.django_db

V1 = "/api/v1"


def test_defaults():
    node = make_node()
    assert (node.device, node.kv_events_port, node.store_mode, node.store_segment_bytes, node.store_client_port) == (
        "cuda", 5557, "embedded", None, 50052)
    assert not node.standalone_store and node.reserved_ports() == {5557: "kv_events_port"}


def test_standalone_store_needs_a_segment_of_at_least_16mb():
    errors = refused(Node(name="n", hostname="h", store_mode="standalone-store"))
    assert "needs store_segment_bytes" in errors["store_segment_bytes"][0]
    errors = refused(Node(name="n", hostname="h", store_mode="standalone-store", store_segment_bytes=1 << 20))
    assert "at least 16MB" in errors["store_segment_bytes"][0]
    node = make_node(store_mode="standalone-store", store_segment_bytes=16 << 20)
    assert node.reserved_ports() == {5557: "kv_events_port", 50052: "store_client_port"}
    # embedded nodes ignore the segment size (kept for a later switch)
    make_node("emb", store_segment_bytes=1 << 20)


@pytest.mark.parametrize(("field", "value"), [("kv_events_port", 0), ("kv_events_port", 65536),
                                              ("store_client_port", 0), ("device", "tpu"), ("store_mode", "shared")])
def test_field_bounds(field, value):
    assert field in refused(Node(name="n", hostname="h", **{field: value}))


def test_node_ports_must_not_collide():
    errors = refused(Node(name="n", hostname="h", store_mode="standalone-store", store_segment_bytes=1 << 30,
                          store_client_port=5557))
    assert "differ from kv_events_port" in errors["store_client_port"][0]
    # embedded: the client port is unused, so it may equal anything
    make_node("emb", store_client_port=5557)


def test_instance_ports_and_node_ports_exclude_each_other(release):
    node = make_node(kv_events_port=7000)
    make_assignment(node, release, port=8000)
    errors = refused_save(InstanceAssignment(node=node, release=release, port=7000))
    assert "kv_events_port" in errors["port"][0]
    errors = refused_save(InstanceAssignment(node=node, release=release, port=8001, role="prefill",
                                             bootstrap_port=7000))
    assert "kv_events_port" in errors["bootstrap_port"][0]
    node.kv_events_port = 8000
    assert "Port 8000 is used by instance" in refused(node)["kv_events_port"][0]


def test_cpu_nodes_take_no_gpu_ids(release):
    node = make_node(device="cpu")
    errors = refused_save(InstanceAssignment(node=node, release=release, port=8001, gpu_ids="0"))
    assert "CPU node" in errors["gpu_ids"][0]


def test_api_create_filter_and_refuse(api):
    body = {"name": "cpu-a", "hostname": "127.0.0.1", "device": "cpu", "kv_events_port": 6001,
            "store_mode": "standalone-store", "store_segment_bytes": "256MB", "store_client_port": 50100}
    created = api.post(f"{V1}/nodes/", body, format="json")
    assert created.status_code == 201, created.json()
    data = created.json()
    assert data["store_segment_bytes"] == 256 << 20 and data["device"] == "cpu" and data["kv_events_port"] == 6001
    plain = api.post(f"{V1}/nodes/", {"name": "gpu-a", "hostname": "10.0.0.1"}, format="json").json()
    assert (plain["device"], plain["store_mode"], plain["kv_events_port"]) == ("cuda", "embedded", 5557)
    names = lambda query: [n["name"] for n in api.get(f"{V1}/nodes/?{query}").json()["results"]]  # noqa: E731
    assert names("device=cpu") == ["cpu-a"] and names("store_mode=embedded") == ["gpu-a"]
    assert api.get(f"{V1}/nodes/?device=tpu").status_code == 400
    refused_response = api.post(f"{V1}/nodes/", {"name": "bad", "hostname": "h", "store_mode": "standalone-store"},
                                format="json")
    assert refused_response.status_code == 400 and "store_segment_bytes" in refused_response.json()
