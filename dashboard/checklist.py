"""The seed's operational checklist as live checks: one pass/fail result per item.

Seed (KV Cache Sharing and Isolation, "Operational Checklist"), in order:

1. ``names_stable`` — *Use deterministic names that remain stable across restarts.* Every namespace the agents
   report now (tenant, served model, release namespace, request group) is one the registry defines; no
   engine instance got different names from one config version to the next (config versions of the last
   ``CONFIG_HISTORY_DAYS``); every live release has a hash
   seed (vLLM's ``PYTHONHASHSEED``: without one, xxhash block hashes change at every restart).
2. ``pd_identical`` — *Keep model and release fields identical across compatible prefill, decode, and replica
   instances.* For every instance of a live release, the values its agent applied (the instance in the config
   document whose digest the agent reports running) equal what the release prescribes: tenant_id, served
   model name, vLLM model name, release namespace, fingerprint, engine, hash algorithm and seed.
3. ``namespace_changed`` — *Change the release namespace before introducing a cache-incompatible
   deployment.* No namespace went to agents with two different fingerprints while its release was serving (same
   history; a warming release may still change its fingerprint, as the registry allows), and no two live
   releases whose keys would meet (same tenant, engine key model and namespace) differ in fingerprint.
4. ``salts_stable`` — *Keep cache_salt stable within a group that should benefit from prefix reuse.* No
   request group went out with two different salts (same history), and the audit log shows no salt change.
5. ``overlap_capacity`` — *Account for duplicate cache occupancy while old and new releases overlap.* For
   every tenant with an upgrade under way, current occupancy + what the warming releases still need to reach
   their old release's size fits the tenant's effective quota, and the master does not report it over quota.

Then the real engines (from the per-instance facts of the agents' reports, ``dashboard.models.InstanceStats``):

6. ``engines_hash_registered`` — *Engines hash as registered*: no observed engine instance stores blocks that do
   not hash under its release's settings (``hash_mismatch``).
7. ``blocks_registered`` — *Every stored block belongs to a registered request group*: no unregistered salt or
   adapter (``unknown_salt``, ``unknown_adapter``) and no Store writes from engines of no instance of the node's
   config (``unknown_topic_blocks``).
8. ``engine_events_flow`` — *Engines' events reach their agent*: every observed engine answers its ``/metrics``,
   one that serves requests sends KV events, and none were lost (``seq_gaps``) or garbled.
9. ``engine_writes_in_store`` — *Engines write where the registry says*: no observed engine writes under a namespace
   that is not its release's (``unknown_namespace_keys``, named by key prefix with its keys and bytes), and every
   write an engine reported stored was found in the Store (``unconfirmed``: forged events, or writes the master
   dropped although the engine got a success code — upstream Mooncake #3741).

8b. ``engine_events_trusted`` — *Only the instance publishes as the instance*: every observed instance's KV events
   come from a socket only its account can have made (``events_status`` ``connected`` or ``waiting``); one its
   agent refuses (another account's socket, a directory others can write: a squatter), a ``tcp://`` endpoint any
   local process could bind, or an instance without an account on its node fails (issue 16). So does a node whose
   agent runs in single-user mode (``NodeState.single_user``: every instance as the agent's account) with
   instances of more than one tenant in its applied document: their engines can read each other's files and
   sockets and publish as each other. One tenant alone on a single-user node passes (a documented choice).

And the pool's capacity:

10. ``quota_capacity`` — *Applying a Mooncake quota to each logical tenant.* (seed overview): every tenant gets
   the quota it requests. From the newest master read-back of each tenant: the effective quota is not below the
   requested one (the master scales every quota down when the requested total exceeds the mounted memory —
   ``tenants.capacity``) and not below what the tenant is charged (the master then refuses its writes).

10. ``budgets_fit`` — *Budgets keep the master from evicting* (issue 18): no tenant's budgets (explicit, and the
    implicit ones of its releases without a budget) can hold more than its effective quota, and all tenants' no
    more than the master's eviction watermark of the mounted capacity (``tenants.room``; ``dashboard.master.room``).

And the faults (``bench.faults``):

11. ``master_healthy`` — the Mooncake master answers its ``/metrics`` probe and did not restart within
    ``KVPOOL_MASTER_RESTART_FLAG_SECONDS`` (``dashboard.master.health``).
12. ``nodes_reporting`` — every registered node's agent sent a heartbeat within
    ``KVPOOL_HEARTBEAT_SILENCE_SECONDS``.

Each check reads the database only (registry, config versions, node states, telemetry, audit log), in a number of
queries that does not grow with the fleet, and reads columns rather than model objects where it reads every row
(issue 17: 10,000 instances, 1,000 nodes' documents). One run (``run_checks``, ``run_check``) reads what several
checks share once: the stored config documents, each decoded once into the fields the checks read
(``_read_documents``), and the observed engines.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.db.models import Count, Exists, Max, OuterRef, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from agent.contract.keys import sglang_model_component
from agent.contract.scope import ENGINE_LOOKUPS
from dashboard.models import ConfigVersion, InstanceStats, LatestSample, NodeState, Report
from tenants.choices import Engine, ReleaseState
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tenants.quota import humanize_bytes

#: Reported names are checked over this many seconds of raw samples.
REPORTED_NAMES_WINDOW_SECONDS = 3600
#: Config versions younger than this many days are searched for renamed instances, reused namespaces and
#: changed salts (older ones are mostly gone anyway: the rollup keeps each node's newest version only).
CONFIG_HISTORY_DAYS = 30
#: Detail lines kept per check (the rest is counted in one last line): bounds memory, not what a page shows.
MAX_DETAILS = 10_000
#: Detail lines of a check in ``CheckResult.as_dict`` and on the checks page; the check's own page
#: (``/checks/<key>/``) pages through all of them.
SHOWN_DETAILS = 10


@dataclass
class CheckResult:
    """One checklist item: ``passed``, a one-line ``summary`` and the ``details`` behind it."""

    key: str
    title: str
    seed: str
    passed: bool
    summary: str
    details: list[str] = field(default_factory=list)

    @property
    def shown_details(self) -> list[str]:
        """The first ``SHOWN_DETAILS`` detail lines (at 1,000 nodes a check failing for 400 of them lists the
        first ones; ``details_total`` counts them all)."""
        return self.details[:SHOWN_DETAILS]

    @property
    def details_total(self) -> int:
        """How many detail lines the check has."""
        return len(self.details)

    def as_dict(self) -> dict[str, Any]:
        """JSON of the check: ``details`` are the first ``SHOWN_DETAILS`` lines, ``details_total`` counts all."""
        return {"key": self.key, "title": self.title, "seed": self.seed, "passed": self.passed,
                "status": "pass" if self.passed else "fail", "summary": self.summary,
                "details": self.shown_details, "details_total": self.details_total}


#: What the checks of one run share (``applied_instances``, ``_observed_engines``), by name; ``None`` outside a run.
_RUN: ContextVar[dict[str, Any] | None] = ContextVar("kvpool_checklist_run", default=None)
#: The ``now`` of the checklist run under way (what its shared values are computed for).
_RUN_NOW: ContextVar[datetime | None] = ContextVar("kvpool_checklist_now", default=None)


@contextmanager
def _checklist_run(now: datetime) -> Iterator[None]:
    """Within the block, ``_once`` computes each shared value once, for ``now`` (one checklist run reads the stored
    config documents once, not once per check). Nested runs share the outer one's values."""
    if _RUN.get() is not None:
        yield
        return
    token, now_token = _RUN.set({}), _RUN_NOW.set(now)
    try:
        yield
    finally:
        _RUN.reset(token)
        _RUN_NOW.reset(now_token)


