"""The node agent's core, independent of Celery: verify and apply config documents, send telemetry.

``Daemon.handle_document`` is what the Celery task ``agent.apply_config`` runs for each received document:

1. open the envelope it arrives in, encrypted to this node (``agent.contract.sealing``: ``undecryptable``), then
   verify the HMAC signature over the document exactly as it came out (``unsigned`` / ``bad_signature``);
2. validate it against ``agent.contract.messages.ConfigDocument`` (``invalid`` / ``unsupported_schema``: schemas 1
   and 2 apply, ``agent.contract.messages.DOCUMENT_SCHEMAS``), check it is
   addressed to this node (``wrong_node``), fresh (``stale``: sent within the freshness window,
   ``agent.node.freshness``; a replayed document applies nowhere, a re-push of the current version does) and newer
   than the applied one (``stale`` /
   ``version_conflict``; a re-delivery of the applied version with the same digest is acked again);
3. build the new bindings — per instance, made by ``binder``; by default the connector's frozen
   ``agent.datapath.keyspace.KeySpace`` objects keyed by ``(tp_rank, request group)`` — into a new, immutable
   ``AppliedConfig``; persist the document (``applied.json`` in the state directory, written to a temporary
   file, fsynced and renamed, so the last applied version survives restarts and older documents stay refused);
   a binder or disk failure rejects the document (``apply_failed``) and keeps the old config;
4. swap ``Daemon.current`` — a single reference assignment, atomic for readers — then call the ``on_apply``
   hooks in order (the engine simulator, then ``agent.node.engines.NodeEngines``: instance directories, the node's
   store client, the engine observer); one failing hook is logged and the next still runs.

Between batches, never during one: a connector reads ``daemon.current`` (or, through ``on_apply``, gets its
``KVConnector.keyspace`` replaced) and ``KVConnector`` reads its key space **once** at the start of a batch,
keeping that object for the whole batch; a swap during the batch changes what the *next* batch sees. Nothing
is mutated, so old objects stay valid for as long as anyone holds them.

Each outcome becomes an ``Ack`` in the outbox. A background thread appends a ``Report`` (the ledger snapshot, plus
the ``report_fields`` source's per-instance engine facts) every ``report_interval`` seconds, sends a ``Heartbeat``
every ``heartbeat_interval`` seconds, and delivers the outbox whenever the broker takes it (see
``agent.node.outbox``).

Everything the daemon sends is signed **at send time** (``_send``: ``agent.contract.signing.sign_message`` with the
node's secret, ``signed_at`` = now), the outbox's backlog included: the dashboard refuses unsigned, tampered,
foreign and stale messages (``dashboard.telemetry.agent_auth``).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agent.contract import sealing, signing
from agent.contract.messages import (
    DOCUMENT_SCHEMAS,
    MAX_SEQUENCE,
    NEWER_AGENT_FIELDS,
    Ack,
    ConfigDocument,
    Heartbeat,
    InstanceSpec,
    MessageError,
    Report,
    ScopeOccupancy,
    clamped,
    parse_document,
    printable,
    utcnow,
)
from agent.contract.scope import NO_REQUEST_GROUP, CacheScope, instance_scopes
from agent.node.outbox import DEFAULT_MAX_MESSAGES, Outbox, fresh_first_sequence

log = logging.getLogger("kvpool.agent.daemon")

#: Turns one instance of a document into the immutable object a connector uses (its key space binding).
Binder = Callable[[InstanceSpec], Any]
#: Returns the ledger snapshot: a list of dicts with ``agent.contract.messages.ScopeOccupancy`` fields.
SnapshotSource = Callable[[], Iterable[Mapping[str, Any]]]
#: Hands a batch of JSON messages to the broker; raises when the broker does not take them.
Publisher = Callable[[list[dict[str, Any]]], None]
#: Returns extra ``Report`` fields for the next report (``instances``, ``unknown_topic_messages``,
#: ``unknown_topic_blocks``; see ``agent.node.engines.NodeEngines.report_fields``).
ReportFields = Callable[[], Mapping[str, Any]]


@dataclass(frozen=True)
class AppliedConfig:
    """An applied document and the bindings built from it; never modified, only replaced.

    ``bindings`` maps ``instance_id`` to what ``binder`` built for that instance (read-only mapping).
    """

    version: int
    digest: str
    document: ConfigDocument
    bindings: Mapping[str, Any]


class Rejected(Exception):
    """A received document is not applied; ``reason`` is one of ``agent.contract.messages.REJECT_REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def keyspace_binder(instance: InstanceSpec) -> Mapping[tuple[int, str], Any]:
    """Default binder: the connector's immutable ``agent.datapath.keyspace.KeySpace`` objects of one instance,
    keyed by ``(tp_rank, request group name)`` (see ``agent.datapath.keyspace.keyspaces_for_instance``), in a
    read-only mapping. Raises ``ValueError`` naming the field when the instance cannot be bound.
    """
    from agent.datapath.keyspace import keyspaces_for_instance

    return MappingProxyType(keyspaces_for_instance(instance))


