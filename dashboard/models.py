"""Telemetry and delivery state of the control plane: what was pushed to each node, what came back.

Rows are keyed by **node name** and **tenant_id** strings, not by foreign keys into the registry: time series
must outlive a deleted node or tenant, ingest must not look up registry rows per sample, and a node that is
deleted and registered again under the same name keeps counting versions upwards (its agent remembers the last
version it applied and refuses older ones).

Levels of ``OccupancySample``: ``RAW`` (one row per namespace per report, about every 10 s), ``MINUTE`` and
``HOUR`` (rollups; gauges averaged, counters the last value in the bucket). See ``dashboard.telemetry.rollup``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connection, models


class NodeStateQuerySet(models.QuerySet):
    """The two ways writers touch many ``NodeState`` rows at once (push versioning, ingest of acks/heartbeats)."""

    def lock_in_name_order(self, names: Iterable[str], *,
                           only: Sequence[str] | None = None) -> dict[str, NodeState]:
        """Lock the rows of ``names`` for the current transaction, **in name order**, creating missing ones;
        returns them by name. Must run inside ``transaction.atomic()``.

        Every writer that updates several node states in one transaction locks all the rows it will touch up
        front through this one method, so two of them (push workers, ingest workers storing overlapping batches
        of many nodes) always lock in the same order and cannot deadlock. Rows of nodes never seen before are
        inserted (``ignore_conflicts``: a concurrent creator wins harmlessly) and then locked too. ``only``
        limits the columns loaded (e.g. ``["node_name"]`` when the caller needs the lock, not the values).
        """
        names = sorted(set(names))
        if not names:
            return {}
        locked = self.select_for_update().order_by("node_name")
        if only is not None:
            locked = locked.only(*only)
        states = self._locked(locked, names, only)
        missing = [name for name in names if name not in states]
        if missing:  # first message/push of these nodes: create their rows, then lock them too
            self.bulk_create([self.model(node_name=name) for name in missing], ignore_conflicts=True)
            states.update(self._locked(locked, missing, only))
        return states

    def _locked(self, locked: models.QuerySet, names: list[str], only: Sequence[str] | None) -> dict[str, NodeState]:
        """The rows of ``names`` (sorted), locked in that order. On PostgreSQL the names travel as one array
        (``node_name = ANY(%s)``): an ``IN`` of 1,000 names cost Django a lookup preparation and psycopg a quoting
        per name, a tenth of a fleet push's CPU; elsewhere ``locked`` (the ORM query) filtered by ``IN``."""
        if connection.vendor != "postgresql" or self.db != "default":
            return {state.node_name: state for state in locked.filter(node_name__in=names)}
        meta = self.model._meta
        quote = connection.ops.quote_name
        fields = [meta.pk, *(meta.get_field(name) for name in only)] if only is not None else meta.concrete_fields
        columns = ", ".join(dict.fromkeys(quote(field.column) for field in fields))
        sql = (f"SELECT {columns} FROM {quote(meta.db_table)} WHERE {quote('node_name')} = ANY(%s) "
               f"ORDER BY {quote('node_name')} FOR UPDATE")
        return {state.node_name: state for state in self.model.objects.raw(sql, [names])}

    def save_fields(self, states: Iterable[NodeState], fields: Sequence[str]) -> None:
        """Write ``fields`` of the given (loaded, usually locked) states: one ``UPDATE ... WHERE <pk> = %s`` per
        row, sent as one ``executemany`` — pipelined into a single round trip by psycopg 3 on PostgreSQL
        (Django's ``bulk_update`` builds a ``CASE`` per field and row instead, which costs far more CPU)."""
        states = list(states)
        if not states:
            return
        quote = connection.ops.quote_name
        meta = self.model._meta
        model_fields = [meta.get_field(name) for name in fields]
        assignments = ", ".join(f"{quote(field.column)} = %s" for field in model_fields)
        rows = [[field.get_db_prep_save(getattr(state, field.attname), connection) for field in model_fields]
                + [state.pk] for state in states]
        with connection.cursor() as cursor:
            cursor.executemany(f"UPDATE {quote(meta.db_table)} SET {assignments} "
                               f"WHERE {quote(meta.pk.column)} = %s", rows)


