"""Store what agents send on ``dashboard.ingest``: acks, occupancy reports, heartbeats.

``ingest(messages)`` first checks who sent each message and that it is fresh (``dashboard.telemetry.agent_auth.check``:
signature with the signing secret of the node it names, ``signed_at`` inside the replay window), then
validates it (``agent.contract.messages.parse_ingest``, after ``dashboard.telemetry.compat.upgrade`` rewrote a report
of an older schema) and, for acks and reports, that it is younger than the receipts
kept (``agent_auth.check_horizon``). A refused message — unsigned, tampered, wrong node, replayed, invalid… —
is logged with its reason and skipped, the rest of the batch is stored; refusals (and duplicates) are counted
per reason in ``MessageRejection`` in the same transaction. The accepted messages are written in one
transaction:

* reports — the receipt row ``(node, sequence)`` is inserted with ``ON CONFLICT DO NOTHING RETURNING`` (SQLite
  ≥ 3.35 and PostgreSQL), so a report delivered twice (the agent's outbox after an outage, or two ingest
  workers racing) is stored once; a new report's occupancy rows and instance stats are kept only when the
  node's applied document carries them (``dashboard.telemetry.report_scope``: one query for the batch, or a row
  of its tenants and served models under a namespace the registry lacks; a row of
  another tenant's namespace, of a tenant that does not exist or of an instance the node does not run is refused,
  counted per row as ``scope_not_in_document`` / ``instance_not_in_document`` and logged once per node, and the
  report's other rows are stored); samples of new reports go in as one bulk insert (``COPY`` on PostgreSQL,
  ``bulk_create`` elsewhere); the newest report of a node is found from the receipts (no per-node update); the
  engine facts of new reports (``Report.instances``) go into ``InstanceStats``, one row per ``(node, instance)``,
  with one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE reported_at <= excluded.reported_at``, so a re-delivered
  or older report never moves a row back;
* acks — ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` on ``(node, sequence)`` (on PostgreSQL one statement
  reading the batch's rows from one JSON text), then a conditional UPDATE moves each new ack's node state forward
  (versions never move back; an out-of-order older ack changes nothing; a re-delivered ack is stored once and
  folded once): on PostgreSQL one ``UPDATE ... FROM json_array_elements(...)`` for every node with one new ack in
  the batch (a config push: each node acks once), and a node's several new acks one statement each, in order, as
  one pipelined ``executemany`` (SQLite: every ack so);
* heartbeats — the newest per node updates its ``NodeState``.

Node state rows touched by a batch are locked in name order before they are written
(``NodeState.objects.lock_in_name_order``, shared with the push), so ingest workers storing overlapping
batches of many nodes at once (see ``dashboard.telemetry.drain``) cannot deadlock.
"""
from __future__ import annotations

import gc
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from django.db import connection, transaction
from django.utils import timezone
from msgspec.structs import astuple
from msgspec.structs import fields as struct_fields

from agent.contract.messages import Ack, Heartbeat, MessageError, Report, ScopeRow, parse_report_rows
from agent.contract.messages import InstanceStats as InstanceFacts
from dashboard.models import ConfigAck, InstanceStats, NodeState, OccupancySample
from dashboard.models import Report as ReportReceipt
from dashboard.telemetry import compat
from dashboard.telemetry.agent_auth import NodeKeys, Refused, Tally, check, check_horizon, check_not_ahead
from dashboard.telemetry.report_scope import UNREGISTERED_PER_REPORT, applied_scopes, unregistered_namespaces

log = logging.getLogger("kvpool.dashboard.ingest")

#: Rows per INSERT statement for receipts and acks (8 / 10 parameters each; below SQLite's 32766 variables).
RECEIPT_CHUNK = 1000
#: Rows per INSERT statement for samples.
SAMPLE_BATCH = 2000


