"""A fleet-shaped registry with small numbers, for the tests of the pages and lists at size (issue 17).

Tenants, served models and releases go through the factories (``validated_save``: fingerprints, audit); the many
rows — request groups, nodes, instance assignments, node states, occupancy samples — are bulk-inserted, as a
migration or an import would, so a test of a few hundred rows stays quick and fires no config push per row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from dashboard.models import NodeState, OccupancySample
from tenants.models import InstanceAssignment, Node, Release, RequestGroup, Tenant
from tests.support.factories import TEST_MODEL_ROOTS, make_model, make_release, make_tenant


@dataclass
class Fleet:
    """What ``build_fleet`` made, by kind."""

    tenants: list[Tenant] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    groups: list[RequestGroup] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)


def build_fleet(*, tenants: int = 2, models_per_tenant: int = 1, releases_per_model: int = 2,
                groups_per_tenant: int = 3, nodes: int = 4, instances_per_node: int = 2,
                samples: bool = True, silent_nodes: int = 0, tag: str = "") -> Fleet:
    """Tenants ``t00`` ... with served models ``m0`` ..., releases ``t00-m0-r00`` ... (serving), request groups
    ``t00-g000`` ..., nodes ``node-000`` ... each running ``instances_per_node`` instances (releases taken in
    turn, ports 8000 up), a heartbeat now from every node but the last ``silent_nodes`` (an hour ago), and with
    ``samples`` one occupancy sample per instance a minute ago (1 MiB, request group the tenant's first). ``tag``
    prefixes every name, so that a second fleet can be added to the first."""
    fleet = Fleet()
    for t in range(tenants):
        tenant = make_tenant(f"{tag}t{t:02d}", quota="100GB")
        fleet.tenants.append(tenant)
        for m in range(models_per_tenant):
            model = make_model(tenant, f"m{m}", model_path=f"/models/m{m}")
            for r in range(releases_per_model):
                fleet.releases.append(make_release(model, f"{tag}t{t:02d}-m{m}-r{r:02d}", state="serving"))
        fleet.groups += RequestGroup.objects.bulk_create(
            RequestGroup(tenant=tenant, name=f"{tag}t{t:02d}-g{g:03d}") for g in range(groups_per_tenant))
    fleet.nodes = Node.objects.bulk_create(
        Node(name=f"{tag}node-{n:03d}", hostname=f"10.{len(tag)}.{n // 250}.{n % 250 + 1}",
             model_roots=list(TEST_MODEL_ROOTS))
        for n in range(nodes))
    assignments = [InstanceAssignment(node=node, release=fleet.releases[(n * instances_per_node + i)
                                                                     % len(fleet.releases)], port=8000 + i)
                   for n, node in enumerate(fleet.nodes) for i in range(instances_per_node)] if fleet.releases else []
    InstanceAssignment.objects.bulk_create(assignments)
    now = timezone.now()
    NodeState.objects.bulk_create(
        NodeState(node_name=node.name, heartbeat_at=now - timedelta(hours=1) if n >= nodes - silent_nodes else now)
        for n, node in enumerate(fleet.nodes))
    if samples:
        groups = {group.tenant_id: group.name for group in reversed(fleet.groups)}
        OccupancySample.objects.bulk_create(
            OccupancySample(level=OccupancySample.Level.RAW, ts=now - timedelta(minutes=1), node_name=a.node.name,
                            tenant_id=a.release.model.tenant.tenant_id,
                            served_model_name=a.release.model.served_model_name, namespace=a.release.namespace,
                            request_group=groups.get(a.release.model.tenant_id, ""), bytes=1 << 20,
                            max_bytes=1 << 20)
            for a in assignments)
    return fleet
