"""Create / edit / delete pages of the registry objects (one generic view per action, one ``Kind`` per model).

Forms are ``dashboard.forms`` ModelForms: the models' ``clean()`` rules with the API's messages, saved through
``validated_save``; the audit middleware records each change under the logged-in user. Each page needs the
model permission the API needs for the same write (``add``/``change``/``delete``; HTTP 403 without it, even for a
GET of the form), under the tenant rules of ``tenants.access``: another tenant's object is HTTP 404, its choices
(tenant, model, release) are not offered, and a submitted object is checked in the tenant it would be saved in. A
user who is not a platform admin cannot change a tenant's ``tenant_id`` or quota (those fields are disabled).
A delete the registry refuses (a protected reference, a served release, a tenant the master still holds objects
for) shows the same reason the API answers with HTTP 409.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Model, ProtectedError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboard import forms as ui_forms
from dashboard.api.base import protected_message
from dashboard.signals import TenantStillOwnsObjects
from dashboard.views.base import model_permission, permission_denied, visible
from tenants.access import PLATFORM_TENANT_FIELDS, is_platform_admin, scope
from tenants.models import (
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tenants.models.reserved_namespace import delete_consequences


@dataclass(frozen=True)
class Kind:
    """A registry model the pages edit: its form, its name in URLs and titles, where to go after a change."""

    slug: str
    model: type[Model]
    form_class: type[forms.ModelForm]
    label: str
    after_save: Callable[[Any], str]
    after_delete: Callable[[Any], str]
    #: Query parameters that pre-fill a create form: parameter -> form field (values are primary keys).
    prefill: tuple[str, ...] = ()

    @property
    def indefinite(self) -> str:
        """The label with its indefinite article: "a tenant", "an instance"."""
        return f"{'an' if self.label[:1].lower() in 'aeiou' else 'a'} {self.label}"


def _registry(_obj: Any) -> str:
    return reverse("ui:registry")


KINDS: dict[str, Kind] = {kind.slug: kind for kind in (
    Kind("tenant", Tenant, ui_forms.TenantForm, "tenant",
         lambda obj: reverse("ui:tenant", args=[obj.pk]), _registry),
    Kind("model", ServedModel, ui_forms.ServedModelForm, "served model",
         lambda obj: reverse("ui:model", args=[obj.pk]),
         lambda obj: reverse("ui:tenant", args=[obj.tenant_id]), prefill=("tenant",)),
    Kind("release", Release, ui_forms.ReleaseForm, "release",
         lambda obj: reverse("ui:release", args=[obj.pk]),
         lambda obj: reverse("ui:model", args=[obj.model_id]), prefill=("model",)),
    Kind("request-group", RequestGroup, ui_forms.RequestGroupForm, "request group",
         lambda obj: reverse("ui:request-group", args=[obj.pk]),
         lambda obj: reverse("ui:tenant", args=[obj.tenant_id]), prefill=("tenant",)),
    Kind("node", Node, ui_forms.NodeForm, "node",
         lambda obj: reverse("ui:node", args=[obj.pk]), _registry),
    Kind("assignment", InstanceAssignment, ui_forms.InstanceAssignmentForm, "instance",
         lambda obj: reverse("ui:release", args=[obj.release_id]),
         lambda obj: reverse("ui:release", args=[obj.release_id]), prefill=("release", "node")),
)}


def _prefill(kind: Kind, request: HttpRequest) -> dict[str, str]:
    return {name: request.GET[name] for name in kind.prefill if request.GET.get(name, "").isdigit()}


def _scoped(form: forms.ModelForm, request: HttpRequest) -> forms.ModelForm:
    """``form`` offering only the related objects the user may see; a tenant's platform fields disabled (their
    stored value kept) for a user who is not a platform admin."""
    for field in form.fields.values():
        if isinstance(field, forms.ModelChoiceField):
            field.queryset = scope(field.queryset, request.user)
    if isinstance(form.instance, Tenant) and not is_platform_admin(request.user):
        for name in PLATFORM_TENANT_FIELDS:
            if name in form.fields:
                form.fields[name].disabled = True
                form.fields[name].help_text = "Only a platform admin may change it."
    return form


def _refused_target(request: HttpRequest, spec: Kind, action: str, form: forms.ModelForm) -> HttpResponse | None:
    """The 403 page when the submitted object (``form.instance``, validated) would land in a tenant where the user
    may not ``action`` it; ``None`` when allowed."""
    return permission_denied(request, [model_permission(spec.model, action)],
                             f"{'create' if action == 'add' else 'save'} {spec.label} '{form.instance}'", form.instance)


def _render(request: HttpRequest, context: dict, status: int) -> HttpResponse:
    context["show_quota_plan"] = is_platform_admin(request.user)  # the plan lists every tenant
    return render(request, "ui/form.html", context, status=status)


@login_required
def create(request: HttpRequest, kind: str) -> HttpResponse:
    spec = KINDS[kind]
    denied = permission_denied(request, [model_permission(spec.model, "add")], f"create {spec.indefinite}")
    if denied:
        return denied
    if request.method == "POST":
        form = _scoped(spec.form_class(request.POST), request)
        if form.is_valid():
            refused = _refused_target(request, spec, "add", form)
            if refused:
                return refused
            if form.save_validated():
                messages.success(request, f"Created {spec.label} '{form.instance}'.")
                return redirect(spec.after_save(form.instance))
        status = 400
    else:
        form = _scoped(spec.form_class(initial=_prefill(spec, request)), request)
        status = 200
    return _render(request, {"form": form, "kind": spec, "title": f"New {spec.label}"}, status)


@login_required
def edit(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    spec = KINDS[kind]
    obj = get_object_or_404(visible(request, spec.model), pk=pk)
    # The bound form writes the submitted values into ``obj``: name the page after the stored object.
    title = f"Edit {spec.label} '{obj}'"
    denied = permission_denied(request, [model_permission(spec.model, "change")], f"edit {spec.label} '{obj}'", obj)
    if denied:
        return denied
    if request.method == "POST":
        form = _scoped(spec.form_class(request.POST, instance=obj), request)
        if form.is_valid() and (refused := _refused_target(request, spec, "change", form)):
            return refused
        if form.is_valid() and form.save_validated():
            if form.has_changed():
                messages.success(request, f"Saved {spec.label} '{form.instance}'.")
            else:
                messages.info(request, f"Nothing changed in {spec.label} '{form.instance}'.")
            return redirect(spec.after_save(form.instance))
        status = 400
    else:
        form = _scoped(spec.form_class(instance=obj), request)
        status = 200
    return _render(request, {"form": form, "kind": spec, "object": obj, "title": title}, status)


@login_required
def delete(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    spec = KINDS[kind]
    obj = get_object_or_404(visible(request, spec.model), pk=pk)
    denied = permission_denied(request, [model_permission(spec.model, "delete")], f"delete {spec.label} '{obj}'",
                               obj)
    if denied:
        return denied
    status = 200
    form_class = ui_forms.ReleaseDeleteForm if isinstance(obj, Release) else ui_forms.DeleteForm
    if request.method == "POST":
        form = form_class(request.POST)
        if form.is_valid() and form.confirms(obj):
            target = spec.after_delete(obj)
            name = str(obj)
            try:
                with transaction.atomic():
                    obj.delete()
            except ProtectedError as error:
                form.add_error(None, protected_message(obj, error))
            except TenantStillOwnsObjects as error:
                form.add_error(None, str(error.detail))
            else:
                messages.success(request, f"Deleted {spec.label} '{name}'.")
                return redirect(target)
        status = 400
    else:
        form = form_class()
    consequences = delete_consequences(obj) if isinstance(obj, Release) else ""
    return render(request, "ui/delete.html", {"form": form, "kind": spec, "object": obj, "consequences": consequences,
                                               "title": f"Delete {spec.label} '{obj}'"}, status=status)