@dataclass
class IngestResult:
    """Counts of one ``ingest`` call.

    ``rejected`` counts the messages refused, per reason of ``dashboard.telemetry.agent_auth.REASONS`` (``invalid`` and
    ``duplicate`` included; the ``*_not_in_document`` reasons count report rows); ``invalid``, ``duplicate_*`` and
    ``refused_*`` are kept as their own counts too.
    """

    reports: int = 0
    duplicate_reports: int = 0
    samples: int = 0
    instance_stats: int = 0
    #: occupancy rows / instance stats of new reports that the node's applied document does not carry
    refused_scopes: int = 0
    refused_instances: int = 0
    acks: int = 0
    duplicate_acks: int = 0
    heartbeats: int = 0
    invalid: int = 0
    #: duplicates (reports and acks) per node they named
    duplicate_nodes: Counter[str] = field(default_factory=Counter)
    rejected: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counts (the task's return value)."""
        return {"reports": self.reports, "duplicate_reports": self.duplicate_reports, "samples": self.samples,
                "instance_stats": self.instance_stats, "refused_scopes": self.refused_scopes,
                "refused_instances": self.refused_instances,
                "acks": self.acks, "duplicate_acks": self.duplicate_acks, "heartbeats": self.heartbeats,
                "invalid": self.invalid, "rejected": dict(self.rejected)}


def ingest(messages: Iterable[Any], *, now: datetime | None = None) -> IngestResult:
    """Verify, validate and store a batch of agent messages (dicts as decoded from JSON); see the module
    docstring. ``now`` (default: the current time) is what the replay window and the receipt horizon are
    measured from, and the receipts' ``received_at``.

    The cyclic garbage collector is paused meanwhile: a batch allocates a few objects per report row, all alive
    until it returns, so the collector's passes over them (every 700 allocations) would find nothing; it runs
    again, as before, when the batch is done."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _ingest(messages, now or timezone.now())
    finally:
        if paused:
            gc.enable()


def _ingest(messages: Iterable[Any], now: datetime) -> IngestResult:
    messages = list(messages)
    result = IngestResult()
    tally = Tally("ingest", log)
    keys = NodeKeys.for_messages(messages)
    reports: list[tuple[Report, list[Any]]] = []  # (report without its rows, rows as ScopeRow)
    acks: list[Ack] = []
    heartbeats: list[Heartbeat] = []
    for raw in messages:
        try:
            check(raw, keys, now)
            try:
                message, rows = parse_report_rows(compat.upgrade(raw))
            except MessageError as exc:
                raise Refused("invalid", str(exc)) from None
            check_not_ahead(message, now)
            if isinstance(message, (Ack, Report)):
                check_horizon(message, now)
        except Refused as exc:
            tally.refuse(raw, exc)
            if exc.reason == "invalid":
                result.invalid += 1
            result.errors.append(f"{exc.reason}: {exc}")
            continue
        if isinstance(message, Report):
            reports.append((message, rows or []))
        elif isinstance(message, Ack):
            acks.append(message)
        else:
            heartbeats.append(message)
    with transaction.atomic():
        if acks and heartbeats:  # both update node states: lock all their rows first, in one order
            NodeState.objects.lock_in_name_order([m.node for m in acks] + [m.node for m in heartbeats],
                                                 only=["node_name"])
        if reports:
            store_reports(reports, now, result, tally)
        if acks:
            store_acks(acks, now, result)
        if heartbeats:
            store_heartbeats(heartbeats, result)
        duplicates = result.duplicate_reports + result.duplicate_acks
        if duplicates:
            log.info("ingest: %d report(s) and %d ack(s) already stored (re-delivered or replayed): ignored",
                     result.duplicate_reports, result.duplicate_acks)
            for node, n in sorted((+result.duplicate_nodes).items()):
                tally.add("duplicate", node, "(node, sequence) already stored", n)
        tally.record(now)
    result.rejected = dict(tally.counts)
    return result


_RECEIPT_COLUMNS = ("node_name", "sequence", "sent_at", "started_at", "applied_version", "received_at",
                    "unknown_topic_messages", "unknown_topic_blocks")


#: Position of ``received_at`` in ``_RECEIPT_COLUMNS`` (the same for every row of a batch: sent as one value).
_RECEIVED_AT = _RECEIPT_COLUMNS.index("received_at")
#: The receipt columns read from one JSON array per row (``_RECEIPT_COLUMNS`` without ``received_at``): psycopg
#: quotes one text parameter in C, where 7 array parameters are quoted element by element in Python.
_RECEIPT_FROM_JSON = ("e->>0, (e->>1)::bigint, (e->>2)::timestamptz, (e->>3)::timestamptz, (e->>4)::bigint, %s, "
                      "(e->>5)::bigint, (e->>6)::bigint")


def _insert_receipts(rows: Sequence[tuple]) -> set[tuple[str, int]]:
    """Insert receipt rows (one ``received_at`` for all), returning the ``(node_name, sequence)`` pairs that were
    new.

    PostgreSQL: one ``INSERT ... SELECT FROM jsonb_array_elements(<the rows as one JSON text>)`` (two parameters
    whatever the batch size: one statement text, parsed once); elsewhere one multi-row ``VALUES`` per
    ``RECEIPT_CHUNK`` rows.
    """
    table = connection.ops.quote_name(ReportReceipt._meta.db_table)
    columns = _RECEIPT_COLUMNS
    column_sql = ", ".join(connection.ops.quote_name(name) for name in columns)
    inserted: set[tuple[str, int]] = set()
    if not rows:
        return inserted
    if connection.vendor == "postgresql":
        received_at = {row[_RECEIVED_AT] for row in rows}
        assert len(received_at) == 1, "one batch, one received_at"
        rows_json = msgspec.json.encode([row[:_RECEIVED_AT] + row[_RECEIVED_AT + 1:] for row in rows]).decode()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({column_sql}) SELECT {_RECEIPT_FROM_JSON} "
                f"FROM jsonb_array_elements(%s::jsonb) AS e "
                f"ON CONFLICT (node_name, sequence) DO NOTHING RETURNING node_name, sequence",
                [received_at.pop(), rows_json],
            )
            inserted.update((name, int(sequence)) for name, sequence in cursor.fetchall())
        return inserted
    fields = [ReportReceipt._meta.get_field(name) for name in columns]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), RECEIPT_CHUNK):
            chunk = rows[start:start + RECEIPT_CHUNK]
            placeholders = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(chunk))
            params: list[Any] = []
            for row in chunk:
                params.extend(f.get_db_prep_save(value, connection) for f, value in zip(fields, row))
            cursor.execute(
                f"INSERT INTO {table} ({column_sql}) VALUES {placeholders} "
                f"ON CONFLICT (node_name, sequence) DO NOTHING RETURNING node_name, sequence",
                params,
            )
            inserted.update((name, int(sequence)) for name, sequence in cursor.fetchall())
    return inserted


#: Columns of a raw sample row: the level, the report's time and node, a ``ScopeRow``'s fields in their order
#: (``msgspec.structs.astuple``), then ``max_bytes`` (a raw row's ``bytes``) and ``samples`` (1).
_SAMPLE_COLUMNS = ("level", "ts", "node_name", *(f.name for f in struct_fields(ScopeRow)), "max_bytes", "samples")
#: Index of ``bytes`` in a ``ScopeRow``'s tuple (a raw row's ``max_bytes`` is its ``bytes``).
_BYTES = [f.name for f in struct_fields(ScopeRow)].index("bytes")


def _insert_samples(rows: list[tuple]) -> None:
    """Bulk-insert raw sample rows (tuples in ``_SAMPLE_COLUMNS`` order) in the current transaction.

    PostgreSQL: one ``COPY ... FROM STDIN`` (psycopg 3) — the Django ORM spends ~100 µs per row preparing
    parameters, COPY a few; other databases: ``bulk_create``.
    """
    if not rows:
        return
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(OccupancySample._meta.db_table)
        columns = ", ".join(connection.ops.quote_name(name) for name in _SAMPLE_COLUMNS)
        with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    OccupancySample.objects.bulk_create(
        [OccupancySample(**dict(zip(_SAMPLE_COLUMNS, row))) for row in rows], batch_size=SAMPLE_BATCH)


def store_reports(reports: Sequence[tuple[Report, Sequence[Any]]], now: datetime, result: IngestResult,
                  tally: Tally) -> None:
    """Store receipts, and the rows the node's applied document carries, of reports not seen before; must run
    inside a transaction. ``reports``: ``(report, its occupancy rows)`` as ``parse_report_rows`` returns them
    (``ScopeRow``; ``report.scopes`` is not read). Rows refused are counted in ``result`` and ``tally`` and logged
    once per node."""
    unique: dict[tuple[str, int], tuple[Report, Sequence[Any]]] = {}
    for item in reports:
        unique.setdefault((item[0].node, item[0].sequence), item)
    receipts = [(r.node, r.sequence, r.sent_at, r.started_at, r.applied_version, now, r.unknown_topic_messages,
                 r.unknown_topic_blocks) for r, _ in unique.values()]
    new_keys = _insert_receipts(receipts)
    result.duplicate_reports += len(reports) - len(new_keys)
    result.duplicate_nodes.update(r.node for r, _ in reports)
    result.duplicate_nodes.subtract(node for node, _ in new_keys)
    fresh = [unique[key] for key in sorted(new_keys)]
    documents = applied_scopes((report.node, report.applied_version) for report, _ in fresh)
    raw = OccupancySample.Level.RAW
    samples = []
    facts: list[tuple[Report, list[InstanceFacts]]] = []
    refused: dict[str, _RefusedRows] = {}
    kept: dict[tuple[str, int], tuple[int, int]] = {}  # (node, sequence) -> occupancy rows, instance rows kept
    # rows outside the document that an unregistered namespace may explain: decided after one registry query
    outside: list[tuple[Report, tuple[str, str, str], Any]] = []
    for report, rows in fresh:
        document = documents[(report.node, report.applied_version)]
        scopes, identities = document.scopes, document.instances
        head = (raw, report.sent_at, report.node)
        # each ScopeRow's fields as a tuple, the first four its cache scope: a CacheScope is a NamedTuple, so the
        # plain tuple hashes and compares the same (list comprehensions: the per-row work of a fleet's batch)
        values = list(map(astuple, rows))
        inside = [row for row in values if row[:4] in scopes]
        samples.extend([head + row + (row[_BYTES], 1) for row in inside])
        rows_kept = len(inside)
        names: set[tuple[str, str, str]] = set()
        for row, fields in zip(rows, values) if rows_kept < len(rows) else ():
            if fields[:4] not in scopes and document.could_be_unregistered(row.scope):
                triple = (row.tenant_id, row.served_model_name, row.namespace)
                if triple in names or len(names) < UNREGISTERED_PER_REPORT:
                    names.add(triple)
                    outside.append((report, triple, row))
        instances = [stats for stats in report.instances
                     if (stats.instance_id, stats.engine, stats.tenant_id, stats.served_model_name,
                         stats.namespace) in identities]
        if instances:
            facts.append((report, instances))
        kept[(report.node, report.sequence)] = (rows_kept, len(instances))
    if outside:
        unregistered = unregistered_namespaces({triple for _, triple, _ in outside})
        for report, triple, row in outside:
            if triple in unregistered:
                fields = astuple(row)
                samples.append((raw, report.sent_at, report.node) + fields + (fields[_BYTES], 1))
                rows_kept, instances_kept = kept[(report.node, report.sequence)]
                kept[(report.node, report.sequence)] = (rows_kept + 1, instances_kept)
    for report, rows in fresh:
        rows_kept, instances_kept = kept[(report.node, report.sequence)]
        if rows_kept < len(rows) or instances_kept < len(report.instances):
            refused.setdefault(report.node, _RefusedRows()).add(
                report, len(rows) - rows_kept, len(report.instances) - instances_kept)
    _insert_samples(samples)
    result.reports += len(new_keys)
    result.samples += len(samples)
    result.instance_stats += _upsert_instance_stats(facts)
    for node, rows_refused in sorted(refused.items()):
        result.refused_scopes += rows_refused.scopes
        result.refused_instances += rows_refused.instances
        rows_refused.refuse(node, tally)


@dataclass
class _RefusedRows:
    """Rows of one node's new reports in a batch that its applied documents do not carry."""

    scopes: int = 0
    instances: int = 0
    reports: int = 0
    versions: set[int] = field(default_factory=set)

    def add(self, report: Report, scopes: int, instances: int) -> None:
        self.scopes += scopes
        self.instances += instances
        self.reports += 1
        self.versions.add(report.applied_version)

    def detail(self, what: str, n: int) -> str:
        """Why, naming the node's document versions only (never a tenant, model or namespace)."""
        versions = ", ".join(f"v{version}" for version in sorted(self.versions))
        return (f"{n} {what} in {self.reports} report(s) that the node's applied config document ({versions}) does "
                "not carry: refused")

    def refuse(self, node: str, tally: Tally) -> None:
        """Log the refusals once (WARNING) and count them per row (``tally.add`` skips a zero count)."""
        parts = [(reason, self.detail(what, n)) for reason, what, n in (
            ("scope_not_in_document", "occupancy row(s)", self.scopes),
            ("instance_not_in_document", "instance stats row(s)", self.instances)) if n]
        log.warning("ingest: node %s: %s", node, "; ".join(detail for _, detail in parts))
        for reason, detail in parts:
            tally.add(reason, node, detail, self.scopes if reason == "scope_not_in_document" else self.instances)


_STATS_COLUMNS = ("node_name", "instance_id", "engine", "tenant_id", "served_model_name", "namespace",
                  "agent_started_at", "reported_at", "report_sequence", "observed_since", "last_event_at",
                  "messages", "events", "blocks_seen", "attributed", "unknown_salt", "unknown_adapter",
                  "hash_mismatch", "unresolved_parent", "unverifiable", "decode_errors", "seq_gaps", "seq_resets",
                  "attributed_by_group", "last_error", "confirmed", "unconfirmed", "pending", "pending_overflow",
                  "dropped_messages", "unknown_namespace_keys", "unknown_namespace_bytes",
                  "prefix_cache_queries", "prefix_cache_hits",
                  "external_prefix_cache_queries", "external_prefix_cache_hits", "store_keys", "store_failed_keys",
                  "metrics_scrapes", "metrics_errors", "metrics_error", "events_endpoint", "events_status",
                  "events_problem", "events_refusals", "topic_mismatch")
#: Rows per upsert statement (46 parameters each: SQLite allows 32,766 per statement).
STATS_CHUNK = 500


def _upsert_instance_stats(reports: Sequence[tuple[Report, Sequence[InstanceFacts]]]) -> int:
    """Write the accepted instance stats of new reports (``(report, its instances kept)``) into ``InstanceStats``:
    per ``(node, instance)`` the row of the newest report (by ``sent_at``) in the batch, upserted only over an older
    row. Returns the rows inserted or updated."""
    newest: dict[tuple[str, str], tuple[Report, Any]] = {}
    for report, instances in reports:
        for stats in instances:
            key = (report.node, stats.instance_id)
            held = newest.get(key)
            if held is None or (report.sent_at, report.sequence) > (held[0].sent_at, held[0].sequence):
                newest[key] = (report, stats)
    if not newest:
        return 0
    ops = connection.ops
    meta = InstanceStats._meta
    fields = [meta.get_field(name) for name in _STATS_COLUMNS]
    table = ops.quote_name(meta.db_table)
    column_sql = ", ".join(ops.quote_name(name) for name in _STATS_COLUMNS)
    updates = ", ".join(f"{ops.quote_name(name)} = excluded.{ops.quote_name(name)}"
                        for name in _STATS_COLUMNS if name not in ("node_name", "instance_id"))
    rows = []
    for (node, _iid), (report, stats) in sorted(newest.items()):
        values = {**stats.model_dump(include=set(_STATS_COLUMNS)), "node_name": node,
                  "agent_started_at": report.started_at, "reported_at": report.sent_at,
                  "report_sequence": report.sequence}
        rows.append([field.get_db_prep_save(values[field.name], connection) for field in fields])
    written = 0
    with connection.cursor() as cursor:
        for start in range(0, len(rows), STATS_CHUNK):
            chunk = rows[start:start + STATS_CHUNK]
            placeholders = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({column_sql}) VALUES {placeholders} "
                f"ON CONFLICT ({ops.quote_name('node_name')}, {ops.quote_name('instance_id')}) DO UPDATE SET "
                f"{updates} WHERE {table}.{ops.quote_name('reported_at')} <= excluded.{ops.quote_name('reported_at')}",
                [value for row in chunk for value in row])
            written += max(cursor.rowcount, 0)  # inserted + updated rows (an older report updates none)
    return written


