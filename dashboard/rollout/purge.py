"""Dashboard side of a release purge: an explicit, confirmed, audited request to remove a retired release's keys.

``request_purge(release, confirm=...)`` refuses unless the release is ``retired`` and the operator typed its namespace;
it then writes an audit entry (``object_type`` ``dashboard.purgerequest``, ``request_id`` = the purge id, ``after`` =
what is removed: tenant, model, namespace, engine, the regex, the nodes asked) and sends one signed
``agent.contract.messages.PurgeRequest`` per node to ``agent.<node>`` (Celery task ``agent.purge_namespace``). The nodes
asked are the ones running any instance of the tenant (their agents hold the node signing secret and the Store
endpoints; a client of the tenant sees every key of the tenant).

Each agent runs ``agent.node.purge.handle_purge`` — ``remove_by_regex`` with the regex of ``agent.contract.keys`` — and
answers with task ``dashboard.purge_result`` (queue ``dashboard.ingest``), which ``record_purge_result``
stores as another audit entry (``dashboard.purgeresult``, actor ``agent:<node>``, ``after`` = node, removed
count, error). ``purge_status`` reads both back; the audit log is the record, so no extra table is needed.

A confirmed delete of a release purges the namespace it leaves the same way (``request_reserved_purge``, called
after the commit by ``dashboard.signals``): the namespace is reserved forever (``tenants.models.ReservedNamespace``),
so the purge never meets a later release; its request and results are audited under the deleted release's id.

The Celery task is defined here; a worker registers it when it imports this module (``dashboard/tasks.py``
should ``from dashboard.rollout.purge import purge_result``).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agent.contract.keys import release_keys_regex
from agent.contract.messages import (
    PURGE_RESULT_TASK,
    PURGE_TASK,
    MessageError,
    PurgeRequest,
    PurgeResult,
    node_queue,
    signed_request,
)
from agent.contract.sealing import seal
from dashboard.celery import app
from tenants.audit import current_context
from tenants.choices import AuditAction, Engine, ReleaseState
from tenants.models import AuditEntry, Node, Release, ReservedNamespace, Tenant

log = logging.getLogger("kvpool.dashboard.purge")

REQUEST_TYPE = "dashboard.purgerequest"
RESULT_TYPE = "dashboard.purgeresult"


class PurgeError(Exception):
    """A purge cannot be requested (no agent could carry it out); the message says why."""


def key_model(release: Release) -> str:
    """The model part of the release's keys: vLLM model name (vLLM 0.33.0) or served model name (SGLang 0.5.23)."""
    model = release.model
    return model.vllm_model_name if release.engine == Engine.VLLM else model.served_model_name


def purge_nodes(release: Release) -> list[Node]:
    """Nodes whose agents are asked: every node running an instance of a release of the release's tenant."""
    return list(Node.objects.filter(assignments__release__model__tenant_id=release.model.tenant_id)
                .distinct().order_by("name"))


def _write_entry(object_type: str, object_id: str, object_repr: str, purge_id: str, after: dict[str, Any],
                 actor_repr: str | None = None) -> AuditEntry:
    context = current_context()
    user, context_actor = context.resolve_actor()
    # The tenant whose members see the entry: named by a request, the request's for a result.
    tenant_pk = (Tenant.objects.filter(tenant_id=after["tenant_id"]).values_list("pk", flat=True).first()
                 if after.get("tenant_id") else
                 AuditEntry.objects.filter(object_type=REQUEST_TYPE, request_id=purge_id)
                 .values_list("tenant_pk", flat=True).first())
    return AuditEntry.objects.create(
        actor=user if actor_repr is None else None, actor_repr=(actor_repr or context_actor)[:255],
        action=AuditAction.CREATE if object_type == REQUEST_TYPE else AuditAction.DELETE,
        object_type=object_type, object_id=object_id, object_repr=object_repr[:255],
        before=None, after=after, request_id=purge_id, tenant_pk=tenant_pk,
    )


def _keys_repr(tenant_id: str, served_model_name: str, namespace: str) -> str:
    return f"{tenant_id}/{served_model_name}/{namespace} keys"


