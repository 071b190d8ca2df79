"""Builders shared by the telemetry tests: config documents, reports, acks, heartbeats (wire dicts).

Agent messages come signed the way an agent sends them (``agent.contract.signing.sign_message``, ``signed_at`` = now)
with ``secret_of(node)``; ``register(*names)`` puts those nodes and secrets into the registry, with version 1 of each
node's config document carrying ``report``'s cache scopes, so the dashboard's ingest accepts them.
``secret=None`` builds an unsigned message.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agent.contract import signing
from agent.contract.messages import (
    DASHBOARD_READS,
    Ack,
    ConfigDocument,
    Heartbeat,
    InstanceSpec,
    KVLayout,
    Report,
    RequestGroupSpec,
    ScopeOccupancy,
    StoreEndpoints,
)

#: A whole hour about a day ago: recent enough for the dashboard's receipt horizon (2 days), old enough that
#: minute and hour buckets before ``rollup(now=T0 + ...)`` are complete.
T0 = (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
_SIGN = object()  # "sign with the node's test secret"


def secret_of(node: str) -> str:
    """The signing secret the tests give ``node`` (see ``register``)."""
    return f"test-secret-of-{node}"


#: Request groups of the instance ``register`` puts in each node's document: ``report``'s rows ``g0``, ``g1``, ...
REPORT_GROUPS = 64


def register(*names: str, applied: bool = True) -> None:
    """Register nodes ``names`` with ``secret_of(name)`` (bulk: no push on commit, no audit entries) and, unless
    ``applied`` is False, store version 1 of each one's config document — the version ``report`` says its agent
    applied — with instance "1" of ``report``'s release and request groups (``REPORT_GROUPS``)."""
    from dashboard.models import ConfigVersion
    from tenants.models import Node

    Node.objects.bulk_create([Node(name=name, hostname="10.0.0.1", signing_secret=secret_of(name))
                              for name in names], ignore_conflicts=True)
    if applied:
        groups = tuple((f"g{index}", f"salt-{index}") for index in range(REPORT_GROUPS))
        documents = {name: document(name, 1, instances=[instance("1", groups=groups)], secret=None)
                     for name in names}
        ConfigVersion.objects.bulk_create([
            ConfigVersion(node_name=name, version=1, digest=signing.digest(doc), content_digest="c" * 64,
                          document=doc) for name, doc in documents.items()], ignore_conflicts=True)


def sent(wire: dict[str, Any], secret: Any = _SIGN, signed_at: datetime | None = None) -> dict[str, Any]:
    """``wire`` as the agent of its node sends it: signed with ``secret`` (default ``secret_of(node)``) at
    ``signed_at`` (default now); unsigned when ``secret`` is None."""
    if secret is None:
        return wire
    return signing.sign_message(wire, secret_of(wire["node"]) if secret is _SIGN else secret, now=signed_at)


def instance(instance_id: str = "1", *, tenant_id: str = "acme", namespace: str = "prod-2026-07",
             groups: tuple[tuple[str, str], ...] = (("default", ""), ("app-a", "salt-a"))) -> InstanceSpec:
    """One vLLM instance spec with the given tenant, namespace and request groups (name, salt)."""
    return InstanceSpec(
        instance_id=instance_id, engine="vllm", engine_version="0.33.0", role="both", port=8000 + int(instance_id),
        tenant_id=tenant_id, tenant_quota_bytes=1 << 30, served_model_name="qwen3-8b",
        model_path="/models/Qwen3-8B", vllm_model_name="Qwen3-8B", namespace=namespace, release_state="serving",
        kv_layout=KVLayout(num_layers=36, num_kv_heads=8, head_dim=128, block_size=16),
        hash_algo="sha256_cbor", hash_seed="42",
        request_groups=[RequestGroupSpec(name=name, cache_salt=salt) for name, salt in groups],
        node_budget_bytes=1 << 28,
    )


def document(node: str = "node-a", version: int = 1, *, instances: list[InstanceSpec] | None = None,
             secret: str | None = "s3cret", sent_at: datetime | str | None = None) -> dict[str, Any]:
    """A config document wire dict, signed with ``secret`` unless it is None; ``sent_at`` (this delivery's stamp)
    is now unless given ("" = none, as older dashboards sent)."""
    stamp = sent_at if isinstance(sent_at, str) else signing.timestamp(sent_at or datetime.now(UTC))
    doc = ConfigDocument(
        node=node, version=version, issued_at="2026-11-30T12:00:00.000000Z", sent_at=stamp,
        store=StoreEndpoints(master_server_address="127.0.0.1:50051",
                             metadata_server="http://127.0.0.1:8080/metadata",
                             global_segment_size=1 << 30, local_buffer_size=1 << 28),
        instances=instances if instances is not None else [instance()], dashboard_reads=DASHBOARD_READS,
    ).to_wire()
    doc.pop("signature")
    return signing.signed(doc, secret) if secret is not None else doc


def report(node: str = "node-a", sequence: int = 1, *, at: datetime = T0, scopes: int = 2,
           bytes_per_scope: int = 4096, hits: int = 3, misses: int = 1, secret: Any = _SIGN,
           signed_at: datetime | None = None) -> dict[str, Any]:
    """A report wire dict with ``scopes`` cache scopes (request groups ``g0``, ``g1``, ... of release
    ``prod-2026-07`` of tenant ``acme``: the document ``register`` stores carries ``REPORT_GROUPS`` of them) under
    applied version 1, sent (see ``sent``)."""
    return sent(Report(
        node=node, sequence=sequence, sent_at=at, started_at=T0 - timedelta(hours=1), applied_version=1,
        scopes=[ScopeOccupancy(tenant_id="acme", served_model_name="qwen3-8b", namespace="prod-2026-07",
                               request_group=f"g{i}", blocks=bytes_per_scope // 1024, bytes=bytes_per_scope,
                               puts=10, gets=20, hit_blocks=hits, miss_blocks=misses)
                for i in range(scopes)],
    ).to_wire(), secret, signed_at)


def ack(node: str = "node-a", sequence: int = 1, *, version: int = 1, status: str = "applied",
        digest: str = "d" * 64, reason: str = "", applied_version: int | None = None,
        at: datetime = T0, secret: Any = _SIGN, signed_at: datetime | None = None) -> dict[str, Any]:
    """An ack wire dict, sent (see ``sent``)."""
    applied = applied_version if applied_version is not None else (version if status == "applied" else 0)
    return sent(Ack(node=node, sequence=sequence, sent_at=at, status=status, version=version,
                    digest=digest, reason=reason, error="refused" if reason else "", applied_version=applied,
                    applied_digest=digest if status == "applied" else "").to_wire(), secret, signed_at)


def heartbeat(node: str = "node-a", *, at: datetime = T0, applied_version: int = 1,
              applied_digest: str = "d" * 64, secret: Any = _SIGN,
              signed_at: datetime | None = None, **fields: Any) -> dict[str, Any]:
    """A heartbeat wire dict, sent (see ``sent``); ``fields``: more ``Heartbeat`` fields (``single_user``)."""
    return sent(Heartbeat(node=node, sent_at=at, started_at=T0 - timedelta(hours=1),
                          applied_version=applied_version, applied_digest=applied_digest, hostname="gpu-1",
                          pid=123, **fields).to_wire(), secret, signed_at)
