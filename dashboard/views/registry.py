"""Registry pages: the registry index, tenant / served model / release / node detail pages, and downloads of
the rendered engine configuration (the same JSON as ``GET /api/v1/releases/{id}/config/``).

Every page shows only what the user may see (``tenants.access.scope``): another tenant's object is HTTP 404, and a
node's page lists only the instances, occupancy, engine facts and audit entries of the user's tenants (its error
texts and refused agent messages are for platform admins)."""
from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.api.telemetry import node_states
from dashboard.checklist import applied_instances, prescribed_values
from dashboard.forms import AdaptersField
from dashboard.master.room import current_pool_room, effective_budget
from dashboard.models import InstanceStats, MessageRejection, NodeState
from dashboard.rollout.purge import purges_for_release
from dashboard.rollout.push import drift
from dashboard.rollout.upgrade import release_key, tenant_quota, upgrade_state
from dashboard.telemetry.agent_auth import NODE_TROUBLE
from dashboard.telemetry.queries import OccupancyFilter, current_occupancy
from dashboard.views.base import ObjectPerms, visible
from dashboard.views.listing import Listing, count_of, paginate, search_text
from tenants import budgets
from tenants.access import is_platform_admin, visible_tenant_ids
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ReservedNamespace,
    ServedModel,
    Tenant,
)
from tenants.rendering import RenderTarget, render_assignment

AUDIT_ROWS = 20


def _audit(request: HttpRequest, object_type: str, pk) -> list[AuditEntry]:
    entries = visible(request, AuditEntry.objects.filter(object_type=object_type, object_id=str(pk)))
    return list(entries[:AUDIT_ROWS])


def registry_lists(request: HttpRequest) -> dict[str, Listing]:
    """The registry page's lists, each paginated and sorted on its own (``<list>_sort``, ``<list>_page``) and all
    searched by the page's one ``?q=``: tenants, served models, release namespaces, request groups, nodes — the
    rows the user may see, with their counts as subqueries (a fixed number of queries whatever the rows)."""
    releases, groups = visible(request, Release), visible(request, RequestGroup)
    tenants = visible(request, Tenant).annotate(
        model_count=count_of(visible(request, ServedModel), "tenant"),
        release_count=count_of(releases, "model__tenant"), group_count=count_of(groups, "tenant"))
    models = visible(request, ServedModel.objects.select_related("tenant")).annotate(
        release_count=count_of(releases, "model"))
    nodes = visible(request, Node).annotate(instance_count=count_of(visible(request, InstanceAssignment), "node"))
    common = {"request": request, "q_param": "q"}
    return {
        "tenants": paginate(**common, queryset=tenants, prefix="tenants_", default="tenant_id",
                            sorts={"tenant_id": ["tenant_id"], "quota": ["quota_bytes"], "models": ["model_count"],
                                   "releases": ["release_count"], "groups": ["group_count"]},
                            search_fields=("tenant_id", "description")),
        "models": paginate(**common, queryset=models, prefix="models_", default="tenant",
                           sorts={"tenant": ["tenant__tenant_id", "served_model_name"],
                                  "name": ["served_model_name", "tenant__tenant_id"],
                                  "releases": ["release_count"], "created": ["created_at"]},
                           search_fields=("served_model_name", "vllm_model_name", "tenant__tenant_id")),
        "releases": paginate(**common, queryset=releases.select_related("model__tenant"), prefix="releases_",
                             default="tenant",
                             sorts={"tenant": ["model__tenant__tenant_id", "model__served_model_name", "namespace"],
                                    "namespace": ["namespace"], "state": ["state", "namespace"],
                                    "engine": ["engine", "namespace"], "created": ["created_at"]},
                             search_fields=("namespace", "model__served_model_name", "model__tenant__tenant_id")),
        "groups": paginate(**common, queryset=groups.select_related("tenant"), prefix="groups_", default="tenant",
                           sorts={"tenant": ["tenant__tenant_id", "name"], "name": ["name", "tenant__tenant_id"],
                                  "budget": ["budget_bytes"], "created": ["created_at"]},
                           search_fields=("name", "tenant__tenant_id", "cache_salt")),
        "nodes": paginate(**common, queryset=nodes, prefix="nodes_", default="name",
                          sorts={"name": ["name"], "hostname": ["hostname", "name"], "device": ["device", "name"],
                                 "instances": ["instance_count"], "created": ["created_at"]},
                          search_fields=("name", "hostname")),
    }


@login_required
def registry_index(request: HttpRequest) -> HttpResponse:
    """The registry at any size: tenants, served models, release namespaces, request groups and nodes the user may
    see, each list paginated and sortable, all searched by ``?q=`` (``registry_lists``)."""
    return render(request, "ui/registry.html",
                  {"lists": registry_lists(request), "q": search_text(request.GET.get("q"))})