def _once(name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``, or within a checklist run (``_checklist_run``) its value computed earlier in the run."""
    memo = _RUN.get()
    if memo is None:
        return compute()
    if name not in memo:
        memo[name] = compute()
    return memo[name]


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= MAX_DETAILS:
        return lines
    return [*lines[:MAX_DETAILS], f"... and {len(lines) - MAX_DETAILS} more"]


def _live_releases():
    return Release.objects.exclude(state=ReleaseState.RETIRED).select_related("model__tenant")


# --- 1 --------------------------------------------------------------------------------------------------


class _GroupFields(msgspec.Struct, frozen=True):
    """The fields of a request group of an instance spec that the checks read (``salts_stable``)."""

    name: Any = ""
    cache_salt: Any = ""


class _InstanceFields(msgspec.Struct, frozen=True):
    """The fields of an instance spec of a config document (``agent.contract.messages.InstanceSpec``) that the
    checks read, with their JSON values as they are; a missing one reads as ``""`` (``instance_id``: ``None``;
    ``release_state``: serving, as documents from before the field count)."""

    instance_id: Any = None
    tenant_id: Any = ""
    served_model_name: Any = ""
    vllm_model_name: Any = ""
    namespace: Any = ""
    release_fingerprint: Any = ""
    engine: Any = ""
    hash_algo: Any = ""
    hash_seed: Any = ""
    release_state: Any = ReleaseState.SERVING.value
    request_groups: list[_GroupFields] = []


class _DocumentFields(msgspec.Struct, frozen=True):
    """The instances of a config document; its other fields (node settings, launch commands, files: most of its
    26 KB at ten instances) are skipped while decoding, not built."""

    instances: list[_InstanceFields] = []


_DOCUMENT = msgspec.json.Decoder(_DocumentFields | None)


def _instances(text: str | None) -> list[_InstanceFields]:
    """The instances of a stored config document given as JSON text (``ConfigVersion.document``; none for a JSON
    ``null``). Raises ``msgspec.ValidationError`` for a document the dashboard would not have rendered (instances
    or request groups not lists of objects)."""
    document = _DOCUMENT.decode(text) if text else None
    return document.instances if document is not None else []


@dataclass(frozen=True)
class _Documents:
    """The stored config documents the checks read, each decoded once (``_documents``): ``history``, the versions
    of the last ``CONFIG_HISTORY_DAYS`` as ``(node_name, version, instances)`` by node and version; ``applied``,
    ``applied_instances()``."""

    history: list[tuple[str, int, list[_InstanceFields]]]
    applied: dict[tuple[str, str], dict[str, Any]]


def _applied_version():
    """``ConfigVersion`` rows whose node's agent reports running them (digest = the node's applied digest)."""
    return Exists(NodeState.objects.filter(node_name=OuterRef("node_name"), applied_digest=OuterRef("digest")))


def _applied_spec(instance: _InstanceFields) -> dict[str, Any]:
    return {name: getattr(instance, name) for name in ("instance_id", *_PRESCRIBED)}


#: Decoded config documents kept by this process, by ``(node_name, version, digest, created_at)``: a stored document
#: never changes and its digest names it (``dashboard.rollout.push``; the creation time tells apart a version of a
#: restored or rebuilt database), so a checklist run decodes only the versions stored since the last one (as
#: ``dashboard.telemetry.report_scope`` keeps their scopes). Cleared when it would hold more than
#: ``DOCUMENT_CACHE_ENTRIES`` (1,000 nodes keep about one version each).
_document_cache: dict[tuple[str, int, str, datetime], list[_InstanceFields]] = {}
DOCUMENT_CACHE_ENTRIES = 20_000
#: Documents read per query when they are not in the cache.
_DOCUMENTS_PER_QUERY = 500


def _decoded(versions: list[tuple[int, str, int, str, datetime]]) -> dict[int, list[_InstanceFields]]:
    """``{pk: instances}`` of ``versions`` (``(pk, node_name, version, digest, created_at)`` of ``ConfigVersion``
    rows), from the process's cache or, for the others, read as JSON text ``_DOCUMENTS_PER_QUERY`` at a time and
    decoded (``_instances``)."""
    found: dict[int, list[_InstanceFields]] = {}
    unseen: dict[int, tuple[str, int, str, datetime]] = {}
    for pk, node, version, digest, created_at in versions:
        key = (node, version, digest, created_at)
        known = _document_cache.get(key)
        if known is None:
            unseen[pk] = key
        else:
            found[pk] = known
    if len(_document_cache) + len(unseen) > DOCUMENT_CACHE_ENTRIES:
        _document_cache.clear()
    pks = list(unseen)
    for start in range(0, len(pks), _DOCUMENTS_PER_QUERY):
        rows = (ConfigVersion.objects.filter(pk__in=pks[start:start + _DOCUMENTS_PER_QUERY])
                .annotate(text=Cast("document", TextField())).values_list("pk", "text"))
        for pk, text in rows:
            found[pk] = _document_cache[unseen[pk]] = _instances(text)
    return found


def _read_documents(now: datetime) -> _Documents:
    """The versions of the last ``CONFIG_HISTORY_DAYS`` and the applied ones (of any age): one query for which they
    are, then their documents (``_decoded``: only those this process has not decoded before)."""
    cutoff = now - timedelta(days=CONFIG_HISTORY_DAYS)
    rows = list(ConfigVersion.objects.filter(Q(created_at__gte=cutoff) | _applied_version())
                .annotate(applied=_applied_version()).order_by("node_name", "version")
                .values_list("pk", "node_name", "version", "digest", "created_at", "applied"))
    documents = _decoded([row[:5] for row in rows])
    history: list[tuple[str, int, list[_InstanceFields]]] = []
    applied: dict[tuple[str, str], dict[str, Any]] = {}
    for pk, node, version, _digest, created_at, is_applied in rows:
        instances = documents[pk]
        if created_at >= cutoff:
            history.append((node, version, instances))
        if is_applied:
            for instance in instances:
                applied[(node, str(instance.instance_id))] = _applied_spec(instance)
    return _Documents(history, applied)


def _documents(now: datetime) -> _Documents:
    """``_read_documents``, once per checklist run (four checks read the documents)."""
    return _once("documents", lambda: _read_documents(_RUN_NOW.get() or now))


def _history(now: datetime) -> list[tuple[str, int, list[_InstanceFields]]]:
    """``(node_name, version, instances)`` of the config versions of the last ``CONFIG_HISTORY_DAYS``, by node and
    version."""
    return _documents(now).history


def _name_problem(tenant_id: str, model: str, namespace: str, group: str, registry: dict[str, set]) -> str | None:
    """What of a reported cache scope's names the registry lacks (the first of tenant, served model, release
    namespace, request group), or ``None`` when it defines them all. ``registry``: ``tenants`` (tenant ids),
    ``models`` (tenant_id, served model name), ``releases`` (tenant_id, served model name, namespace), ``groups``
    (tenant_id, request group name)."""
    if tenant_id not in registry["tenants"]:
        return f"tenant '{tenant_id}' is not in the registry"
    if model and (tenant_id, model) not in registry["models"]:
        return f"served model '{model}' is not registered in tenant '{tenant_id}'"
    if namespace and (tenant_id, model, namespace) not in registry["releases"]:
        return f"release namespace '{namespace}' is not registered for model '{model}'"
    if group and group != ENGINE_LOOKUPS and (tenant_id, group) not in registry["groups"]:
        return f"request group '{group}' is not registered in tenant '{tenant_id}'"
    return None


def _reported_name_problems(now: datetime) -> tuple[int, list[str]]:
    """How many distinct (node, cache scope) pairs the raw samples of the last ``REPORTED_NAMES_WINDOW_SECONDS``
    report, and one line per pair whose names the registry lacks (``_name_problem``), ordered by node, tenant,
    served model, namespace, request group.

    Set-based, from ``LatestSample`` (the newest raw sample of each pair, one row per pair: not the window's
    samples, 360 per pair in an hour): one query groups the pairs by cache scope and counts each one's nodes
    (10,000 scopes come back, not 50,000 pairs), the registry's names are four queries; only the scopes with a
    problem are read again, with their nodes."""
    registry = {
        "tenants": set(Tenant.objects.values_list("tenant_id", flat=True)),
        "models": set(ServedModel.objects.values_list("tenant__tenant_id", "served_model_name")),
        "releases": set(Release.objects.values_list("model__tenant__tenant_id", "model__served_model_name",
                                                    "namespace")),
        "groups": set(RequestGroup.objects.values_list("tenant__tenant_id", "name")),
    }
    scope_fields = ("tenant_id", "served_model_name", "namespace", "request_group")
    # the newest raw sample of each (node, cache scope): a pair reported in the window has its newest one in it
    recent = LatestSample.objects.filter(ts__gte=now - timedelta(seconds=REPORTED_NAMES_WINDOW_SECONDS))
    seen = 0
    wrong: dict[tuple[str, ...], str] = {}
    for *names, nodes in (recent.order_by().values_list(*scope_fields)
                          .annotate(nodes=Count("node_name"))):  # one row per (node, scope)
        seen += nodes
        problem = _name_problem(*names, registry)
        if problem is not None:
            wrong[tuple(names)] = problem
    if not wrong:
        return seen, []
    pairs = (recent.filter(tenant_id__in={names[0] for names in wrong})
             .values_list("node_name", *scope_fields).order_by("node_name", *scope_fields))
    problems = []
    for node, *names in pairs.iterator(chunk_size=2000):
        problem = wrong.get(tuple(names))
        if problem is not None:
            tenant_id, model, namespace, _group = names
            problems.append(f"node {node} reports {tenant_id}/{model or '-'}/{namespace or '-'}: {problem}")
    return seen, problems


def check_names_stable(now: datetime) -> CheckResult:
    """Fail for every reported name the registry does not define (``_reported_name_problems``), every instance
    renamed between two config versions of its node (``_renamed_instances``) and every live release without a hash
    seed."""
    seen, problems = _reported_name_problems(now)
    problems.extend(_renamed_instances(now))
    for namespace, model in _live_releases().filter(hash_seed="").values_list("namespace", "model__served_model_name"):
        problems.append(f"release '{namespace}' of '{model}' has no hash seed: block hashes "
                        "(PYTHONHASHSEED) would differ after a restart")
    passed = not problems
    summary = (f"{seen} reported name(s) all match the registry; instance names unchanged across config versions"
               if passed else f"{len(problems)} name problem(s)")
    return CheckResult("names_stable", "Names stable across restarts",
                       "Use deterministic names that remain stable across restarts.", passed, summary,
                       _capped(problems))


def _renamed_instances(now: datetime) -> list[str]:
    """Instances whose (tenant, served model, namespace) changed between two stored config versions of a node."""
    problems = []
    history: dict[tuple[str, str], tuple[int, tuple[str, str, str]]] = {}
    for node, version, instances in _history(now):
        for instance in instances:
            names = (instance.tenant_id, instance.served_model_name, instance.namespace)
            key = (node, str(instance.instance_id))
            previous = history.get(key)
            if previous is not None and previous[1] != names:
                problems.append(f"instance {key[1]} on node {node} changed names from {'/'.join(previous[1])} "
                                f"(v{previous[0]}) to {'/'.join(names)} (v{version})")
            history[key] = (version, names)
    return problems


# --- 2 --------------------------------------------------------------------------------------------------

_PRESCRIBED = ("tenant_id", "served_model_name", "vllm_model_name", "namespace", "release_fingerprint", "engine",
               "hash_algo", "hash_seed")


def prescribed_values(release: Release) -> dict[str, str]:
    """What every instance of ``release`` must run with (the config document's instance fields)."""
    model = release.model
    return {"tenant_id": model.tenant.tenant_id, "served_model_name": model.served_model_name,
            "vllm_model_name": model.vllm_model_name, "namespace": release.namespace,
            "release_fingerprint": release.fingerprint, "engine": release.engine, "hash_algo": release.hash_algo,
            "hash_seed": release.hash_seed}


def applied_instances(nodes: Iterable[str] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(node name, instance_id) -> the instance spec in the document each agent reports running (of ``nodes``
    only, when given: node names): its ``instance_id`` and the ``prescribed_values`` fields, ``""`` where the spec
    lacks one.

    The document is the stored ``ConfigVersion`` whose digest equals the node's applied digest (from its
    newest ack or heartbeat); nodes whose digest matches no stored version contribute nothing. One query (a join
    on node name and digest), and one per ``_DOCUMENTS_PER_QUERY`` documents this process has not decoded before
    (``_decoded``); within a checklist run (``run_checks``) the whole fleet's is read once: with the
    history when a check read that already (``_documents``), else alone.
    """
    memo = _RUN.get()
    if nodes is None and memo is not None:
        if "documents" in memo:
            return memo["documents"].applied
        return _once("applied_instances", _read_applied_instances)
    return _read_applied_instances(nodes)


def _read_applied_instances(nodes: Iterable[str] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    versions = ConfigVersion.objects.filter(_applied_version())
    if nodes is not None:
        versions = versions.filter(node_name__in=list(nodes))
    rows = list(versions.values_list("pk", "node_name", "version", "digest", "created_at"))
    documents = _decoded(rows)
    result: dict[tuple[str, str], dict[str, Any]] = {}
    for pk, node, *_ in rows:
        for instance in documents[pk]:
            result[(node, str(instance.instance_id))] = _applied_spec(instance)
    return result


#: ``InstanceAssignment`` columns ``check_pd_identical`` reads: where the instance runs, then the
#: ``prescribed_values`` of its release, in ``_PRESCRIBED`` order.
_PD_COLUMNS = ("pk", "role", "port", "node__name", "release__model__tenant__tenant_id",
               "release__model__served_model_name", "release__model__vllm_model_name", "release__namespace",
               "release__fingerprint", "release__engine", "release__hash_algo", "release__hash_seed")


def check_pd_identical(now: datetime) -> CheckResult:
    """Fail for every instance of a live release whose agent has not applied it, or applied other values than
    ``prescribed_values`` of its release. Three queries whatever the fleet: the applied documents, the nodes with
    an applied digest, and the instances with their release's values (columns, not model objects)."""
    applied = applied_instances()
    applied_nodes = {node for node, _ in applied}
    node_states = set(NodeState.objects.exclude(applied_digest="").values_list("node_name", flat=True))
    problems: list[str] = []
    checked = 0
    assignments = (InstanceAssignment.objects.exclude(release__state=ReleaseState.RETIRED)
                   .order_by("release__namespace", "node__name", "port").values_list(*_PD_COLUMNS))
    for pk, role, port, node, *values in assignments.iterator(chunk_size=2000):
        where = f"{values[3]} {role} on {node}:{port}"
        spec = applied.get((node, str(pk)))
        if spec is None:
            if node not in node_states:
                problems.append(f"{where}: the agent of node {node} has not reported running any config yet")
            elif node not in applied_nodes:
                problems.append(f"{where}: node {node} runs a config version the dashboard no longer holds")
            else:
                problems.append(f"{where}: not in the config the agent runs (not applied yet)")
            continue
        checked += 1
        wrong = [f"{name} '{spec.get(name, '')}' (release prescribes '{value}')"
                 for name, value in zip(_PRESCRIBED, values, strict=True) if str(spec.get(name, "")) != str(value)]
        if wrong:
            problems.append(f"{where}: the agent applied " + ", ".join(wrong))
    passed = not problems
    summary = (f"{checked} instance(s) apply exactly what their release prescribes" if passed
               else f"{len(problems)} instance(s) differ from their release or are unconfirmed")
    return CheckResult("pd_identical", "Prefill/decode values identical",
                       "Keep model and release fields identical across compatible prefill, decode, and replica "
                       "instances.", passed, summary, _capped(problems))


# --- 3 --------------------------------------------------------------------------------------------------


def _key_identity(tenant_id: str, engine: str, served_model_name: str, vllm_model_name: str, namespace: str):
    """Releases with equal identity write the same keys (vLLM: model name = vllm_model_name)."""
    model = vllm_model_name if engine == Engine.VLLM else sglang_model_component(served_model_name)
    return (tenant_id, engine, model, namespace)


def _sent_while_serving(instance: _InstanceFields) -> bool:
    """Whether an instance spec of a stored config document was sent while its release was serving.

    The registry lets a release's fingerprint change (adapters, KV layout, ...) only before it has served, so
    the specs of a ``warming`` (or never-served ``retired``) release may carry earlier fingerprints without two
    caches ever having served under the namespace. Specs without ``release_state`` (documents from before the
    field) count, to stay on the safe side.
    """
    return instance.release_state == ReleaseState.SERVING


def check_namespace_changed(now: datetime) -> CheckResult:
    """Fail when one namespace's keys served with two fingerprints, or two live releases share its keys.

    Pushed history: only instance specs sent while their release was serving count (``_sent_while_serving``):
    a fingerprint-relevant edit of a warming release, which the registry allows, is not a namespace reuse.
    """
    problems: list[str] = []
    pushed: dict[tuple, dict[str, tuple[str, int]]] = defaultdict(dict)
    for node, version, instances in _history(now):
        for instance in instances:
            if not _sent_while_serving(instance):
                continue
            identity = _key_identity(instance.tenant_id, instance.engine, instance.served_model_name,
                                     instance.vllm_model_name, instance.namespace)
            fingerprint = instance.release_fingerprint
            pushed[identity].setdefault(fingerprint, (node, version))
    for identity, fingerprints in sorted(pushed.items()):
        if len(fingerprints) > 1:
            seen = ", ".join(f"{fp[:12]} (first on {node} v{version})" for fp, (node, version) in fingerprints.items())
            problems.append(f"namespace '{identity[3]}' of {identity[0]}/{identity[2]} ({identity[1]}) served on "
                            f"agents with {len(fingerprints)} fingerprints: {seen}; a cache-incompatible change kept "
                            "the namespace")
    live: dict[tuple, list[tuple[str, str, str]]] = defaultdict(list)
    for tenant_id, engine, model, vllm_model, namespace, fingerprint in _live_releases().values_list(
            "model__tenant__tenant_id", "engine", "model__served_model_name", "model__vllm_model_name", "namespace",
            "fingerprint"):
        live[_key_identity(tenant_id, engine, model, vllm_model, namespace)].append((model, namespace, fingerprint))
    for identity, releases in sorted(live.items()):
        if len({fingerprint for _, _, fingerprint in releases}) > 1:
            names = ", ".join(f"{model}/{namespace} ({fingerprint[:12]})" for model, namespace, fingerprint in releases)
            problems.append(f"live releases share the keys of namespace '{identity[3]}' with different "
                            f"fingerprints: {names}")
    passed = not problems
    summary = (f"{len(pushed)} served namespace(s), each with a single fingerprint" if passed
               else f"{len(problems)} namespace(s) reused across incompatible settings")
    return CheckResult("namespace_changed", "Namespace changed on incompatible change",
                       "Change the release namespace before introducing a cache-incompatible deployment.",
                       passed, summary, _capped(problems))


# --- 4 --------------------------------------------------------------------------------------------------


def check_salts_stable(now: datetime) -> CheckResult:
    problems: list[str] = []
    salts: dict[tuple[str, str], dict[str, tuple[str, int]]] = defaultdict(dict)
    for node, version, instances in _history(now):
        for instance in instances:
            for group in instance.request_groups:
                key = (instance.tenant_id, group.name)
                salts[key].setdefault(group.cache_salt, (node, version))
    for (tenant_id, name), values in sorted(salts.items()):
        if len(values) > 1:
            problems.append(f"request group {tenant_id}/{name} went to agents with {len(values)} different "
                            "cache_salt values: its requests stopped reusing each other's prefixes")
    changes = AuditEntry.objects.filter(object_type="tenants.requestgroup", action="update").order_by("timestamp")
    for entry in changes:
        before, after = entry.before or {}, entry.after or {}
        if "cache_salt" in before and before.get("cache_salt") != after.get("cache_salt"):
            problems.append(f"request group {entry.object_repr}: cache_salt changed at "
                            f"{entry.timestamp:%Y-%m-%d %H:%M:%S} by {entry.actor_repr}")
    groups = RequestGroup.objects.count()
    passed = not problems
    summary = (f"{groups} request group(s); every salt unchanged since it was first sent" if passed
               else f"{len(problems)} salt change(s)")
    return CheckResult("salts_stable", "Salts stable",
                       "Keep cache_salt stable within a group that should benefit from prefix reuse.",
                       passed, summary, _capped(problems))


# --- 5 --------------------------------------------------------------------------------------------------


def check_overlap_capacity(now: datetime) -> CheckResult:
    from dashboard.rollout.upgrade import tenant_overlaps

    overlaps = tenant_overlaps()
    problems, fine = [], []
    for overlap in overlaps:
        pairs = ", ".join(f"{model}: {old} → {new}" for model, old, new in overlap.overlaps)
        line = (f"tenant {overlap.quota.tenant_id} ({pairs}): occupancy {humanize_bytes(overlap.current_bytes)} + "
                f"warm-up still to come {humanize_bytes(overlap.pending_bytes)} = "
                f"{humanize_bytes(overlap.peak_bytes)} vs {overlap.quota.source} "
                f"{humanize_bytes(overlap.quota.limit_bytes)}")
        if overlap.quota.over_quota:
            line += "; the master reports the tenant over quota"
        (fine if overlap.fits else problems).append(line)
    passed = not problems
    if not overlaps:
        summary = "no release overlap in progress"
    elif passed:
        summary = f"{len(overlaps)} tenant(s) with overlapping releases, all within quota"
    else:
        summary = f"{len(problems)} tenant(s) would exceed their quota while releases overlap"
    return CheckResult("overlap_capacity", "Overlap capacity",
                       "Account for duplicate cache occupancy while old and new releases overlap.",
                       passed, summary, _capped(problems + fine))


# --- real engines --------------------------------------------------------------------------------------------

#: An engine that answered prefix-cache queries but sent no KV event for this long fails ``engine_events_flow``.
ENGINE_EVENTS_SILENCE_SECONDS = 120


def _where(row: InstanceStats) -> str:
    scope = "/".join(part or "-" for part in (row.tenant_id, row.served_model_name, row.namespace))
    return f"instance {row.instance_id} on node {row.node_name} ({scope})"


def _observed_engines() -> list[InstanceStats]:
    """Engine facts of the instances in the documents the agents run (rows of instances that left are ignored).
    Read once per checklist run (``run_checks``): five checks look at them."""
    def read() -> list[InstanceStats]:
        applied = applied_instances()
        return [row for row in InstanceStats.objects.order_by("node_name", "instance_id")
                if (row.node_name, row.instance_id) in applied]

    return _once("observed_engines", read)


def check_engines_hash_registered(now: datetime) -> CheckResult:
    """Fail for every observed engine instance whose Store blocks do not hash as the registry says (its release's
    ``hash_algo``, ``PYTHONHASHSEED``, block size, request group salts): the agent cannot account for them."""
    rows = _observed_engines()
    problems = [f"{_where(row)}: {row.hash_mismatch} of {row.blocks_seen} Store block(s) hash differently from "
                "the release's settings (hash algorithm, PYTHONHASHSEED, block size): the engine runs with values "
                "the registry does not know; restart it from its instance directory" for row in rows
                if row.hash_mismatch > 0]
    passed = not problems
    blocks = sum(row.attributed for row in rows)
    if not rows:
        summary = "no engine instance reports Store writes yet"
    elif passed:
        summary = f"{len(rows)} engine instance(s): all {blocks} attributed Store block(s) hash as registered"
    else:
        summary = f"{len(problems)} engine instance(s) hash differently from their release"
    return CheckResult("engines_hash_registered", "Engines hash as registered",
                       "Keep model and release fields identical across compatible prefill, decode, and replica "
                       "instances.", passed, summary, _capped(problems))


def check_blocks_registered(now: datetime) -> CheckResult:
    """Fail when engines store blocks that belong to no registered request group (an unregistered or per-request
    ``cache_salt``, an unregistered LoRA adapter) or when an agent receives Store writes from an engine of no
    instance of its document (``Report.unknown_topic_blocks`` of each node's newest report)."""
    problems: list[str] = []
    rows = _observed_engines()
    for row in rows:
        if row.unknown_salt:
            problems.append(f"{_where(row)}: {row.unknown_salt} Store block(s) with a cache_salt of no registered "
                            "request group (a random salt per request stores blocks nothing can reuse)")
        if row.unknown_adapter:
            problems.append(f"{_where(row)}: {row.unknown_adapter} Store block(s) of a LoRA adapter the release "
                            "does not list")
    newest = dict(Report.objects.values("node_name").annotate(ts=Max("sent_at")).values_list("node_name", "ts"))
    receipts = Report.objects.filter(sent_at__in=set(newest.values()), unknown_topic_blocks__gt=0)
    for receipt in receipts.order_by("node_name"):
        if newest.get(receipt.node_name) == receipt.sent_at:
            problems.append(f"node {receipt.node_name}: {receipt.unknown_topic_blocks} Store block(s) in "
                            f"{receipt.unknown_topic_messages} KV-event message(s) from engines of no instance of its "
                            "config (an engine started by hand, or with another instance's topic)")
    passed = not problems
    attributed = sum(row.attributed for row in rows)
    summary = (f"{attributed} Store block(s) of {len(rows)} engine instance(s), every one in a registered request "
               "group" if passed else f"{len(problems)} source(s) of Store blocks outside the registry")
    return CheckResult("blocks_registered", "Every stored block belongs to a registered request group",
                       "Avoid generating a random salt for every request unless disabling cross-request reuse is "
                       "intentional.", passed, summary, _capped(problems))


def check_engine_events_flow(now: datetime) -> CheckResult:
    """Fail for an observed vLLM instance whose engine has not answered its ``/metrics`` since it is observed, that
    answered prefix-cache queries but sent no KV event, both for over ``ENGINE_EVENTS_SILENCE_SECONDS``, or whose
    event stream lost or garbled messages (``seq_gaps``, ``decode_errors``): the ledger then misses Store blocks.
    (Agents that run ``--simulate-engines`` observe no engine and report none.)"""
    problems: list[str] = []
    silence = timedelta(seconds=ENGINE_EVENTS_SILENCE_SECONDS)
    rows = _observed_engines()
    for row in rows:
        where = _where(row)
        age = int((now - row.observed_since).total_seconds())
        if now - row.observed_since > silence:
            if row.metrics_scrapes == 0 and row.metrics_errors > 0:
                problems.append(f"{where}: its engine has not answered /metrics for {age} s "
                                f"({row.metrics_error or 'no answer'}): not started, or not on its port")
            elif row.messages == 0 and row.prefix_cache_queries > 0:
                problems.append(f"{where}: the engine served {row.prefix_cache_queries} prompt token(s) but no "
                                f"KV event reached the agent in {age} s (see the instance's KV events status on "
                                "its node page)")
        if row.seq_gaps:
            problems.append(f"{where}: {row.seq_gaps} KV-event message(s) lost (sequence gaps): Store blocks are "
                            "missing from the agent's ledger")
        if row.decode_errors:
            problems.append(f"{where}: {row.decode_errors} malformed KV-event message(s) dropped "
                            f"({row.last_error or 'no detail'})")
    passed = not problems
    if not rows:
        summary = "no engine instance observed"
    elif passed:
        summary = f"{len(rows)} observed engine instance(s), their events complete"
    else:
        summary = f"{len(problems)} problem(s) with engine events"
    return CheckResult("engine_events_flow", "Engines' events reach their agent", "", passed, summary,
                       _capped(problems))


def _shared_single_user_nodes() -> list[str]:
    """One line per node whose newest heartbeat says single-user mode (``NodeState.single_user``) and whose applied
    document holds instances of more than one tenant, naming the node and how many tenants (not which)."""
    single = set(NodeState.objects.filter(single_user=True).values_list("node_name", flat=True))
    if not single:
        return []
    tenants: dict[str, set[str]] = defaultdict(set)
    for (node, _instance_id), instance in applied_instances().items():
        if node in single:
            tenants[node].add(str(instance["tenant_id"]))
    return [f"node {node}: its agent runs in single-user mode (not privileged, or --single-user: every engine "
            f"instance runs as the agent's account) with instances of {len(names)} tenants, which can read each "
            "other's files and sockets and publish as each other; run the agent as root or with CAP_CHOWN, "
            "CAP_DAC_OVERRIDE and CAP_FOWNER, without --single-user (README \"Users and permissions on a node\")"
            for node, names in sorted(tenants.items()) if len(names) > 1]


def check_engine_events_trusted(now: datetime) -> CheckResult:
    """Fail for every observed instance whose agent does not receive its KV events from a socket only the instance's
    account can have made (``InstanceStats.events_untrusted``: a refused socket, a tcp endpoint, no account), and
    for messages that arrived on an instance's socket under another instance's topic (``topic_mismatch``), and for
    every single-user node running instances of more than one tenant (:func:`_shared_single_user_nodes`)."""
    problems: list[str] = _shared_single_user_nodes()
    rows = _observed_engines()
    for row in rows:
        if row.events_untrusted:
            refusals = f" ({row.events_refusals} refused connection attempt(s))" if row.events_refusals else ""
            problems.append(f"{_where(row)}: KV events {row.events_status}{refusals}: {row.events_problem}")
        if row.topic_mismatch:
            problems.append(f"{_where(row)}: {row.topic_mismatch} KV-event message(s) on its socket under another "
                            "topic (dropped): its engine runs with another instance's --kv-events-config")
    passed = not problems
    connected = sum(row.events_status == "connected" for row in rows)
    if not rows:
        summary = "no engine instance observed"
    elif passed:
        summary = (f"{connected} of {len(rows)} engine instance(s) connected, each on a socket only its own account "
                   "can have made")
    else:
        summary = f"{len(problems)} instance(s) or node(s) whose KV events the agent cannot vouch for"
    return CheckResult("engine_events_trusted", "Only the instance publishes as the instance", "", passed, summary,
                       _capped(problems))


def check_engine_writes_in_store(now: datetime) -> CheckResult:
    """Fail for an observed engine instance whose engine writes blocks under a key prefix that is not its release's
    (``unknown_namespace_keys``: a mistyped ``cache_prefix``, another ``--model``; the blocks count nowhere in the
    product) or that reported Store writes the Store did not hold (``unconfirmed``)."""
    problems: list[str] = []
    rows = _observed_engines()
    for row in rows:
        for name, keys, size in row.unknown_namespaces:
            problems.append(f"{_where(row)}: its engine wrote {keys} key(s), {humanize_bytes(size)}, under namespace "
                            f"{name}, not under its release's: restart it from its instance directory (check "
                            "cache_prefix and --model)")
        if row.unconfirmed:
            problems.append(f"{_where(row)}: {row.unconfirmed} Store write(s) the engine reported were not in the "
                            "Store (forged KV events, or writes the master dropped over the tenant's quota)")
    passed = not problems
    confirmed = sum(row.confirmed for row in rows)
    if not rows:
        summary = "no engine instance observed"
    elif passed:
        summary = f"{confirmed} engine-written block(s) of {len(rows)} instance(s) confirmed in the Store"
    else:
        summary = f"{len(problems)} engine write problem(s)"
    return CheckResult("engine_writes_in_store", "Engines write where the registry says",
                       "Use deterministic names that remain stable across restarts.", passed, summary,
                       _capped(problems))


# --- pool capacity ---------------------------------------------------------------------------------------------


def check_quota_capacity(now: datetime) -> CheckResult:
    """Fail when a tenant's effective quota (newest master read-back) is below its requested quota or below its
    charged bytes; say so when the master was never read back. Only the newest sampling round counts: a tenant
    missing from it is one the master no longer holds."""
    from dashboard.telemetry.queries import latest_master_quotas

    samples = latest_master_quotas()
    if samples:
        newest = max(sample.ts for sample in samples.values())
        samples = {tenant_id: sample for tenant_id, sample in samples.items() if sample.ts == newest}
    problems, fine = [], []
    for tenant_id, sample in sorted(samples.items()):
        at = f"(master read-back {sample.ts:%Y-%m-%d %H:%M:%S} UTC)"
        requested, effective, charged = (sample.requested_quota_bytes, sample.effective_quota_bytes,
                                         sample.charged_bytes)
        if effective < requested:
            problems.append(f"tenant {tenant_id}: effective quota {humanize_bytes(effective)} is below the requested "
                            f"{humanize_bytes(requested)}: the requested quotas exceed the pool's mounted memory, so "
                            f"the master scaled them down {at}")
        if effective < charged:
            problems.append(f"tenant {tenant_id}: charged {humanize_bytes(charged)} is above its effective quota "
                            f"{humanize_bytes(effective)}: the master refuses its writes until eviction frees "
                            f"space {at}")
        if effective >= requested and effective >= charged:
            fine.append(f"tenant {tenant_id}: requested {humanize_bytes(requested)}, effective "
                        f"{humanize_bytes(effective)}, charged {humanize_bytes(charged)} {at}")
    registry = set(Tenant.objects.values_list("tenant_id", flat=True))
    unsampled = sorted(registry - set(samples))
    passed = not problems
    if not samples:
        summary = "no read-back from the Mooncake master yet: effective quotas unknown"
    elif passed:
        summary = f"{len(samples)} tenant(s) get their requested quota and are charged within it"
    else:
        summary = f"{len(problems)} quota problem(s): effective below requested or below charged"
    details = problems + fine + [f"tenant {tenant_id}: no read-back from the master yet" for tenant_id in unsampled]
    return CheckResult("quota_capacity", "Quotas fit the pool",
                       "Applying a Mooncake quota to each logical tenant.", passed, summary, _capped(details))


def check_budgets_fit(now: datetime) -> CheckResult:
    """Fail when budgets let the master's prefix-blind eviction start (``tenants.room``, measured in
    ``docs/eviction.md``): a tenant's explicit and implicit budgets can hold more than its effective quota (the master
    evicts inside the tenant), or all tenants' more than the watermark of the mounted capacity (it evicts across the
    pool). Each failing line says which of the tenant's own budgets to lower to what."""
    from dashboard.master.room import current_pool_room

    pool = current_pool_room()
    problems, fine = [], []
    for tenant_id, room in sorted(pool.tenants.items()):
        if room.quota_excess_bytes:
            problems.append(room.advice("quota"))
        elif room.unbudgeted and not room.unbudgeted_room_bytes:
            fine.append(f"tenant {tenant_id}: its explicit budgets reach its eviction point, so its "
                        f"{len(room.unbudgeted)} release(s) without a budget keep nothing (give them budgets, or "
                        "lower the others)")
        else:
            fine.append(f"tenant {tenant_id}: budgets can hold {humanize_bytes(room.held_bytes)} of its "
                        f"{room.eviction_point_source} {humanize_bytes(room.eviction_point_bytes)}")
    watermark = pool.watermark_bytes
    if pool.watermark_excess_bytes:
        problems.append(
            f"all tenants can hold {humanize_bytes(pool.held_bytes)}, {humanize_bytes(pool.watermark_excess_bytes)} "
            f"above the pool's eviction watermark of {humanize_bytes(watermark or 0)} "
            f"({pool.eviction.high_watermark_ratio:g} of {humanize_bytes(pool.capacity_bytes or 0)} mounted), where "
            "the master starts evicting across tenants, least recently used first"
            + (f" (tenants only the master holds: {humanize_bytes(sum(pool.others.values()))})" if pool.others else ""))
        problems.extend(room.advice("watermark") for _, room in sorted(pool.tenants.items())
                        if room.watermark_excess_bytes)
    passed = pool.fits
    if pool.capacity_bytes is None:
        summary = ("mounted capacity unknown (no master probe yet, or nothing mounted): budgets checked against the "
                   "requested quotas only")
    elif passed:
        summary = (f"every tenant's budgets fit its effective quota; all fit the watermark "
                   f"{humanize_bytes(watermark or 0)} of {humanize_bytes(pool.capacity_bytes)} mounted")
    else:
        summary = f"{len(problems)} budget problem(s): the master would evict before the agents choose"
    if not passed and pool.capacity_bytes is None:
        summary = f"{len(problems)} budget problem(s) against the requested quotas (mounted capacity unknown)"
    return CheckResult("budgets_fit", "Budgets keep the master from evicting",
                       "Budgets, not the Store's prefix-blind eviction, choose what goes.", passed, summary,
                       _capped(problems + fine))


# --- faults: the master and the agents ------------------------------------------------------------------------


def check_master_healthy(now: datetime) -> CheckResult:
    """Fail while the newest master probe (``dashboard.master.health``) could not read the master, when no probe
    ran for ``3 * KVPOOL_MASTER_PROBE_SECONDS`` (at least 15 s) since the first one, and for
    ``KVPOOL_MASTER_RESTART_FLAG_SECONDS`` after a detected restart (every object of the pool was lost; the agents'
    ledgers follow within seconds); in HA mode also for ``KVPOOL_MASTER_FAILOVER_FLAG_SECONDS`` after a failover,
    and while no standby answers."""
    from django.conf import settings

    from dashboard.master.health import current_health

    row = current_health()
    interval = settings.CELERY_BEAT_SCHEDULE.get("probe-master", {}).get("schedule", 5)
    stale_after = timedelta(seconds=max(15, 3 * float(interval)))
    problems: list[str] = []
    if row.checked_at is not None and now - row.checked_at > stale_after:
        problems.append(f"no master probe for {int((now - row.checked_at).total_seconds())} s (is the dashboard's "
                        "Celery beat running?)")
    if row.checked_at is not None and not row.up:
        since = row.down_since or row.checked_at
        problems.append(f"the master is down since {since:%Y-%m-%d %H:%M:%S} UTC: {row.last_error}")
    flag = timedelta(seconds=settings.KVPOOL_MASTER_RESTART_FLAG_SECONDS)
    if row.last_restart_at is not None and now - row.last_restart_at <= flag:
        problems.append(f"{row.last_restart_reason} at {row.last_restart_at:%Y-%m-%d %H:%M:%S} UTC: every object "
                        "in the pool was lost; agents drop the lost blocks from their ledgers at their next Store "
                        "probe")
    failover_flag = timedelta(seconds=settings.KVPOOL_MASTER_FAILOVER_FLAG_SECONDS)
    if row.last_failover_at is not None and now - row.last_failover_at <= failover_flag:
        problems.append(f"{row.last_failover_reason} at {row.last_failover_at:%Y-%m-%d %H:%M:%S} UTC: clients "
                        "followed the new leader; the registry's quotas are pushed to it")
    ha = bool(row.leader_address)
    if ha and row.checked_at is not None and row.up and not row.standbys:
        down = f" ({row.masters_down})" if row.masters_down else ""
        problems.append(f"no standby master answers{down}: nothing takes over if leader {row.leader_address} stops")
    passed = not problems
    if row.checked_at is None:
        summary = "the master was not probed yet (the dashboard's Celery beat probes it)"
    elif passed:
        summary = (f"master up, {row.key_count} key(s), {humanize_bytes(row.capacity_bytes or 0)} mounted; "
                   f"{row.restarts} restart(s) seen")
        if ha:
            summary += (f"; HA: leader {row.leader_address}, {row.standbys} standby(s), "
                        f"{row.failovers} failover(s) seen")
    else:
        summary = "; ".join(problems)[:300]
    return CheckResult("master_healthy", "Master up, no recent restart or failover",
                       "Mooncake master: a restart without HA loses every cached object; in HA mode a standby "
                       "takes over.", passed, summary, _capped(problems))


def check_nodes_reporting(now: datetime) -> CheckResult:
    """Fail for every registered node whose agent sent no heartbeat for ``KVPOOL_HEARTBEAT_SILENCE_SECONDS``
    (agent down, broker stalled, dashboard worker stopped: its outbox keeps the messages until they go through)."""
    from django.conf import settings

    from tenants.models import Node

    silence = timedelta(seconds=settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS)
    states = {s.node_name: s for s in NodeState.objects.all()}
    problems: list[str] = []
    nodes = list(Node.objects.order_by("name").values_list("name", flat=True))
    never = 0
    for name in nodes:
        state = states.get(name)
        if state is None or state.heartbeat_at is None:
            never += 1  # never heard from: not silent (nothing was lost); pd_identical fails for it
            continue
        age = now - state.heartbeat_at
        if age > silence:
            problems.append(f"node {name}: no heartbeat for {int(age.total_seconds())} s (agent stopped, or the "
                            f"broker or the dashboard worker stalled; outbox had {state.outbox_pending} message(s) "
                            "pending)")
    passed = not problems
    heard = f"{len(nodes) - never} node(s) heard from within {settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS} s"
    waiting = f"; {never} never heard from yet (no agent has started: see 'Prefill/decode values identical')" if never \
        else ""
    summary = f"{heard}{waiting}" if passed else f"{len(problems)} silent node(s)"
    return CheckResult("nodes_reporting", "Agents reporting", "", passed, summary, _capped(problems))


CHECKS: tuple[Callable[[datetime], CheckResult], ...] = (
    check_names_stable, check_pd_identical, check_namespace_changed, check_salts_stable, check_overlap_capacity,
    check_engines_hash_registered, check_blocks_registered, check_engine_events_flow, check_engine_events_trusted,
    check_engine_writes_in_store, check_quota_capacity, check_budgets_fit, check_master_healthy, check_nodes_reporting,
)


def run_checks(now: datetime | None = None) -> list[CheckResult]:
    """Run every check in the seed's order."""
    now = now or timezone.now()
    with _checklist_run(now):
        return [check(now) for check in CHECKS]


#: Seconds the overview reuses a checklist run (its flags and "check failed" warnings): the checklist reads every
#: node, instance and recent sample, seconds of work at fleet size. The checks page and its JSON always run it
#: afresh, and store their run for the overview.
CHECKS_CACHE_SECONDS = 30
_CACHE_KEY = "kvpool:checklist"


def recent_checks(max_age: int = CHECKS_CACHE_SECONDS) -> list[CheckResult]:
    """``run_checks()`` as run at most ``max_age`` seconds ago (this process's cache), else run now."""
    from django.core.cache import cache

    checks = cache.get(_CACHE_KEY)
    if checks is None:
        checks = remember_checks(run_checks(), max_age)
    return checks


def remember_checks(checks: list[CheckResult], max_age: int = CHECKS_CACHE_SECONDS) -> list[CheckResult]:
    """Keep ``checks`` (a fresh ``run_checks()``) for ``recent_checks``; returns them."""
    from django.core.cache import cache

    cache.set(_CACHE_KEY, checks, max_age)
    return checks


def run_check(key: str, now: datetime | None = None) -> CheckResult | None:
    """Run the one check whose result has ``key`` (``None`` for an unknown key): the checks' keys are their
    function names without ``check_``."""
    check = next((check for check in CHECKS if check.__name__ == f"check_{key}"), None)
    if check is None:
        return None
    now = now or timezone.now()
    with _checklist_run(now):
        return check(now)
