"""Prometheus ``/metrics``: occupancy per tenant and namespace, master quotas, node drift (read from the DB).

A custom collector builds the families at scrape time (nothing is cached between scrapes, so every dashboard
process answers the same). Occupancy sums, over nodes, each node's newest report younger than
``KVPOOL_METRICS_WINDOW_SECONDS``; a node that stopped reporting drops out of the sums.

Families (labels):
  ``kvpool_namespace_occupancy_bytes`` / ``_blocks`` / ``_orphaned_bytes`` / ``_in_flight_requests``
      (tenant_id, served_model_name, namespace, request_group: the fields of ``agent.contract.scope.CacheScope``)
  ``kvpool_namespace_hit_ratio`` — hit_blocks / (hit_blocks + miss_blocks), counters since each agent started
  ``kvpool_namespace_{puts,gets,hit_blocks,miss_blocks,evicted_blocks}_total`` (same labels; counters)
  ``kvpool_tenant_occupancy_bytes`` / ``_blocks`` / ``kvpool_tenant_hit_ratio`` (tenant_id)
  ``kvpool_tenant_quota_bytes`` (tenant_id) — the registry's quota
  ``kvpool_master_tenant_quota_{requested,effective,charged}_bytes``, ``..._admission_closed``,
  ``..._over_quota`` (tenant_id) — newest read-back from the master
  ``kvpool_node_config_{desired,acked}_version``, ``kvpool_node_{behind,silent,digest_mismatch}``,
  ``kvpool_node_heartbeat_age_seconds``, ``kvpool_node_outbox_pending`` (node)
  ``kvpool_agent_messages_rejected_total`` (reason, node) — agent messages refused by ingest and the purge-result
      task: unsigned, unknown_node, bad_signature, wrong_node, replayed, clock_skew, expired, invalid,
      duplicate (``dashboard.telemetry.agent_auth``; counted in the database, so every process answers the same)
"""
from __future__ import annotations

import hmac
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Max
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agent.contract.scope import CacheScope
from dashboard.models import MasterQuotaSample, NodeState, OccupancySample, Report

NS_LABELS = list(CacheScope._fields)


def latest_samples() -> list[OccupancySample]:
    """Each node's newest report (within the window) as raw samples."""
    since = timezone.now() - timedelta(seconds=settings.KVPOOL_METRICS_WINDOW_SECONDS)
    newest = dict(Report.objects.filter(sent_at__gte=since).values("node_name").annotate(ts=Max("sent_at"))
                  .values_list("node_name", "ts"))
    if not newest:
        return []
    rows = OccupancySample.objects.filter(level=OccupancySample.Level.RAW, ts__in=set(newest.values()),
                                          node_name__in=list(newest))
    return [row for row in rows if newest.get(row.node_name) == row.ts]


def _ratio(hits: int, misses: int) -> float:
    return hits / (hits + misses) if hits + misses else 0.0


