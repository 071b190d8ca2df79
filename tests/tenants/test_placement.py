"""Placement between the tenants of a node (``tenants.placement``): GPUs, instance caps, model roots, and values
that would read as engine options; migration 0012's seeded roots."""
from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps

from tenants import placement
from tenants.models import InstanceAssignment, Node, Release, RequestGroup, ServedModel
from tenants.services import validated_save
from tenants.validators import MAX_ADAPTERS
from tests.support.factories import (
    RELEASE_DEFAULTS,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
    refused,
    refused_save,
)

pytestmark = pytest.mark.django_db

TAKEN = "GPU {} is not available on node 'node-a': choose other GPUs."


@pytest.fixture
def two_tenants():
    """A release of tenant A and one of tenant B."""
    a = make_release(make_model(make_tenant("tenant-a"), "model-a", "org/model-a"), "ns-a")
    b = make_release(make_model(make_tenant("tenant-b"), "model-b", "org/model-b"), "ns-b")
    return a, b


# --- GPUs -------------------------------------------------------------------------------------------------------


def test_a_gpu_another_tenant_holds_is_not_available(node, two_tenants):
    a, b = two_tenants
    make_assignment(node, a, port=8000, gpu_ids="0,1")
    errors = refused(InstanceAssignment(node=node, release=b, port=8001, gpu_ids="2,1"))
    assert errors == {"gpu_ids": [TAKEN.format(1)]}
    errors = refused(InstanceAssignment(node=node, release=b, port=8001, gpu_ids="1,0"))
    assert errors == {"gpu_ids": ["GPU 0, 1 are not available on node 'node-a': choose other GPUs."]}
    make_assignment(node, b, port=8001, gpu_ids="2,3")
    make_assignment(make_node("node-b"), b, port=8001, gpu_ids="0,1")  # another node has GPUs of its own


def test_a_blank_gpu_list_holds_every_gpu_of_a_cuda_node(node, two_tenants):
    a, b = two_tenants
    make_assignment(node, a, port=8000, gpu_ids="3")
    assert refused(InstanceAssignment(node=node, release=b, port=8001))["gpu_ids"] == [
        "gpu_ids is blank, which gives the instance every GPU of node 'node-a', and some of them are not available: "
        "list the GPUs the instance may use."]
    other = make_node("node-b")
    make_assignment(other, a, port=8000)
    assert refused(InstanceAssignment(node=other, release=b, port=8001, gpu_ids="7"))["gpu_ids"] == [
        "GPU 7 is not available on node 'node-b': choose other GPUs."]


def test_cpu_nodes_hold_no_gpus(two_tenants):
    a, b = two_tenants
    node = make_node("cpu-a", device="cpu")
    make_assignment(node, a, port=8000)
    make_assignment(node, b, port=8001)


def test_one_models_releases_may_share_gpus_and_other_models_may_not(node, release):
    """The copies of a rolling upgrade take the old instances' layout; another model of the same tenant is
    another engine on the GPU."""
    make_assignment(node, release, port=8000, gpu_ids="0")
    upgrade = make_release(release.model, "production-2026-08")
    make_assignment(node, upgrade, port=8100, gpu_ids="0")
    other = make_release(make_model(release.model.tenant, "other", "org/other"), "other-ns")
    assert refused(InstanceAssignment(node=node, release=other, port=8200, gpu_ids="0"))["gpu_ids"] == [TAKEN.format(0)]


def test_changing_gpu_ids_is_checked_too(node, two_tenants):
    a, b = two_tenants
    make_assignment(node, a, port=8000, gpu_ids="0")
    mine = make_assignment(node, b, port=8001, gpu_ids="1")
    mine.gpu_ids = "1,0"
    assert refused_save(mine) == {"gpu_ids": [TAKEN.format(0)]}


# --- caps -------------------------------------------------------------------------------------------------------


def test_a_full_node_is_not_available(settings, two_tenants):
    settings.KVPOOL_MAX_INSTANCES_PER_NODE = 2
    a, b = two_tenants
    node = make_node("cpu-a", device="cpu")
    make_assignment(node, a, port=8000)
    make_assignment(node, a, port=8001)
    assert refused(InstanceAssignment(node=node, release=b, port=8002))["node"] == [
        "Node 'cpu-a' is not available: it runs the most instances a node may (KVPOOL_MAX_INSTANCES_PER_NODE = 2). "
        "Choose another node."]


