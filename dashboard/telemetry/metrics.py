"""Prometheus ``/metrics``: occupancy per tenant and cache scope, master quotas, node drift (read from the DB).

A custom collector builds the families at scrape time (nothing is cached between scrapes, so every dashboard
process answers the same). Occupancy sums, over nodes, each node's newest report younger than
``KVPOOL_METRICS_WINDOW_SECONDS``; a node that stopped reporting drops out of the sums (one set-based query:
``dashboard.telemetry.scope_totals``). ``render`` writes the text with ``dashboard.telemetry.exposition``.

Series cap (``KVPOOL_METRICS_MAX_SERIES`` per family, 0 = none; ``dashboard.telemetry.series_cap``): the cache-scope
families keep the top N scopes by occupancy bytes (ties: by the scope's labels), the ``kvpool_engine_*`` families the
top N instances (in trouble first: ``metrics_engines.trouble``; then by attributed blocks), the per-node families
(``kvpool_node_*``, ``kvpool_ingest_lag_seconds``, ``kvpool_node_engine_unknown_topic_blocks_total``, the node label
of ``kvpool_agent_messages_rejected_total``) the top N nodes (config behind, silent, digest mismatch, unknown-topic
blocks, a message refused in the node's name in the last 10 minutes first; then by name); each kind is ranked once
per scrape, so the same entities keep series in every family of that kind. The rest are summed into one row whose
entity labels read ``(other)``: no ``(other)`` row for versions, ages and lags (they do not add up), ratios of the
row from its summed counts.
``kvpool_metrics_series_dropped{family}`` counts the series folded (0 when none). The ``kvpool_tenant_*`` families
stay exact per tenant. A counter of an ``(other)`` row jumps up or down when an entity enters or leaves the top N
(``rate()`` reads a drop as a reset): read rates of ``(other)`` rows as approximate.

Families (labels):
  ``kvpool_cache_scope_occupancy_bytes`` / ``_blocks`` / ``_orphaned_bytes`` / ``_in_flight_requests``
      (tenant_id, served_model_name, namespace, request_group: the fields of ``agent.contract.scope.CacheScope``)
  ``kvpool_cache_scope_hit_ratio`` — hit_blocks / (hit_blocks + miss_blocks), counters since each agent started
  ``kvpool_cache_scope_{puts,gets,hit_blocks,miss_blocks,evicted_blocks}_total`` (same labels; counters)
  ``kvpool_cache_scope_evicted_blocks_by_cause_total`` (same labels plus ``cause``: ``store`` — the Store's master
      evicted them, ``budget`` — the agent removed them over a budget, ``orphan`` — the agent removed them as orphans;
      counters; summed over ``cause`` they make ``evicted_blocks_total`` for agents that report the split, 0 from
      agents before it)
  ``kvpool_tenant_occupancy_bytes`` / ``_blocks`` / ``kvpool_tenant_hit_ratio`` (tenant_id)
  ``kvpool_tenant_quota_bytes`` (tenant_id) — the registry's quota
  ``kvpool_master_tenant_quota_{requested,effective,charged}_bytes``, ``..._admission_closed``,
  ``..._over_quota`` (tenant_id) — newest read-back from the master
  ``kvpool_tenant_quota_scaled_down`` / ``kvpool_tenant_quota_effective_below_charged`` (tenant_id) — 1 when the
      newest read-back has effective < requested / effective < charged; ``kvpool_pool_requested_quota_bytes`` (sum
      of the registry's quotas), ``kvpool_pool_effective_quota_bytes`` (sum of the newest effective quotas)
  ``kvpool_tenant_eviction_point_bytes`` (tenant_id) — what the tenant may hold before the master evicts
      prefix-blind: its effective quota, or its watermark share when smaller (``tenants.room``; the requested quota
      while the mounted capacity is unknown); ``kvpool_tenant_watermark_share_bytes``,
      ``kvpool_tenant_quota_room_bytes`` (effective quota - charged), ``kvpool_tenant_watermark_room_bytes``
      (watermark share - charged) (tenant_id; while capacity and read-back are known);
      ``kvpool_tenant_budget_excess_bytes`` (tenant_id, limit: ``effective_quota`` / ``watermark_share``) — bytes by
      which the tenant's budgets pass it (0: fit); ``kvpool_pool_watermark_bytes``, ``kvpool_pool_budget_excess_bytes``
      (all tenants' budgets above the watermark) and ``kvpool_budgets_fit`` (1 when the ``budgets_fit`` check
      passes); ``kvpool_release_budget_bytes`` (tenant_id, served_model_name, namespace, implicit) — the budget each
      live release works under, its own or implicit
  ``kvpool_node_config_{desired,acked}_version``, ``kvpool_node_{behind,silent,digest_mismatch}``,
  ``kvpool_node_heartbeat_age_seconds``, ``kvpool_node_outbox_pending`` (node)
  ``kvpool_engine_store_blocks_total`` (tenant_id, served_model_name, namespace, instance_id, node, outcome:
      attributed, unknown_salt, unknown_adapter, hash_mismatch, unresolved_parent, unverifiable) and, with the same
      labels but ``outcome``, ``kvpool_engine_kv_event_{messages,seq_gaps,decode_errors}_total``,
      ``kvpool_engine_{prefix_cache,external_prefix_cache}_{queries,hits}_tokens_total``,
      ``kvpool_engine_metrics_scrape_errors_total``, ``kvpool_engine_external_hit_ratio``,
      ``kvpool_engine_last_event_age_seconds``, ``kvpool_engine_events_untrusted`` (+ ``status``: 1 when its agent
      refuses or cannot vouch for the instance's KV-event socket), ``kvpool_engine_events_refusals_total``,
      ``kvpool_engine_events_topic_mismatch_messages_total`` — real engine instances (``InstanceStats`` reported
      within the window; counters since each agent started);
      ``kvpool_engine_store_writes_{confirmed,unconfirmed}_blocks_total`` (attributed blocks the Store confirmed / did
      not hold after the grace: forged events, writes the master dropped),
      ``kvpool_engine_store_writes_pending_blocks``, ``kvpool_engine_kv_event_dropped_total``;
      ``kvpool_engine_unknown_namespace_{blocks,bytes}_total`` (the same labels plus ``key_prefix``: blocks the engine
      wrote under a namespace that is not its release's)
  ``kvpool_node_engine_unknown_topic_blocks_total`` (node) — Store blocks from engines of no instance of the node's
      config (newest report)
  ``kvpool_master_up``, ``kvpool_master_restarts_total``, ``kvpool_master_last_restart_timestamp_seconds``,
      ``kvpool_master_key_count``, ``kvpool_master_capacity_bytes`` (no labels) — the master probe
      (``dashboard.master.health``); up is 0 when the newest probe failed or is older than 3 probe intervals
      (HA mode: while no master serves as leader)
  ``kvpool_master_failovers_total``, ``kvpool_master_last_failover_timestamp_seconds``, ``kvpool_master_standbys``
      (no labels) — HA mode: elections the probe saw, the newest, standbys answering
  Series of tenants and nodes deleted from the registry are not exported.
  ``kvpool_metrics_series_dropped`` (family) — series of the family summed into its ``(other)`` row this scrape
  ``kvpool_ingest_lag_seconds`` (node) — received_at - sent_at of the node's newest stored report within the
      window: how far ingest runs behind the agents (outbox, broker queue, ingest worker); a stopped ingest freezes
      it and turns ``kvpool_node_silent`` on instead
  ``kvpool_agent_messages_rejected_total`` (reason, node) — agent messages refused by ingest and the purge-result
      task: unsigned, unknown_node, bad_signature, wrong_node, replayed, clock_skew, expired, invalid,
      duplicate (``dashboard.telemetry.agent_auth``; counted in the database, so every process answers the same);
      scope_not_in_document and instance_not_in_document count rows of accepted reports that the node's applied
      document does not carry (``dashboard.telemetry.report_scope``)
"""
from __future__ import annotations