class KVPoolCollector:
    """Collector reading telemetry rows at scrape time (see the module docstring)."""

    def collect(self):
        yield from self._occupancy()
        yield from self._quotas()
        yield from self._nodes()
        yield self._rejections()

    def _rejections(self) -> CounterMetricFamily:
        from dashboard.telemetry.agent_auth import rejection_series

        family = CounterMetricFamily("kvpool_agent_messages_rejected",
                                     "Agent messages refused (nothing stored), by reason and the registered node "
                                     'they named ("" for none)', labels=["reason", "node"])
        for (reason, node), count in sorted(rejection_series().items()):
            family.add_metric([reason, node], count)
        return family

    def _occupancy(self):
        fields = ("bytes", "blocks", "orphaned_bytes", "in_flight_requests", *OccupancySample.COUNTERS)
        per_ns: dict[tuple, dict[str, int]] = defaultdict(lambda: dict.fromkeys(fields, 0))
        per_tenant: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(fields, 0))
        for row in latest_samples():
            key = CacheScope(row.tenant_id, row.served_model_name, row.namespace, row.request_group)
            for name in fields:
                per_ns[key][name] += getattr(row, name)
                per_tenant[row.tenant_id][name] += getattr(row, name)
        gauges = {
            "bytes": GaugeMetricFamily("kvpool_namespace_occupancy_bytes", "Bytes cached for the namespace",
                                       labels=NS_LABELS),
            "blocks": GaugeMetricFamily("kvpool_namespace_occupancy_blocks", "Blocks cached for the namespace",
                                        labels=NS_LABELS),
            "orphaned_bytes": GaugeMetricFamily("kvpool_namespace_orphaned_bytes",
                                                "Bytes of blocks whose prefix is gone", labels=NS_LABELS),
            "in_flight_requests": GaugeMetricFamily("kvpool_namespace_in_flight_requests",
                                                    "Requests in flight on the namespace", labels=NS_LABELS),
        }
        counters = {name: CounterMetricFamily(f"kvpool_namespace_{name}", f"{name} since each agent started",
                                              labels=NS_LABELS) for name in OccupancySample.COUNTERS}
        hit_ratio = GaugeMetricFamily("kvpool_namespace_hit_ratio", "hit_blocks / (hit_blocks + miss_blocks)",
                                      labels=NS_LABELS)
        for key, values in sorted(per_ns.items()):
            labels = list(key)
            for name, family in gauges.items():
                family.add_metric(labels, values[name])
            for name, family in counters.items():
                family.add_metric(labels, values[name])
            hit_ratio.add_metric(labels, _ratio(values["hit_blocks"], values["miss_blocks"]))
        yield from gauges.values()
        yield from counters.values()
        yield hit_ratio
        t_bytes = GaugeMetricFamily("kvpool_tenant_occupancy_bytes", "Bytes cached for the tenant",
                                    labels=["tenant_id"])
        t_blocks = GaugeMetricFamily("kvpool_tenant_occupancy_blocks", "Blocks cached for the tenant",
                                     labels=["tenant_id"])
        t_ratio = GaugeMetricFamily("kvpool_tenant_hit_ratio", "hit_blocks / (hit_blocks + miss_blocks)",
                                    labels=["tenant_id"])
        for tenant_id, values in sorted(per_tenant.items()):
            t_bytes.add_metric([tenant_id], values["bytes"])
            t_blocks.add_metric([tenant_id], values["blocks"])
            t_ratio.add_metric([tenant_id], _ratio(values["hit_blocks"], values["miss_blocks"]))
        yield from (t_bytes, t_blocks, t_ratio)

    def _quotas(self):
        from tenants.models import Tenant

        quota = GaugeMetricFamily("kvpool_tenant_quota_bytes", "Quota requested in the registry",
                                  labels=["tenant_id"])
        for tenant_id, quota_bytes in Tenant.objects.values_list("tenant_id", "quota_bytes").order_by("tenant_id"):
            quota.add_metric([tenant_id], quota_bytes)
        yield quota
        newest = MasterQuotaSample.objects.values("tenant_id").annotate(ts=Max("ts"))
        pairs = {(row["tenant_id"], row["ts"]) for row in newest}
        rows = [row for row in MasterQuotaSample.objects.filter(ts__in={ts for _, ts in pairs})
                if (row.tenant_id, row.ts) in pairs]
        families = {
            name: GaugeMetricFamily(f"kvpool_master_tenant_quota_{name}", f"Master read-back: {name}",
                                    labels=["tenant_id"])
            for name in ("requested_bytes", "effective_bytes", "charged_bytes", "admission_closed", "over_quota")
        }
        for row in sorted(rows, key=lambda r: r.tenant_id):
            families["requested_bytes"].add_metric([row.tenant_id], row.requested_quota_bytes)
            families["effective_bytes"].add_metric([row.tenant_id], row.effective_quota_bytes)
            families["charged_bytes"].add_metric([row.tenant_id], row.charged_bytes)
            families["admission_closed"].add_metric([row.tenant_id], int(row.admission_closed))
            families["over_quota"].add_metric([row.tenant_id], int(row.over_quota))
        yield from families.values()

    def _nodes(self):
        from dashboard.rollout.push import drift

        names = ("config_desired_version", "config_acked_version", "behind", "silent", "digest_mismatch",
                 "heartbeat_age_seconds", "outbox_pending")
        families = {name: GaugeMetricFamily(f"kvpool_node_{name}", f"Node {name.replace('_', ' ')}",
                                            labels=["node"]) for name in names}
        now = timezone.now()
        for state in NodeState.objects.all():
            flags = drift(state, now)
            labels = [state.node_name]
            families["config_desired_version"].add_metric(labels, state.desired_version)
            families["config_acked_version"].add_metric(labels, state.acked_version)
            families["behind"].add_metric(labels, int(flags["behind"]))
            families["silent"].add_metric(labels, int(flags["silent"]))
            families["digest_mismatch"].add_metric(labels, int(flags["digest_mismatch"]))
            if flags["heartbeat_age_seconds"] is not None:
                families["heartbeat_age_seconds"].add_metric(labels, flags["heartbeat_age_seconds"])
            families["outbox_pending"].add_metric(labels, state.outbox_pending)
        yield from families.values()


def render() -> bytes:
    """The exposition text of a fresh registry holding ``KVPoolCollector``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KVPoolCollector())
    return generate_latest(registry)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``; requires ``Authorization: Bearer <KVPOOL_METRICS_TOKEN>`` when that is set."""
    token = settings.KVPOOL_METRICS_TOKEN
    if token and not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {token}"):
        return HttpResponse("missing or wrong bearer token\n", status=401, content_type="text/plain")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