_HEARTBEAT_FIELDS = ["heartbeat_at", "agent_started_at", "agent_hostname", "agent_pid", "outbox_pending",
                     "outbox_dropped", "single_user", "applied_version", "applied_digest", "applied_seen_at"]


_ACK_COLUMNS = ("node_name", "sequence", "version", "digest", "status", "reason", "error", "applied_version",
                "sent_at", "received_at")

# One statement folds one ack into its node's state; every CASE reads the row as it was before the statement.
# Applied: acked_* move forward only. Rejected: recorded with its reason; a stale/version_conflict rejection
# from an agent already at or above the dashboard's counter (a restored database) raises version_floor so the
# next document outnumbers it. Both: applied_* follow the newest message that reported them.
_ACK_UPDATE = """
UPDATE {table} SET
  acked_version = CASE WHEN %(applied)s AND %(version)s >= acked_version THEN %(version)s ELSE acked_version END,
  acked_digest = CASE WHEN %(applied)s AND %(version)s >= acked_version THEN %(digest)s ELSE acked_digest END,
  acked_at = CASE WHEN %(applied)s AND %(version)s >= acked_version THEN %(sent_at)s ELSE acked_at END,
  rejected_version = CASE WHEN %(applied)s THEN rejected_version ELSE %(version)s END,
  rejection_reason = CASE WHEN %(applied)s THEN rejection_reason ELSE %(reason)s END,
  rejection_error = CASE WHEN %(applied)s THEN rejection_error ELSE %(error)s END,
  rejected_at = CASE WHEN %(applied)s THEN rejected_at ELSE %(sent_at)s END,
  version_floor = CASE WHEN %(raises_floor)s AND %(applied_version)s >= desired_version
                            AND %(applied_version)s > version_floor
                       THEN %(applied_version)s ELSE version_floor END,
  applied_version = CASE WHEN applied_seen_at IS NULL OR %(sent_at)s >= applied_seen_at
                         THEN %(applied_version)s ELSE applied_version END,
  applied_digest = CASE WHEN applied_seen_at IS NULL OR %(sent_at)s >= applied_seen_at
                        THEN %(applied_digest)s ELSE applied_digest END,
  applied_seen_at = CASE WHEN applied_seen_at IS NULL OR %(sent_at)s >= applied_seen_at
                         THEN %(sent_at)s ELSE applied_seen_at END
WHERE node_name = %(node)s
"""


