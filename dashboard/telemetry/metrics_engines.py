"""``/metrics`` families per real engine instance (``kvpool_engine_*``), under the series cap.

Rows are the ``InstanceStats`` reported within ``KVPOOL_METRICS_WINDOW_SECONDS`` (of tenants still in the
registry, or of no tenant). Instances are ranked once per scrape (``rank``): those in trouble first (what the
``deploy/prometheus`` engine alerts look at), then by attributed Store blocks, then by node and instance id; every
family keeps the same top ``KVPOOL_METRICS_MAX_SERIES`` instances and sums the rest into one row labelled
``(other)`` (``dashboard.telemetry.series_cap``). ``kvpool_engine_last_event_age_seconds`` has no ``(other)`` row
(ages do not add up); ``kvpool_engine_external_hit_ratio`` of that row is the ratio of the summed tokens.
"""
from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dashboard.telemetry.series_cap import OTHER, Dropped, split

#: Labels of the per-engine-instance families.
ENGINE_LABELS = ("tenant_id", "served_model_name", "namespace", "instance_id", "node")
#: Attribution outcomes of ``kvpool_engine_store_blocks_total`` (``InstanceStats`` columns).
OUTCOMES = ("attributed", "unknown_salt", "unknown_adapter", "hash_mismatch", "unresolved_parent", "unverifiable")
#: Counter family key -> (``InstanceStats`` column, family name without ``_total``, help).
COUNTERS: dict[str, tuple[str, str]] = {
    "messages": ("kvpool_engine_kv_event_messages", "KV-event messages received"),
    "seq_gaps": ("kvpool_engine_kv_event_seq_gaps", "KV-event messages lost (sequence gaps)"),
    "decode_errors": ("kvpool_engine_kv_event_decode_errors", "Malformed KV-event messages dropped"),
    "prefix_cache_queries": ("kvpool_engine_prefix_cache_queries_tokens",
                             "Tokens looked up in the engine's own prefix cache"),
    "prefix_cache_hits": ("kvpool_engine_prefix_cache_hits_tokens", "Tokens found in the engine's own prefix cache"),
    "external_prefix_cache_queries": ("kvpool_engine_external_prefix_cache_queries_tokens",
                                      "Tokens the engine looked up in the Store"),
    "external_prefix_cache_hits": ("kvpool_engine_external_prefix_cache_hits_tokens",
                                   "Tokens the engine found in the Store"),
    "metrics_errors": ("kvpool_engine_metrics_scrape_errors", "Failed scrapes of the engine's /metrics by its agent"),
    "events_refusals": ("kvpool_engine_events_refusals", "Times the agent refused the instance's KV-event socket "
                        "(another account's, or in a directory others can write)"),
    "topic_mismatch": ("kvpool_engine_events_topic_mismatch_messages", "KV-event messages on the instance's socket "
                       "under another topic (dropped)"),
    "confirmed": ("kvpool_engine_store_writes_confirmed_blocks", "Attributed blocks whose keys the Store held under "
                  "the instance's tenant (booked)"),
    "unconfirmed": ("kvpool_engine_store_writes_unconfirmed_blocks", "Blocks the engine reported stored that the "
                    "Store did not hold after the grace (forged events, writes the master dropped, blocks evicted "
                    "before the check)"),
    "dropped_messages": ("kvpool_engine_kv_event_dropped", "KV-event messages received but never attributed (the "
                         "instance's queue was full)"),
}


def trouble(row) -> int:
    """How many kinds of trouble the ``InstanceStats`` row shows (0: none): blocks of unregistered request groups or
    adapters, hash mismatches, unconfirmed writes, lost or malformed KV events, an untrusted KV-event socket or
    messages under another topic, writes under another namespace, failed scrapes of the engine's ``/metrics`` (what
    the ``deploy/prometheus`` engine alerts look at)."""
    return sum((
        row.unknown_salt + row.unknown_adapter > 0,
        row.hash_mismatch > 0,
        row.unconfirmed > 0,
        row.seq_gaps + row.decode_errors > 0,
        row.events_untrusted or row.topic_mismatch > 0,
        any(int(keys) > 0 for keys in (row.unknown_namespace_keys or {}).values()),
        row.metrics_errors > 0,
    ))


def rank(rows: list) -> list:
    """``rows`` best first: most kinds of trouble, then most attributed blocks, then node name and instance id."""
    return sorted(rows, key=lambda row: (-trouble(row), -row.attributed, row.node_name, row.instance_id))


