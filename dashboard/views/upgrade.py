"""Rolling upgrade page of a served model (``dashboard.rollout.upgrade``) and the purge of a retired release
(``dashboard.rollout.purge``). Every step is a POST that redirects back to the page with a message.

Every user who may see the model's tenant may look (``tenants.access``; another tenant's model is HTTP 404); each
step needs the model permissions of the registry writes it makes (``STEP_PERMISSIONS``) in the model's tenant,
else HTTP 403, and the page hides the steps the user may not take.
"""
from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from agent.contract.keys import release_keys_regex
from dashboard.forms import PurgeForm, StartUpgradeForm, add_validation_error
from dashboard.rollout import upgrade as flow
from dashboard.rollout.purge import (
    PurgeError,
    key_model,
    purge_nodes,
    purges_for_release,
    request_purge,
)
from dashboard.telemetry.queries import OccupancyFilter, current_occupancy
from dashboard.views.base import model_permission, permission_denied, visible
from tenants.models import InstanceAssignment, Release, ServedModel
from tenants.services import build_release_copy

STEPS = (("start", "Start new release"), ("warm", "Warm"), ("shift", "Shift traffic"), ("retire", "Retire old"),
         ("purge", "Purge old keys"))


#: Model permissions of each step: the registry writes it makes. A purge destroys the release's cached data, so
#: it needs the permission to delete releases.
STEP_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "start": (model_permission(Release, "add"), model_permission(InstanceAssignment, "add")),
    "shift": (model_permission(Release, "change"),),
    "retire": (model_permission(Release, "change"), model_permission(InstanceAssignment, "delete")),
    "abort": (model_permission(Release, "change"), model_permission(InstanceAssignment, "delete")),
    "purge": (model_permission(Release, "delete"),),
}


def allowed_steps(user, obj=None) -> dict[str, bool]:
    """``{step: True when user holds every permission of STEP_PERMISSIONS[step]}`` in ``obj``'s tenant (a served
    model or a release; without ``obj``: in some tenant) — what the page offers."""
    return {step: user.has_perms(perms, obj) for step, perms in STEP_PERMISSIONS.items()}


def _denied(request: HttpRequest, step: str, what: str, obj) -> HttpResponse | None:
    return permission_denied(request, STEP_PERMISSIONS[step], what, obj)


def _step(state: flow.UpgradeState) -> str:
    if state.phase == flow.PHASE_WARMING:
        return "warm"
    if state.phase == flow.PHASE_DRAINING:
        return "retire"
    return "start"


def _page(request: HttpRequest, model: ServedModel, form: StartUpgradeForm | None = None,
          status: int = 200) -> HttpResponse:
    state = flow.upgrade_state(model)
    occupancy = current_occupancy(OccupancyFilter(tenant_id=model.tenant.tenant_id,
                                                  served_model_name=model.served_model_name))
    sides = []
    for role, release in (("old", state.old), ("new", state.new)):
        if release is not None:
            entry = occupancy.get(flow.release_key(release))
            sides.append({"role": role, "release": release, "occupancy": entry,
                          "instances": release.assignments.select_related("node").order_by("node__name", "port")})
    projection = None
    if state.old is not None or state.new is not None:
        tenant_occupancy = current_occupancy(OccupancyFilter(tenant_id=model.tenant.tenant_id))
        projection = flow.project(state.old, state.new, occupancy=tenant_occupancy)
    if form is None and state.phase == flow.PHASE_IDLE and state.old is not None:
        form = StartUpgradeForm()
    retired = [{"release": release, "purges": purges_for_release(release)} for release in state.retired]
    # the chart is live (the last 15 minutes read every node's reports as they arrive; windows of an hour and longer
    # read the occupancy summed over nodes, which the rollup writes a minute late); the link opens the hour
    scope = {"tenant_id": model.tenant.tenant_id, "served_model_name": model.served_model_name}
    chart_params = {"window": "15m", **scope}
    context = {
        "model": model, "state": state, "sides": sides, "projection": projection, "form": form,
        "readiness": flow.retire_readiness(state.old) if state.phase == flow.PHASE_DRAINING else None,
        "retired": retired, "steps": STEPS, "current_step": _step(state), "can": allowed_steps(request.user, model),
        "step_permissions": STEP_PERMISSIONS,
        "can_assign": request.user.has_perm(model_permission(InstanceAssignment, "add"), model),
        "data_url": f"{reverse('ui:occupancy-data')}?{urlencode(chart_params)}",
        "occupancy_url": f"{reverse('ui:occupancy')}?{urlencode({'window': '1h', **scope})}",
    }
    return render(request, "ui/upgrade.html", context, status=status)


