"""Overview page: Store capacity and use, per-tenant quota gauges, nodes with drift flags, latest warnings. At fleet
size (1,000 nodes, 50 tenants) it shows counts over all of them and the ``OVERVIEW_ROWS`` needing attention most,
linking the full, paginated lists of the registry page.

A user who is not a platform admin sees the tenants they are a member of (``tenants.access``), every node's drift
flags without its error texts, and no checklist or refused agent messages (platform admins' matters)."""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboard.checklist import CHECKS_CACHE_SECONDS, recent_checks
from dashboard.master.room import current_pool_room
from dashboard.models import MasterQuotaSync, NodeState
from dashboard.rollout.push import drift
from dashboard.rollout.upgrade import tenant_quota
from dashboard.telemetry.agent_auth import NODE_TROUBLE, ROW_REASONS, recent_node_refusals
from dashboard.telemetry.queries import (
    latest_master_quotas,
    tenant_bytes_now,
)
from tenants import budgets
from tenants.access import is_platform_admin, scope, visible_tenants
from tenants.models import Node, Tenant

log = logging.getLogger("kvpool.dashboard.views")

#: Seconds a read of the master's /metrics is reused between page loads.
STORE_METRICS_CACHE_SECONDS = 10


@dataclass(frozen=True)
class StoreCapacity:
    """The master's view of the whole Store (Prometheus ``master_*`` gauges of mooncake_master 0.3.13.post1).

    ``error`` is set (and the numbers are None) when the master's metrics could not be read.
    """

    total_capacity_bytes: int | None = None
    allocated_bytes: int | None = None
    key_count: int | None = None
    error: str = ""

    @property
    def used_ratio(self) -> float | None:
        if not self.total_capacity_bytes or self.allocated_bytes is None:
            return None
        return self.allocated_bytes / self.total_capacity_bytes


def parse_store_metrics(text: str) -> StoreCapacity:
    """Pick ``master_total_capacity_bytes``, ``master_allocated_bytes`` and ``master_key_count`` from a
    Prometheus text exposition (missing families stay None)."""
    values: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("master_total_capacity_bytes", "master_allocated_bytes", "master_key_count"):
                values[sample.name] = int(sample.value)
    return StoreCapacity(values.get("master_total_capacity_bytes"), values.get("master_allocated_bytes"),
                         values.get("master_key_count"))


