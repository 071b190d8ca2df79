"""Trust of agent → dashboard messages: who signed each one, whether it is fresh; counting what is refused.

Acks, reports, heartbeats (``dashboard.ingest``) and purge results (``dashboard.purge_result``) are signed by
the agent when it sends them (``agent.contract.signing.sign_message``) with the signing secret of its node — the same
``tenants.models.Node.signing_secret`` that signs the node's config documents. ``check`` verifies a message
exactly as received, before the schema or anything stored looks at it:

1. a JSON object carrying a ``signature`` — else ``invalid`` / ``unsigned``;
2. ``node`` names a registered node — else ``unknown_node`` (there is no key to verify with);
3. the HMAC matches that node's secret — else ``wrong_node`` when another registered node's secret produced it
   (an agent started with the wrong ``--node`` or secret file, or one node speaking for another), else
   ``bad_signature`` (tampered, or signed with a retired secret);
4. ``signed_at`` lies within [now − ``KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS``, now +
   ``KVPOOL_AGENT_CLOCK_SKEW_SECONDS``] — else ``replayed`` (a captured message sent again, or one that
   waited in the broker longer than the window) / ``clock_skew`` (the agent's clock runs ahead).

After the schema (``invalid``), ``check_horizon`` refuses an ack or report whose ``sent_at`` is older than the
dashboard keeps receipts (``KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS``, see ``dashboard.telemetry.rollup``) as ``expired``:
its ``(node, sequence)`` receipt may already be gone, so a replay could not be told from a first delivery; and
``check_not_ahead`` refuses any message whose ``sent_at`` lies further ahead than ``signed_at`` may
(``clock_skew``: a report dated years ahead would stay every "newest sample" query's answer until then).
Inside that horizon a replay is the ``duplicate`` of a stored ``(node, sequence)`` and changes nothing (heartbeats:
only a newer ``sent_at`` moves a node's state; purge results: one per node and purge).

Ingest also refuses single rows of an accepted report that the node's applied document does not carry
(``scope_not_in_document``, ``instance_not_in_document``, counted per row: ``dashboard.telemetry.report_scope``).

A refused message is logged (WARNING, with the reason and the node it named), stores nothing, and is counted
per reason and registered node named in ``dashboard.models.MessageRejection`` — in the transaction that refused
it — which ``/metrics`` exposes as ``kvpool_agent_messages_rejected_total{reason,node}`` (``node=""``: none or an
unregistered one) and the overview lists as warnings for :data:`NODE_TROUBLE` reasons.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agent.contract import signing
from agent.contract.messages import Ack, Heartbeat, Report
from dashboard.models import MessageRejection

log = logging.getLogger("kvpool.dashboard.agent_auth")

#: Why a message was refused (label ``reason`` of ``kvpool_agent_messages_rejected_total``).
REASONS = {
    "unsigned": "no signature",
    "unknown_node": "names a node the registry does not know",
    "bad_signature": "HMAC does not match the named node's secret (tampered, or an old secret)",
    "wrong_node": "signed with another registered node's secret",
    "replayed": "signed longer ago than KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS",
    "clock_skew": "signed further in the future than KVPOOL_AGENT_CLOCK_SKEW_SECONDS",
    "expired": "ack or report older than the dashboard keeps receipts (KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS)",
    "invalid": "not a message of the schema",
    "duplicate": "an ack or report already stored (re-delivered or replayed)",
    "task_not_allowed": "a task other than the agents' own not signed by the dashboard (dashboard.task_queues)",
    # Rows of an accepted report (counted per row; the report's other rows are stored): see
    # dashboard.telemetry.report_scope.
    "scope_not_in_document": "report rows of cache scopes the node's applied config document does not carry",
    "instance_not_in_document": "report instance stats of instances the node's applied config document does not "
                                "carry",
}
#: Reasons that count rows of accepted reports, not messages (``dashboard.telemetry.report_scope``).
ROW_REASONS = frozenset({"scope_not_in_document", "instance_not_in_document"})
#: Messages per batch whose bad signature is tried against every other node's secret (for ``wrong_node``);
#: bounds the HMACs a flood of forged messages costs. Later ones are ``bad_signature`` without trying.
WRONG_NODE_PROBES = 16


class Refused(Exception):
    """A message is not accepted; ``reason`` is a key of ``REASONS``, the text says what was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def max_age() -> timedelta:
    """How long after ``signed_at`` a message is accepted (``KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS``, 6 h by
    default). It bounds how long a message may wait in the broker (an ingest outage); the agent's outbox
    backlog is signed when it is sent, so a broker outage does not age it."""
    return timedelta(seconds=settings.KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS)


