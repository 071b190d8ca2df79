"""Config documents: render from the registry, version, sign, send to ``agent.<node>``; drift per node.

* ``render_content(node)`` — the document without ``version``/``issued_at``/``signature``: store endpoints
  (``tenants.rendering.StoreEndpoints.from_settings()``) and one ``agent.messages.InstanceSpec`` per
  ``InstanceAssignment`` of the node (release namespace, state, KV layout, hash algo + seed, ranks, the
  tenant's request groups with salts, budgets), ordered by port. Validated through the shared schema, so the
  dashboard never sends what the agent would refuse as ``invalid``.
* ``ensure_version(name)`` — in one transaction with the node's ``NodeState`` row locked: a new
  ``ConfigVersion`` (version = counter + 1) only when the content changed (``content_digest``) or an agent
  reported running a version at/above the counter (``version_floor``).
* ``send(node, config_version)`` — signs with the node's current ``signing_secret`` and publishes the Celery
  task ``agent.apply_config`` to ``agent.<node>`` (expires after ``KVPOOL_PUSH_EXPIRES_SECONDS``).
* ``push_nodes(names)`` — ensure + send when new, or when the node's ack lags and the last send is older than
  ``KVPOOL_REPUSH_AFTER_SECONDS``; ``reconcile()`` does that for every registered node (periodic).
* ``drift(state)`` — behind / silent / digest mismatch flags.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, Iterable

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agent import signing
from agent.messages import (
    APPLY_CONFIG_TASK,
    SCHEMA_VERSION,
    InstanceSpec,
    KVLayout,
    Ranks,
    RequestGroupSpec,
    StoreEndpoints,
    node_queue,
)
from dashboard.models import ConfigVersion, NodeState

log = logging.getLogger("kvpool.dashboard.push")

#: Members of a document that are not its content (excluded from ``content_digest``).
VOLATILE_FIELDS = ("version", "issued_at", "signature")


def _store_endpoints() -> dict[str, Any]:
    from tenants.rendering import StoreEndpoints as RegistryEndpoints

    endpoints = RegistryEndpoints.from_settings()
    return StoreEndpoints(
        master_server_address=endpoints.master_address,
        metadata_server=endpoints.metadata_server,
        protocol=endpoints.protocol,
        device_name=endpoints.device_name,
        global_segment_size=endpoints.global_segment_size,
        local_buffer_size=endpoints.local_buffer_size,
    ).model_dump(mode="json")


def _instance(assignment, groups: list[RequestGroupSpec]) -> InstanceSpec:
    release = assignment.release
    model = release.model
    tenant = model.tenant
    return InstanceSpec(
        instance_id=str(assignment.pk),
        engine=release.engine,
        engine_version=release.engine_version,
        role=assignment.role,
        port=assignment.port,
        tenant_id=tenant.tenant_id,
        tenant_quota_bytes=tenant.quota_bytes,
        served_model_name=model.served_model_name,
        model_path=model.model_path,
        vllm_model_name=model.vllm_model_name,
        namespace=release.namespace,
        release_state=release.state,
        release_fingerprint=release.fingerprint,
        kv_layout=KVLayout(
            num_layers=release.num_layers, num_kv_heads=release.num_kv_heads, head_dim=release.head_dim,
            block_size=release.block_size, kv_dtype=release.kv_dtype, quantization=release.quantization,
            adapters=sorted(release.adapters or []), weights_revision=release.weights_revision,
        ),
        hash_algo=release.hash_algo,
        hash_seed=release.hash_seed,
        ranks=Ranks(
            tp_rank=assignment.tp_rank, tp_size=assignment.tp_size, pp_rank=assignment.pp_rank,
            pp_size=assignment.pp_size, pcp_rank=assignment.pcp_rank, pcp_size=assignment.pcp_size,
            dcp_rank=assignment.dcp_rank, dcp_size=assignment.dcp_size,
        ),
        request_groups=groups,
        budget_bytes=release.budget_bytes,
    )


def render_content(node) -> dict[str, Any]:
    """The node's document content as a JSON-ready dict (no version, issued_at or signature).

    ``node`` is a ``tenants.models.Node``. Raises ``agent.messages.MessageError``-compatible pydantic errors
    only if the registry holds something the schema refuses (a bug, logged by the caller).
    """
    from tenants.models import RequestGroup

    assignments = list(
        node.assignments.select_related("release__model__tenant").order_by("port", "pk")
    )
    tenant_pks = {a.release.model.tenant_id for a in assignments}
    groups: dict[int, list[RequestGroupSpec]] = {pk: [] for pk in tenant_pks}
    for group in RequestGroup.objects.filter(tenant_id__in=tenant_pks).order_by("name"):
        groups[group.tenant_id].append(
            RequestGroupSpec(name=group.name, cache_salt=group.cache_salt, budget_bytes=group.budget_bytes))
    instances = [_instance(a, groups[a.release.model.tenant_id]).model_dump(mode="json") for a in assignments]
    return {"schema": SCHEMA_VERSION, "kind": "config", "node": node.name, "store": _store_endpoints(),
            "instances": instances}


def content_digest(content: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical document without its volatile members."""
    return signing.digest({k: v for k, v in content.items() if k not in VOLATILE_FIELDS})