class NodeState(models.Model):
    """Per node: desired config version (the counter), last push, last ack, last heartbeat.

    ``desired_version`` is the newest ``ConfigVersion`` of the node (0 before the first); it only grows.
    ``version_floor`` is the highest version an agent reported as applied when it refused a document as stale —
    the next version is created above it (recovers from a restored dashboard database).
    ``applied_version``/``applied_digest`` come from the newest ack or heartbeat, whichever is newer;
    ``single_user`` and the agent's other facts from the newest heartbeat.
    """

    node_name = models.CharField(max_length=128, unique=True)
    desired_version = models.PositiveBigIntegerField(default=0)
    desired_digest = models.CharField(max_length=64, blank=True, default="")
    version_floor = models.PositiveBigIntegerField(default=0)
    pushed_version = models.PositiveBigIntegerField(default=0)
    pushed_at = models.DateTimeField(null=True, blank=True)
    push_error = models.TextField(blank=True, default="")

    acked_version = models.PositiveBigIntegerField(default=0)
    acked_digest = models.CharField(max_length=64, blank=True, default="")
    acked_at = models.DateTimeField(null=True, blank=True)
    rejected_version = models.BigIntegerField(null=True, blank=True)
    rejection_reason = models.CharField(max_length=32, blank=True, default="")
    rejection_error = models.TextField(blank=True, default="")
    rejected_at = models.DateTimeField(null=True, blank=True)

    applied_version = models.PositiveBigIntegerField(default=0)
    applied_digest = models.CharField(max_length=64, blank=True, default="")
    applied_seen_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    agent_started_at = models.DateTimeField(null=True, blank=True)
    agent_hostname = models.CharField(max_length=255, blank=True, default="")
    agent_pid = models.PositiveIntegerField(default=0)
    outbox_pending = models.PositiveIntegerField(default=0)
    outbox_dropped = models.PositiveBigIntegerField(default=0)
    single_user = models.BooleanField(
        default=False, help_text="The agent runs every engine instance as its own account (newest heartbeat): "
        "instances on the node are not kept from each other's files and sockets.")

    objects = NodeStateQuerySet.as_manager()

    class Meta:
        ordering = ["node_name"]

    def __str__(self) -> str:
        return f"{self.node_name} desired v{self.desired_version} acked v{self.acked_version}"


class ConfigVersion(models.Model):
    """One version of a node's config document, as rendered (unsigned; signed when sent).

    ``digest`` = SHA-256 of the canonical document (what the agent acks); ``content_digest`` = the same
    without ``version`` and ``issued_at`` (two renders with equal content do not make a new version).
    """

    node_name = models.CharField(max_length=128)
    version = models.PositiveBigIntegerField()
    digest = models.CharField(max_length=64)
    content_digest = models.CharField(max_length=64)
    document = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node_name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["node_name", "version"], name="dashboard_configversion_node_version")
        ]

    def __str__(self) -> str:
        return f"{self.node_name} v{self.version}"


class ConfigAck(models.Model):
    """An agent's ack of one received document (applied or rejected with a reason). Unique per (node, sequence)."""

    class Status(models.TextChoices):
        APPLIED = "applied", "Applied"
        REJECTED = "rejected", "Rejected"

    node_name = models.CharField(max_length=128)
    sequence = models.PositiveBigIntegerField()
    version = models.BigIntegerField(null=True, blank=True)
    digest = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices)
    reason = models.CharField(max_length=32, blank=True, default="")
    error = models.TextField(blank=True, default="")
    applied_version = models.PositiveBigIntegerField(default=0)
    sent_at = models.DateTimeField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-sent_at"]
        constraints = [
            models.UniqueConstraint(fields=["node_name", "sequence"], name="dashboard_configack_node_sequence")
        ]
        indexes = [models.Index(fields=["node_name", "-sent_at"], name="dashboard_ack_node_sent")]

    def __str__(self) -> str:
        return f"{self.node_name} #{self.sequence} {self.status} v{self.version}"