def _send(purge_id: str, object_id: str, object_repr: str, nodes: list[Node], fields: dict[str, Any]) -> None:
    """Audit the request (``fields`` + the nodes asked), then send one signed ``PurgeRequest`` per node; a node the
    broker does not reach is recorded as a failed result."""
    issued_at = timezone.now().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with transaction.atomic():
        _write_entry(REQUEST_TYPE, object_id, object_repr, purge_id, {
            "purge_id": purge_id, **fields, "nodes": [node.name for node in nodes], "issued_at": issued_at})
    for node in nodes:
        request = PurgeRequest(purge_id=purge_id, node=node.name, tenant_id=fields["tenant_id"],
                               engine=fields["engine"], namespace=fields["namespace"], model=fields["model"],
                               served_model_name=fields["served_model_name"], issued_at=issued_at)
        try:
            envelope = seal(signed_request(request, node.signing_secret), node.signing_secret, node=node.name)
            app.send_task(PURGE_TASK, args=[envelope], argsrepr=f"[<purge {purge_id} node={node.name}>]",
                          queue=node_queue(node.name), expires=settings.KVPOOL_PUSH_EXPIRES_SECONDS, retry=True,
                          retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.5,
                                        "interval_max": 0.5})
        except Exception as exc:  # broker down: record it as this node's answer
            log.error("purge %s: could not send to node %s: %s", purge_id, node.name, exc)
            _write_entry(RESULT_TYPE, object_id, object_repr, purge_id,
                         {"purge_id": purge_id, "node": node.name, "removed": 0,
                          "error": f"not sent: {type(exc).__name__}: {exc}"[:2000]},
                         actor_repr="system")
    log.info("purge %s of %s requested from nodes %s (regex %s)", purge_id, fields["namespace"],
             [n.name for n in nodes], fields["regex"])


def request_purge(release: Release, *, confirm: str) -> str:
    """Ask the agents of the release's tenant to remove the release's keys; returns the purge id.

    Raises ``ValidationError`` keyed ``confirm`` when ``confirm`` is not the release namespace, keyed ``state``
    when the release is not retired, and ``PurgeError`` when no node runs an instance of the tenant. The
    request is audited before anything is sent; a node the broker does not reach is recorded as a failed
    result (its error says so), so the page never waits for it. A request an agent has not taken within
    ``KVPOOL_PUSH_EXPIRES_SECONDS`` expires in its queue (a namespace of a never-served release may be reused
    later; a stale purge must not reach it): the node then shows as not answered and the operator may ask again.
    """
    if release.state != ReleaseState.RETIRED:
        raise ValidationError({"state": (
            f"Release '{release.namespace}' is {release.state}: only a retired release's keys can be purged "
            "(purging a live namespace throws away the cache its instances read). Retire it first.")})
    if confirm.strip() != release.namespace:
        raise ValidationError({"confirm": f"Type the release namespace '{release.namespace}' to confirm the purge."})
    nodes = purge_nodes(release)
    if not nodes:
        raise PurgeError(
            f"No node runs an instance of tenant '{release.model.tenant.tenant_id}', so no agent can remove the "
            f"keys of '{release.namespace}'. They leave the Store through normal eviction.")
    model = key_model(release)
    tenant_id, served_model_name = release.model.tenant.tenant_id, release.model.served_model_name
    purge_id = uuid.uuid4().hex
    _send(purge_id, str(release.pk), _keys_repr(tenant_id, served_model_name, release.namespace), nodes, {
        "release": release.pk, "tenant_id": tenant_id, "served_model_name": served_model_name,
        "namespace": release.namespace, "engine": release.engine, "model": model,
        "regex": release_keys_regex(release.engine, release.namespace, model)})
    return purge_id


def request_reserved_purge(reservation: ReservedNamespace) -> str:
    """Ask the agents of the reservation's tenant to remove the keys of a deleted release's namespace (the
    release's delete was confirmed and audited; its namespace stays reserved forever, so this purge can never
    reach a later release). Returns the purge id and stores it on the reservation; "" when no node runs an
    instance of the tenant (the keys then leave the Store through normal eviction) or the regex cannot be built.
    """
    nodes = list(Node.objects.filter(assignments__release__model__tenant__tenant_id=reservation.tenant_id)
                 .distinct().order_by("name"))
    model = reservation.vllm_model_name if reservation.engine == Engine.VLLM else reservation.served_model_name
    try:
        regex = release_keys_regex(reservation.engine, reservation.namespace, model)
    except ValueError as exc:
        log.error("no purge for reserved namespace %s: %s", reservation, exc)
        return ""
    if not nodes:
        log.info("no node runs an instance of tenant %s: the keys of deleted release %s leave through eviction",
                 reservation.tenant_id, reservation.namespace)
        return ""
    purge_id = uuid.uuid4().hex
    _send(purge_id, str(reservation.release_pk),
          _keys_repr(reservation.tenant_id, reservation.served_model_name, reservation.namespace), nodes, {
              "release": reservation.release_pk, "reserved_namespace": reservation.pk, "reason": "release deleted",
              "tenant_id": reservation.tenant_id, "served_model_name": reservation.served_model_name,
              "namespace": reservation.namespace, "engine": reservation.engine, "model": model, "regex": regex})
    reservation.purge_id = purge_id
    reservation.save(update_fields=["purge_id", "updated_at"])
    return purge_id


