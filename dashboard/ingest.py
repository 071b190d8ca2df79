"""Store what agents send on ``dashboard.ingest``: acks, occupancy reports, heartbeats.

``ingest(messages)`` validates each message (``agent.messages.parse_ingest``; an invalid one is logged with the
field at fault and skipped, the rest of the batch is stored) and writes in one transaction:

* reports — the receipt row ``(node, sequence)`` is inserted with ``ON CONFLICT DO NOTHING RETURNING`` (SQLite
  ≥ 3.35 and PostgreSQL), so a report delivered twice (the agent's outbox after an outage, or two ingest
  workers racing) is stored once; samples of new reports go in as one bulk insert (``COPY`` on PostgreSQL,
  ``bulk_create`` elsewhere); the newest report of a node is found from the receipts (no per-node update);
* acks — ``bulk_create(ignore_conflicts=True)`` on ``(node, sequence)``, then each node's state moves forward
  (versions never move back; an out-of-order older ack changes nothing);
* heartbeats — the newest per node updates its ``NodeState``.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agent.messages import Ack, Heartbeat, MessageError, Report, parse_ingest
from dashboard.models import ConfigAck, NodeState, OccupancySample
from dashboard.models import Report as ReportReceipt

log = logging.getLogger("kvpool.dashboard.ingest")

#: Rows per INSERT statement for receipts (6 parameters each; well below SQLite's 32766-variable limit).
RECEIPT_CHUNK = 1000
#: Rows per INSERT statement for samples.
SAMPLE_BATCH = 2000


@dataclass
class IngestResult:
    """Counts of one ``ingest`` call."""

    reports: int = 0
    duplicate_reports: int = 0
    samples: int = 0
    acks: int = 0
    heartbeats: int = 0
    invalid: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counts (the task's return value)."""
        return {"reports": self.reports, "duplicate_reports": self.duplicate_reports, "samples": self.samples,
                "acks": self.acks, "heartbeats": self.heartbeats, "invalid": self.invalid}


def ingest(messages: Iterable[Any]) -> IngestResult:
    """Validate and store a batch of agent messages (dicts as decoded from JSON); see the module docstring."""
    result = IngestResult()
    reports: list[Report] = []
    acks: list[Ack] = []
    heartbeats: list[Heartbeat] = []
    for raw in messages:
        try:
            message = parse_ingest(raw)
        except MessageError as exc:
            result.invalid += 1
            node = raw.get("node") if isinstance(raw, dict) else None
            result.errors.append(str(exc))
            log.warning("ingest: dropped invalid message from node %r: %s", node, exc)
            continue
        if isinstance(message, Report):
            reports.append(message)
        elif isinstance(message, Ack):
            acks.append(message)
        else:
            heartbeats.append(message)
    now = timezone.now()
    with transaction.atomic():
        if reports:
            store_reports(reports, now, result)
        if acks:
            store_acks(acks, now, result)
        if heartbeats:
            store_heartbeats(heartbeats, result)
    return result


def _insert_receipts(rows: Sequence[tuple]) -> set[tuple[str, int]]:
    """Insert receipt rows, returning the ``(node_name, sequence)`` pairs that were new."""
    table = connection.ops.quote_name(ReportReceipt._meta.db_table)
    columns = ("node_name", "sequence", "sent_at", "started_at", "applied_version", "received_at")
    column_sql = ", ".join(connection.ops.quote_name(name) for name in columns)
    inserted: set[tuple[str, int]] = set()
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


_SAMPLE_COLUMNS = ("level", "ts", "node_name", "tenant_id", "served_model_name", "namespace", "salt_group",
                   "blocks", "bytes", "max_bytes", "orphaned_bytes", "in_flight_requests", "puts", "gets",
                   "hit_blocks", "miss_blocks", "evicted_blocks", "samples")


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
        with connection.cursor() as cursor:
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return
    OccupancySample.objects.bulk_create(
        [OccupancySample(**dict(zip(_SAMPLE_COLUMNS, row))) for row in rows], batch_size=SAMPLE_BATCH)


def store_reports(reports: Sequence[Report], now: datetime, result: IngestResult) -> None:
    """Store receipts and samples of reports not seen before; must run inside a transaction."""
    unique: dict[tuple[str, int], Report] = {}
    for report in reports:
        unique.setdefault((report.node, report.sequence), report)
    rows = [(r.node, r.sequence, r.sent_at, r.started_at, r.applied_version, now) for r in unique.values()]
    new_keys = _insert_receipts(rows)
    result.duplicate_reports += len(reports) - len(new_keys)
    raw = OccupancySample.Level.RAW
    samples = [
        (raw, report.sent_at, report.node, ns.tenant_id, ns.served_model_name, ns.namespace, ns.salt_group,
         ns.blocks, ns.bytes, ns.bytes, ns.orphaned_bytes, ns.in_flight_requests, ns.puts, ns.gets, ns.hit_blocks,
         ns.miss_blocks, ns.evicted_blocks, 1)
        for report in (unique[key] for key in new_keys) for ns in report.namespaces
    ]
    _insert_samples(samples)
    result.reports += len(new_keys)
    result.samples += len(samples)