class Report(models.Model):
    """Receipt of one occupancy report: makes ``(node, sequence)`` the idempotency key of ingest.

    ``unknown_topic_messages`` / ``unknown_topic_blocks``: KV-event messages, and the Store blocks in them, that the
    node's agent received under the topic of no instance of its document (counters since ``started_at``).
    """

    node_name = models.CharField(max_length=128)
    sequence = models.PositiveBigIntegerField()
    sent_at = models.DateTimeField()
    started_at = models.DateTimeField()
    applied_version = models.PositiveBigIntegerField(default=0)
    received_at = models.DateTimeField()
    unknown_topic_messages = models.PositiveBigIntegerField(default=0)
    unknown_topic_blocks = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node_name", "sequence"], name="dashboard_report_node_sequence")
        ]
        indexes = [models.Index(fields=["sent_at"], name="dashboard_report_sent")]

    def __str__(self) -> str:
        return f"{self.node_name} report #{self.sequence}"


class OccupancySample(models.Model):
    """Occupancy of one cache scope (``agent.contract.scope.CacheScope``: tenant, model, release namespace, request
    group) on one node at one time (raw) or over one bucket (rolled up).

    Gauges (``blocks``, ``bytes``, ``orphaned_bytes``, ``in_flight_requests``) in raw rows are the reported
    values, in rollups the average over ``samples`` raw rows (``max_bytes`` keeps the peak). Counters (``puts``,
    ``gets``, ``hit_blocks``, ``miss_blocks``, ``evicted_blocks`` and its causes ``store_evicted_blocks``,
    ``budget_evicted_blocks``, ``orphan_removed_blocks``: ``agent.contract.messages.ScopeOccupancy``; 0 from agents
    before the split) are cumulative since ``started_at`` of the agent; rollups keep the last value of the bucket.
    ``ts`` is the report's ``sent_at`` (raw) or the bucket
    start (rollups).
    """

    class Level(models.IntegerChoices):
        RAW = 0, "raw (per report)"
        MINUTE = 1, "1 minute"
        HOUR = 2, "1 hour"

    level = models.PositiveSmallIntegerField(choices=Level.choices, default=Level.RAW)
    ts = models.DateTimeField()
    node_name = models.CharField(max_length=128)
    tenant_id = models.CharField(max_length=128)
    served_model_name = models.CharField(max_length=255, blank=True, default="")
    namespace = models.CharField(max_length=255, blank=True, default="")
    request_group = models.CharField(max_length=255, blank=True, default="")
    blocks = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    max_bytes = models.BigIntegerField(default=0)
    orphaned_bytes = models.BigIntegerField(default=0)
    in_flight_requests = models.BigIntegerField(default=0)
    puts = models.BigIntegerField(default=0)
    gets = models.BigIntegerField(default=0)
    hit_blocks = models.BigIntegerField(default=0)
    miss_blocks = models.BigIntegerField(default=0)
    evicted_blocks = models.BigIntegerField(default=0)
    store_evicted_blocks = models.BigIntegerField(default=0)
    budget_evicted_blocks = models.BigIntegerField(default=0)
    orphan_removed_blocks = models.BigIntegerField(default=0)
    samples = models.PositiveIntegerField(default=1)

    class Meta:
        indexes = [
            models.Index(fields=["level", "ts"], name="dashboard_occ_level_ts"),
            models.Index(fields=["tenant_id", "namespace", "level", "ts"], name="dashboard_occ_ns_level_ts"),
        ]
        constraints = [
            # the conflict target of the rollups' upserts (dashboard.telemetry.rollup); raw rows may repeat a key
            models.UniqueConstraint(
                fields=["level", "ts", "node_name", "tenant_id", "served_model_name", "namespace", "request_group"],
                condition=models.Q(level__gt=0), name="dashboard_occ_rollup_key"),
        ]

    GAUGES = ("blocks", "bytes", "orphaned_bytes", "in_flight_requests")
    COUNTERS = ("puts", "gets", "hit_blocks", "miss_blocks", "evicted_blocks", "store_evicted_blocks",
                "budget_evicted_blocks", "orphan_removed_blocks")
    #: ``evicted_blocks`` by cause: counter name -> the ``cause`` label (``/metrics``, the occupancy API and page).
    EVICTION_CAUSES = {"store_evicted_blocks": "store", "budget_evicted_blocks": "budget",
                       "orphan_removed_blocks": "orphan"}

    def __str__(self) -> str:
        return f"{self.node_name} {self.tenant_id} {self.get_level_display()} at {self.ts}"
    KEY = ("node_name", "tenant_id", "served_model_name", "namespace", "request_group")


