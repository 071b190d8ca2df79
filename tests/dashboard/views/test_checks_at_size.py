"""The checklist at fleet size, tested with small numbers (issue 17): the set-based checks (``dashboard.checklist``:
columns instead of model objects, the stored config documents read and decoded once per run, reported names grouped
in SQL) give exactly the verdicts, summaries and lines of a brute-force reading (every row and document, one at a
time, as the checks were first written), and their queries do not grow with the fleet.

The registries are fleet-shaped (``bench.fleet_registry``) with heartbeats, occupancy and every node's config
document applied (``bench.pages``), plus one fault of each kind the four rewritten checks look for."""
from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agent.contract.scope import ENGINE_LOOKUPS
from bench.fleet_registry import build_fleet
from bench.pages import add_telemetry, apply_documents
from dashboard.checklist import (
    CONFIG_HISTORY_DAYS,
    REPORTED_NAMES_WINDOW_SECONDS,
    _key_identity,
    applied_instances,
    prescribed_values,
    run_checks,
)
from dashboard.models import ConfigVersion, NodeState, OccupancySample
from tenants.choices import ReleaseState
from tenants.models import AuditEntry, InstanceAssignment, Release, RequestGroup, ServedModel, Tenant
from tests.support.rows import sample

pytestmark = pytest.mark.django_db

SHAPE = {"nodes": 12, "tenants": 3, "models": 4, "releases": 12, "scopes": 36, "scopes_per_node": 9}
#: Checks whose code was rewritten set-based; the others are compared too (they share the run's documents).
REWRITTEN = ("names_stable", "pd_identical", "namespace_changed", "salts_stable")


@pytest.fixture(autouse=True)
def _slow_silence(settings):
    settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS = 1800


# --- brute force: the checks as first written (model objects, every document decoded by each check) --------------


def _documents(now):
    return [(v.node_name, v.version, v.document) for v in ConfigVersion.objects.filter(
        created_at__gte=now - timedelta(days=CONFIG_HISTORY_DAYS)).order_by("node_name", "version")]


def brute_applied() -> dict:
    states = {s.node_name: s.applied_digest for s in NodeState.objects.exclude(applied_digest="")}
    result = {}
    for version in ConfigVersion.objects.all():
        if states.get(version.node_name) == version.digest:
            for instance in (version.document or {}).get("instances", []):
                result[(version.node_name, str(instance.get("instance_id")))] = instance
    return result


def brute_names_stable(now) -> tuple[bool, str, list[str]]:
    problems = []
    tenants = {t.tenant_id for t in Tenant.objects.all()}
    models = {(m.tenant.tenant_id, m.served_model_name) for m in ServedModel.objects.all()}
    releases = {(r.model.tenant.tenant_id, r.model.served_model_name, r.namespace) for r in Release.objects.all()}
    groups = {(g.tenant.tenant_id, g.name) for g in RequestGroup.objects.all()}
    reported = sorted({(s.node_name, s.tenant_id, s.served_model_name, s.namespace, s.request_group)
                       for s in OccupancySample.objects.filter(level=OccupancySample.Level.RAW)
                       if s.ts >= now - timedelta(seconds=REPORTED_NAMES_WINDOW_SECONDS)})
    for node, tenant_id, model, namespace, group in reported:
        where = f"node {node} reports {tenant_id}/{model or '-'}/{namespace or '-'}"
        if tenant_id not in tenants:
            problems.append(f"{where}: tenant '{tenant_id}' is not in the registry")
        elif model and (tenant_id, model) not in models:
            problems.append(f"{where}: served model '{model}' is not registered in tenant '{tenant_id}'")
        elif namespace and (tenant_id, model, namespace) not in releases:
            problems.append(f"{where}: release namespace '{namespace}' is not registered for model '{model}'")
        elif group and group != ENGINE_LOOKUPS and (tenant_id, group) not in groups:
            problems.append(f"{where}: request group '{group}' is not registered in tenant '{tenant_id}'")
    history: dict = {}
    for node, version, document in _documents(now):
        for instance in (document or {}).get("instances", []):
            names = (instance.get("tenant_id", ""), instance.get("served_model_name", ""),
                     instance.get("namespace", ""))
            key = (node, str(instance.get("instance_id")))
            previous = history.get(key)
            if previous is not None and previous[1] != names:
                problems.append(f"instance {key[1]} on node {node} changed names from {'/'.join(previous[1])} "
                                f"(v{previous[0]}) to {'/'.join(names)} (v{version})")
            history[key] = (version, names)
    for release in Release.objects.exclude(state=ReleaseState.RETIRED):
        if not release.hash_seed:
            problems.append(f"release '{release.namespace}' of '{release.model}' has no hash seed: block hashes "
                            "(PYTHONHASHSEED) would differ after a restart")
    summary = (f"{len(reported)} reported name(s) all match the registry; instance names unchanged across config "
               "versions" if not problems else f"{len(problems)} name problem(s)")
    return not problems, summary, problems