def test_one_tenant_cannot_fill_a_shared_node(settings, two_tenants):
    settings.KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE = 2
    a, b = two_tenants
    node = make_node("cpu-a", device="cpu")
    make_assignment(node, a, port=8000)
    make_assignment(node, a, port=8001)
    assert refused(InstanceAssignment(node=node, release=a, port=8002))["node"] == [
        "Tenant 'tenant-a' already runs 2 instances on node 'cpu-a', the most one tenant may run on a node "
        "(KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE). Choose another node."]
    make_assignment(node, b, port=8002)
    make_assignment(make_node("cpu-b", device="cpu"), a, port=8002)


def test_one_tenant_has_a_total_cap(settings, release):
    settings.KVPOOL_MAX_INSTANCES_PER_TENANT = 2
    make_assignment(make_node("cpu-a", device="cpu"), release, port=8000)
    make_assignment(make_node("cpu-b", device="cpu"), release, port=8000)
    assert refused(InstanceAssignment(node=make_node("cpu-c", device="cpu"), release=release, port=8000))["node"] == [
        "Tenant 'acme' already runs 2 instances, the most one tenant may run (KVPOOL_MAX_INSTANCES_PER_TENANT). "
        "Remove one first."]


def test_instances_saved_before_a_cap_was_lowered_stay_editable(settings, release):
    node = make_node("cpu-a", device="cpu")
    first = make_assignment(node, release, port=8000)
    make_assignment(node, release, port=8001)
    settings.KVPOOL_MAX_INSTANCES_PER_NODE = 1
    first.port = 8005
    validated_save(first)


def test_a_tenant_has_a_request_group_cap(settings, tenant):
    """Every instance of the tenant carries all its groups in its node's document."""
    settings.KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT = 2
    make_group(tenant, "g1")
    make_group(tenant, "g2")
    assert refused(RequestGroup(tenant=tenant, name="g3"))["tenant"] == [
        "Tenant 'acme' already has 2 request groups, the most one tenant may have "
        "(KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT). Delete one first."]
    make_group(make_tenant("other"), "g3")


def test_a_release_loads_a_bounded_number_of_adapters(served_model):
    adapters = [{"name": f"a{i}", "path": f"org/a{i}"} for i in range(MAX_ADAPTERS + 1)]
    release = Release(model=served_model, namespace="ns", adapters=adapters, **RELEASE_DEFAULTS)
    assert refused(release)["adapters"] == [f"A release loads at most {MAX_ADAPTERS} LoRA adapters (it lists 65)."]
    release.adapters = adapters[:-1]
    release.full_clean()


# --- model roots ------------------------------------------------------------------------------------------------


def _model(tenant, path: str, name: str = "m") -> Release:
    return make_release(make_model(tenant, name, path), f"{name}-ns")


OUTSIDE = ("{what} '{path}' is not under a model root of node '{node}' (its model_roots: {roots}). Use a path under "
           "one of them or a hub id, or ask a platform admin to add the root.")


def test_an_absolute_model_path_must_lie_under_a_root_of_the_node(tenant):
    node = make_node("gpu-x", model_roots=["/models"])
    make_assignment(node, _model(tenant, "/models/Qwen3-8B", "inside"), port=8000, gpu_ids="0")
    make_assignment(node, _model(tenant, "/models", "root-itself"), port=8001, gpu_ids="1")
    for path in ("/etc/Qwen3-8B", "/models-evil/Qwen3-8B", "/model"):
        release = _model(tenant, path, f"out{len(path)}")
        assert refused(InstanceAssignment(node=node, release=release, port=8002, gpu_ids="2"))["node"] == [
            OUTSIDE.format(what="model_path", path=path, node="gpu-x", roots="'/models'")]
    make_assignment(node, _model(tenant, "Qwen/Qwen3-8B", "hub"), port=8003, gpu_ids="3")  # hub ids need no root


def test_a_node_without_roots_loads_hub_ids_only(tenant):
    node = make_node("gpu-y", model_roots=[])
    release = _model(tenant, "/models/Qwen3-8B")
    assert refused(InstanceAssignment(node=node, release=release, port=8000))["node"] == [
        OUTSIDE.format(what="model_path", path="/models/Qwen3-8B", node="gpu-y", roots="none: it loads hub ids only")]


def test_adapter_paths_must_lie_under_a_root_too(tenant):
    node = make_node("gpu-x", model_roots=["/models"])
    release = make_release(make_model(tenant), adapters=[{"name": "sql", "path": "/adapters/sql-v1"},
                                                         {"name": "hub", "path": "org/hub-lora"}])
    assert refused(InstanceAssignment(node=node, release=release, port=8000))["node"] == [
        OUTSIDE.format(what="adapter 'sql' path", path="/adapters/sql-v1", node="gpu-x", roots="'/models'")]


