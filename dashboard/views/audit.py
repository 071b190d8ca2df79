"""Audit log page: newest entries first, filtered by object type and actor, paginated; a user who is not a
platform admin sees the entries about their tenants only (``tenants.access``)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.views.base import visible
from tenants.models import AuditEntry

PAGE_SIZE = 50


@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    entries = visible(request, AuditEntry)
    object_type = request.GET.get("type", "").strip()
    actor = request.GET.get("actor", "").strip()
    if object_type:
        entries = entries.filter(object_type=object_type)
    if actor:
        entries = entries.filter(actor_repr=actor)
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    types = sorted(set(visible(request, AuditEntry).values_list("object_type", flat=True).distinct()))
    return render(request, "ui/audit.html", {"page": page, "types": types, "object_type": object_type,
                                              "actor": actor})