#: The fold of ``_ACK_UPDATE`` for many nodes at once (PostgreSQL): the same SET clause, each parameter read from
#: the row ``a`` of its node (columns ``ack_<parameter>``, from one JSON text: ``_ACK_ROWS``). Only for nodes with one
#: new ack in the batch: an UPDATE changes a row once, and a node's several acks fold in order (``_ACK_UPDATE``).
_ACK_PARAMETERS = ("node", "applied", "version", "digest", "sent_at", "reason", "error", "raises_floor",
                   "applied_version", "applied_digest")
_ACK_TYPES = {"applied": "boolean", "raises_floor": "boolean", "version": "bigint", "applied_version": "bigint",
              "sent_at": "timestamptz"}
_ACK_ROWS = ", ".join(f"(e->>{i})::{_ACK_TYPES.get(name, 'text')} AS ack_{name}"
                      for i, name in enumerate(_ACK_PARAMETERS))
_ACK_UPDATE_MANY = (re.sub(r"%\((\w+)\)s", r"a.ack_\1", _ACK_UPDATE.rpartition("WHERE node_name")[0])
                    + f"FROM (SELECT {_ACK_ROWS} FROM json_array_elements(%s::json) AS e) AS a "
                      "WHERE node_name = a.ack_node")


def _insert_acks(cursor, items: Sequence[Ack], now: datetime) -> set[tuple[str, int]]:
    """Insert ``ConfigAck`` rows ``ON CONFLICT (node_name, sequence) DO NOTHING``; returns the ``(node, sequence)``
    pairs that were new. PostgreSQL: one ``INSERT ... SELECT FROM json_array_elements(<the rows as one JSON
    text>)`` (two parameters whatever the batch size; psycopg scans a statement of thousands of placeholders in
    Python); elsewhere one multi-row ``VALUES`` per ``RECEIPT_CHUNK`` rows."""
    ops = connection.ops
    table = ops.quote_name(ConfigAck._meta.db_table)
    columns = ", ".join(map(ops.quote_name, _ACK_COLUMNS))
    new_keys: set[tuple[str, int]] = set()
    if connection.vendor == "postgresql":
        rows = msgspec.json.encode([(a.node, a.sequence, a.version, a.digest or "", a.status, a.reason, a.error,
                                     a.applied_version, a.sent_at) for a in items]).decode()
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT e->>0, (e->>1)::bigint, (e->>2)::bigint, e->>3, e->>4, e->>5, "
            f"e->>6, (e->>7)::bigint, (e->>8)::timestamptz, %s FROM json_array_elements(%s::json) AS e "
            "ON CONFLICT (node_name, sequence) DO NOTHING RETURNING node_name, sequence", [now, rows])
        return {(name, int(sequence)) for name, sequence in cursor.fetchall()}
    when = ops.adapt_datetimefield_value
    for start in range(0, len(items), RECEIPT_CHUNK):
        chunk = items[start:start + RECEIPT_CHUNK]
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES "
            + ", ".join(["(" + ", ".join(["%s"] * len(_ACK_COLUMNS)) + ")"] * len(chunk))
            + " ON CONFLICT (node_name, sequence) DO NOTHING RETURNING node_name, sequence",
            [value for a in chunk for value in (a.node, a.sequence, a.version, a.digest or "", a.status,
                                                 a.reason, a.error, a.applied_version, when(a.sent_at),
                                                 when(now))],
        )
        new_keys.update((name, int(sequence)) for name, sequence in cursor.fetchall())
    return new_keys


