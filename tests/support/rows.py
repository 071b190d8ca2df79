"""Builders of telemetry rows for the page tests (``OccupancySample``, ``NodeState``, ``MasterQuotaSample``)."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from dashboard.models import MasterQuotaSample, NodeState, OccupancySample


def sample(*, ts: datetime | None = None, node: str = "node-a", tenant_id: str = "acme",
           model: str = "qwen3-8b", namespace: str = "production-2026-07", group: str = "",
           level: int = OccupancySample.Level.RAW, size: int = 0, **fields: Any) -> OccupancySample:
    """One occupancy sample (``size`` = bytes; other ``OccupancySample`` fields by name)."""
    return OccupancySample.objects.create(
        level=level, ts=ts or timezone.now(), node_name=node, tenant_id=tenant_id, served_model_name=model,
        namespace=namespace, request_group=group, bytes=size, max_bytes=fields.pop("max_bytes", size), **fields)


def master_sample(tenant_id: str = "acme", *, effective: int, charged: int = 0, requested: int | None = None,
                  ago: float = 5, **flags: bool) -> MasterQuotaSample:
    """A master quota read-back ``ago`` seconds old."""
    return MasterQuotaSample.objects.create(
        ts=timezone.now() - timedelta(seconds=ago), tenant_id=tenant_id,
        requested_quota_bytes=requested if requested is not None else effective, effective_quota_bytes=effective,
        charged_bytes=charged, **flags)


def node_alive(name: str, *, digest: str = "", version: int = 1) -> NodeState:
    """A node whose agent heartbeats now and runs the config with ``digest``."""
    now = timezone.now()
    state, _ = NodeState.objects.get_or_create(node_name=name)
    state.heartbeat_at = now
    state.applied_seen_at = now
    state.applied_version = version
    state.applied_digest = digest
    state.acked_version = version
    state.acked_digest = digest
    state.desired_version = max(state.desired_version, version)
    state.save()
    return state


def apply_config(node) -> NodeState:
    """Render and version ``node``'s config document and mark it applied by its agent (what an ack does)."""
    from dashboard.rollout.push import ensure_version

    ensured = ensure_version(node)
    return node_alive(node.name, digest=ensured.version.digest, version=ensured.version.version)