def clock_skew() -> timedelta:
    """How far ``signed_at`` may lie ahead of the dashboard's clock (``KVPOOL_AGENT_CLOCK_SKEW_SECONDS``, 5 min
    by default)."""
    return timedelta(seconds=settings.KVPOOL_AGENT_CLOCK_SKEW_SECONDS)


class NodeKeys:
    """Signing secrets of the registered nodes a batch names, read with one query.

    ``secret(name)`` is the key to verify a message of ``name`` with (None: not registered);
    ``signer(raw, claimed)`` names the other registered node whose secret produced ``raw``'s signature, reading
    every node's secret once and trying at most ``WRONG_NODE_PROBES`` messages per instance.
    """

    def __init__(self, names: Iterable[str]) -> None:
        from tenants.models import Node

        wanted = {name for name in names if isinstance(name, str)}
        if connection.vendor == "postgresql":  # one array parameter: no statement of N placeholders to parse
            table = connection.ops.quote_name(Node._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT name, signing_secret FROM {table} WHERE name = ANY(%s::varchar[])",
                               [sorted(wanted)])
                self._secrets = dict(cursor.fetchall())
        else:
            self._secrets = dict(Node.objects.filter(name__in=wanted).values_list("name", "signing_secret"))
        self._everyone: list[tuple[str, str]] | None = None
        self._probes_left = WRONG_NODE_PROBES

    @classmethod
    def for_messages(cls, messages: Iterable[Any]) -> NodeKeys:
        """Keys of the nodes ``messages`` (raw dicts) name."""
        return cls(raw.get("node") for raw in messages if isinstance(raw, Mapping))

    def secret(self, name: str) -> str | None:
        """The signing secret of registered node ``name``, else None."""
        return self._secrets.get(name)

    def signer(self, raw: Mapping[str, Any], claimed: str) -> str | None:
        """The registered node other than ``claimed`` whose secret signed ``raw``, else None."""
        if self._probes_left <= 0:
            return None
        self._probes_left -= 1
        if self._everyone is None:
            from tenants.models import Node

            self._everyone = list(Node.objects.values_list("name", "signing_secret"))
        return signing.signer_among(raw, ((name, key) for name, key in self._everyone if name != claimed))