def store_capacity() -> StoreCapacity:
    """Read the master's ``/metrics`` (``KVPOOL_MASTER_ADMIN_URL``; in HA mode the leader's,
    ``dashboard.master.leader``), cached for ``STORE_METRICS_CACHE_SECONDS``."""
    from dashboard.master.leader import NoLeader, leader_admin_url

    try:
        url = leader_admin_url().rstrip("/") + "/metrics"
    except NoLeader as exc:
        return StoreCapacity(error=str(exc))
    cache_key = f"kvpool:store-capacity:{url}"
    cached = cache.get(cache_key)
    if cached is not None:
        return cached
    try:
        with urllib.request.urlopen(url, timeout=settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS) as response:
            capacity = parse_store_metrics(response.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        capacity = StoreCapacity(error=f"master metrics at {url} unavailable: {reason}")
    cache.set(cache_key, capacity, STORE_METRICS_CACHE_SECONDS)
    return capacity


#: How long a node's refused agent messages stay on the overview after the last one.
REFUSAL_WARNING_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Notice:
    """One line of the warnings list (``at`` None when the time is unknown)."""

    at: datetime | None
    kind: str
    message: str


def collect_warnings(node_rows: list[dict], tenant_rows: list[dict], checks, user=None) -> list[Notice]:
    """Newest first: node drift, agent messages refused for a node-side reason in the last hour, master quota
    flags and sync errors, failing checks. For a ``user`` who is not a platform admin: node drift without the
    error texts (they may name any tenant's instances), the quota matters of their tenants, nothing else."""
    platform = user is None or is_platform_admin(user)
    now = timezone.now()
    warnings: list[Notice] = []
    for row in node_rows:
        state, flags = row["state"], row["drift"]
        name = row["name"]
        if state is None:
            warnings.append(Notice(None, "node", f"node {name}: no agent has contacted the dashboard yet"))
            continue
        if flags["silent"]:
            seen = f"last heartbeat {state.heartbeat_at:%Y-%m-%d %H:%M:%S}" if state.heartbeat_at else "no heartbeat"
            warnings.append(Notice(state.heartbeat_at, "node", f"node {name} is silent ({seen})"))
        if flags["rejected"]:
            error = f" {state.rejection_error}" if platform else ""
            warnings.append(Notice(state.rejected_at, "node", f"node {name} rejected config version "
                                     f"{state.rejected_version}: {state.rejection_reason}{error}"))
        elif flags["behind"]:
            warnings.append(Notice(state.pushed_at, "node", f"node {name} acked version {state.acked_version}, "
                                     f"desired {state.desired_version}"))
        if flags["digest_mismatch"]:
            warnings.append(Notice(state.applied_seen_at, "node",
                                     f"node {name} runs a document whose digest differs from the dashboard's"))
        if state.push_error and platform:
            warnings.append(Notice(state.pushed_at, "node", f"node {name}: push failed: {state.push_error}"))
    for row in tenant_rows:
        quota = row["quota"]
        if quota.over_quota:
            warnings.append(Notice(quota.sampled_at, "tenant", f"tenant {quota.tenant_id} is over its quota"))
        if quota.admission_closed:
            warnings.append(Notice(quota.sampled_at, "tenant",
                                     f"tenant {quota.tenant_id}: the master closed admission (writes refused)"))
        if row.get("room_advice"):  # names only the tenant's own budgets
            warnings.append(Notice(now, "budget", row["room_advice"]))
    syncs = MasterQuotaSync.objects.exclude(last_error="")
    for sync in (syncs if platform else scope(syncs, user)):
        warnings.append(Notice(sync.last_error_at, "master", f"quota sync of tenant {sync.tenant_id}: "
                                 f"{sync.last_error}"))
    if platform:
        for row in recent_node_refusals(now - REFUSAL_WARNING_WINDOW):
            what = "report row(s)" if row.reason in ROW_REASONS else "agent message(s)"
            warnings.append(Notice(row.last_at, "node", f"node {row.node}: {row.count} {what} refused "
                                     f"as {row.reason} — {NODE_TROUBLE[row.reason]}"))
    for check in checks:
        if not check.passed:
            warnings.append(Notice(now, "check", f"check failed: {check.title} — {check.summary}"))
    return sorted(warnings, key=lambda w: (w.at is not None, w.at or now), reverse=True)


def node_rows() -> list[dict]:
    """Registry nodes and nodes known only from telemetry, each with its state and drift flags (``node``: the
    registry's ``Node`` with its name and pk only, for the link)."""
    states = {state.node_name: state for state in NodeState.objects.all()}
    nodes = {node.name: node for node in Node.objects.only("name")}
    rows = []
    for name in sorted(set(nodes) | set(states)):
        state = states.get(name)
        rows.append({"name": name, "node": nodes.get(name), "registered": name in nodes, "state": state,
                     "drift": drift(state) if state is not None else None})
    return rows


def tenant_rows(user=None, pool=None) -> list[dict]:
    """Per tenant ``user`` may see (every tenant without a user): registry quota, master read-back, agent-reported
    occupancy, budgets, and its room under the master's eviction points (``room``: ``tenants.room.TenantRoom``)."""
    samples = latest_master_quotas()
    occupancy = tenant_bytes_now()
    pool = pool if pool is not None else current_pool_room()
    rows = []
    tenants = visible_tenants(user) if user is not None else Tenant.objects.all()
    budgeted = budgets.budgeted_bytes_by_tenant(tenants)
    for tenant in tenants:
        quota = tenant_quota(tenant, samples)
        room = pool.tenants.get(tenant.tenant_id)
        charged = quota.charged_bytes
        limit = quota.limit_bytes
        rows.append({
            "tenant": tenant, "quota": quota, "occupancy_bytes": occupancy.get(tenant.tenant_id, 0),
            "budgeted_bytes": budgeted.get(tenant.pk, 0), "room": room,
            "room_advice": (room.advice("quota") or room.advice("watermark")) if room else "",
            "charged_percent": round(100 * charged / limit) if charged is not None and limit else None,
            "occupancy_percent": round(100 * occupancy.get(tenant.tenant_id, 0) / limit) if limit else None,
        })
    return rows


#: Rows of each list on the overview (nodes, tenants): those needing attention first; the full lists are paginated
#: on the registry page.
OVERVIEW_ROWS = 20
#: Drift flags counted in the overview's node summary, in the order shown.
NODE_FLAGS = ("silent", "rejected", "behind", "digest_mismatch")


def node_attention(row: dict) -> tuple:
    """Sort key of a ``node_rows`` row: nodes in trouble (silent, rejected, behind, digest mismatch, no agent yet,
    not registered) first, the worst first, then by name."""
    flags = row["drift"]
    if flags is None:
        return (4 if row["registered"] else 0, row["name"])
    worst = next((rank for rank, name in enumerate(NODE_FLAGS) if flags[name]), None)
    return (worst if worst is not None else 5, row["name"])


def node_summary(rows: list[dict]) -> dict[str, int]:
    """Counts over every node row: ``total``, ``in_sync``, one per ``NODE_FLAGS`` flag, ``no_agent``,
    ``unregistered``."""
    counts = {"total": len(rows), "in_sync": 0, "no_agent": 0, "unregistered": 0, **dict.fromkeys(NODE_FLAGS, 0)}
    for row in rows:
        flags = row["drift"]
        counts["unregistered"] += not row["registered"]
        if flags is None:
            counts["no_agent"] += 1
            continue
        counts["in_sync"] += bool(flags["in_sync"])
        for name in NODE_FLAGS:
            counts[name] += bool(flags[name])
    return counts


def tenant_attention(row: dict) -> tuple:
    """Sort key of a ``tenant_rows`` row: flagged tenants first, then the fullest (charged, else reported, share of
    the quota), then by name."""
    quota = row["quota"]
    flagged = quota.over_quota or quota.admission_closed or quota.charged_above_effective or bool(row["room_advice"])
    fullness = row["charged_percent"] if row["charged_percent"] is not None else (row["occupancy_percent"] or 0)
    return (not flagged, -fullness, row["tenant"].tenant_id)


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    """The overview at any fleet size: figures aggregated over every tenant and node, the ``OVERVIEW_ROWS`` nodes
    and tenants needing attention most, with links to the full lists, and the newest 50 warnings. The checklist's
    flags come from a run at most ``CHECKS_CACHE_SECONDS`` old (``recent_checks``)."""
    nodes = node_rows()
    pool = current_pool_room()
    tenants = tenant_rows(request.user, pool)
    platform = is_platform_admin(request.user)
    checks = recent_checks() if platform else []
    context = {
        "capacity": store_capacity(), "checks": checks, "checks_max_age": CHECKS_CACHE_SECONDS, "pool": pool,
        "nodes": sorted(nodes, key=node_attention)[:OVERVIEW_ROWS], "node_summary": node_summary(nodes),
        "tenants": sorted(tenants, key=tenant_attention)[:OVERVIEW_ROWS], "tenant_count": len(tenants),
        "reported_bytes": sum(row["occupancy_bytes"] for row in tenants),
        "warnings": collect_warnings(nodes, tenants, checks, request.user)[:50],
    }
    return render(request, "ui/overview.html", context)
