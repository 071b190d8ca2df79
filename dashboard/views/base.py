"""Helpers shared by the page views: login for JSON endpoints, occupancy filters from query parameters."""
from __future__ import annotations

from functools import wraps

from django.http import HttpRequest, JsonResponse

from dashboard.views.queries import DEFAULT_WINDOW, WINDOWS, OccupancyFilter


def json_login_required(view):
    """Like ``login_required``, but answers HTTP 401 with a JSON error instead of redirecting (for ``fetch``)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            return JsonResponse({"detail": "Authentication credentials were not provided."}, status=401)
        return view(request, *args, **kwargs)

    return wrapper


def occupancy_filter(request: HttpRequest) -> OccupancyFilter:
    """``?tenant= &model= &release= &group=`` -> ``OccupancyFilter`` (blank = all)."""
    params = request.GET
    return OccupancyFilter(tenant_id=params.get("tenant", "").strip(),
                           served_model_name=params.get("model", "").strip(),
                           namespace=params.get("release", "").strip(),
                           salt_group=params.get("group", "").strip())


class WindowError(ValueError):
    """An unknown ``window`` query parameter."""


def window_param(request: HttpRequest) -> str:
    """``?window=`` (one of ``queries.WINDOWS``; default 1h). Raises ``WindowError`` naming the choices."""
    window = request.GET.get("window", "").strip() or DEFAULT_WINDOW
    if window not in WINDOWS:
        raise WindowError(f"window: '{window}' is not one of {', '.join(WINDOWS)}.")
    return window