def store_acks(acks: Sequence[Ack], now: datetime, result: IngestResult) -> None:
    """Store acks not seen before and fold each into its node's state (``_ACK_UPDATE``); must run inside a
    transaction.

    The ack rows go in with ``_insert_acks``; only the acks that were new are folded (a re-delivered ack changes
    nothing): on PostgreSQL the nodes with one new ack by one ``_ACK_UPDATE_MANY``, the others' acks in
    ``(node, sequence)`` order as one ``executemany`` of ``_ACK_UPDATE`` (one round trip: psycopg 3 pipelines
    it); elsewhere every ack by the ``executemany``. Duplicates are counted in ``duplicate_acks``.
    """
    ops = connection.ops
    when = ops.adapt_datetimefield_value
    table = ops.quote_name(NodeState._meta.db_table)
    unique: dict[tuple[str, int], Ack] = {}
    for ack in acks:
        unique.setdefault((ack.node, ack.sequence), ack)
    items = list(unique.values())
    NodeState.objects.lock_in_name_order((node for node, _ in unique), only=["node_name"])
    with connection.cursor() as cursor:
        new_keys = _insert_acks(cursor, items, now)
        fresh = [unique[key] for key in sorted(new_keys)]
        params = []
        for ack in fresh:
            applied = ack.status == "applied"
            params.append({"applied": applied, "version": ack.version, "digest": ack.digest or "",
                           "sent_at": when(ack.sent_at), "reason": ack.reason, "error": ack.error,
                           "raises_floor": not applied and ack.reason in {"stale", "version_conflict"},
                           "applied_version": ack.applied_version, "applied_digest": ack.applied_digest,
                           "node": ack.node})
            if not applied:
                log.warning("node %s rejected config version %s: %s: %s", ack.node, ack.version, ack.reason,
                            ack.error)
        if connection.vendor == "postgresql" and params:
            acks_of = Counter(param["node"] for param in params)
            single = [param for param in params if acks_of[param["node"]] == 1]
            params = [param for param in params if acks_of[param["node"]] > 1]  # folded one by one, in order
            if single:
                cursor.execute(_ACK_UPDATE_MANY.format(table=table), [msgspec.json.encode(
                    [[param[name] for name in _ACK_PARAMETERS] for param in single]).decode()])
        if params:
            cursor.executemany(_ACK_UPDATE.format(table=table), params)
    result.acks += len(fresh)
    result.duplicate_acks += len(acks) - len(fresh)
    result.duplicate_nodes.update(a.node for a in acks)
    result.duplicate_nodes.subtract(a.node for a in fresh)


