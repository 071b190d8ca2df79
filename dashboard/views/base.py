"""Helpers shared by the page views: login for JSON endpoints, write permissions, occupancy filters from query
parameters."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import wraps

from django.contrib.auth import get_permission_codename
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.telemetry.queries import DEFAULT_WINDOW, WINDOWS, OccupancyFilter


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


def permission_denied(request: HttpRequest, perms: Iterable[str], action: str) -> HttpResponse | None:
    """``None`` when the user holds every permission of ``perms``, else the HTTP 403 page naming the missing ones.

    Pages apply the permissions the REST API applies (``dashboard.api.permissions``): a write needs the model's
    add/change/delete permission, a superuser has them all. ``action`` says what was refused ("edit tenant 'acme'").
    """
    missing = [perm for perm in perms if not request.user.has_perm(perm)]
    if not missing:
        return None
    log.warning("refused %s %s to %s: missing %s", request.method, request.path, request.user.get_username(),
                ", ".join(missing))
    return render(request, "ui/forbidden.html", {"action": action, "missing": missing}, status=403)


def occupancy_filter(request: HttpRequest) -> OccupancyFilter:
    """``?tenant= &model= &release= &group=`` -> ``OccupancyFilter`` (blank = all)."""
    params = request.GET
    return OccupancyFilter(tenant_id=params.get("tenant", "").strip(),
                           served_model_name=params.get("model", "").strip(),
                           namespace=params.get("release", "").strip(),
                           request_group=params.get("group", "").strip())


class WindowError(ValueError):
    """An unknown ``window`` query parameter."""


def window_param(request: HttpRequest) -> str:
    """``?window=`` (one of ``queries.WINDOWS``; default 1h). Raises ``WindowError`` naming the choices."""
    window = request.GET.get("window", "").strip() or DEFAULT_WINDOW
    if window not in WINDOWS:
        raise WindowError(f"window: '{window}' is not one of {', '.join(WINDOWS)}.")
    return window