def _signed_at(raw: Mapping[str, Any]) -> datetime:
    value = raw.get(signing.SIGNED_AT_FIELD)
    if not isinstance(value, str):
        raise Refused("invalid", "signed_at: missing (a signed message carries its signing time)")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise Refused("invalid", f"signed_at: {value[:40]!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        raise Refused("invalid", f"signed_at: {value[:40]!r} has no time zone")
    return moment


def check(raw: Any, keys: NodeKeys, now: datetime) -> None:
    """Accept ``raw`` (a message as decoded from the broker) or raise ``Refused`` (steps 1-4 of the module
    docstring). ``keys`` must hold the node ``raw`` names; ``now`` is the dashboard's time (aware)."""
    if not isinstance(raw, Mapping):
        raise Refused("invalid", f"expected a JSON object, got {type(raw).__name__}")
    signature = raw.get(signing.SIGNATURE_FIELD)
    if not isinstance(signature, str) or not signature:
        raise Refused("unsigned", "the message carries no signature")
    node = raw.get("node")
    if not isinstance(node, str) or not node:
        raise Refused("invalid", "node: missing (a signed message names its sender)")
    secret = keys.secret(node)
    if secret is None:
        raise Refused("unknown_node", f"node {node!r} is not registered, so nothing can verify its signature")
    try:
        signing.verify(raw, secret)
    except signing.SignatureError as exc:
        signer = keys.signer(raw, node) if exc.reason == "bad_signature" else None
        if signer is not None:
            raise Refused("wrong_node", f"names node {node!r} but is signed with node {signer!r}'s secret "
                                        "(agent started with another node's name or secret file?)") from None
        raise Refused(exc.reason, f"{exc} for node {node!r}") from None
    signed_at = _signed_at(raw)
    if signed_at < now - max_age():
        raise Refused("replayed", f"signed at {signed_at.isoformat()}, more than {max_age()} ago")
    if signed_at > now + clock_skew():
        raise Refused("clock_skew", f"signed at {signed_at.isoformat()}, more than {clock_skew()} ahead of the "
                                    "dashboard's clock")


def check_horizon(message: Ack | Report, now: datetime) -> None:
    """Raise ``Refused("expired")`` when an ack or report is older than the receipts the dashboard keeps."""
    horizon = timedelta(seconds=settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS)
    if message.sent_at < now - horizon:
        raise Refused("expired", f"{message.kind} {message.sequence} was sent at {message.sent_at.isoformat()}, "
                                 f"before the {horizon} the dashboard keeps receipts, so a replay could not be "
                                 "told apart")


def check_not_ahead(message: Ack | Report | Heartbeat, now: datetime) -> None:
    """Raise ``Refused("clock_skew")`` when a message's ``sent_at`` lies further ahead of ``now`` than
    ``signed_at`` may (``clock_skew``): an agent stamps ``sent_at`` before it signs, so only a forging or broken
    agent sends one later. Accepted, a report dated years ahead would stay the newest sample of its scopes (what
    the pages, ``/metrics`` and the budget shares read) and a heartbeat would keep its node looking alive."""
    if message.sent_at > now + clock_skew():
        raise Refused("clock_skew", f"{message.kind} was sent at {message.sent_at.isoformat()}, more than "
                                    f"{clock_skew()} ahead of the dashboard's clock")


def describe(raw: Any) -> tuple[str, str]:
    """``(kind, node)`` of a raw message for logs (``?`` when absent; the node is what it *claims*)."""
    if not isinstance(raw, Mapping):
        return "?", "?"
    return str(raw.get("kind", "?"))[:32], str(raw.get("node", "?"))[:128]


@dataclass
class Tally:
    """Refusals of one batch per (reason, node named), with the newest refusal's text; ``record`` stores them.

    ``source`` prefixes the log lines (``ingest``, ``purge result``), written to ``logger``.
    """

    source: str = "agent message"
    logger: logging.Logger = log
    named: Counter[tuple[str, str]] = field(default_factory=Counter)
    last: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def counts(self) -> Counter[str]:
        """Refusals per reason."""
        per_reason: Counter[str] = Counter()
        for (reason, _), n in self.named.items():
            per_reason[reason] += n
        return per_reason

    def add(self, reason: str, node: str, detail: str, n: int = 1) -> None:
        """Count ``n`` refusals for ``reason`` (the node the message named, and why)."""
        if n <= 0:
            return
        self.named[(reason, node)] += n
        self.last[(reason, node)] = detail

    def refuse(self, raw: Any, exc: Refused) -> None:
        """Log (WARNING) and count one refused message."""
        kind, node = describe(raw)
        self.logger.warning("%s: refused %s message naming node %r: %s: %s", self.source, kind, node, exc.reason,
                            exc)
        self.add(exc.reason, node, str(exc))

    def record(self, now: datetime) -> None:
        """Add the counts to ``MessageRejection``, one row per (reason, registered node named, else ""), in
        sorted order so concurrent writers cannot deadlock; call inside the transaction whose outcome they
        describe."""
        if not self.named:
            return
        from tenants.models import Node

        names = {node for _, node in self.named}
        registered = set(Node.objects.filter(name__in=names).values_list("name", flat=True))
        rows: Counter[tuple[str, str]] = Counter()
        newest: dict[tuple[str, str], tuple[str, str]] = {}
        for (reason, node), n in self.named.items():
            label = node if node in registered else ""
            rows[(reason, label)] += n
            newest[(reason, label)] = (node, self.last[(reason, node)])
        keys = sorted(rows)
        MessageRejection.objects.bulk_create([MessageRejection(reason=r, node=n) for r, n in keys],
                                             ignore_conflicts=True)
        for reason, label in keys:
            node, detail = newest[(reason, label)]
            MessageRejection.objects.filter(reason=reason, node=label).update(
                count=F("count") + rows[(reason, label)], last_at=now, last_node=node[:128],
                last_error=detail[:2000])


def count_refused(reason: str, detail: str, *, n: int = 1, node: str = "?", now: datetime | None = None) -> None:
    """Count ``n`` refusals outside a batch (e.g. malformed ingest tasks) in their own transaction; the caller
    logs them."""
    tally = Tally()
    tally.add(reason, node, detail, n)
    with transaction.atomic():
        tally.record(now or timezone.now())


def accept(raw: Any, *, source: str = "agent message", now: datetime | None = None) -> bool:
    """Verify one message on its own (``check``, e.g. a purge result); a refusal is logged (prefixed with
    ``source``), counted in its own transaction, and answered False."""
    now = now or timezone.now()
    try:
        check(raw, NodeKeys.for_messages([raw]), now)
    except Refused as exc:
        tally = Tally(source)
        tally.refuse(raw, exc)
        with transaction.atomic():
            tally.record(now)
        return False
    return True


def rejection_counts() -> dict[str, int]:
    """Refused messages per reason since the database was created: every reason of ``REASONS`` (0 when none)
    plus any other stored one."""
    counts = dict.fromkeys(REASONS, 0)
    for reason, count in MessageRejection.objects.values_list("reason", "count"):
        counts[reason] = counts.get(reason, 0) + count
    return counts


def rejection_series() -> dict[tuple[str, str], int]:
    """Refused messages per (reason, registered node named or ""): ``("<reason>", "")`` for every reason of
    ``REASONS`` (0 when none), plus every stored row. The labels of ``kvpool_agent_messages_rejected_total``."""
    series = {(reason, ""): 0 for reason in REASONS}
    series.update({(r, n): c for r, n, c in MessageRejection.objects.values_list("reason", "node", "count")})
    return series


#: Reasons that point at one node's agent rather than at a forger: shown as warnings on the overview.
NODE_TROUBLE = {
    "bad_signature": "its agent may sign with an old secret (restart it after a rotation)",
    "wrong_node": "its agent signs with another node's secret (check --node and the secret file)",
    "clock_skew": "its agent's clock runs ahead (check NTP)",
    "replayed": "its messages arrive older than KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS (a stalled ingest or outbox)",
    "expired": "its backlog is older than the dashboard keeps receipts",
    "scope_not_in_document": "its agent reports occupancy for cache scopes its applied document does not carry "
                             "(refused: a tampered agent, or one that does not filter its ledger)",
    "instance_not_in_document": "its agent reports instances its applied document does not carry (refused)",
}


def recent_node_refusals(since: datetime) -> list[MessageRejection]:
    """Rows of :data:`NODE_TROUBLE` reasons for registered nodes refused at or after ``since``, newest first."""
    return list(MessageRejection.objects.filter(reason__in=NODE_TROUBLE, last_at__gte=since)
                .exclude(node="").order_by("-last_at"))
