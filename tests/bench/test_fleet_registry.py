"""bench/fleet_registry.py at small size: the counts, about ``scopes_per_node`` cache scopes per node, every registry
rule holding for every object (``full_clean`` and the placement checks of a new instance), and every node's rendered
document valid and carrying exactly the cache scopes the fleet lists for it."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent.contract.messages import parse_document
from bench.fleet_registry import FleetShape, build_fleet
from dashboard.rollout.push import render_contents
from tenants import placement
from tenants.models import InstanceAssignment, Node, Release, RequestGroup, ReservedTenantId, ServedModel, Tenant

SHAPE = {"nodes": 12, "tenants": 3, "models": 6, "releases": 18, "scopes": 90, "scopes_per_node": 20}


@pytest.fixture
def fleet(db):
    return build_fleet(**SHAPE)


def test_counts_and_scopes_per_node(fleet):
    assert (Tenant.objects.count(), ServedModel.objects.count(), Release.objects.count()) == (3, 6, 18)
    assert RequestGroup.objects.count() == 3 * 5  # 90 scopes / 18 releases = 5 groups per tenant
    assert Node.objects.count() == len(fleet.node_names) == 12
    assert ReservedTenantId.objects.count() == 3
    assert len(fleet.scopes) == len(set(fleet.scopes)) == 90
    assert InstanceAssignment.objects.count() == fleet.instances == 18 * 3  # 12 * 20 / 5 / 18 = 2.7 -> 3 replicas
    per_node = [len(scopes) for scopes in fleet.scopes_by_node.values()]
    assert sum(per_node) == fleet.instances * 5
    assert min(per_node) >= 15 and max(per_node) <= 25  # about 20 each (54 instances over 12 nodes)
    assert {scope for scopes in fleet.scopes_by_node.values() for scope in scopes} == set(fleet.scopes)
    assert len({namespace for _, _, namespace in fleet.releases}) == 18
    assert set(fleet.secrets) == set(fleet.node_names)


def test_every_object_passes_the_registry_rules(fleet):
    for model in (Tenant, ServedModel, Release, RequestGroup, Node):
        for obj in model.objects.all():
            obj.full_clean()
    for assignment in InstanceAssignment.objects.select_related("node", "release__model__tenant"):
        assignment.full_clean()
        assert placement.check_assignment(assignment, moved=True) == {}  # GPUs, caps, model roots
    assert all(r.fingerprint == r.compute_fingerprint() and r.first_served_at for r in Release.objects.all())
    assert len(set(RequestGroup.objects.values_list("cache_salt", flat=True))) == 15


def test_rendered_documents_are_valid_and_carry_the_fleet_scopes(fleet):
    contents = render_contents(Node.objects.all())
    assert sorted(contents) == fleet.node_names
    now = datetime.now(UTC).isoformat()
    for name, content in contents.items():
        document = parse_document({**content, "version": 1, "issued_at": now})
        carried = [(i.tenant_id, i.served_model_name, i.namespace, g.name)
                   for i in document.instances for g in i.request_groups]
        assert carried == fleet.scopes_by_node[name]
        assert len({i.port for i in document.instances}) == len(document.instances)


def test_a_second_seed_varies_hash_seeds_only(db):
    small = {**SHAPE, "nodes": 2, "releases": 6, "scopes": 12, "scopes_per_node": 4}
    build_fleet(**small, seed=3)
    assert sorted(Release.objects.values_list("hash_seed", flat=True)) == sorted(str(18 + r) for r in range(6))


@pytest.mark.parametrize(("change", "field"), [
    ({"models": 2}, "models"), ({"releases": 5}, "releases"), ({"nodes": 0}, "nodes"),
    ({"scopes_per_node": 2000}, "scopes_per_node"),
])
def test_shapes_that_cannot_fit_are_refused(change, field):
    with pytest.raises(ValueError, match=field):
        FleetShape.plan(**{**SHAPE, **change})


@pytest.mark.parametrize("setting", ["KVPOOL_MAX_INSTANCES_PER_NODE", "KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE",
                                     "KVPOOL_MAX_INSTANCES_PER_TENANT"])
def test_shapes_over_a_placement_cap_are_refused(setting, settings):
    FleetShape.plan(**SHAPE)
    setattr(settings, setting, 1)
    with pytest.raises(ValueError, match=setting):
        FleetShape.plan(**SHAPE)
