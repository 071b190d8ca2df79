"""What a node's report may speak for: the instances of the config document its agent says it applied.

A report carries ``applied_version``, the version of the node's document its agent ran when it made the report.
The dashboard rendered that document (``dashboard.models.ConfigVersion``, unique per node and version) and knows
what it carries: per instance its cache scopes (``agent.contract.scope.instance_scopes``: each request group and
the release scope) and its identity (instance id, engine, tenant, served model, namespace). Ingest stores a
report's occupancy rows and instance stats only when they are in that set; anything else — a namespace of
another tenant, a tenant that does not exist, an instance of another node, any row of a document the dashboard
does not hold (``applied_version`` 0, or a version it never rendered) — is refused row by row, counted
(``scope_not_in_document`` / ``instance_not_in_document`` in ``MessageRejection``) and logged once per node and
batch, naming only the node and the version; the report's other rows are stored.

One kind of row outside the document is kept: a row of a tenant and served model that an instance of the document
carries, in one of that instance's request groups, under a namespace the registry does not have for that served
model (``unregistered_namespaces``: one registry query per batch, only when such rows arrive). That is an engine
of the node launched by hand with a mistyped namespace (the agent reports it when it knows the engine's real
launch values: the simulator's launch overrides); its rows stay within the tenants the node serves, the overview
marks the namespace as not in the registry and the ``names_stable`` check fails naming it. A registered namespace
the document does not carry (another node's release, a retired one) is still refused.

The node's own counters stay attributed to that node and need no row of the document: the report receipt's
``unknown_topic_messages`` / ``unknown_topic_blocks`` (KV events of engines no instance of the document names)
and each accepted instance's ``unknown_salt`` / ``unknown_adapter`` blocks.

``applied_scopes`` looks up every ``(node, version)`` of a batch in one query (id and digest only) and reads the
instances only of documents this process has not seen before, in a second one: a document is immutable and named
by its digest (SHA-256 of its canonical JSON, ``dashboard.rollout.push``), so what it carries is kept per
``(node, version, digest)`` (``CACHE_ENTRIES`` at most; a restored database that renders another document under the
same version has another digest).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection

from agent.contract.scope import CacheScope, instance_scopes
from dashboard.models import ConfigVersion

#: ``(node, version)`` pairs per query (two parameters each).
PAIRS_PER_QUERY = 500
#: Namespaces outside its document one report may keep rows of (``unregistered_namespaces``); rows of further ones
#: are refused, so a report cannot make the registry query grow with its size.
UNREGISTERED_PER_REPORT = 8
#: Documents whose scopes a process keeps (all are dropped when full).
CACHE_ENTRIES = 10_000


@dataclass(frozen=True)
class AppliedScopes:
    """What one stored document carries: ``scopes`` (cache scopes of its instances) and ``instances``
    (``(instance_id, engine, tenant_id, served_model_name, namespace)`` of each)."""

    scopes: frozenset[CacheScope]
    instances: frozenset[tuple[str, str, str, str, str]]
    groups: frozenset[tuple[str, str, str]] = frozenset()

    def could_be_unregistered(self, scope: CacheScope) -> bool:
        """Whether ``scope`` (not in :attr:`scopes`) has the tenant, served model and request group of one of the
        document's scopes under another namespace: kept if the registry has no such namespace for that model."""
        return (scope.tenant_id, scope.served_model_name, scope.request_group) in self.groups

    @classmethod
    def of_instances(cls, instances: Iterable[Mapping[str, Any]]) -> AppliedScopes:
        """From the ``instances`` of a document as stored (wire dicts)."""
        scopes: set[CacheScope] = set()
        identities = set()
        for spec in instances:
            tenant, model, namespace = (str(spec.get(name) or "") for name in
                                        ("tenant_id", "served_model_name", "namespace"))
            groups = [str(group.get("name") or "") for group in spec.get("request_groups") or ()]
            scopes |= instance_scopes(tenant, model, namespace, groups)
            identities.add((str(spec.get("instance_id") or ""), str(spec.get("engine") or "vllm"), tenant, model,
                            namespace))
        return cls(frozenset(scopes), frozenset(identities),
                   frozenset((s.tenant_id, s.served_model_name, s.request_group) for s in scopes))