class ScopeSeries(models.Model):
    """Occupancy of one cache scope summed over nodes, per bucket of ``width`` seconds (``Width``: 1 minute ... 6
    hours, the bucket widths of the chart's windows): the occupancy chart's source for windows of an hour and
    longer, one row per scope (or release) and bucket whatever the number of nodes. Written only by
    ``dashboard.telemetry.series`` (from ``OccupancySample`` rows, by the rollup). ``request_group`` ``NULL``: the
    whole release (its scopes summed, ``CacheScope.release_scope()``); ``""``: the rows without a request group.

    Gauges (``bytes``, ``orphaned_bytes``, ``in_flight_requests``): in a 1-minute row, the sum over nodes of each
    node's sample-weighted average in the minute (rounded half up); in a coarser row, the mean of the finer tier's
    rows in its bucket (rounded half up). ``samples``: the samples summed (each weighing its own ``samples``).
    Counters (``hit_blocks``, ``miss_blocks`` and the evicted blocks by
    cause, ``OccupancySample.EVICTION_CAUSES``) are the **increases** counted in the bucket (summed over nodes and
    finer rows; a decrease of an agent's cumulative counter is a restart: the new value counts from zero).
    ``ts`` is the bucket start (UTC).
    """

    class Width(models.IntegerChoices):
        MINUTE = 60, "1 minute"
        FIVE_MINUTES = 300, "5 minutes"
        QUARTER_HOUR = 900, "15 minutes"
        HOUR = 3600, "1 hour"
        TWO_HOURS = 7200, "2 hours"
        SIX_HOURS = 21600, "6 hours"

    width = models.PositiveIntegerField(choices=Width.choices)
    ts = models.DateTimeField()
    tenant_id = models.CharField(max_length=128)
    served_model_name = models.CharField(max_length=255, blank=True, default="")
    namespace = models.CharField(max_length=255, blank=True, default="")
    # NULL (not ""): the whole release, as ``CacheScope.release_scope()``; "" is the rows without a request group
    request_group = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    bytes = models.BigIntegerField(default=0)
    orphaned_bytes = models.BigIntegerField(default=0)
    in_flight_requests = models.BigIntegerField(default=0)
    hit_blocks = models.BigIntegerField(default=0)
    miss_blocks = models.BigIntegerField(default=0)
    store_evicted_blocks = models.BigIntegerField(default=0)
    budget_evicted_blocks = models.BigIntegerField(default=0)
    orphan_removed_blocks = models.BigIntegerField(default=0)
    samples = models.BigIntegerField(default=0)

    class Meta:
        indexes = [
            # everything / one served model / one request group: the release rows (request_group NULL) or one
            # group's, of one tier, over a time range; one tenant: the same, narrowed first by tenant
            models.Index(fields=["width", "request_group", "ts"], name="dashboard_series_group_ts"),
            models.Index(fields=["width", "tenant_id", "request_group", "ts"], name="dashboard_series_tenant_ts"),
        ]

    GAUGES = ("bytes", "orphaned_bytes", "in_flight_requests")
    COUNTERS = ("hit_blocks", "miss_blocks", "store_evicted_blocks", "budget_evicted_blocks",
                "orphan_removed_blocks")
    SCOPE = ("tenant_id", "served_model_name", "namespace", "request_group")

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.get_width_display()} at {self.ts}"


