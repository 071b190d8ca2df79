"""Checks page: the seed's operational checklist, one pass/fail line per item (``dashboard.checklist``)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.checklist import run_checks
from dashboard.views.base import json_login_required


@login_required
def checks_page(request: HttpRequest) -> HttpResponse:
    checks = run_checks()
    return render(request, "ui/checks.html", {"checks": checks, "failed": sum(not c.passed for c in checks)})


@json_login_required
def checks_data(request: HttpRequest) -> JsonResponse:
    """``{"checks": [{key, title, seed, passed, status, summary, details}, ...]}`` in the seed's order."""
    return JsonResponse({"checks": [check.as_dict() for check in run_checks()]})