@login_required
def tenant_detail(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = get_object_or_404(visible(request, Tenant), pk=pk)
    occupancy = current_occupancy(OccupancyFilter(tenant_id=tenant.tenant_id))
    models = paginate(request, tenant.served_models.prefetch_related("releases"), prefix="models_", default="name",
                      sorts={"name": ["served_model_name"], "created": ["created_at"]},
                      search_fields=("served_model_name", "vllm_model_name", "model_path"))
    groups = paginate(request, tenant.request_groups.all(), prefix="groups_", default="name",
                      sorts={"name": ["name"], "budget": ["budget_bytes"], "created": ["created_at"]},
                      search_fields=("name", "cache_salt"))
    room = current_pool_room().tenants.get(tenant.tenant_id)
    advice = [line for line in (room.advice("quota"), room.advice("watermark")) if line] if room else []
    context = {
        "tenant": tenant, "quota": tenant_quota(tenant), "models": models, "room": room, "room_advice": advice,
        "groups": groups, "budgeted_bytes": budgets.budgeted_bytes(tenant),
        "occupancy": sorted(occupancy.values(), key=lambda entry: entry.key),
        "occupancy_bytes": sum(entry.bytes for entry in occupancy.values()),
        "audit": _audit(request, "tenants.tenant", tenant.pk), "perms": ObjectPerms(request.user, tenant),
    }
    return render(request, "ui/tenant_detail.html", context)


@login_required
def model_detail(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(visible(request, ServedModel.objects.select_related("tenant")), pk=pk)
    occupancy = current_occupancy(OccupancyFilter(tenant_id=model.tenant.tenant_id,
                                                  served_model_name=model.served_model_name))
    listing = paginate(request, model.releases.select_related("model__tenant").annotate(
        instance_count=count_of(InstanceAssignment, "release")), default="-created",
        sorts={"namespace": ["namespace"], "state": ["state", "namespace"], "created": ["created_at"],
               "instances": ["instance_count"]}, search_fields=("namespace", "fingerprint", "weights_revision"))
    releases = []
    for release in listing.rows:
        entry = occupancy.get(release_key(release))
        releases.append({"release": release, "instances": release.instance_count,
                         "bytes": entry.bytes if entry else 0})
    reserved = [{"reservation": reservation, "purges": purges_for_release(reservation)}
                for reservation in ReservedNamespace.objects.filter(tenant_id=model.tenant.tenant_id,
                                                                    served_model_name=model.served_model_name)]
    context = {"model": model, "releases": releases, "release_list": listing, "upgrade": upgrade_state(model),
               "reserved": reserved,
               "audit": _audit(request, "tenants.servedmodel", model.pk), "perms": ObjectPerms(request.user, model)}
    return render(request, "ui/model_detail.html", context)


def instance_rows(release: Release, assignments: list[InstanceAssignment] | None = None) -> list[dict]:
    """Per instance of ``release`` (of ``assignments`` only when given: a page of them): its rendered config, what
    its node's agent applied and, for a real engine the agent observes, its newest facts (``InstanceStats``, key
    ``engine``)."""
    endpoints = RenderTarget.from_settings()
    expected = prescribed_values(release)
    if assignments is None:
        assignments = list(release.assignments.select_related("node", "release__model__tenant")
                           .order_by("node__name", "port"))
    applied = applied_instances({assignment.node.name for assignment in assignments})
    states = {s.node_name: s for s in NodeState.objects.filter(
        node_name__in={assignment.node.name for assignment in assignments})}
    engines = {(row.node_name, row.instance_id): row for row in InstanceStats.objects.filter(
        instance_id__in=[str(assignment.pk) for assignment in assignments])}
    rows = []
    for assignment in assignments:
        config = render_assignment(assignment, endpoints)
        spec = applied.get((assignment.node.name, str(assignment.pk)))
        if spec is None:
            agent = {"status": "unconfirmed", "differs": []}
        else:
            differs = [name for name, value in expected.items() if str(spec.get(name, "")) != str(value)]
            agent = {"status": "differs" if differs else "matches", "differs": differs}
        state = states.get(assignment.node.name)
        rows.append({
            "assignment": assignment, "config": config, "agent": agent, "state": state,
            "drift": drift(state) if state else None, "engine": engines.get((assignment.node.name, str(assignment.pk))),
            "json": json.dumps(config.to_dict(), indent=2, sort_keys=True),
        })
    return rows


@login_required
def release_detail(request: HttpRequest, pk: int) -> HttpResponse:
    release = get_object_or_404(visible(request, Release.objects.select_related("model__tenant")), pk=pk)
    tenant_id, model_name, namespace, _ = release_key(release)
    occupancy = current_occupancy(OccupancyFilter(tenant_id=tenant_id, served_model_name=model_name,
                                                  namespace=namespace)).get(release_key(release))
    instances = paginate(request, release.assignments.select_related("node", "release__model__tenant"),
                         prefix="instances_", default="node", per_page=10,
                         sorts={"node": ["node__name", "port"], "port": ["port", "node__name"],
                                "role": ["role", "node__name", "port"]},
                         search_fields=("node__name", "node__hostname", "role"))
    context = {
        "release": release, "model": release.model, "tenant": release.model.tenant,
        "budget": effective_budget(release), "instances": instance_rows(release, list(instances.rows)),
        "instance_list": instances, "occupancy": occupancy,
        "purges": purges_for_release(release), "audit": _audit(request, "tenants.release", release.pk),
        "perms": ObjectPerms(request.user, release),
        "settings": [(name, getattr(release, name)) for name in (
            "weights_revision", "num_layers", "num_kv_heads", "head_dim", "block_size", "kv_dtype", "quantization",
            "engine", "engine_version", "hash_algo", "hash_seed", "max_model_len")]
        + [("adapters", AdaptersField().prepare_value(release.adapters or []) or "none")],
    }
    return render(request, "ui/release_detail.html", context)


def _json_download(payload, filename: str) -> HttpResponse:
    response = HttpResponse(json.dumps(payload, indent=2, sort_keys=True) + "\n", content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
def release_config_download(request: HttpRequest, pk: int) -> HttpResponse:
    """Every instance's rendered config as one JSON file (the API's ``/releases/{id}/config/`` document)."""
    release = get_object_or_404(visible(request, Release.objects.select_related("model__tenant")), pk=pk)
    endpoints = RenderTarget.from_settings()
    assignments = release.assignments.select_related("node", "release__model__tenant").order_by("node__name", "port")
    payload = {"release": release.pk, "namespace": release.namespace, "fingerprint": release.fingerprint,
               "instances": [render_assignment(a, endpoints).to_dict() for a in assignments]}
    return _json_download(payload, f"{release.namespace}-config.json")


@login_required
def instance_config_download(request: HttpRequest, pk: int, assignment_pk: int) -> HttpResponse:
    """One instance's rendered config as a JSON file (the API's ``?assignment=`` document)."""
    assignment = get_object_or_404(visible(request, InstanceAssignment.objects.select_related(
        "node", "release__model__tenant")), pk=assignment_pk, release_id=pk)
    config = render_assignment(assignment, RenderTarget.from_settings())
    return _json_download(config.to_dict(), f"{assignment.release.namespace}-{assignment.node.name}-"
                                            f"{assignment.port}.json")


@login_required
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(visible(request, Node), pk=pk)
    platform = is_platform_admin(request.user)
    # annotated with last_report_at (newest report receipt), as GET /api/v1/telemetry/nodes/ shows it
    state = node_states().filter(node_name=node.name).first()
    if state is not None and not platform:  # error texts may name any tenant's instances
        state.push_error = state.rejection_error = ""
    occupancy = current_occupancy(OccupancyFilter(tenant_ids=visible_tenant_ids(request.user)), node_name=node.name)
    stats = {row.instance_id: row for row in visible(request, InstanceStats.objects.filter(node_name=node.name))}
    rows = []
    listing = paginate(request, visible(request, node.assignments.select_related("release__model__tenant")),
                       default="port", sorts={"port": ["port"], "namespace": ["release__namespace", "port"],
                                              "tenant": ["release__model__tenant__tenant_id", "port"],
                                              "role": ["role", "port"]},
                       search_fields=("release__namespace", "release__model__served_model_name",
                                      "release__model__tenant__tenant_id"))
    for assignment in listing.rows:
        entry = occupancy.get(release_key(assignment.release))
        rows.append({"assignment": assignment, "bytes": entry.by_node.get(node.name, 0) if entry else 0,
                     "engine": stats.get(str(assignment.pk))})
    context = {"node": node, "state": state, "drift": drift(state) if state else None, "assignments": rows,
               "assignment_list": listing,
               "refusals": node_refusals(node.name) if platform else [],
               "audit": _audit(request, "tenants.node", node.pk), "perms": ObjectPerms(request.user, node)}
    return render(request, "ui/node_detail.html", context)


def node_refusals(name: str) -> list[dict]:
    """Agent messages refused in ``name``'s name, newest first: ``{"row": MessageRejection, "trouble": str}``.

    ``trouble`` is the ``dashboard.telemetry.agent_auth.NODE_TROUBLE`` explanation ("its agent may sign with an old
    secret ...") for reasons that point at the node's own agent, "" for the others (a forger can name any node).
    """
    rows = MessageRejection.objects.filter(node=name).order_by("-last_at", "reason")
    return [{"row": row, "trouble": NODE_TROUBLE.get(row.reason, "")} for row in rows]


@login_required
def request_group_detail(request: HttpRequest, pk: int) -> HttpResponse:
    group = get_object_or_404(visible(request, RequestGroup.objects.select_related("tenant")), pk=pk)
    return render(request, "ui/request_group_detail.html",
                  {"group": group, "audit": _audit(request, "tenants.requestgroup", group.pk),
                   "perms": ObjectPerms(request.user, group)})
