"""Chargeback page: bytes·hours of the pool per tenant, served model, release namespace, request group or cache scope
over a period, sorted by use, with totals and the share of the pool's capacity, and a CSV download of the same rows.

The page reads the query parameters of ``GET /api/v1/telemetry/chargeback/`` (``dashboard.api.chargeback``: the
same form, the same numbers) and links to its CSV twin; rows are those of the tenants the user may see.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from dashboard.api.chargeback import ChargebackQuery, report_for
from dashboard.telemetry.chargeback import GIB, GROUPINGS, Chargeback
from dashboard.telemetry.queries import OccupancyFilter
from tenants.access import visible_tenant_ids

#: Column heading of each key field.
KEY_LABELS = {"tenant_id": "tenant", "served_model_name": "served model", "namespace": "release namespace",
              "request_group": "request group"}
#: Label of each ``group_by``.
GROUP_LABELS = {"tenant": "tenant", "model": "served model", "release": "release namespace",
                "request_group": "request group", "scope": "cache scope (all four)"}


def _month_start(moment: datetime) -> datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def presets(now: datetime) -> list[tuple[str, datetime, datetime]]:
    """The period picker's shortcuts: ``(label, start, end)``, whole seconds, UTC."""
    now = now.replace(microsecond=0)
    this_month = _month_start(now)
    last_month = _month_start(this_month - timedelta(days=1))
    return [("last 24 hours", now - timedelta(hours=24), now), ("last 7 days", now - timedelta(days=7), now),
            ("last 30 days", now - timedelta(days=30), now), ("this month", this_month, now),
            ("last month", last_month, this_month)]


def _local(moment: datetime) -> str:
    """``moment`` as an ``<input type="datetime-local">`` value (UTC, whole seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _shown(report: Chargeback, byte_hours: float) -> dict:
    """The numbers of one line of the table: byte·h, GiB·h, average bytes (whole), share of capacity in percent
    (``None`` while the capacity is unknown)."""
    share = report.share(byte_hours)
    return {"byte_hours": byte_hours, "gib_hours": byte_hours / GIB, "average_bytes": round(report.average_bytes(
        byte_hours)), "share_percent": None if share is None else share * 100}


@login_required
def chargeback_page(request: HttpRequest) -> HttpResponse:
    """The page; invalid parameters show the errors without a table (HTTP 400)."""
    now = timezone.now()
    query = ChargebackQuery.from_query(request.GET, now=now)
    valid = query.is_valid()
    data = query.cleaned_data if valid else {}
    params = {name: request.GET.get(name) for name in ChargebackQuery.base_fields if request.GET.get(name)}
    shown_filters = OccupancyFilter.from_params(params, tenant_ids=visible_tenant_ids(request.user))
    context = {
        "query": query, "filters": shown_filters, "groupings": GROUP_LABELS,
        "group_by": data.get("group_by") or params.get("group_by", "tenant"),
        "start_value": params.get("start", ""), "end_value": params.get("end", ""),
        "presets": [(label, f"?{urlencode({**params, 'start': _local(start), 'end': _local(end)})}")
                    for label, start, end in presets(now)],
    }
    if not valid:
        return render(request, "ui/chargeback.html", context, status=400)
    report = report_for(query, request.user)
    keys = GROUPINGS[report.group_by]
    rows = [{"key": [row.key[name] for name in keys], **_shown(report, row.byte_hours)} for row in report.rows]
    full = {**params, "start": report.start.isoformat(), "end": report.end.isoformat(), "group_by": report.group_by}
    context.update({
        "report": report, "rows": rows, "key_labels": [KEY_LABELS[name] for name in keys],
        "splits_groups": "request_group" in keys,  # the last key: "" there is the row without a request group
        "total": _shown(report, report.total_byte_hours),
        "start_value": _local(report.start), "end_value": _local(report.end),
        "csv_url": f"{reverse('telemetry-chargeback-csv')}?{urlencode(full)}",
        "json_url": f"{reverse('telemetry-chargeback')}?{urlencode(full)}",
    })
    return render(request, "ui/chargeback.html", context)