def brute_pd_identical(now) -> tuple[bool, str, list[str]]:
    applied = brute_applied()
    applied_nodes = {node for node, _ in applied}
    node_states = {s.node_name for s in NodeState.objects.exclude(applied_digest="")}
    problems, checked = [], 0
    assignments = sorted((a for a in InstanceAssignment.objects.all() if a.release.state != ReleaseState.RETIRED),
                         key=lambda a: (a.release.namespace, a.node.name, a.port))
    for assignment in assignments:
        node = assignment.node.name
        where = f"{assignment.release.namespace} {assignment.role} on {node}:{assignment.port}"
        spec = applied.get((node, str(assignment.pk)))
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
                 for name, value in prescribed_values(assignment.release).items()
                 if str(spec.get(name, "")) != str(value)]
        if wrong:
            problems.append(f"{where}: the agent applied " + ", ".join(wrong))
    summary = (f"{checked} instance(s) apply exactly what their release prescribes" if not problems
               else f"{len(problems)} instance(s) differ from their release or are unconfirmed")
    return not problems, summary, problems


def brute_namespace_changed(now) -> tuple[bool, str, list[str]]:
    problems = []
    pushed: dict = defaultdict(dict)
    for node, version, document in _documents(now):
        for instance in (document or {}).get("instances", []):
            if instance.get("release_state", ReleaseState.SERVING) != ReleaseState.SERVING:
                continue
            identity = _key_identity(instance.get("tenant_id", ""), instance.get("engine", ""),
                                     instance.get("served_model_name", ""), instance.get("vllm_model_name", ""),
                                     instance.get("namespace", ""))
            pushed[identity].setdefault(instance.get("release_fingerprint", ""), (node, version))
    for identity, fingerprints in sorted(pushed.items()):
        if len(fingerprints) > 1:
            seen = ", ".join(f"{fp[:12]} (first on {node} v{version})" for fp, (node, version) in fingerprints.items())
            problems.append(f"namespace '{identity[3]}' of {identity[0]}/{identity[2]} ({identity[1]}) served on "
                            f"agents with {len(fingerprints)} fingerprints: {seen}; a cache-incompatible change kept "
                            "the namespace")
    live: dict = defaultdict(list)
    for release in Release.objects.exclude(state=ReleaseState.RETIRED):
        model = release.model
        live[_key_identity(model.tenant.tenant_id, release.engine, model.served_model_name, model.vllm_model_name,
                           release.namespace)].append(release)
    for identity, releases in sorted(live.items()):
        if len({r.fingerprint for r in releases}) > 1:
            names = ", ".join(f"{r.model}/{r.namespace} ({r.fingerprint[:12]})" for r in releases)
            problems.append(f"live releases share the keys of namespace '{identity[3]}' with different "
                            f"fingerprints: {names}")
    summary = (f"{len(pushed)} served namespace(s), each with a single fingerprint" if not problems
               else f"{len(problems)} namespace(s) reused across incompatible settings")
    return not problems, summary, problems


