"""Checks page: the seed's operational checklist, one pass/fail line per item (``dashboard.checklist``). The
checklist spans every tenant and node, so the page and its data are for platform admins (HTTP 403 otherwise)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.checklist import run_checks
from dashboard.views.base import json_login_required, platform_only
from tenants.access import is_platform_admin


@login_required
def checks_page(request: HttpRequest) -> HttpResponse:
    denied = platform_only(request, "see the operational checklist (it spans every tenant)")
    if denied:
        return denied
    checks = run_checks()
    return render(request, "ui/checks.html", {"checks": checks, "failed": sum(not c.passed for c in checks)})


@json_login_required
def checks_data(request: HttpRequest) -> JsonResponse:
    """``{"checks": [{key, title, seed, passed, status, summary, details}, ...]}`` in the seed's order (HTTP 403
    ``{"detail": ...}`` for a user who is not a platform admin)."""
    if not is_platform_admin(request.user):
        return JsonResponse({"detail": "The operational checklist is for platform admins only."}, status=403)
    return JsonResponse({"checks": [check.as_dict() for check in run_checks()]})
