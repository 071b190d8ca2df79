"""Helpers shared by the page views: login for JSON endpoints, tenant scoping and write permissions
(``tenants.access``), occupancy filters from query parameters."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import wraps
from typing import Any

from django.contrib.auth import get_permission_codename
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.shortcuts import render

from dashboard.telemetry.queries import DEFAULT_WINDOW, WINDOWS, OccupancyFilter
from tenants.access import is_platform_admin, scope, visible_tenant_ids


def json_login_required(view):
    """Like ``login_required``, but answers HTTP 401 with a JSON error instead of redirecting (for ``fetch``)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
        return view(request, *args, **kwargs)

    return wrapper


log = logging.getLogger("kvpool.dashboard.views")


def model_permission(model: type[Model], action: str) -> str:
    """``"<app_label>.<action>_<model>"``, e.g. ``model_permission(Tenant, "change") == "tenants.change_tenant"``."""
    return f"{model._meta.app_label}.{get_permission_codename(action, model._meta)}"


def permission_denied(request: HttpRequest, perms: Iterable[str], action: str,
                      obj: Model | None = None) -> HttpResponse | None:
    """``None`` when the user holds every permission of ``perms`` (in ``obj``'s tenant when ``obj`` is given, else
    in some tenant), else the HTTP 403 page naming the missing ones.

    Pages apply the permissions the REST API applies (``dashboard.api.permissions``, ``tenants.access``): a write
    needs the model's add/change/delete permission — a platform admin's model permission, anyone else's role in
    the object's tenant; a superuser has them all. ``action`` says what was refused ("edit tenant 'acme'").
    """
    missing = [perm for perm in perms if not request.user.has_perm(perm, obj)]
    if not missing:
        return None
    log.warning("refused %s %s to %s: missing %s", request.method, request.path, request.user.get_username(),
                ", ".join(missing))
    return render(request, "ui/forbidden.html", {"action": action, "missing": missing}, status=403)


def platform_only(request: HttpRequest, action: str) -> HttpResponse | None:
    """``None`` for a platform admin, else the HTTP 403 page saying that ``action`` is for platform admins."""
    if is_platform_admin(request.user):
        return None
    return permission_denied(request, ["tenants.platform_admin"], action)


def visible(request: HttpRequest, rows: type[Model] | QuerySet) -> QuerySet:
    """The rows of ``rows`` (a model or a queryset) the user may see (``tenants.access.scope``)."""
    queryset = rows._default_manager.all() if isinstance(rows, type) else rows
    return scope(queryset, request.user)


class ObjectPerms:
    """The templates' ``perms`` bound to one object: ``perms.tenants.change_release`` asks
    ``user.has_perm("tenants.change_release", obj)`` — the user's role in ``obj``'s tenant, or a platform admin's
    model permission. A detail page passes it as ``perms`` so its buttons match what its forms allow."""

    def __init__(self, user: Any, obj: Model) -> None:
        self.user, self.obj = user, obj

    def __getitem__(self, app_label: str) -> _AppPerms:
        return _AppPerms(self.user, app_label, self.obj)


class _AppPerms:
    def __init__(self, user: Any, app_label: str, obj: Model) -> None:
        self.user, self.app_label, self.obj = user, app_label, obj

    def __getitem__(self, codename: str) -> bool:
        return self.user.has_perm(f"{self.app_label}.{codename}", self.obj)

    def __bool__(self) -> bool:
        return True


def occupancy_filter(request: HttpRequest) -> OccupancyFilter:
    """``?tenant_id= &served_model_name= &namespace= &request_group=`` (the names of
    ``GET /api/v1/telemetry/occupancy/``) -> ``OccupancyFilter`` (blank = all), limited to the tenants the user may
    see (``tenant_ids``)."""
    return OccupancyFilter.from_params(request.GET, tenant_ids=visible_tenant_ids(request.user))


#: The occupancy page's former parameter names -> the API's (``occupancy_filter``).
RENAMED_OCCUPANCY_PARAMS = {"tenant": "tenant_id", "model": "served_model_name", "release": "namespace",
                            "group": "request_group"}


def renamed_params_redirect(request: HttpRequest) -> HttpResponse | None:
    """A permanent redirect to the same URL with the former names (``RENAMED_OCCUPANCY_PARAMS``) replaced by the
    API's, so old links keep working; ``None`` when the URL uses none of them. A new name given too wins."""
    if not any(old in request.GET for old in RENAMED_OCCUPANCY_PARAMS):
        return None
    params = request.GET.copy()
    for old, new in RENAMED_OCCUPANCY_PARAMS.items():
        if old in params:
            value = params.pop(old)[-1]
            params.setdefault(new, value)
    return HttpResponsePermanentRedirect(f"{request.path}?{params.urlencode()}")


class WindowError(ValueError):
    """An unknown ``window`` query parameter."""


def window_param(request: HttpRequest) -> str:
    """``?window=`` (one of ``queries.WINDOWS``; default 1h). Raises ``WindowError`` naming the choices."""
    window = request.GET.get("window", "").strip() or DEFAULT_WINDOW
    if window not in WINDOWS:
        raise WindowError(f"window: '{window}' is not one of {', '.join(WINDOWS)}.")
    return window