def _lock_state_dir(state_dir: Path):
    """Hold an exclusive lock on ``state_dir/lock`` for the life of the process.

    Raises ``RuntimeError`` when another agent already uses the directory (two agents would each keep their
    own applied version and interleave sequences).
    """
    from agent.node.accounts import private_file

    private_file(state_dir / "lock")
    handle = open(state_dir / "lock", "a+")  # noqa: SIM115 (held, and the lock with it, until the process exits)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise RuntimeError(f"state directory {state_dir} is in use by another agent process") from None
    return handle


class Daemon:
    """One node's agent state: applied config, outbox, telemetry thread.

    Args:
        node: the node name (queue ``agent.<node>``).
        secret: the node's signing secret: HMAC key of the documents it receives and of the messages it sends.
        state_dir: directory for ``applied.json`` and ``outbox.sqlite3`` (created when missing).
        publish: sends a batch of messages to ``dashboard.ingest``; raises when the broker is unavailable.
        binder: builds the per-instance bindings (default: ``keyspace_binder``, the connector's key spaces).
        snapshot: the ledger snapshot source (default: ``ledger.snapshot`` when a ledger is given, else none:
            bound scopes report zeros).
        ledger: the node's ``agent.datapath.ledger.Ledger`` that in-process connectors record into (``self.ledger``).
        on_apply: called with the new ``AppliedConfig`` right after each swap, e.g. to set
            ``KVConnector.keyspace`` (itself one reference assignment; a batch in flight keeps the key space
            it started with); a sequence of such hooks is called in order. Their exceptions are logged (each hook
            on its own, so a failing one does not skip the next); the document stays applied.
        report_fields: extra fields of every ``Report`` (per-instance engine facts), read when it is built.
        launched_scopes: cache scopes outside the document that the node's engines really run under (hand-typed
            launch values; the simulator's ``launched_scopes``), reported beside the document's scopes.
        report_interval / heartbeat_interval: seconds between reports / heartbeats.
        outbox_max: most undelivered messages kept on disk.
        max_message_age / clock_skew: the freshness window of received documents' ``sent_at`` (seconds;
            ``agent.node.freshness``: 2 h back, 5 min ahead by default).
        single_user: every engine instance runs as the agent's account (``NodeEngines.single_user``): said in
            every heartbeat (``Heartbeat.single_user``).
    """

    def __init__(
        self,
        node: str,
        secret: str,
        state_dir: str | Path,
        *,
        publish: Publisher,
        binder: Binder = keyspace_binder,
        snapshot: SnapshotSource | None = None,
        ledger: Any | None = None,
        on_apply: Callable[[AppliedConfig], None] | Sequence[Callable[[AppliedConfig], None]] | None = None,
        report_fields: ReportFields | None = None,
        launched_scopes: Callable[[], Iterable[CacheScope]] | None = None,
        report_interval: float = 10.0,
        heartbeat_interval: float = 5.0,
        outbox_max: int = DEFAULT_MAX_MESSAGES,
        max_message_age: float | None = None,
        clock_skew: float | None = None,
        single_user: bool = False,
    ) -> None:
        from agent.node.freshness import DEFAULT_CLOCK_SKEW_SECONDS, DEFAULT_MAX_AGE_SECONDS

        if not secret:
            raise ValueError("the node's signing secret is empty")
        if report_interval <= 0 or heartbeat_interval <= 0:
            raise ValueError("report_interval and heartbeat_interval must be positive seconds")
        self.node = node
        self._secret = secret
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock_file = _lock_state_dir(self.state_dir)
        self._publish = publish
        self._binder = binder
        self.ledger = ledger
        self._snapshot = snapshot if snapshot is not None else (ledger.snapshot if ledger is not None else None)
        self._on_apply: list[Callable[[AppliedConfig], None]] = (
            [] if on_apply is None else [on_apply] if callable(on_apply) else list(on_apply))
        self._report_fields = report_fields
        self._launched_scopes = launched_scopes
        self.max_message_age = DEFAULT_MAX_AGE_SECONDS if max_message_age is None else max_message_age
        self.clock_skew = DEFAULT_CLOCK_SKEW_SECONDS if clock_skew is None else clock_skew
        self.report_interval = report_interval
        self.heartbeat_interval = heartbeat_interval
        self.single_user = single_user
        self.outbox = Outbox(self.state_dir / "outbox.sqlite3", max_messages=outbox_max,
                             first_sequence=fresh_first_sequence())
        self.started_at: datetime = utcnow()
        self._apply_lock = threading.Lock()
        self._deliver_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._broker_ok = True
        self._plain_warned = False
        self.current: AppliedConfig | None = self._load_applied()

    # --- applied state ------------------------------------------------------------------------------------

    @property
    def _applied_path(self) -> Path:
        return self.state_dir / "applied.json"

    def _load_applied(self) -> AppliedConfig | None:
        path = self._applied_path
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            applied = self._build(parse_document(raw), signing.document_digest(raw))
        except (OSError, ValueError) as exc:  # MessageError and the binders' errors are ValueErrors
            raise RuntimeError(f"cannot resume from {path}: {exc} (move the file away to accept any version "
                               "again)") from None
        log.info("node %s: resumed applied config version %d (digest %s)", self.node, applied.version,
                 applied.digest[:12])
        return applied

    def _build(self, document: ConfigDocument, digest: str) -> AppliedConfig:
        bindings = {instance.instance_id: self._binder(instance) for instance in document.instances}
        return AppliedConfig(document.version, digest, document, MappingProxyType(bindings))

    def _persist(self, raw: Mapping[str, Any]) -> None:
        path = self._applied_path
        tmp = path.with_name(path.name + ".tmp")
        # 0600: the document holds the seed and salts of every co-located tenant
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(raw, sort_keys=True))  # same text as json.dump, but the C encoder
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @property
    def applied_version(self) -> int:
        """Version of the applied document, 0 before the first one."""
        current = self.current
        return current.version if current else 0

    @property
    def applied_digest(self) -> str:
        """Digest of the applied document, "" before the first one."""
        current = self.current
        return current.digest if current else ""

    # --- documents ----------------------------------------------------------------------------------------

    def handle_document(self, raw: Any) -> dict[str, Any]:
        """Verify, validate and apply one received document; queue and return the ack (wire dict).

        Never raises for a bad document: the rejection is logged (WARNING, with the reason) and acked.
        """
        digest: str | None = None
        version: int | None = None
        with self._apply_lock:
            try:
                if not isinstance(raw, Mapping):
                    raise Rejected("invalid", f"expected a JSON object, got {type(raw).__name__}")
                raw = self._unsealed(raw)
                number = raw.get("version")
                in_bounds = isinstance(number, int) and not isinstance(number, bool) and abs(number) <= MAX_SEQUENCE
                version = number if in_bounds else None  # Ack.version's bounds: an absurd number is not echoed
                try:
                    signing.verify(raw, self._secret)
                except signing.SignatureError as exc:
                    raise Rejected(exc.reason, str(exc)) from None
                digest = signing.document_digest(raw)
                document = self._validate(raw)
                self._check_fresh(document)
                applied = self._apply(raw, document, digest)
                status, reason, error = "applied", "", ""
                if applied:
                    log.info("node %s: applied config version %d (digest %s, %d instances)", self.node,
                             document.version, digest[:12], len(document.instances))
            except Rejected as exc:
                status, reason, error = "rejected", exc.reason, str(exc)
                log.warning("node %s: rejected config document version=%s: %s: %s", self.node, version,
                            exc.reason, exc)
            ack = self._queue_ack(status, version, digest, reason, error)
        self._wake.set()
        return ack

    def _unsealed(self, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        """The document inside a sealed envelope (``agent.contract.sealing``); a plain one (a dashboard that does
        not seal yet) as it is, with a warning once. Raises ``Rejected`` (``undecryptable`` / ``invalid``)."""
        if not sealing.is_sealed(raw):
            if not self._plain_warned:
                self._plain_warned = True
                log.warning("node %s: a config document arrived unencrypted: its seeds and salts were readable on "
                            "the broker (upgrade the dashboard: it seals documents to their node)", self.node)
            return raw
        try:
            return sealing.unseal(raw, self._secret, node=self.node)
        except sealing.SealError as exc:
            raise Rejected(exc.reason, str(exc)) from None

    def _check_fresh(self, document: ConfigDocument) -> None:
        """Refuse (``stale``) a delivery sent outside the freshness window, and an unstamped one on an agent that
        has applied nothing (``agent.node.freshness``)."""
        from agent.node.freshness import NotFresh, check_fresh

        if not document.sent_at:
            if self.current is None:
                raise Rejected("stale", "document carries no sent_at stamp and this agent has applied nothing: an "
                                        "old document replayed cannot be told from a current one (upgrade the "
                                        "dashboard: it stamps every delivery)")
            return
        try:
            check_fresh(document.sent_at, what="sent_at", max_age=self.max_message_age, skew=self.clock_skew)
        except NotFresh as exc:
            raise Rejected("stale", str(exc)) from None

    def _validate(self, raw: Mapping[str, Any]) -> ConfigDocument:
        if raw.get("schema") not in DOCUMENT_SCHEMAS:
            raise Rejected("unsupported_schema", f"schema {raw.get('schema')!r} is not one of "
                                                 f"{', '.join(map(str, DOCUMENT_SCHEMAS))}")
        try:
            document = parse_document(raw)
        except MessageError as exc:
            raise Rejected("invalid", str(exc)) from None
        if document.node != self.node:
            raise Rejected("wrong_node", f"document is for node {document.node!r}, this is {self.node!r}")
        return document

    def _apply(self, raw: Mapping[str, Any], document: ConfigDocument, digest: str) -> bool:
        """Swap in ``document``; False when it was already applied (a re-delivery)."""
        current = self.current
        if current is not None:
            if document.version < current.version:
                raise Rejected("stale", f"version {document.version} is older than applied version "
                                        f"{current.version}")
            if document.version == current.version:
                if digest == current.digest:
                    return False
                raise Rejected("version_conflict", f"version {document.version} is already applied with "
                                                   f"digest {current.digest[:12]}, this one has {digest[:12]}")
        try:
            new = self._build(document, digest)
            self._persist(raw)
        except Exception as exc:  # a binder or the disk failed: keep running the old config
            log.exception("node %s: applying version %d failed", self.node, document.version)
            raise Rejected("apply_failed", f"{type(exc).__name__}: {exc}") from None
        self.current = new
        self.run_hooks(new)
        return True

    def run_hooks(self, applied: AppliedConfig) -> None:
        """Call every ``on_apply`` hook with ``applied`` in order (also what the command line does at start for a
        document resumed from the state directory); a hook's exception is logged and the next hook still runs."""
        for hook in self._on_apply:
            try:
                hook(applied)
            except Exception:  # the swap happened; a failing hook must not make the ack lie
                log.exception("node %s: on_apply hook %s failed for version %d", self.node,
                              getattr(hook, "__qualname__", hook), applied.version)

    def _queue_ack(self, status: str, version: int | None, digest: str | None, reason: str,
                   error: str) -> dict[str, Any]:
        built: list[dict[str, Any]] = []

        def build(sequence: int) -> dict[str, Any]:
            built.append(Ack(node=self.node, sequence=sequence, sent_at=utcnow(), status=status,
                             version=version, digest=digest, reason=reason, error=printable(error, 2000),
                             applied_version=self.applied_version,
                             applied_digest=self.applied_digest).to_wire())
            return built[-1]

        self.outbox.add(build)
        return built[-1]

    # --- telemetry ----------------------------------------------------------------------------------------

    def occupancy(self) -> list[dict[str, Any]]:
        """Ledger snapshot merged with the bound scopes (a bound scope without traffic reports zeros), restricted
        to the scopes of the applied document's instances (``agent.contract.scope.instance_scopes``): the
        dashboard refuses any other row, so blocks a release left behind on leaving the document (retired, not yet
        purged) or a ledger restored from an older document are not reported. No document, no rows. The
        ``launched_scopes`` source adds the scopes the node's engines really run under when launched by hand with
        another namespace than their instance's (the simulator's launch overrides): the dashboard keeps those rows
        when the namespace is not one the registry has for that tenant and served model
        (``dashboard.telemetry.report_scope``), so the mistyped namespace shows with its lookups and hits.

        Each entry has the ``ScopeOccupancy`` fields, one per ``CacheScope``.
        """
        entries: dict[CacheScope, dict[str, Any]] = {}
        allowed: set[CacheScope] = set()
        current = self.current
        if current is not None:
            for instance in current.document.instances:
                groups = [group.name for group in instance.request_groups]
                allowed |= instance_scopes(instance.tenant_id, instance.served_model_name, instance.namespace,
                                           groups)
                for group in groups or [NO_REQUEST_GROUP]:
                    scope = CacheScope(instance.tenant_id, instance.served_model_name, instance.namespace, group)
                    entries.setdefault(scope, scope._asdict())
            if self._launched_scopes is not None:
                allowed |= set(self._launched_scopes())
        if self._snapshot is not None:
            for row in self._snapshot():
                item = ScopeOccupancy.model_validate(clamped(ScopeOccupancy, dict(row)))  # counters past MAX_COUNT
                if item.scope in allowed:
                    entries[item.scope] = item.model_dump()
        return [ScopeOccupancy.model_validate(entry).model_dump() for entry in entries.values()]

    def _unread(self, part: str) -> frozenset[str]:
        """The fields of ``part`` (``agent.contract.messages.NEWER_AGENT_FIELDS``) the dashboard that rendered the
        applied document does not read (``ConfigDocument.dashboard_reads``): left out of what is sent."""
        current = self.current
        reads = set(current.document.dashboard_reads) if current is not None else set()
        return frozenset(name for name in NEWER_AGENT_FIELDS[part] if name not in reads)

    def report_now(self) -> int:
        """Append one occupancy report to the outbox (with the ``report_fields`` source's fields); returns its
        sequence."""
        extra = dict(self._report_fields()) if self._report_fields is not None else {}
        scopes = self.occupancy()
        unread = self._unread("report_row")

        def build(sequence: int) -> dict[str, Any]:
            wire = Report(node=self.node, sequence=sequence, sent_at=utcnow(), started_at=self.started_at,
                          applied_version=self.applied_version, scopes=scopes, **extra).to_wire()
            for row in wire["scopes"]:
                for name in unread:
                    row.pop(name, None)
            return wire

        return self.outbox.add(build)

    def heartbeat_now(self) -> bool:
        """Send one heartbeat directly (never buffered); returns whether the broker took it."""
        heartbeat = Heartbeat(node=self.node, sent_at=utcnow(), started_at=self.started_at,
                              applied_version=self.applied_version, applied_digest=self.applied_digest,
                              hostname=socket.gethostname(), pid=os.getpid(), outbox_pending=len(self.outbox),
                              outbox_dropped=self.outbox.dropped, single_user=self.single_user).to_wire()
        for name in self._unread("heartbeat"):
            heartbeat.pop(name, None)
        return self._send([heartbeat])

    def _send(self, messages: list[dict[str, Any]]) -> bool:
        """Sign ``messages`` now (a fresh ``signed_at`` on every attempt) and publish them; False when the broker
        did not take them (logged once per outage)."""
        now = utcnow()
        signed = [signing.sign_message(message, self._secret, now=now) for message in messages]
        try:
            self._publish(signed)
        except Exception as exc:  # broker down: keep the messages, log once per outage
            if self._broker_ok:
                log.warning("node %s: broker unavailable, buffering telemetry (%s: %s)", self.node,
                            type(exc).__name__, exc)
            self._broker_ok = False
            return False
        if not self._broker_ok:
            log.info("node %s: broker reachable again", self.node)
        self._broker_ok = True
        return True

    def flush(self) -> int:
        """Deliver the outbox; returns how many messages the broker took (0 while it is down)."""
        with self._deliver_lock:
            delivered = 0

            def send(batch: list[dict[str, Any]]) -> None:
                if not self._send(batch):
                    raise ConnectionError("broker unavailable")

            try:
                delivered = self.outbox.deliver(send)
            except ConnectionError:
                pass
            return delivered

    # --- background thread --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the telemetry thread (reports, heartbeats, outbox delivery)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"kvpool-agent-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the telemetry thread and make a last delivery attempt; close the outbox."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush()
        self.outbox.close()
        self._lock_file.close()

    def _run(self) -> None:
        next_report = time.monotonic()
        next_heartbeat = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_report:
                    self.report_now()
                    next_report = now + self.report_interval
                if len(self.outbox):
                    self.flush()
                if now >= next_heartbeat:  # after the flush: its outbox_pending counts what could not be sent
                    self.heartbeat_now()
                    next_heartbeat = now + self.heartbeat_interval
            except Exception:  # never let the telemetry thread die; the next tick retries
                log.exception("node %s: telemetry tick failed", self.node)
            wait = max(0.0, min(next_report, next_heartbeat) - time.monotonic())
            self._wake.wait(min(wait, 1.0))
            self._wake.clear()
