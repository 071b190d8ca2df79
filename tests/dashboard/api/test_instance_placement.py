"""REST API: an operator of tenant A places instances on a node tenant B shares without taking B's GPUs, without
filling the node, without loading files from outside the node's model roots, and without values that would read
as engine options; refusals are 400s naming the field and nothing of B. Two tenants racing for one GPU get it once
(PostgreSQL: the node row is locked for the check)."""
from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections

from tenants import placement
from tenants.models import InstanceAssignment
from tenants.services import validated_save
from tests.support.factories import (
    RELEASE_DEFAULTS,
    grant_role,
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.registry import token_client

V1 = "/api/v1"
MARK = "bravo-secret"


@pytest.fixture
def shared(db, django_user_model):
    """A shared node (roots /models), tenant B's instance holding GPUs 0,1 on it, and A's operator."""
    node = make_node("node-shared", "10.0.0.5", model_roots=["/models"])
    b = make_release(make_model(make_tenant(f"{MARK}-t"), f"{MARK}-model", f"org/{MARK}-weights"), f"{MARK}-ns")
    make_assignment(node, b, port=8001, gpu_ids="0,1")
    a_tenant = make_tenant("alpha-t")
    a = make_release(make_model(a_tenant, "alpha-model", "/models/alpha"), "alpha-ns")
    alice = token_client(grant_role(django_user_model.objects.create_user("alice"), a_tenant, "operator"))
    return node, a, alice


def _refusal(response, field: str) -> str:
    assert response.status_code == 400, response.content
    assert MARK not in response.content.decode()
    assert list(response.json()) == [field], response.json()
    return response.json()[field][0]


def test_another_tenants_gpu_is_not_available(shared):
    node, a, alice = shared
    body = {"node": node.pk, "release": a.pk, "port": 8100}
    message = _refusal(alice.post(f"{V1}/assignments/", {**body, "gpu_ids": "1"}, format="json"), "gpu_ids")
    assert message == "GPU 1 is not available on node 'node-shared': choose other GPUs."
    _refusal(alice.post(f"{V1}/assignments/", body, format="json"), "gpu_ids")  # blank: every GPU
    assert alice.post(f"{V1}/assignments/", {**body, "gpu_ids": "2"}, format="json").status_code == 201
    assert InstanceAssignment.objects.count() == 2


def test_a_full_node_is_refused(shared, settings):
    node, a, alice = shared
    settings.KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE = 1
    body = {"node": node.pk, "release": a.pk, "port": 8100, "gpu_ids": "2"}
    assert alice.post(f"{V1}/assignments/", body, format="json").status_code == 201
    message = _refusal(alice.post(f"{V1}/assignments/", {**body, "port": 8101, "gpu_ids": "3"}, format="json"), "node")
    assert "KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE" in message
    settings.KVPOOL_MAX_INSTANCES_PER_NODE = 2
    settings.KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE = 16
    message = _refusal(alice.post(f"{V1}/assignments/", {**body, "port": 8101, "gpu_ids": "3"}, format="json"), "node")
    assert message.startswith("Node 'node-shared' is not available")


def test_files_from_outside_the_nodes_roots_are_refused(shared):
    node, a, alice = shared
    model = alice.post(f"{V1}/models/", {"tenant": a.model.tenant_id, "served_model_name": "etc",
                                         "model_path": "/etc/ssl"}, format="json").json()
    release = alice.post(f"{V1}/releases/", {"model": model["id"], "namespace": "etc-ns", **RELEASE_DEFAULTS},
                         format="json").json()
    message = _refusal(alice.post(f"{V1}/assignments/", {"node": node.pk, "release": release["id"], "port": 8100,
                                                         "gpu_ids": "2"}, format="json"), "node")
    assert message.startswith("model_path '/etc/ssl' is not under a model root of node 'node-shared'")
    # placed under a root, then pointed elsewhere
    assert alice.post(f"{V1}/assignments/", {"node": node.pk, "release": a.pk, "port": 8100, "gpu_ids": "2"},
                      format="json").status_code == 201
    response = alice.patch(f"{V1}/releases/{a.pk}/", {"adapters": [{"name": "x", "path": "/root/x"}]}, format="json")
    assert "is not under a model root" in _refusal(response, "adapters")
    response = alice.patch(f"{V1}/models/{a.model_id}/", {"model_path": "/models/../etc/alpha"}, format="json")
    assert "normal form" in _refusal(response, "model_path")
    # only platform admins set a node's roots
    assert alice.patch(f"{V1}/nodes/{node.pk}/", {"model_roots": ["/etc"]}, format="json").status_code == 403


def test_platform_admins_set_a_nodes_roots(shared, admin_api):
    node, a, _alice = shared
    make_assignment(node, a, port=8100, gpu_ids="2")
    response = admin_api.patch(f"{V1}/nodes/{node.pk}/", {"model_roots": ["/models", "/data/adapters"]},
                               format="json")
    assert response.status_code == 200 and response.json()["model_roots"] == ["/models", "/data/adapters"]
    response = admin_api.patch(f"{V1}/nodes/{node.pk}/", {"model_roots": ["/data/"]}, format="json")
    assert response.status_code == 400 and "normal form" in response.json()["model_roots"][0]
    response = admin_api.patch(f"{V1}/nodes/{node.pk}/", {"model_roots": ["/data"]}, format="json")
    assert response.status_code == 400  # a platform admin is told which instance loads from the root
    assert response.json()["model_roots"][0].startswith("Instance 'alpha-ns both on node-shared:8100' on this node")
    assert admin_api.post(f"{V1}/nodes/", {"name": "fresh", "hostname": "h"}, format="json").json()["model_roots"] == []


def test_values_that_would_read_as_engine_options_are_refused(shared):
    _node, a, alice = shared
    response = alice.post(f"{V1}/models/", {"tenant": a.model.tenant_id, "served_model_name": "--trust-remote-code",
                                            "model_path": "org/x"}, format="json")
    assert "must not start with '-'" in _refusal(response, "served_model_name")
    response = alice.patch(f"{V1}/releases/{a.pk}/", {"weights_revision": "--trust-remote-code"}, format="json")
    assert "must not start with '-'" in _refusal(response, "weights_revision")


@pytest.mark.django_db(transaction=True)
def test_two_tenants_racing_for_one_gpu_get_it_once(monkeypatch):
    """Each writer checks, then waits (up to 3 s) for the other to have checked too: without the node lock both
    pass the check and both save; with it the second writer checks after the first committed."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (DATABASE_URL=postgres://...); SQLite serialises writers anyway")
    node = make_node("node-race", model_roots=[])
    releases = [make_release(make_model(make_tenant(f"t{i}"), f"m{i}", f"org/m{i}"), f"ns{i}") for i in range(2)]
    checked = threading.Barrier(2, timeout=3)
    original = placement.device_refusal

    def device_refusal_then_wait(assignment):
        refusal = original(assignment)
        try:
            checked.wait()
        except threading.BrokenBarrierError:
            pass  # the other writer is blocked on the lock
        return refusal

    monkeypatch.setattr(placement, "device_refusal", device_refusal_then_wait)
    outcomes: list[str] = []

    def assign(release, port):
        try:
            validated_save(InstanceAssignment(node=node, release=release, port=port, gpu_ids="0"))
            outcomes.append("saved")
        except ValidationError as error:
            outcomes.append(error.message_dict["gpu_ids"][0])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=assign, args=(release, 8000 + i)) for i, release in enumerate(releases)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["GPU 0 is not available on node 'node-race': choose other GPUs.", "saved"]
    assert InstanceAssignment.objects.filter(node=node).count() == 1