class OccupancyCell(models.Model):
    """One node's samples of one cache scope and minute as the fold would write its 1-minute ``OccupancySample``
    row, kept by the series' pass over the raw samples (``dashboard.telemetry.series``) so the fold of that minute
    writes its rows from these instead of aggregating the raw samples again (``dashboard.telemetry.rollup``).

    ``minute``: whole minutes since the epoch (UTC); gauges the average of the samples (rounded half up),
    ``max_bytes`` and counters the largest, ``samples`` the raw samples (each of weight 1). Written only on
    PostgreSQL (an ``UNLOGGED`` table: a crash empties it, and the fold then aggregates the raw samples), only for
    minutes that held nothing but raw samples of weight 1, deleted by the fold of their minute.
    """

    minute = models.BigIntegerField()
    node_name = models.CharField(max_length=128)
    tenant_id = models.CharField(max_length=128)
    served_model_name = models.CharField(max_length=255, blank=True, default="")
    namespace = models.CharField(max_length=255, blank=True, default="")
    request_group = models.CharField(max_length=255, blank=True, default="")
    blocks = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    max_bytes = models.BigIntegerField(default=0)
    orphaned_bytes = models.BigIntegerField(default=0)
    in_flight_requests = models.BigIntegerField(default=0)
    puts = models.BigIntegerField(default=0)
    gets = models.BigIntegerField(default=0)
    hit_blocks = models.BigIntegerField(default=0)
    miss_blocks = models.BigIntegerField(default=0)
    evicted_blocks = models.BigIntegerField(default=0)
    store_evicted_blocks = models.BigIntegerField(default=0)
    budget_evicted_blocks = models.BigIntegerField(default=0)
    orphan_removed_blocks = models.BigIntegerField(default=0)
    samples = models.PositiveIntegerField(default=1)

    class Meta:
        indexes = [models.Index(fields=["minute"], name="dashboard_cell_minute")]

    def __str__(self) -> str:
        return f"{self.node_name} {self.tenant_id} minute {self.minute}"


class LatestSample(models.Model):
    """The newest raw ``OccupancySample`` of each (node, cache scope): its time and the figures the current
    occupancy reads (``dashboard.telemetry.queries.current_occupancy``, ``tenant_bytes_now``, the checklist's
    reported names), so those read one row per pair instead of the raw samples of their window (at fleet size
    millions of rows).

    Written by the database itself wherever raw samples are written (ingest's ``COPY``, bulk loads): a trigger on
    ``OccupancySample`` inserts (PostgreSQL: once per statement, from its new rows, set-based; SQLite: per row) upserts
    the newest raw row of each pair, moving ``ts`` forward only (an older, re-delivered sample changes nothing; of
    rows with the same ``ts`` the last inserted is kept). Deleted by the rollup when ``ts`` is older than the raw
    horizon (``KVPOOL_ROLLUP_RAW_AFTER_SECONDS``: the pair has no raw sample left). Migration 0016.
    """

    node_name = models.CharField(max_length=128)
    tenant_id = models.CharField(max_length=128)
    served_model_name = models.CharField(max_length=255, blank=True, default="")
    namespace = models.CharField(max_length=255, blank=True, default="")
    request_group = models.CharField(max_length=255, blank=True, default="")
    ts = models.DateTimeField()
    blocks = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    in_flight_requests = models.BigIntegerField(default=0)
    hit_blocks = models.BigIntegerField(default=0)
    miss_blocks = models.BigIntegerField(default=0)

    #: The columns copied from the newest raw sample, besides the key (``OccupancySample.KEY``).
    COPIED = ("ts", "blocks", "bytes", "in_flight_requests", "hit_blocks", "miss_blocks")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node_name", "tenant_id", "served_model_name", "namespace",
                                            "request_group"], name="dashboard_latest_key"),
        ]

    def __str__(self) -> str:
        return f"{self.node_name} {self.tenant_id}/{self.namespace} at {self.ts}"


