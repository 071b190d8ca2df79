"""Checks page: the seed's operational checklist, one pass/fail line per item (``dashboard.checklist``) with its first
``SHOWN_DETAILS`` detail lines and a link to the check's own page, which pages through all of them (at 1,000 nodes
a check can fail for hundreds). The checklist spans every tenant and node, so the pages and their data are for
platform admins (HTTP 403 otherwise)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.checklist import remember_checks, run_check, run_checks
from dashboard.views.base import json_login_required, platform_only
from dashboard.views.listing import paginate_lines
from tenants.access import is_platform_admin


@login_required
def checks_page(request: HttpRequest) -> HttpResponse:
    denied = platform_only(request, "see the operational checklist (it spans every tenant)")
    if denied:
        return denied
    checks = remember_checks(run_checks())  # the overview shows this run for a while
    return render(request, "ui/checks.html", {"checks": checks, "failed": sum(not c.passed for c in checks)})


#: Detail lines per page of a check's own page.
DETAILS_PER_PAGE = 50


@login_required
def check_page(request: HttpRequest, key: str) -> HttpResponse:
    """One check with all its detail lines, ``DETAILS_PER_PAGE`` a page (``?page=``), searched by ``?q=`` (words
    that must all occur in a line); 404 for an unknown check."""
    denied = platform_only(request, "see the operational checklist (it spans every tenant)")
    if denied:
        return denied
    check = run_check(key)
    if check is None:
        raise Http404(f"No check is called '{key[:40]}'.")
    details = paginate_lines(request, check.details, per_page=DETAILS_PER_PAGE)
    return render(request, "ui/check.html", {"check": check, "details": details})


@json_login_required
def checks_data(request: HttpRequest) -> JsonResponse:
    """``{"checks": [{key, title, seed, passed, status, summary, details, details_total}, ...]}`` in the seed's
    order, ``details`` the first ``SHOWN_DETAILS`` lines of ``details_total`` (HTTP 403
    ``{"detail": ...}`` for a user who is not a platform admin)."""
    if not is_platform_admin(request.user):
        return JsonResponse({"detail": "The operational checklist is for platform admins only."}, status=403)
    return JsonResponse({"checks": [check.as_dict() for check in run_checks()]})