def brute_salts_stable(now) -> tuple[bool, str, list[str]]:
    problems = []
    salts: dict = defaultdict(dict)
    for node, version, document in _documents(now):
        for instance in (document or {}).get("instances", []):
            for group in instance.get("request_groups", []):
                salts[(instance.get("tenant_id", ""), group.get("name", ""))].setdefault(
                    group.get("cache_salt", ""), (node, version))
    for (tenant_id, name), values in sorted(salts.items()):
        if len(values) > 1:
            problems.append(f"request group {tenant_id}/{name} went to agents with {len(values)} different "
                            "cache_salt values: its requests stopped reusing each other's prefixes")
    for entry in AuditEntry.objects.filter(object_type="tenants.requestgroup", action="update").order_by("timestamp"):
        before, after = entry.before or {}, entry.after or {}
        if "cache_salt" in before and before.get("cache_salt") != after.get("cache_salt"):
            problems.append(f"request group {entry.object_repr}: cache_salt changed at "
                            f"{entry.timestamp:%Y-%m-%d %H:%M:%S} by {entry.actor_repr}")
    summary = (f"{RequestGroup.objects.count()} request group(s); every salt unchanged since it was first sent"
               if not problems else f"{len(problems)} salt change(s)")
    return not problems, summary, problems


BRUTE = {"names_stable": brute_names_stable, "pd_identical": brute_pd_identical,
         "namespace_changed": brute_namespace_changed, "salts_stable": brute_salts_stable}


# --- the fleet and its faults ------------------------------------------------------------------------------------


def _new_version(node: str, change) -> str:
    """Store the next config version of ``node`` with ``change(instances)`` applied to a copy of its newest
    document's instances; returns its digest."""
    newest = ConfigVersion.objects.filter(node_name=node).order_by("-version").first()
    document = json.loads(json.dumps(newest.document))
    document["instances"] = change(document["instances"])
    digest = f"{newest.version + 1:064d}"[-64:].replace("0", "d", 1)
    ConfigVersion.objects.create(node_name=node, version=newest.version + 1, digest=digest,
                                 content_digest="c" * 64, document=document)
    return digest


def _apply(node: str, digest: str) -> None:
    NodeState.objects.filter(node_name=node).update(applied_digest=digest)