import hmac
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Max
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from agent.contract.scope import CacheScope
from dashboard.models import MasterQuotaSample, MessageRejection, NodeState, OccupancySample, Report
from dashboard.telemetry import exposition
from dashboard.telemetry.metrics_engines import ENGINE_LABELS, engine_families
from dashboard.telemetry.scope_totals import FIELDS as SCOPE_FIELDS
from dashboard.telemetry.scope_totals import scope_totals
from dashboard.telemetry.series_cap import OTHER, Dropped, limit, split, sum_fields

SCOPE_LABELS = list(CacheScope._fields)
__all__ = ["ENGINE_LABELS", "KVPoolCollector", "metrics_view", "render"]
#: Per-node families (``kvpool_node_<name>``) and those whose ``(other)`` row sums the folded nodes.
NODE_FAMILIES = ("config_desired_version", "config_acked_version", "behind", "silent", "digest_mismatch",
                 "heartbeat_age_seconds", "outbox_pending")
NODE_SUMMED = ("behind", "silent", "digest_mismatch", "outbox_pending")
#: ``InstanceStats`` columns ``/metrics`` never reads (not loaded).
_UNUSED_STATS = ("attributed_by_group", "store_keys", "store_failed_keys", "last_error", "metrics_error",
                 "events_problem", "events_endpoint", "agent_started_at", "observed_since")