#: A document the dashboard does not hold: nothing may be reported under it.
NOTHING = AppliedScopes(frozenset(), frozenset())


_cache: dict[tuple[str, int, str], AppliedScopes] = {}


def _versions(pairs: list[tuple[str, int]]) -> list[tuple[int, str, int, str]]:
    """``(id, node, version, digest)`` of the stored documents of ``pairs``: one ``WHERE (node_name, version) IN
    (...)`` on the unique index (row values: PostgreSQL, SQLite >= 3.15; the ORM's OR of 500 ``Q`` objects took
    50 ms to build); on PostgreSQL the pairs travel as two arrays (``unnest``)."""
    ops = connection.ops
    table = ops.quote_name(ConfigVersion._meta.db_table)
    if connection.vendor == "postgresql":  # one statement text whatever the batch: psycopg parses it once
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, node_name, version, digest FROM {table} WHERE (node_name, version) IN "
                           "(SELECT * FROM unnest(%s::varchar[], %s::bigint[]))",
                           [[node for node, _ in pairs], [version for _, version in pairs]])
            return cursor.fetchall()
    rows = ", ".join(["(%s, %s)"] * len(pairs))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {ops.quote_name('id')}, {ops.quote_name('node_name')}, {ops.quote_name('version')}, "
                       f"{ops.quote_name('digest')} FROM {table} WHERE ({ops.quote_name('node_name')}, "
                       f"{ops.quote_name('version')}) IN ({rows})", [value for pair in pairs for value in pair])
        return cursor.fetchall()


def applied_scopes(pairs: Iterable[tuple[str, int]]) -> dict[tuple[str, int], AppliedScopes]:
    """The scopes of the stored document of each ``(node, version)``; a pair with no stored document (version
    0, never rendered, or pruned) maps to ``NOTHING``. One query per ``PAIRS_PER_QUERY`` pairs, plus one for the
    instances of documents not in the process's cache."""
    wanted = sorted(set(pairs))
    found: dict[tuple[str, int], AppliedScopes] = dict.fromkeys(wanted, NOTHING)
    stored = [(node, version) for node, version in wanted if version > 0]
    unseen: dict[int, tuple[str, int, str]] = {}
    for start in range(0, len(stored), PAIRS_PER_QUERY):
        for pk, node, version, digest in _versions(stored[start:start + PAIRS_PER_QUERY]):
            key = (node, int(version), digest)
            known = _cache.get(key)
            if known is None:
                unseen[pk] = key
            else:
                found[key[:2]] = known
    if unseen:
        if len(_cache) + len(unseen) > CACHE_ENTRIES:
            _cache.clear()
        for pk, instances in ConfigVersion.objects.filter(pk__in=list(unseen)).values_list(
                "pk", "document__instances"):
            key = unseen[pk]
            found[key[:2]] = _cache[key] = AppliedScopes.of_instances(instances or ())
    return found


def unregistered_namespaces(candidates: Iterable[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    """Of ``candidates`` ``(tenant_id, served_model_name, namespace)``, those the registry has no release of (one
    query; none for an empty input)."""
    from django.db.models import Q

    from tenants.models import Release

    wanted = set(candidates)
    if not wanted:
        return set()
    query = Q()
    for tenant_id, model, namespace in wanted:
        query |= Q(model__tenant__tenant_id=tenant_id, model__served_model_name=model, namespace=namespace)
    registered = set(Release.objects.filter(query).values_list("model__tenant__tenant_id",
                                                               "model__served_model_name", "namespace"))
    return wanted - registered