@pytest.fixture
def faulty_fleet():
    """A 12-node fleet (9 heartbeating now, 2 an hour ago, 1 never) whose nodes' documents are applied, with one
    fault of each kind."""
    fleet = build_fleet(**SHAPE)
    add_telemetry(fleet, alive=9, silent=2, reports=2, per_scope=True)
    apply_documents(fleet)
    n = fleet.node_names
    # node 0 runs a version whose first instance has another hash seed and vLLM model name (pd_identical, and
    # names_stable: renamed) and whose second lacks most fields (the defaults)
    _apply(n[0], _new_version(n[0], lambda xs: [
        {**xs[0], "hash_seed": "999", "vllm_model_name": "other", "namespace": "renamed"},
        {"instance_id": xs[1]["instance_id"], "tenant_id": xs[1]["tenant_id"]}, *xs[2:]]))
    # node 1 runs a version the dashboard does not hold; node 2 one without its last instance (not applied yet)
    _apply(n[1], "f" * 64)
    _apply(n[2], _new_version(n[2], lambda xs: xs[:-1]))
    # node 3 was sent another fingerprint for a serving instance, for one without a release state (from before the
    # field: counts as serving) and for a warming one (not a reuse)
    _new_version(n[3], lambda xs: [{**xs[0], "release_fingerprint": "0" * 64},
                                   {**xs[1], "release_fingerprint": "1" * 64, "release_state": "warming"},
                                   {**{k: v for k, v in xs[2].items() if k != "release_state"},
                                    "release_fingerprint": "2" * 64}, *xs[3:]])
    # node 4 was sent another salt for one request group
    _new_version(n[4], lambda xs: [{**xs[0], "request_groups": [
        {**xs[0]["request_groups"][0], "cache_salt": "changed"}, *xs[0]["request_groups"][1:]]}, *xs[1:]])
    # names the registry lacks, and names it has
    tenant_id, model, namespace = fleet.releases[0]
    for fields in ({"tenant_id": "ghost"}, {"tenant_id": tenant_id, "model": "nope"},
                   {"tenant_id": tenant_id, "model": model, "namespace": "rel-zzz"},
                   {"tenant_id": tenant_id, "model": model, "namespace": namespace, "group": "ghost-group"},
                   {"tenant_id": tenant_id, "model": model, "namespace": namespace, "group": ENGINE_LOOKUPS},
                   {"tenant_id": tenant_id, "model": "", "namespace": ""}):
        for node in (n[5], n[0]):
            sample(node=node, **{"model": "", "namespace": "", **fields})
    sample(node=n[6], tenant_id="ghost", ts=timezone.now() - timedelta(seconds=REPORTED_NAMES_WINDOW_SECONDS + 60))
    # a live release without a hash seed; a salt change in the audit log
    Release.objects.filter(namespace=fleet.releases[1][2]).update(hash_seed="")
    AuditEntry.objects.create(actor_repr="script", action="update", object_type="tenants.requestgroup",
                              object_id="1", object_repr="app-000", before={"cache_salt": "x"},
                              after={"cache_salt": "y"})
    return fleet


def test_the_rewritten_checks_give_the_brute_force_verdicts_and_lines(faulty_fleet):
    now = timezone.now()
    checks = {check.key: check for check in run_checks(now)}
    for key in REWRITTEN:
        passed, summary, details = BRUTE[key](now)
        assert (checks[key].passed, checks[key].summary) == (passed, summary), key
        assert checks[key].details == details, key
        assert not passed, key  # every fault shows
    # each kind of fault is among the lines
    lines = {key: "\n".join(checks[key].details) for key in REWRITTEN}
    assert "hash_seed '999'" in lines["pd_identical"] and "no longer holds" in lines["pd_identical"]
    assert "not applied yet" in lines["pd_identical"] and "has not reported running" in lines["pd_identical"]
    assert "changed names from" in lines["names_stable"] and "has no hash seed" in lines["names_stable"]
    for missing in ("tenant 'ghost'", "served model 'nope'", "namespace 'rel-zzz'", "request group 'ghost-group'"):
        assert lines["names_stable"].count(missing) == 2, missing  # on both nodes
    assert ENGINE_LOOKUPS not in lines["names_stable"]
    assert lines["namespace_changed"].count("2 fingerprints") == 2 and "2222" in lines["namespace_changed"]
    assert "1111" not in lines["namespace_changed"]
    assert "2 different cache_salt values" in lines["salts_stable"] and "cache_salt changed" in lines["salts_stable"]


def test_applied_instances_holds_what_each_agent_applied(faulty_fleet):
    brute = brute_applied()
    fields = ("instance_id", *prescribed_values(Release.objects.first()))
    expected = {key: {name: spec.get(name, "") for name in fields} for key, spec in brute.items()}
    for key in expected:
        if expected[key]["instance_id"] == "":
            expected[key]["instance_id"] = None
    assert applied_instances() == expected
    some = {faulty_fleet.node_names[0], faulty_fleet.node_names[3]}
    assert applied_instances(some) == {key: spec for key, spec in expected.items() if key[0] in some}
    assert len(expected) > 20  # of 36 instances: node 1 runs an unknown version, node 11 none