def test_changing_a_placed_models_path_or_adapters_is_checked_on_its_nodes(tenant):
    node = make_node("gpu-x", model_roots=["/models"])
    release = _model(tenant, "/models/Qwen3-8B")
    make_assignment(node, release, port=8000)
    model = ServedModel.objects.get(pk=release.model_id)
    model.model_path = "/home/someone/Qwen3-8B"
    assert refused_save(model) == {"model_path": [
        OUTSIDE.format(what="model_path", path="/home/someone/Qwen3-8B", node="gpu-x", roots="'/models'")]}
    release.adapters = [{"name": "sql", "path": "/root/sql"}]
    assert refused_save(release) == {"adapters": [
        OUTSIDE.format(what="adapter 'sql' path", path="/root/sql", node="gpu-x", roots="'/models'")]}
    release.adapters = [{"name": "sql", "path": "/models/sql"}]
    validated_save(release)


def test_a_node_cannot_drop_a_root_its_instances_load_from(tenant):
    node = make_node("gpu-x", model_roots=["/models", "/data"])
    make_assignment(node, _model(tenant, "/models/Qwen3-8B"), port=8000)
    node.model_roots = ["/data"]
    message = refused_save(node)["model_roots"][0]
    assert message.startswith("Instance 'm-ns both on gpu-x:8000' on this node: model_path '/models/Qwen3-8B'")
    node.model_roots = ["/models"]
    validated_save(node)


@pytest.mark.parametrize(("roots", "message"), [
    ("/models", "model_roots must be a list of absolute directories, e.g. [\"/models\"]."),
    (["models"], "each model root must be an absolute directory such as '/models'."),
    (["/"], "each model root '/' must name a directory below '/'."),
    (["/models/"], "each model root '/models/' must be written in normal form, '/models' (no '.', '..', '//' or "
                   "trailing '/')."),
    (["/models/../etc"], "each model root '/models/../etc' must be written in normal form, '/etc' (no '.', '..', "
                         "'//' or trailing '/')."),
    (["//models"], "each model root '//models' must name a directory below '/'."),
    (["/models", "/models"], "model_roots lists a directory twice."),
    ([7], "each model root must be an absolute directory such as '/models'."),
    ([f"/m{i}" for i in range(33)], "model_roots holds at most 32 directories."),
])
def test_model_roots_refused(roots, message):
    assert refused(Node(name="n", hostname="h", model_roots=roots))["model_roots"] == [message]


# --- values that would read as engine options -------------------------------------------------------------------

OPTION = "{} must not start with '-': the engines get it as a command-line argument, where it would read as an option."


def test_argv_values_starting_with_a_dash_are_refused(tenant, served_model):
    assert refused(ServedModel(tenant=tenant, served_model_name="--trust-remote-code", model_path="org/m"))[
        "served_model_name"] == [OPTION.format("served_model_name")]
    assert refused(ServedModel(tenant=tenant, served_model_name="m", model_path="--trust-remote-code"))[
        "model_path"] == [OPTION.format("model_path")]
    release = Release(model=served_model, namespace="ns", weights_revision="--trust-remote-code", **RELEASE_DEFAULTS)
    assert refused(release)["weights_revision"] == [OPTION.format("weights_revision")]
    release = Release(model=served_model, namespace="ns", adapters=[{"name": "-x", "path": "org/x"}],
                      **RELEASE_DEFAULTS)
    assert refused(release)["adapters"] == [OPTION.format("adapter name '-x'")]


# --- migration 0012 ---------------------------------------------------------------------------------------------

MIGRATION = importlib.import_module("tenants.migrations.0012_model_roots_and_argv_values")


def test_migration_keeps_every_placed_path_loadable(tenant):
    node = make_node("gpu-x", model_roots=["/Top", "/models", "/srv"])
    idle = make_node("gpu-idle")
    make_assignment(node, _model(tenant, "/models/Qwen3-8B", "a"), port=8000, gpu_ids="0")
    make_assignment(node, _model(tenant, "/models/sub/Llama", "b"), port=8001, gpu_ids="1")
    make_assignment(node, _model(tenant, "/Top", "c"), port=8002, gpu_ids="2")
    with_adapter = make_release(make_model(tenant, "d", "org/d"), "d-ns",
                                adapters=[{"name": "sql", "path": "/srv/adapters/sql"}])
    make_assignment(node, with_adapter, port=8003, gpu_ids="3")
    Node.objects.update(model_roots=[])  # as before the migration
    MIGRATION.seed_roots(django_apps, None)
    assert Node.objects.get(pk=node.pk).model_roots == ["/Top", "/models", "/srv/adapters"]
    assert Node.objects.get(pk=idle.pk).model_roots == []
    node.refresh_from_db()
    for assignment in InstanceAssignment.objects.select_related("release__model"):
        assert placement.path_refusal(node, assignment.release.model, assignment.release) is None