class _Other:
    """Sums of the folded instances (the ``(other)`` row)."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.untrusted = 0
        self.elsewhere: dict[str, int] = {"blocks": 0, "bytes": 0}

    def add(self, row) -> None:
        for name in (*OUTCOMES, *COUNTERS, "pending"):
            self.values[name] = self.values.get(name, 0) + getattr(row, name)
        self.untrusted += int(row.events_untrusted)
        for _, keys, size in row.unknown_namespaces:
            self.elsewhere["blocks"] += keys
            self.elsewhere["bytes"] += size


def engine_families(rows: list, cap: int, dropped: Dropped) -> Iterator[Metric]:
    """The ``kvpool_engine_*`` families of ``rows`` (``InstanceStats``), the top ``cap`` instances (0: all) with
    their own series and one ``(other)`` row for the rest; folded series are counted in ``dropped``."""
    labels = [*ENGINE_LABELS]
    blocks = CounterMetricFamily("kvpool_engine_store_blocks", "Store blocks the engine wrote, by attribution "
                                 "outcome, since its agent started", labels=[*labels, "outcome"])
    counters = {key: CounterMetricFamily(name, text, labels=labels) for key, (name, text) in COUNTERS.items()}
    pending = GaugeMetricFamily("kvpool_engine_store_writes_pending_blocks", "Attributed blocks waiting for the "
                                "Store's confirmation", labels=labels)
    elsewhere = {
        "blocks": CounterMetricFamily("kvpool_engine_unknown_namespace_blocks", "Blocks the engine wrote under a "
                                      "namespace that is not its release's, by key prefix",
                                      labels=[*labels, "key_prefix"]),
        "bytes": CounterMetricFamily("kvpool_engine_unknown_namespace_bytes", "Bytes the engine wrote under a "
                                     "namespace that is not its release's, by key prefix",
                                     labels=[*labels, "key_prefix"]),
    }
    untrusted = GaugeMetricFamily("kvpool_engine_events_untrusted", "1 when the agent does not receive the "
                                  "instance's KV events from a socket only its account can have made (refused, "
                                  "insecure tcp endpoint, no account); label status; the (other) row counts them",
                                  labels=[*labels, "status"])
    ratio = GaugeMetricFamily("kvpool_engine_external_hit_ratio", "Store hit tokens / looked-up tokens of the "
                              "engine's KV connector (0 without lookups)", labels=labels)
    age = GaugeMetricFamily("kvpool_engine_last_event_age_seconds", "Seconds since the engine's newest KV event "
                            "reached its agent (at the agent's newest report)", labels=labels)
    chosen = split(rank(rows), cap)
    for row in sorted(chosen.kept, key=lambda r: (r.node_name, r.instance_id)):
        values = [row.tenant_id, row.served_model_name, row.namespace, row.instance_id, row.node_name]
        for outcome in OUTCOMES:
            blocks.add_metric([*values, outcome], getattr(row, outcome))
        for name, family in counters.items():
            family.add_metric(values, getattr(row, name))
        ratio.add_metric(values, row.external_hit_ratio or 0.0)
        untrusted.add_metric([*values, row.events_status], 1.0 if row.events_untrusted else 0.0)
        pending.add_metric(values, row.pending)
        for name, keys, size in row.unknown_namespaces:
            elsewhere["blocks"].add_metric([*values, name], keys)
            elsewhere["bytes"].add_metric([*values, name], size)
        if row.last_event_at is not None:
            age.add_metric(values, _age(row.reported_at, row.last_event_at))
    folded = len(chosen.folded)
    other = _Other()
    for row in chosen.folded:
        other.add(row)
    prefixes = sum(len(row.unknown_namespaces) for row in chosen.folded)
    if folded:
        values = [OTHER] * len(ENGINE_LABELS)
        for outcome in OUTCOMES:
            blocks.add_metric([*values, outcome], other.values[outcome])
        for name, family in counters.items():
            family.add_metric(values, other.values[name])
        queries = other.values["external_prefix_cache_queries"]
        ratio.add_metric(values, other.values["external_prefix_cache_hits"] / queries if queries else 0.0)
        untrusted.add_metric([*values, OTHER], other.untrusted)
        pending.add_metric(values, other.values["pending"])
        if prefixes:
            for name, family in elsewhere.items():
                family.add_metric([*values, OTHER], other.elsewhere[name])
    dropped.add(blocks, folded * len(OUTCOMES))
    for family in (*counters.values(), ratio, untrusted, pending):
        dropped.add(family, folded)
    for family in elsewhere.values():
        dropped.add(family, prefixes)
    dropped.add(age, sum(row.last_event_at is not None for row in chosen.folded))
    yield blocks
    yield from counters.values()
    yield from (ratio, age, untrusted, pending)
    yield from elsewhere.values()


def _age(reported_at: datetime, last_event_at: datetime) -> float:
    return max(0.0, (reported_at - last_event_at).total_seconds())