def _observe_applied(state: NodeState, at: datetime, version: int, digest: str) -> None:
    """Take the agent's applied version/digest from a message unless a newer message already reported it."""
    if state.applied_seen_at is None or at >= state.applied_seen_at:
        state.applied_version = version
        state.applied_digest = digest
        state.applied_seen_at = at


def store_heartbeats(heartbeats: Sequence[Heartbeat], result: IngestResult) -> None:
    """Update each node's liveness from its newest heartbeat; must run inside a transaction."""
    newest: dict[str, Heartbeat] = {}
    for heartbeat in heartbeats:
        if heartbeat.node not in newest or heartbeat.sent_at > newest[heartbeat.node].sent_at:
            newest[heartbeat.node] = heartbeat
    states = NodeState.objects.lock_in_name_order(newest)
    for node, hb in newest.items():
        state = states[node]
        if state.heartbeat_at is None or hb.sent_at >= state.heartbeat_at:
            state.heartbeat_at = hb.sent_at
            state.agent_started_at = hb.started_at
            state.agent_hostname = hb.hostname[:255]
            state.agent_pid = hb.pid
            state.outbox_pending = hb.outbox_pending
            state.outbox_dropped = hb.outbox_dropped
            state.single_user = hb.single_user
        _observe_applied(state, hb.sent_at, hb.applied_version, hb.applied_digest)
    NodeState.objects.save_fields(states.values(), _HEARTBEAT_FIELDS)
    result.heartbeats += len(heartbeats)