def newest_receipts() -> list[Report]:
    """The newest stored report (``Report`` receipt) of each registered node sent within
    ``KVPOOL_METRICS_WINDOW_SECONDS``, by node name (a node deleted from the registry drops out)."""
    from tenants.models import Node

    since = timezone.now() - timedelta(seconds=settings.KVPOOL_METRICS_WINDOW_SECONDS)
    newest = dict(Report.objects.filter(sent_at__gte=since, node_name__in=Node.objects.values("name"))
                  .values("node_name").annotate(ts=Max("sent_at")).values_list("node_name", "ts"))
    receipts = Report.objects.filter(sent_at__in=set(newest.values())).order_by("node_name")
    return [receipt for receipt in receipts if newest.get(receipt.node_name) == receipt.sent_at]


def ingest_lag_seconds(receipt: Report) -> float:
    """Seconds (float, >= 0) between the agent sending ``receipt``'s report (``sent_at``, agent clock) and ingest
    storing it (``received_at``, dashboard clock): time in the agent's outbox (broker down), the broker queue and
    behind other tasks of the ingest worker. Clock skew between the hosts shows up in it (ingest refuses
    messages skewed beyond its replay window); a negative difference reads 0."""
    return max(0.0, (receipt.received_at - receipt.sent_at).total_seconds())


def _registry_tenants() -> set[str]:
    """Tenant ids in the registry: series of deleted tenants are not exported."""
    from tenants.models import Tenant

    return set(Tenant.objects.values_list("tenant_id", flat=True))


def _ratio(hits: int, misses: int) -> float:
    return hits / (hits + misses) if hits + misses else 0.0


class _NodeCap:
    """Which nodes keep their own series in the per-node families: the first ``cap`` of ``ranked`` (all if 0)."""

    def __init__(self, ranked: list[str], cap: int) -> None:
        self.folded = frozenset(split(ranked, cap).folded)

    def keeps(self, node: str) -> bool:
        """Whether ``node`` keeps its own series."""
        return node not in self.folded


#: Seconds a refused message in a node's name ranks the node among those in trouble (the 10 minutes
#: ``KvpoolAgentMessagesRejected`` looks at).
RECENT_REFUSAL_SECONDS = 600


class _Scrape:
    """What one scrape reads once and its families share: the window, the registry's tenants, the series cap, each
    node's newest receipt, drift and rejections, the node ranking, and the series folded so far."""

    def __init__(self) -> None:
        from dashboard.rollout.push import drift
        from dashboard.telemetry.agent_auth import rejection_series
        from tenants.models import Node

        now = self.now = timezone.now()
        self.since = now - timedelta(seconds=settings.KVPOOL_METRICS_WINDOW_SECONDS)
        self.tenants = _registry_tenants()
        self.cap = limit()
        self.dropped = Dropped()
        self.receipts = newest_receipts()
        self.states = list(NodeState.objects.filter(node_name__in=Node.objects.values("name"))  # deleted: drop out
                           .order_by("node_name"))
        self.drift = {state.node_name: drift(state, now) for state in self.states}
        self.rejections = rejection_series()
        self.nodes = _NodeCap(self._rank_nodes(), self.cap)

    def _rank_nodes(self) -> list[str]:
        """Node names in trouble first (config behind, silent, digest mismatch, Store blocks of unknown engines,
        refused messages other than duplicates within ``RECENT_REFUSAL_SECONDS``: one point each), then by name."""
        trouble: dict[str, int] = defaultdict(int)
        for name, flags in self.drift.items():
            trouble[name] += int(flags["behind"]) + int(flags["silent"]) + int(flags["digest_mismatch"])
        for receipt in self.receipts:
            trouble[receipt.node_name] += int(receipt.unknown_topic_blocks > 0)
        # refused messages: one point while a refusal is recent, whatever the reasons (unsigned or badly signed
        # messages may name any node: a forger needs no secret to add points to healthy nodes, and the counts
        # never shrink: a refusal a month ago must not outrank a node that is silent now)
        recent = MessageRejection.objects.filter(last_at__gte=self.now - timedelta(seconds=RECENT_REFUSAL_SECONDS),
                                                 count__gt=0).exclude(reason="duplicate").exclude(node="")
        for node in set(recent.values_list("node", flat=True)):
            trouble[node] += 1
        return sorted(trouble, key=lambda name: (-trouble[name], name))