class InstanceStats(models.Model):
    """The newest engine facts of one real engine instance, per ``(node_name, instance_id)``: the
    ``agent.contract.messages.InstanceStats`` row of the newest report that carried it (ingest keeps the row whose
    ``reported_at`` is the latest, so re-delivered or out-of-order reports never move it back).

    Counters are cumulative since ``agent_started_at`` (the agent's start): KV-event messages and Store blocks with
    their attribution outcome (``blocks_seen`` = ``attributed`` + ``unknown_salt`` + ``unknown_adapter`` +
    ``hash_mismatch`` + ``unresolved_parent`` + ``unverifiable``), stream troubles (``decode_errors``,
    ``seq_gaps``, ``seq_resets``), and the engine's ``/metrics`` in tokens (``prefix_cache_*``: its own prefix
    cache; ``external_prefix_cache_*``: the Store through its KV connector) and keys per Store operation
    (``store_keys``). Where its KV events come from: ``events_endpoint``, ``events_status`` / ``events_problem``
    (``connected``, ``waiting``, or refused by its agent: ``refused``, ``insecure``, ``unobserved``),
    ``events_refusals`` and ``topic_mismatch`` (``agent.contract.messages.InstanceStats``).
    Confirmation (engine events are hints the Store confirms, ``agent.datapath.pending``):
    ``confirmed``, ``unconfirmed`` (the engine reported them stored, the Store does not hold them: forged events,
    writes the master dropped — Mooncake #3741 —, blocks evicted before the check), ``pending`` (waiting now),
    ``pending_overflow``, ``dropped_messages``; ``unknown_namespace_keys`` / ``unknown_namespace_bytes``: the
    engine's blocks found under a key prefix that is not its release's, per key prefix (``<cache_prefix>@<model>``).
    """

    node_name = models.CharField(max_length=128)
    instance_id = models.CharField(max_length=128)
    engine = models.CharField(max_length=16, default="vllm")
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    served_model_name = models.CharField(max_length=255, blank=True, default="")
    namespace = models.CharField(max_length=255, blank=True, default="")
    agent_started_at = models.DateTimeField()
    reported_at = models.DateTimeField()
    report_sequence = models.PositiveBigIntegerField(default=0)
    observed_since = models.DateTimeField()
    last_event_at = models.DateTimeField(null=True, blank=True)
    messages = models.BigIntegerField(default=0)
    events = models.BigIntegerField(default=0)
    blocks_seen = models.BigIntegerField(default=0)
    attributed = models.BigIntegerField(default=0)
    unknown_salt = models.BigIntegerField(default=0)
    unknown_adapter = models.BigIntegerField(default=0)
    hash_mismatch = models.BigIntegerField(default=0)
    unresolved_parent = models.BigIntegerField(default=0)
    unverifiable = models.BigIntegerField(default=0)
    decode_errors = models.BigIntegerField(default=0)
    seq_gaps = models.BigIntegerField(default=0)
    seq_resets = models.BigIntegerField(default=0)
    attributed_by_group = models.JSONField(default=dict, blank=True)
    last_error = models.TextField(blank=True, default="")
    confirmed = models.BigIntegerField(default=0)
    unconfirmed = models.BigIntegerField(default=0)
    pending = models.BigIntegerField(default=0)
    pending_overflow = models.BigIntegerField(default=0)
    dropped_messages = models.BigIntegerField(default=0)
    unknown_namespace_keys = models.JSONField(default=dict, blank=True)
    unknown_namespace_bytes = models.JSONField(default=dict, blank=True)
    prefix_cache_queries = models.BigIntegerField(default=0)
    prefix_cache_hits = models.BigIntegerField(default=0)
    external_prefix_cache_queries = models.BigIntegerField(default=0)
    external_prefix_cache_hits = models.BigIntegerField(default=0)
    store_keys = models.JSONField(default=dict, blank=True)
    store_failed_keys = models.JSONField(default=dict, blank=True)
    metrics_scrapes = models.BigIntegerField(default=0)
    metrics_errors = models.BigIntegerField(default=0)
    metrics_error = models.TextField(blank=True, default="")
    events_endpoint = models.TextField(blank=True, default="")
    events_status = models.CharField(max_length=16, blank=True, default="")
    events_problem = models.TextField(blank=True, default="")
    events_refusals = models.BigIntegerField(default=0)
    topic_mismatch = models.BigIntegerField(default=0)

    #: Counter columns (the ``agent.contract.messages.InstanceStats`` integer fields).
    COUNTERS = ("messages", "events", "blocks_seen", "attributed", "unknown_salt", "unknown_adapter", "hash_mismatch",
                "unresolved_parent", "unverifiable", "decode_errors", "seq_gaps", "seq_resets", "confirmed",
                "unconfirmed", "pending_overflow", "dropped_messages", "prefix_cache_queries", "prefix_cache_hits",
                "external_prefix_cache_queries", "external_prefix_cache_hits", "metrics_scrapes", "metrics_errors",
                "events_refusals", "topic_mismatch")

    class Meta:
        ordering = ["node_name", "instance_id"]
        constraints = [
            models.UniqueConstraint(fields=["node_name", "instance_id"], name="dashboard_instancestats_node_instance")
        ]
        indexes = [models.Index(fields=["tenant_id", "namespace"], name="dashboard_instancestats_scope")]

    def __str__(self) -> str:
        return f"{self.node_name} instance {self.instance_id}"

    @property
    def external_hit_ratio(self) -> float | None:
        """Store hit tokens / looked-up tokens of the engine's KV connector (None without lookups)."""
        q = self.external_prefix_cache_queries
        return self.external_prefix_cache_hits / q if q else None

    @property
    def prefix_hit_ratio(self) -> float | None:
        """Hit tokens / queried tokens of the engine's own prefix cache (None without queries)."""
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else None

    @property
    def events_untrusted(self) -> bool:
        """Whether its agent refuses or cannot vouch for the socket its KV events would come from."""
        from agent.contract.messages import InstanceStats as Stats

        return self.events_status in Stats.UNTRUSTED_EVENTS

    @property
    def unknown_blocks(self) -> int:
        """Store blocks of the instance that belong to no registered request group or adapter."""
        return self.unknown_salt + self.unknown_adapter

    @property
    def unknown_namespaces(self) -> list[tuple[str, int, int]]:
        """``(key prefix, keys, bytes)`` of every namespace the engine writes under that is not its release's."""
        sizes = self.unknown_namespace_bytes or {}
        return [(name, int(keys), int(sizes.get(name, 0)))
                for name, keys in sorted((self.unknown_namespace_keys or {}).items())]


