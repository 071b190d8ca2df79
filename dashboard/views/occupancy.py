"""Occupancy page: stacked area chart of bytes per release namespace over a window (15 minutes ... 30 days),
filters by tenant / served model / release namespace / request group (``?tenant_id= &served_model_name= &namespace=
&request_group=``, the names of ``GET /api/v1/telemetry/occupancy/``), and the same numbers as tables.

The chart is drawn in the browser by the vendored Chart.js from ``occupancy/data.json`` (same query
parameters); the page's tables are rendered from the same ``queries.occupancy_series`` result, so the chart
and the tables show identical numbers. Both show only the tenants the user may see (``tenants.access``): the
filters carry them (``OccupancyFilter.tenant_ids``). The filters are free-text inputs with a type-ahead
(``templates/ui/_scope_filters.html``) from ``GET /api/v1/names/<kind>/``, which offers only those tenants' names: at
fleet size a drop-down of every release namespace or request group would be thousands of entries.
"""
from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse

from agent.contract.scope import CacheScope
from dashboard.telemetry.queries import (
    DEFAULT_WINDOW,
    WINDOW_LABELS,
    occupancy_series,
)
from dashboard.telemetry.quota_lines import quota_lines
from dashboard.views.base import (
    WindowError,
    json_login_required,
    occupancy_filter,
    renamed_params_redirect,
    window_param,
)

#: Most release namespaces the page's "Chart data" table tabulates (a column each); beyond it (a fleet's thousands)
#: the table is left out and links the same numbers as JSON (``occupancy/data.json``).
DATA_TABLE_MAX_SERIES = 40


@login_required
def occupancy_page(request: HttpRequest) -> HttpResponse:
    """The chart page; an unknown ``window`` shows the default window with the error (HTTP 400). The former
    parameter names (``?tenant= &model= &release= &group=``) redirect to the API's."""
    redirect = renamed_params_redirect(request)
    if redirect is not None:
        return redirect
    status, error = 200, ""
    try:
        window = window_param(request)
    except WindowError as exc:
        window, status, error = DEFAULT_WINDOW, 400, str(exc)
    filters = occupancy_filter(request)
    series = occupancy_series(window, filters)
    params = {"window": window, **filters.as_params()}
    ratios = series.hit_ratios()
    tabulated = len(series.series) <= DATA_TABLE_MAX_SERIES
    rows = [] if not tabulated else [
        {"bucket": bucket, "values": [s.data[index] for s in series.series], "total": total,
         "hit_ratio": ratios[index], "hit_percent": None if ratios[index] is None else round(100 * ratios[index])}
        for index, (bucket, total) in enumerate(zip(series.buckets, series.totals())) if total is not None
    ]
    context = {
        "series": series, "filters": filters, "window": window,
        "windows": WINDOW_LABELS, "rows": rows, "tabulated": tabulated, "table_max": DATA_TABLE_MAX_SERIES,
        "error": error,
        "quota_lines": quota_lines(filters, [s.key for s in series.series if not s.other],
                                   summed=any(s.other for s in series.series)),
        "data_url": f"{reverse('ui:occupancy-data')}?{urlencode(params)}",
    }
    return render(request, "ui/occupancy.html", context, status=status)


@json_login_required
def occupancy_data(request: HttpRequest) -> JsonResponse:
    """JSON of ``queries.OccupancySeries.as_dict()`` (each series a whole release: ``request_group`` ``null``)
    plus the applied filters (``filters``: the four ``CacheScope`` fields; "" = all, ``request_group`` ``null`` =
    every group) and the quota and budget lines (``quota_lines``: ``QuotaLine.as_dict()`` each,
    ``dashboard.telemetry.quota_lines``); 400 names a bad ``window``. Former parameter names redirect (the
    page's)."""
    redirect = renamed_params_redirect(request)
    if redirect is not None:
        return redirect
    try:
        window = window_param(request)
    except WindowError as exc:
        return JsonResponse({"window": [str(exc)]}, status=400)
    filters = occupancy_filter(request)
    series = occupancy_series(window, filters)
    payload = series.as_dict()
    shown = [s.key for s in series.series if not s.other]  # the releases of their own (not the rest summed)
    summed = any(s.other for s in series.series)  # the rest summed: its tenants are not named
    payload["quota_lines"] = [line.as_dict() for line in quota_lines(filters, shown, summed=summed)]
    payload["filters"] = {name: getattr(filters, name) for name in CacheScope._fields}
    return JsonResponse(payload)
