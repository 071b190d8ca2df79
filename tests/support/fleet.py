"""Telemetry on top of a fleet-shaped registry (``bench.fleet_registry.build_fleet``), for the tests of the pages
and lists at size (issue 17) with small numbers: node heartbeats and occupancy samples, bulk-inserted."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from bench.fleet_registry import Fleet
from dashboard.models import NodeState, OccupancySample
from tenants.models import InstanceAssignment

MB = 1 << 20


def fleet_telemetry(fleet: Fleet, *, alive: int | None = None, silent: int = 0, samples: bool = True) -> None:
    """Heartbeats of the fleet's first ``alive`` nodes (all without it) now and of the next ``silent`` ones an
    hour ago (the rest never reported), and with ``samples`` one occupancy sample a minute ago for every instance
    of a heartbeating node (2 MiB, the tenant's request group ``app-000``)."""
    alive = len(fleet.node_names) - silent if alive is None else alive
    now = timezone.now()
    NodeState.objects.bulk_create(
        NodeState(node_name=name, heartbeat_at=now if n < alive else now - timedelta(hours=1))
        for n, name in enumerate(fleet.node_names[:alive + silent]))
    if not samples:
        return
    live = set(fleet.node_names[:alive])
    OccupancySample.objects.bulk_create(
        OccupancySample(level=OccupancySample.Level.RAW, ts=now - timedelta(seconds=60), node_name=a.node.name,
                        tenant_id=a.release.model.tenant.tenant_id, served_model_name=a.release.model.served_model_name,
                        namespace=a.release.namespace, request_group="app-000", bytes=2 * MB, max_bytes=2 * MB)
        for a in InstanceAssignment.objects.select_related("node", "release__model__tenant")
        if a.node.name in live)