class MasterQuotaSample(models.Model):
    """A tenant's quota state read back from the Mooncake master admin API (0.3.13.post1 field names)."""

    ts = models.DateTimeField()
    tenant_id = models.CharField(max_length=128)
    requested_quota_bytes = models.BigIntegerField(default=0)
    effective_quota_bytes = models.BigIntegerField(default=0)
    charged_bytes = models.BigIntegerField(default=0)
    admission_closed = models.BooleanField(default=False)
    over_quota = models.BooleanField(default=False)
    has_explicit_policy = models.BooleanField(default=False)

    class Meta:
        ordering = ["tenant_id", "-ts"]
        indexes = [models.Index(fields=["tenant_id", "ts"], name="dashboard_mq_tenant_ts"),
                   models.Index(fields=["ts"], name="dashboard_mq_ts")]

    def __str__(self) -> str:
        return f"{self.tenant_id} quota at {self.ts:%Y-%m-%d %H:%M:%S}" if self.ts else f"{self.tenant_id} quota"


class MasterQuotaSync(models.Model):
    """Per tenant: what the registry wants on the master and how the last attempt went.

    ``pending_delete`` marks a tenant removed from the registry whose quota the master still holds (the
    master was unreachable, or refused because the tenant still owns objects — ``last_error`` says which).
    """

    tenant_id = models.CharField(max_length=128, unique=True)
    desired_quota_bytes = models.BigIntegerField(null=True, blank=True)
    synced_quota_bytes = models.BigIntegerField(null=True, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    pending_delete = models.BooleanField(default=False)
    last_error = models.TextField(blank=True, default="")
    last_error_code = models.IntegerField(null=True, blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant_id"]

    def __str__(self) -> str:
        return f"{self.tenant_id} quota sync"


class MasterHealth(models.Model):
    """The Mooncake master as the dashboard's probe last saw it (one row, ``pk=1``; ``dashboard.master.health``).

    ``up`` — the newest probe read the master's Prometheus ``/metrics``; ``key_count`` / ``capacity_bytes`` /
    ``allocated_bytes`` — ``master_key_count``, ``master_total_capacity_bytes``, ``master_allocated_bytes`` of
    that probe; ``counters_total`` — the sum of the master's ``master_*_total`` request counters (they only go
    down when the process restarted); ``restarts`` — restarts detected since this row exists (a counter);
    ``last_restart_at`` / ``last_restart_reason`` — the newest one.

    HA mode (``dashboard.master.leader``): ``leader_address`` / ``leader_admin_url`` / ``view_version`` — the
    master that won the newest election (serving or warming up) and the election's counter; ``standbys`` — masters
    answering as standbys at the newest probe; ``masters_down`` — the ones that did not answer, and why;
    ``failovers`` — elections seen since this row exists (another master, or the same one again, leads: a counter);
    ``last_failover_at`` / ``last_failover_reason`` — the newest one.
    """

    up = models.BooleanField(default=False)
    checked_at = models.DateTimeField(null=True, blank=True)
    up_since = models.DateTimeField(null=True, blank=True)
    down_since = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    key_count = models.BigIntegerField(null=True, blank=True)
    capacity_bytes = models.BigIntegerField(null=True, blank=True)
    allocated_bytes = models.BigIntegerField(null=True, blank=True)
    counters_total = models.FloatField(null=True, blank=True)
    remounts_total = models.FloatField(null=True, blank=True)
    restarts = models.IntegerField(default=0)
    last_restart_at = models.DateTimeField(null=True, blank=True)
    last_restart_reason = models.TextField(blank=True, default="")
    key_count_before_restart = models.BigIntegerField(null=True, blank=True)
    leader_address = models.CharField(max_length=300, blank=True, default="")
    leader_admin_url = models.CharField(max_length=300, blank=True, default="")
    view_version = models.BigIntegerField(null=True, blank=True)
    standbys = models.IntegerField(null=True, blank=True)
    masters_down = models.TextField(blank=True, default="")
    failovers = models.IntegerField(default=0)
    last_failover_at = models.DateTimeField(null=True, blank=True)
    last_failover_reason = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"master {'up' if self.up else 'down'} ({self.restarts} restart(s), {self.failovers} failover(s))"



class MessageRejection(models.Model):
    """How many agent → dashboard messages were refused, per reason and node (``kvpool_agent_messages_rejected_total``);
    for the ``*_not_in_document`` reasons, how many rows of accepted reports.

    One row per (reason, node) (reasons: ``dashboard.telemetry.agent_auth.REASONS``), incremented in the transaction
    that refused the messages, so every dashboard process exposes the same counts. ``node`` is the registered node the
    message *named* (not a verified identity: a forger can name any node), or "" when it named none or an unregistered
    one, so the rows stay bounded by the registry. ``last_*`` describe the newest refusal; ``last_node`` is the name as
    received.
    """

    reason = models.CharField(max_length=32)
    node = models.CharField(max_length=128, blank=True, default="")
    count = models.PositiveBigIntegerField(default=0)
    last_at = models.DateTimeField(null=True, blank=True)
    last_node = models.CharField(max_length=128, blank=True, default="")
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["reason", "node"]
        constraints = [models.UniqueConstraint(fields=["reason", "node"], name="message_rejection_reason_node")]

    def __str__(self) -> str:
        return f"{self.reason}: {self.count}"