def _lock_states(names) -> dict[str, NodeState]:
    """The ``NodeState`` rows of ``names`` (created when missing), locked for this transaction, by name."""
    names = sorted(set(names))
    locked = NodeState.objects.select_for_update().order_by("node_name")
    states = {state.node_name: state for state in locked.filter(node_name__in=names)}
    missing = [name for name in names if name not in states]
    if missing:
        NodeState.objects.bulk_create([NodeState(node_name=name) for name in missing], ignore_conflicts=True)
        states.update((state.node_name, state) for state in locked.filter(node_name__in=missing))
    return states


def _save_states(states: Iterable[NodeState], fields: list[str]) -> None:
    """Write ``fields`` of the states: plain UPDATEs for a few rows (``bulk_update`` builds a costly CASE per
    field), ``bulk_update`` for many."""
    states = list(states)
    if len(states) <= 4:
        for state in states:
            state.save(update_fields=fields)
    else:
        NodeState.objects.bulk_update(states, fields, batch_size=200)


_ACK_FIELDS = ["acked_version", "acked_digest", "acked_at", "rejected_version", "rejection_reason",
               "rejection_error", "rejected_at", "version_floor", "applied_version", "applied_digest",
               "applied_seen_at"]
_HEARTBEAT_FIELDS = ["heartbeat_at", "agent_started_at", "agent_hostname", "agent_pid", "outbox_pending",
                     "outbox_dropped", "applied_version", "applied_digest", "applied_seen_at"]


def store_acks(acks: Sequence[Ack], now: datetime, result: IngestResult) -> None:
    """Store acks and move each node's ack state forward; must run inside a transaction."""
    ConfigAck.objects.bulk_create(
        [ConfigAck(node_name=a.node, sequence=a.sequence, version=a.version, digest=a.digest or "",
                   status=a.status, reason=a.reason, error=a.error, applied_version=a.applied_version,
                   sent_at=a.sent_at) for a in acks],
        ignore_conflicts=True,
    )
    result.acks += len(acks)
    states = _lock_states(ack.node for ack in acks)
    for ack in sorted(acks, key=lambda a: (a.node, a.sequence)):
        apply_ack(states[ack.node], ack)
    _save_states(states.values(), _ACK_FIELDS)


def apply_ack(state: NodeState, ack: Ack) -> None:
    """Fold one ack into ``state`` (in memory). Versions only move forward.

    An applied ack raises ``acked_version``/``acked_digest``; a rejection is recorded with its reason. A
    ``stale``/``version_conflict`` rejection from an agent that already runs a version at or above the
    dashboard's counter (a restored database) raises ``version_floor`` so the next document outnumbers it.
    """
    if ack.status == "applied":
        if ack.version is not None and ack.version >= state.acked_version:
            state.acked_version = ack.version
            state.acked_digest = ack.digest or ""
            state.acked_at = ack.sent_at
    else:
        state.rejected_version = ack.version
        state.rejection_reason = ack.reason
        state.rejection_error = ack.error
        state.rejected_at = ack.sent_at
        log.warning("node %s rejected config version %s: %s: %s", ack.node, ack.version, ack.reason, ack.error)
        if ack.reason in {"stale", "version_conflict"} and ack.applied_version >= state.desired_version:
            state.version_floor = max(state.version_floor, ack.applied_version)
    _observe_applied(state, ack.sent_at, ack.applied_version, ack.applied_digest)


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
    states = _lock_states(newest)
    for node, hb in newest.items():
        state = states[node]
        if state.heartbeat_at is None or hb.sent_at >= state.heartbeat_at:
            state.heartbeat_at = hb.sent_at
            state.agent_started_at = hb.started_at
            state.agent_hostname = hb.hostname[:255]
            state.agent_pid = hb.pid
            state.outbox_pending = hb.outbox_pending
            state.outbox_dropped = hb.outbox_dropped
        _observe_applied(state, hb.sent_at, hb.applied_version, hb.applied_digest)
    _save_states(states.values(), _HEARTBEAT_FIELDS)
    result.heartbeats += len(heartbeats)