def record_purge_result(raw: Any) -> bool:
    """Store one agent's ``PurgeResult``; returns False for a duplicate or an answer nobody asked for.

    Trusts ``raw``: the task ``purge_result`` verifies the agent's signature first.

    Raises ``agent.contract.messages.MessageError`` for a message that is not a purge result (named field).
    """
    try:
        result = PurgeResult.model_validate(raw)
    except Exception as exc:
        raise MessageError(f"invalid purge result: {exc}") from None
    with transaction.atomic():
        request = AuditEntry.objects.filter(object_type=REQUEST_TYPE, request_id=result.purge_id).first()
        if request is None or result.node not in (request.after or {}).get("nodes", []):
            log.warning("purge result %s from node %s matches no request; ignored", result.purge_id, result.node)
            return False
        if AuditEntry.objects.filter(object_type=RESULT_TYPE, request_id=result.purge_id,
                                     after__node=result.node).exists():
            return False
        # The release may be gone (a confirmed delete purges the namespace it leaves): the request entry names it.
        _write_entry(RESULT_TYPE, request.object_id, request.object_repr, result.purge_id,
                     {"purge_id": result.purge_id, "node": result.node, "removed": result.removed,
                      "error": result.error, "sent_at": result.sent_at.isoformat()},
                     actor_repr=f"agent:{result.node}")
    log.info("purge %s: node %s removed %d objects%s", result.purge_id, result.node, result.removed,
             f" (error: {result.error})" if result.error else "")
    return True


@app.task(name=PURGE_RESULT_TASK, ignore_result=True)
def purge_result(result: dict[str, Any]) -> bool:
    """Celery task: an agent's answer to a purge request, stored (``record_purge_result``) only when signed by
    the node it names and fresh (``dashboard.telemetry.agent_auth.accept``: a refusal is logged and counted)."""
    from dashboard.telemetry.agent_auth import accept

    if not accept(result, source="purge result"):
        return False
    try:
        return record_purge_result(result)
    except MessageError as exc:
        log.warning("dropped invalid purge result: %s", exc)
        return False


@dataclass
class NodePurge:
    """One node's answer (``removed`` None while it has not answered)."""

    node: str
    removed: int | None = None
    error: str = ""
    answered_at: datetime | None = None


@dataclass
class PurgeStatus:
    """A purge request and the answers so far; ``total_removed`` sums the nodes' counts."""

    purge_id: str
    namespace: str
    regex: str
    requested_at: datetime
    requested_by: str
    nodes: list[NodePurge] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(node.removed is not None or node.error for node in self.nodes)

    @property
    def total_removed(self) -> int:
        return sum(node.removed or 0 for node in self.nodes)

    @property
    def failed(self) -> list[NodePurge]:
        return [node for node in self.nodes if node.error]


def _status(request: AuditEntry, results: list[AuditEntry]) -> PurgeStatus:
    after = request.after or {}
    nodes = {name: NodePurge(name) for name in after.get("nodes", [])}
    for entry in results:
        data = entry.after or {}
        node = nodes.get(data.get("node"))
        if node is not None and node.answered_at is None:
            node.removed = int(data.get("removed") or 0) if not data.get("error") else None
            node.error = data.get("error") or ""
            node.answered_at = entry.timestamp
    return PurgeStatus(request.request_id, after.get("namespace", ""), after.get("regex", ""), request.timestamp,
                       request.actor_repr, list(nodes.values()))


def purge_status(purge_id: str) -> PurgeStatus | None:
    """The status of one purge (None for an unknown id)."""
    request = AuditEntry.objects.filter(object_type=REQUEST_TYPE, request_id=purge_id).first()
    if request is None:
        return None
    results = list(AuditEntry.objects.filter(object_type=RESULT_TYPE, request_id=purge_id).order_by("timestamp", "pk"))
    return _status(request, results)


def purges_for_release(release: Release | ReservedNamespace) -> list[PurgeStatus]:
    """Every purge requested for ``release`` (or for the deleted release a reservation names), newest first."""
    object_id = str(release.release_pk if isinstance(release, ReservedNamespace) else release.pk)
    requests = list(AuditEntry.objects.filter(object_type=REQUEST_TYPE, object_id=object_id)
                    .order_by("-timestamp", "-pk"))
    results: dict[str, list[AuditEntry]] = {}
    entries = AuditEntry.objects.filter(object_type=RESULT_TYPE, object_id=object_id).order_by("timestamp", "pk")
    for entry in entries:
        results.setdefault(entry.request_id, []).append(entry)
    return [_status(request, results.get(request.request_id, [])) for request in requests]