def _issued_at(now: datetime) -> str:
    return now.astimezone(dt_timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Ensured:
    """Outcome of ``ensure_version``: the newest version of the node, whether it was just created."""

    version: ConfigVersion
    created: bool


def ensure_version(node) -> Ensured:
    """Make sure the newest ``ConfigVersion`` of ``node`` matches the registry; see the module docstring."""
    from agent.messages import parse_document

    with transaction.atomic():
        state, _ = NodeState.objects.get_or_create(node_name=node.name)
        state = NodeState.objects.select_for_update().get(pk=state.pk)
        # Rendered under the lock: a concurrent push that renders later also versions later.
        content = render_content(node)
        cdigest = content_digest(content)
        latest = ConfigVersion.objects.filter(node_name=node.name).order_by("-version").first()
        if (latest is not None and latest.version == state.desired_version
                and latest.content_digest == cdigest and state.version_floor < state.desired_version):
            return Ensured(latest, False)
        version = max(state.desired_version, state.version_floor) + 1
        document = {**content, "version": version, "issued_at": _issued_at(timezone.now())}
        parse_document(document)  # the agent would refuse it otherwise; fail here, loudly
        digest = signing.digest(document)
        created = ConfigVersion.objects.create(node_name=node.name, version=version, digest=digest,
                                               content_digest=cdigest, document=document)
        state.desired_version = version
        state.desired_digest = digest
        state.save(update_fields=["desired_version", "desired_digest"])
    log.info("node %s: config version %d (digest %s, %d instances)", node.name, version, digest[:12],
             len(content["instances"]))
    return Ensured(created, True)


def send(node, config_version: ConfigVersion) -> bool:
    """Sign ``config_version`` with ``node.signing_secret`` and publish it to ``agent.<node>``.

    Returns whether the broker took it; a failure is logged and kept in ``NodeState.push_error`` (the periodic
    reconcile sends again).
    """
    from dashboard.celery import app

    document = signing.signed(config_version.document, node.signing_secret)
    now = timezone.now()
    try:
        app.send_task(
            APPLY_CONFIG_TASK, args=[document], queue=node_queue(node.name),
            expires=settings.KVPOOL_PUSH_EXPIRES_SECONDS, retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5},
        )
    except Exception as exc:  # broker down: record, the reconcile task retries
        NodeState.objects.filter(node_name=node.name).update(push_error=f"{type(exc).__name__}: {exc}"[:2000])
        log.error("node %s: pushing config version %d failed: %s", node.name, config_version.version, exc)
        return False
    NodeState.objects.filter(node_name=node.name).update(
        pushed_version=config_version.version, pushed_at=now, push_error="")
    return True


def push_nodes(names: Iterable[str], *, force: bool = False) -> dict[str, int]:
    """Ensure and send the documents of the named nodes; returns counts (``versions``, ``sent``, ``missing``).

    A document is sent when a new version was created, when ``force`` is set, or when the node's ack lags the
    desired version and the last send is older than ``KVPOOL_REPUSH_AFTER_SECONDS``. Names not in the
    registry are counted as ``missing`` (a deleted node has nothing to receive).
    """
    from tenants.models import Node

    counts = {"versions": 0, "sent": 0, "missing": 0, "failed": 0}
    names = sorted(set(names))
    nodes = {node.name: node for node in Node.objects.filter(name__in=names)}
    repush_before = timezone.now() - timedelta(seconds=settings.KVPOOL_REPUSH_AFTER_SECONDS)
    for name in names:
        node = nodes.get(name)
        if node is None:
            counts["missing"] += 1
            continue
        try:
            ensured = ensure_version(node)
        except Exception:
            counts["failed"] += 1
            log.exception("node %s: rendering its config document failed", name)
            continue
        counts["versions"] += int(ensured.created)
        state = NodeState.objects.get(node_name=name)
        behind = state.acked_version < state.desired_version
        stale_push = state.pushed_at is None or state.pushed_at < repush_before or state.pushed_version < state.desired_version
        if ensured.created or force or (behind and stale_push):
            counts["sent"] += int(send(node, ensured.version))
    return counts


def reconcile() -> dict[str, int]:
    """``push_nodes`` for every registered node (catches changes no signal saw, e.g. ``QuerySet.update``)."""
    from tenants.models import Node

    return push_nodes(Node.objects.values_list("name", flat=True))


def drift(state: NodeState, now: datetime | None = None) -> dict[str, Any]:
    """Drift flags of one node.

    * ``behind`` — the acked version is below the desired one;
    * ``silent`` — no heartbeat within ``KVPOOL_HEARTBEAT_SILENCE_SECONDS`` (or never);
    * ``digest_mismatch`` — the agent reports running the desired version with another digest, or acked a
      version with a digest other than the one the dashboard stored for it;
    * ``rejected`` — the newest ack was a rejection of the desired version (``rejection_reason`` says why);
    * ``in_sync`` — none of the above.
    """
    now = now or timezone.now()
    silence = timedelta(seconds=settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS)
    behind = state.acked_version < state.desired_version
    silent = state.heartbeat_at is None or now - state.heartbeat_at > silence
    mismatch = bool(
        (state.applied_version == state.desired_version and state.applied_digest
         and state.applied_digest != state.desired_digest)
        or (state.acked_version == state.desired_version and state.acked_digest
            and state.acked_digest != state.desired_digest)
    )
    rejected = state.rejected_version is not None and state.rejected_version == state.desired_version and behind
    age = (now - state.heartbeat_at).total_seconds() if state.heartbeat_at else None
    return {
        "behind": behind,
        "silent": silent,
        "digest_mismatch": mismatch,
        "rejected": rejected,
        "in_sync": not (behind or silent or mismatch),
        "heartbeat_age_seconds": age,
    }