class KVPoolCollector:
    """Collector reading telemetry rows at scrape time (see the module docstring)."""

    def collect(self):
        scrape = _Scrape()
        yield from self._master()
        yield from self._occupancy(scrape)
        yield from self._quotas()
        yield from self._room()
        yield from self._nodes(scrape)
        yield self._rejections(scrape)
        yield self._ingest(scrape)
        yield from self._engines(scrape)
        yield scrape.dropped.family()

    def _master(self):
        """The master probe (``dashboard.master.health``): up, restarts, keys and mounted bytes."""
        from dashboard.master.health import current_health

        row = current_health()
        interval = settings.CELERY_BEAT_SCHEDULE.get("probe-master", {}).get("schedule", 5)
        fresh = row.checked_at is not None and (timezone.now() - row.checked_at).total_seconds() <= max(
            15.0, 3 * float(interval))
        up = GaugeMetricFamily("kvpool_master_up", "1 when the newest probe (within 3 probe intervals) read the "
                               "Mooncake master's /metrics", labels=[])
        up.add_metric([], int(bool(row.up and fresh)))
        restarts = CounterMetricFamily("kvpool_master_restarts", "Master restarts detected by the dashboard's probe "
                                       "(the master's request counters went back)", labels=[])
        restarts.add_metric([], row.restarts)
        yield from (up, restarts)
        since = GaugeMetricFamily("kvpool_master_last_restart_timestamp_seconds", "Unix time of the newest detected "
                                  "master restart", labels=[])
        if row.last_restart_at is not None:
            since.add_metric([], row.last_restart_at.timestamp())
        keys = GaugeMetricFamily("kvpool_master_key_count", "master_key_count at the newest successful probe",
                                 labels=[])
        capacity = GaugeMetricFamily("kvpool_master_capacity_bytes", "master_total_capacity_bytes at the newest "
                                     "successful probe", labels=[])
        if row.key_count is not None:
            keys.add_metric([], row.key_count)
            capacity.add_metric([], row.capacity_bytes or 0)
        yield from (since, keys, capacity)
        yield from self._master_ha(row)

    def _master_ha(self, row):
        """HA mode (``dashboard.master.health``): failovers, the newest one, standbys answering."""
        failovers = CounterMetricFamily("kvpool_master_failovers", "Master failovers detected by the dashboard's "
                                        "probe (a new leader election in etcd; 0 without HA)", labels=[])
        failovers.add_metric([], row.failovers)
        last = GaugeMetricFamily("kvpool_master_last_failover_timestamp_seconds", "Unix time of the newest detected "
                                 "master failover", labels=[])
        if row.last_failover_at is not None:
            last.add_metric([], row.last_failover_at.timestamp())
        standbys = GaugeMetricFamily("kvpool_master_standbys", "HA masters answering as standbys at the newest probe "
                                     "(absent without HA)", labels=[])
        if row.leader_address and row.standbys is not None:
            standbys.add_metric([], row.standbys)
        yield from (failovers, last, standbys)

    def _engines(self, scrape: _Scrape):
        """Per real engine instance (``dashboard.telemetry.metrics_engines``) and per node (newest report)."""
        from dashboard.models import InstanceStats

        rows = [row for row in InstanceStats.objects.filter(reported_at__gte=scrape.since).defer(*_UNUSED_STATS)
                if not row.tenant_id or row.tenant_id in scrape.tenants]
        yield from engine_families(rows, scrape.cap, scrape.dropped)
        unknown = CounterMetricFamily("kvpool_node_engine_unknown_topic_blocks", "Store blocks in KV events of no "
                                      "instance of the node's config, since its agent started", labels=["node"])
        folded = [receipt for receipt in scrape.receipts if not scrape.nodes.keeps(receipt.node_name)]
        for receipt in scrape.receipts:
            if scrape.nodes.keeps(receipt.node_name):
                unknown.add_metric([receipt.node_name], receipt.unknown_topic_blocks)
        if folded:
            unknown.add_metric([OTHER], sum(receipt.unknown_topic_blocks for receipt in folded))
        scrape.dropped.add(unknown, len(folded))
        yield unknown

    def _ingest(self, scrape: _Scrape) -> GaugeMetricFamily:
        """Ingest lag per node: how long the newest stored report waited between its agent and the database."""
        lag = GaugeMetricFamily("kvpool_ingest_lag_seconds", "received_at - sent_at of the node's newest stored "
                                "report: seconds it spent in the agent's outbox, the broker queue and the ingest "
                                "worker (agent clock against dashboard clock; 0 when negative)", labels=["node"])
        kept = [receipt for receipt in scrape.receipts if scrape.nodes.keeps(receipt.node_name)]
        for receipt in kept:
            lag.add_metric([receipt.node_name], ingest_lag_seconds(receipt))
        scrape.dropped.add(lag, len(scrape.receipts) - len(kept))  # lags do not add up: no (other) row
        return lag

    def _rejections(self, scrape: _Scrape) -> CounterMetricFamily:
        family = CounterMetricFamily("kvpool_agent_messages_rejected",
                                     "Agent messages refused (nothing stored), by reason and the registered node "
                                     'they named ("" for none); *_not_in_document: rows of reports refused',
                                     labels=["reason", "node"])
        other: dict[str, int] = {}
        for (reason, node), count in sorted(scrape.rejections.items()):
            if node == "" or scrape.nodes.keeps(node):
                family.add_metric([reason, node], count)
            else:
                other[reason] = other.get(reason, 0) + count
                scrape.dropped.add(family, 1)
        for reason, count in sorted(other.items()):
            family.add_metric([reason, OTHER], count)
        scrape.dropped.add(family, 0)
        return family

    def _occupancy(self, scrape: _Scrape):
        """Per cache scope (the top ``KVPOOL_METRICS_MAX_SERIES`` by occupancy bytes, the rest in one ``(other)``
        row) and per tenant (every tenant, exact sums)."""
        per_scope = scope_totals(scrape.since)
        per_tenant: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SCOPE_FIELDS, 0))
        for key, values in per_scope.items():
            for name in SCOPE_FIELDS:
                per_tenant[key.tenant_id][name] += values[name]
        chosen = split(sorted(per_scope, key=lambda key: (-per_scope[key]["bytes"], key)), scrape.cap)
        rows = [(list(key), per_scope[key]) for key in sorted(chosen.kept)]
        if chosen.folded:
            rows.append(([OTHER] * len(SCOPE_LABELS), sum_fields((per_scope[key] for key in chosen.folded),
                                                                 SCOPE_FIELDS)))
        gauges = {
            "bytes": GaugeMetricFamily("kvpool_cache_scope_occupancy_bytes", "Bytes cached for the cache scope",
                                       labels=SCOPE_LABELS),
            "blocks": GaugeMetricFamily("kvpool_cache_scope_occupancy_blocks", "Blocks cached for the cache scope",
                                        labels=SCOPE_LABELS),
            "orphaned_bytes": GaugeMetricFamily("kvpool_cache_scope_orphaned_bytes",
                                                "Bytes of blocks whose prefix is gone", labels=SCOPE_LABELS),
            "in_flight_requests": GaugeMetricFamily("kvpool_cache_scope_in_flight_requests",
                                                    "Requests in flight in the cache scope", labels=SCOPE_LABELS),
        }
        causes = OccupancySample.EVICTION_CAUSES
        counters = {name: CounterMetricFamily(f"kvpool_cache_scope_{name}", f"{name} since each agent started",
                                              labels=SCOPE_LABELS)
                    for name in OccupancySample.COUNTERS if name not in causes}
        by_cause = CounterMetricFamily("kvpool_cache_scope_evicted_blocks_by_cause",
                                       "evicted_blocks since each agent started, by cause: store (the master evicted "
                                       "them), budget (the agent removed them over a budget), orphan (the agent "
                                       "removed them as orphans)", labels=[*SCOPE_LABELS, "cause"])
        hit_ratio = GaugeMetricFamily("kvpool_cache_scope_hit_ratio", "hit_blocks / (hit_blocks + miss_blocks)",
                                      labels=SCOPE_LABELS)
        for labels, values in rows:
            for name, family in gauges.items():
                family.add_metric(labels, values[name])
            for name, family in counters.items():
                family.add_metric(labels, values[name])
            for name, cause in causes.items():
                by_cause.add_metric([*labels, cause], values[name])
            hit_ratio.add_metric(labels, _ratio(values["hit_blocks"], values["miss_blocks"]))
        for family in (*gauges.values(), *counters.values(), hit_ratio):
            scrape.dropped.add(family, len(chosen.folded))
        scrape.dropped.add(by_cause, len(chosen.folded) * len(causes))
        yield from gauges.values()
        yield from counters.values()
        yield by_cause
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
        tenants = _registry_tenants()
        newest = MasterQuotaSample.objects.filter(tenant_id__in=tenants).values("tenant_id").annotate(ts=Max("ts"))
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
        yield from self._capacity(rows)

    def _capacity(self, rows: list[MasterQuotaSample]):
        """Pool-wide quota sums and per-tenant flags of the newest master sampling round (``tenants.capacity``)."""
        from tenants.models import Tenant

        newest = max((row.ts for row in rows), default=None)
        current = sorted((row for row in rows if row.ts == newest), key=lambda r: r.tenant_id)
        requested = GaugeMetricFamily("kvpool_pool_requested_quota_bytes",
                                      "Sum of the quotas the registry requests for its tenants")
        requested.add_metric([], sum(Tenant.objects.values_list("quota_bytes", flat=True)))
        effective = GaugeMetricFamily("kvpool_pool_effective_quota_bytes",
                                      "Sum of the effective quotas of the newest master read-back (equals the "
                                      "mounted capacity while the pool is overcommitted)")
        effective.add_metric([], sum(row.effective_quota_bytes for row in current))
        scaled = GaugeMetricFamily("kvpool_tenant_quota_scaled_down",
                                   "1 when the tenant's effective quota is below its requested quota (the requested "
                                   "quotas exceed the mounted capacity)", labels=["tenant_id"])
        below = GaugeMetricFamily("kvpool_tenant_quota_effective_below_charged",
                                  "1 when the tenant is charged more than its effective quota (writes refused)",
                                  labels=["tenant_id"])
        for row in current:
            scaled.add_metric([row.tenant_id], int(row.effective_quota_bytes < row.requested_quota_bytes))
            below.add_metric([row.tenant_id], int(row.effective_quota_bytes < row.charged_bytes))
        yield from (requested, effective, scaled, below)

    def _room(self):
        """Room under the master's eviction points and the budgets against it (``dashboard.master.room``)."""
        from dashboard.master.room import current_pool_room, release_budgets
        from tenants.choices import ReleaseState
        from tenants.models import Release

        pool = current_pool_room()
        labels = ["tenant_id"]
        point = GaugeMetricFamily("kvpool_tenant_eviction_point_bytes", "Bytes the tenant may hold before the master "
                                  "evicts prefix-blind (effective quota or watermark share)", labels=labels)
        share = GaugeMetricFamily("kvpool_tenant_watermark_share_bytes", "The tenant's share of the pool's eviction "
                                  "watermark", labels=labels)
        quota_room = GaugeMetricFamily("kvpool_tenant_quota_room_bytes", "Effective quota minus charged bytes",
                                       labels=labels)
        watermark_room = GaugeMetricFamily("kvpool_tenant_watermark_room_bytes", "Watermark share minus charged "
                                           "bytes", labels=labels)
        excess = GaugeMetricFamily("kvpool_tenant_budget_excess_bytes", "Bytes by which the tenant's budgets pass "
                                   "the limit (0: they fit)", labels=[*labels, "limit"])
        for tenant_id, room in sorted(pool.tenants.items()):
            point.add_metric([tenant_id], room.eviction_point_bytes)
            excess.add_metric([tenant_id, "effective_quota"], room.quota_excess_bytes)
            if room.watermark_share_bytes is not None:
                share.add_metric([tenant_id], room.watermark_share_bytes)
                excess.add_metric([tenant_id, "watermark_share"], room.watermark_excess_bytes)
            if room.quota_room_bytes is not None:
                quota_room.add_metric([tenant_id], room.quota_room_bytes)
            if room.watermark_room_bytes is not None:
                watermark_room.add_metric([tenant_id], room.watermark_room_bytes)
        yield from (point, share, quota_room, watermark_room, excess)
        watermark = GaugeMetricFamily("kvpool_pool_watermark_bytes", "Allocated bytes above which the master "
                                      "evicts across tenants (eviction_high_watermark_ratio of the mounted capacity)")
        if pool.watermark_bytes is not None:
            watermark.add_metric([], pool.watermark_bytes)
        pool_excess = GaugeMetricFamily("kvpool_pool_budget_excess_bytes", "Bytes by which all tenants' budgets pass "
                                        "the pool's eviction watermark (0: they fit)")
        pool_excess.add_metric([], pool.watermark_excess_bytes)
        fit = GaugeMetricFamily("kvpool_budgets_fit", "1 when no budget lets the master's prefix-blind eviction start "
                                "(the budgets_fit check)")
        fit.add_metric([], int(pool.fits))
        yield from (watermark, pool_excess, fit)
        budget = GaugeMetricFamily("kvpool_release_budget_bytes", "Budget the live release works under: its own, "
                                   "or implicit (a share of what its tenant's budgets leave)",
                                   labels=["tenant_id", "served_model_name", "namespace", "implicit"])
        implicit = release_budgets(pool)
        rows = (Release.objects.exclude(state=ReleaseState.RETIRED).order_by("model__tenant__tenant_id",
                                                                   "model__served_model_name", "namespace")
                .values_list("pk", "model__tenant__tenant_id", "model__served_model_name", "namespace", "budget_bytes"))
        for pk, tenant_id, model, namespace, own in rows:
            if own is not None:
                budget.add_metric([tenant_id, model, namespace, "0"], own)
            elif pk in implicit and implicit[pk].budget_bytes is not None:
                budget.add_metric([tenant_id, model, namespace, "1"], implicit[pk].budget_bytes)
        yield budget

    def _nodes(self, scrape: _Scrape):
        """Config drift, heartbeat and outbox per node (the top ``KVPOOL_METRICS_MAX_SERIES`` nodes, those in trouble
        first); the ``(other)`` row sums the flags and the outbox (versions and ages do not add up)."""
        families = {name: GaugeMetricFamily(f"kvpool_node_{name}", f"Node {name.replace('_', ' ')}",
                                            labels=["node"]) for name in NODE_FAMILIES}
        other = dict.fromkeys(NODE_SUMMED, 0)
        folded = dict.fromkeys(NODE_FAMILIES, 0)
        for state in scrape.states:
            flags = scrape.drift[state.node_name]
            values = {"config_desired_version": state.desired_version, "config_acked_version": state.acked_version,
                      "behind": int(flags["behind"]), "silent": int(flags["silent"]),
                      "digest_mismatch": int(flags["digest_mismatch"]),
                      "heartbeat_age_seconds": flags["heartbeat_age_seconds"], "outbox_pending": state.outbox_pending}
            kept = scrape.nodes.keeps(state.node_name)
            for name, value in values.items():
                if value is None:
                    continue
                if kept:
                    families[name].add_metric([state.node_name], value)
                    continue
                folded[name] += 1
                if name in other:
                    other[name] += value
        for name, family in families.items():
            if name in other and folded[name]:
                family.add_metric([OTHER], other[name])
            scrape.dropped.add(family, folded[name])
        yield from families.values()


def render() -> bytes:
    """The exposition text of ``KVPoolCollector``'s families (``dashboard.telemetry.exposition``: the bytes
    ``prometheus_client.generate_latest`` would write, several times faster)."""
    return exposition.text(KVPoolCollector().collect())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``; requires ``Authorization: Bearer <KVPOOL_METRICS_TOKEN>`` when that is set (compared as
    bytes: ``hmac.compare_digest`` raises on a ``str`` with non-ASCII characters, which any client can send)."""
    token = settings.KVPOOL_METRICS_TOKEN
    sent = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    if token and not hmac.compare_digest(sent, f"Bearer {token}".encode()):
        return HttpResponse("missing or wrong bearer token\n", status=401, content_type="text/plain")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
