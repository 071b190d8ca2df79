"""Error responses Django itself produces (no route, a refused request, an unhandled exception): JSON
``{"detail": "<reason>"}`` under ``/api/`` like every other API error, Django's HTML pages elsewhere.

Installed as ``handler400``/``handler404``/``handler500`` in ``dashboard/urls.py`` (used when ``DEBUG`` is off).
"""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def _is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith("/api/")


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """HTTP 400 for a request Django refused before any view (``SuspiciousOperation``: too many form fields, a
    disallowed host, ...)."""
    if _is_api(request):
        return JsonResponse({"detail": "Bad request."}, status=400)
    return defaults.bad_request(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """HTTP 404 for a path no route matches."""
    if _is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """HTTP 500 (the exception is logged by Django, never shown)."""
    if _is_api(request):
        return JsonResponse({"detail": "Internal server error."}, status=500)
    return defaults.server_error(request)