@login_required
def upgrade_page(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(visible(request, ServedModel.objects.select_related("tenant")), pk=pk)
    return _page(request, model)


def _back(model: ServedModel) -> HttpResponse:
    return redirect(reverse("ui:upgrade", args=[model.pk]))


@login_required
@require_POST
def upgrade_start(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_object_or_404(visible(request, ServedModel.objects.select_related("tenant")), pk=pk)
    denied = _denied(request, "start", f"start a rolling upgrade of '{model}'", model)
    if denied:
        return denied
    form = StartUpgradeForm(request.POST)
    state = flow.upgrade_state(model)
    if state.old is None or state.phase != flow.PHASE_IDLE:
        messages.error(request, f"'{model}' has no serving release to upgrade from, or an upgrade is under way.")
        return _back(model)
    if form.is_valid():
        data = form.cleaned_data
        try:
            new = flow.start_upgrade(state.old, data["namespace"], overrides=form.overrides(),
                                     budget_bytes=data.get("budget_bytes"), copy_instances=data["copy_instances"],
                                     port_offset=data["port_offset"], accept_over_quota=data["accept_over_quota"])
        except ValidationError as error:
            add_validation_error(form, error)
        except flow.UpgradeError as error:
            messages.error(request, str(error))
            return _back(model)
        else:
            messages.success(request, f"Started release '{new.namespace}' (warming) from '{state.old.namespace}'.")
            return _back(model)
    else:
        _add_start_refusals(form, state.old)
    return _page(request, model, form=form, status=400)


def _add_start_refusals(form: StartUpgradeForm, old: Release) -> None:
    """On an invalid start form, add what ``start_upgrade`` would refuse too — the quota projection and the new
    release's rules for the values that are valid — so that every error shows at once."""
    data = form.cleaned_data
    refusal = flow.quota_refusal(flow.project(old), data.get("accept_over_quota", False))
    if refusal is not None:
        add_validation_error(form, ValidationError({"accept_over_quota": refusal}))
    if "namespace" in data:
        try:
            build_release_copy(old, data["namespace"], budget_bytes=data.get("budget_bytes"),
                               **form.overrides()).full_clean()
        except ValidationError as error:
            add_validation_error(form, error)


def _step_view(step: str, action):
    @login_required
    @require_POST
    def view(request: HttpRequest, pk: int) -> HttpResponse:
        model = get_object_or_404(visible(request, ServedModel.objects.select_related("tenant")), pk=pk)
        denied = _denied(request, step, f"take the step '{step}' of the rolling upgrade of '{model}'", model)
        if denied:
            return denied
        try:
            message = action(model)
        except flow.UpgradeError as error:
            messages.error(request, str(error))
        except ValidationError as error:
            messages.error(request, " ".join(f"{name}: {' '.join(msgs)}" for name, msgs in error.message_dict.items())
                           if hasattr(error, "error_dict") else " ".join(error.messages))
        else:
            messages.success(request, message)
        return _back(model)

    view.__doc__ = action.__doc__
    return view


def _shift(model: ServedModel) -> str:
    """POST: the warming release serves, the old one drains."""
    state = flow.shift_traffic(model)
    old = f"; '{state.old.namespace}' is draining" if state.old else ""
    return f"Traffic shifted to '{state.new.namespace}'{old}."


def _retire(model: ServedModel) -> str:
    """POST: retire the draining release once no request is in flight."""
    old = flow.retire(model)
    return f"Retired '{old.namespace}' and removed its instances. Its keys can now be purged."


def _abort(model: ServedModel) -> str:
    """POST: retire the warming release instead of shifting traffic to it."""
    new = flow.abort_upgrade(model)
    return f"Aborted the upgrade: '{new.namespace}' is retired."


upgrade_shift = _step_view("shift", _shift)
upgrade_retire = _step_view("retire", _retire)
upgrade_abort = _step_view("abort", _abort)


@login_required
def purge_page(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: what a purge of the release removes and from whom; POST: the confirmed request."""
    release = get_object_or_404(visible(request, Release.objects.select_related("model__tenant")), pk=pk)
    status = 200
    if request.method == "POST":
        denied = _denied(request, "purge", f"purge the keys of release '{release.namespace}'", release)
        if denied:
            return denied
        form = PurgeForm(request.POST)
        if form.is_valid():
            try:
                purge_id = request_purge(release, confirm=form.cleaned_data["confirm"])
            except ValidationError as error:
                add_validation_error(form, error)
            except PurgeError as error:
                form.add_error(None, str(error))
            else:
                messages.success(request, f"Purge {purge_id[:8]} of '{release.namespace}' requested from the agents.")
                return redirect(reverse("ui:purge", args=[release.pk]))
        status = 400
    else:
        form = PurgeForm()
    try:
        regex = release_keys_regex(release.engine, release.namespace, key_model(release))
    except ValueError as error:
        regex = f"({error})"
    context = {"release": release, "form": form, "regex": regex, "nodes": purge_nodes(release),
               "purges": purges_for_release(release), "can_purge": allowed_steps(request.user, release)["purge"],
               "purge_permissions": STEP_PERMISSIONS["purge"]}
    return render(request, "ui/purge.html", context, status=status)