def test_a_healthy_fleet_passes_the_rewritten_checks_as_brute_force_does():
    fleet = build_fleet(**SHAPE)
    add_telemetry(fleet, reports=2, per_scope=True)
    apply_documents(fleet)
    now = timezone.now()
    checks = {check.key: check for check in run_checks(now)}
    for key in REWRITTEN:
        assert (checks[key].passed, checks[key].summary, checks[key].details) == (True, *BRUTE[key](now)[1:]), key
    assert checks["names_stable"].summary.startswith(f"{sum(map(len, fleet.scopes_by_node.values()))} reported")


def test_a_run_decodes_only_the_documents_this_process_has_not_decoded():
    from dashboard import checklist

    fleet = build_fleet(**SHAPE)
    add_telemetry(fleet, reports=1, per_scope=True)
    apply_documents(fleet)
    checklist._document_cache.clear()
    with CaptureQueriesContext(connection) as cold:
        first = run_checks()
    with CaptureQueriesContext(connection) as warm:
        second = run_checks()
    documents = [q["sql"] for q in cold.captured_queries if "::text" in q["sql"] or "AS TEXT" in q["sql"].upper()]
    assert len(cold) == len(warm) + 1 and len(documents) == 1  # the documents, read once, in one query
    assert [c.as_dict() for c in first] == [c.as_dict() for c in second]
    node = fleet.node_names[0]
    _apply(node, _new_version(node, lambda xs: [{**xs[0], "hash_seed": "999"}, *xs[1:]]))
    pd = {check.key: check for check in run_checks()}["pd_identical"]
    assert not pd.passed and pd.details == [line for line in brute_pd_identical(timezone.now())[2]]
    assert any("hash_seed '999'" in line for line in pd.details)


def test_tenant_overlaps_reads_the_occupancy_of_the_overlapping_tenants_only():
    from dashboard.rollout.upgrade import start_upgrade, tenant_overlaps
    from dashboard.telemetry.queries import current_occupancy

    fleet = build_fleet(**SHAPE)
    add_telemetry(fleet, per_scope=True)
    assert tenant_overlaps() == []
    start_upgrade(Release.objects.get(namespace=fleet.releases[0][2]), "rel-new")
    assert tenant_overlaps() == tenant_overlaps(occupancy=current_occupancy())
    assert [overlap.quota.tenant_id for overlap in tenant_overlaps()] == [fleet.releases[0][0]]


class _Undo(Exception):
    pass


def _queries(shape: dict, client) -> dict[str, int]:
    """Queries of a checklist run and of the pages that read the applied documents, on a fleet of ``shape`` with
    its documents applied (rolled back after)."""
    from django.core.cache import cache

    counts: dict[str, int] = {}
    try:
        with transaction.atomic():
            fleet = build_fleet(**shape)
            add_telemetry(fleet, silent=1, per_scope=True)
            apply_documents(fleet)
            release = Release.objects.order_by("namespace").first()
            node = fleet.node_names[0]
            from tenants.models import Node

            pages = {"checks": reverse("ui:checks"), "check": reverse("ui:check", args=["pd_identical"]),
                     "release": reverse("ui:release", args=[release.pk]),
                     "node": reverse("ui:node", args=[Node.objects.get(name=node).pk]),
                     "api_tenants": "/api/v1/tenants/"}
            for name, url in pages.items():
                cache.clear()
                client.get(url)
                with CaptureQueriesContext(connection) as captured:
                    assert client.get(url).status_code == 200, url
                counts[name] = len(captured)
            with CaptureQueriesContext(connection) as captured:
                run_checks()
            counts["run_checks"] = len(captured)
            raise _Undo
    except _Undo:
        pass
    return counts


def test_queries_do_not_grow_with_the_fleet(ui):
    small = _queries({"nodes": 3, "tenants": 2, "models": 2, "releases": 4, "scopes": 8, "scopes_per_node": 4}, ui)
    large = _queries({"nodes": 9, "tenants": 5, "models": 5, "releases": 15, "scopes": 45, "scopes_per_node": 9}, ui)
    assert large == small
