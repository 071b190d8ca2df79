"""Chargeback API: bytes·hours of the pool per tenant, served model, release namespace or request group over a period.

Routes (``dashboard/api/telemetry_urls.py``, under ``/api/v1/telemetry/``):
  ``chargeback/``       JSON: the period, the pool's capacity over it, totals, one row per group (largest first)
  ``chargeback.csv``    the same rows as CSV (units in the header), a download

Query parameters, the same for both and for the Chargeback page (``dashboard.views.chargeback``), checked by
``ChargebackQuery``: ``start``, ``end`` (ISO 8601, UTC without an offset; ``end`` defaults to now, ``start`` to 24 hours
before ``end``; ``start < end``), ``group_by`` (``tenant`` by default, ``model``, ``release``, ``request_group``,
``scope``), and the cache scope filters ``tenant_id``, ``served_model_name``, ``namespace``, ``request_group``. A bad
value, or a parameter given twice, is a 400 ``{parameter: [message]}``; a blank value means the parameter is absent.
Rows are those of the tenants the user may see (``tenants.access.scope``). The integration rule is
``dashboard.telemetry.chargeback``'s.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django import forms
from django.http import HttpResponse, QueryDict
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError as ApiValidationError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboard.api.params import StrictIsoDateTimeField
from dashboard.master.health import current_health
from dashboard.models import OccupancySample
from dashboard.telemetry.chargeback import GROUPINGS, Chargeback, chargeback, csv_text
from dashboard.telemetry.queries import OccupancyFilter
from tenants.access import scope

#: Length of the period when ``start`` is not given.
DEFAULT_PERIOD = timedelta(hours=24)


class ChargebackQuery(forms.Form):
    """The query of a chargeback (API and page): period, grouping, cache scope filters.

    Build it with ``from_query`` (blank values dropped, a repeated parameter refused). Once valid,
    ``cleaned_data`` holds ``start``/``end`` (aware UTC, defaults filled in), ``group_by`` and the four filters
    ("" = all).
    """

    start = StrictIsoDateTimeField(required=False, help_text="Start of the period (ISO 8601, UTC without an "
                                   "offset); default: 24 hours before end.")
    end = StrictIsoDateTimeField(required=False, help_text="End of the period, exclusive; default: now.")
    group_by = forms.ChoiceField(choices=[(name, name) for name in GROUPINGS], required=False,
                                 help_text="One row per tenant (default), served model, release namespace, "
                                 "request group (of a tenant, over its releases) or whole cache scope.")
    tenant_id = forms.CharField(required=False, help_text="Only this tenant (Mooncake tenant_id).")
    served_model_name = forms.CharField(required=False, help_text="Only this served model name.")
    namespace = forms.CharField(required=False, help_text="Only this release namespace.")
    request_group = forms.CharField(required=False, help_text="Only this request group.")

    def __init__(self, *args, now: datetime | None = None, repeated: tuple[str, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.now = now or timezone.now()
        self.repeated = repeated

    @classmethod
    def from_query(cls, query: QueryDict, *, now: datetime | None = None) -> ChargebackQuery:
        """The form over ``query`` (a request's ``GET``): blank values are absent; a parameter of the form given
        more than once is an error on it."""
        data = {name: query.get(name) for name in cls.base_fields if query.get(name, "") != ""}
        repeated = tuple(name for name in cls.base_fields if len(query.getlist(name)) > 1)
        return cls(data, now=now, repeated=repeated)

    def clean(self):
        data = super().clean()
        for name in self.repeated:
            self.add_error(name, f"Give {name} once (it was given {name} more than once).")
        if self.errors:
            return data
        end = data.get("end") or self.now
        start = data.get("start")
        if start is None:
            try:
                start = end - DEFAULT_PERIOD
            except OverflowError:
                self.add_error("start", "Give start: 24 hours before end is before year 1.")
                return data
        if end <= start:
            self.add_error("end", f"end ({end.isoformat()}) must be after start ({start.isoformat()}).")
            return data
        data.update(start=start, end=end, group_by=data.get("group_by") or "tenant")
        return data

    def filters(self) -> OccupancyFilter:
        """The cache scope filters of the (valid) form."""
        data = self.cleaned_data
        return OccupancyFilter.from_params(data)

    def api_errors(self) -> dict[str, list[str]]:
        """The form's errors as the API's 400 body (``{parameter: [message]}``)."""
        return {name: [str(message) for message in messages] for name, messages in self.errors.items()}


def report_for(query: ChargebackQuery, user) -> Chargeback:
    """The chargeback of a valid ``query`` over the samples ``user`` may see, against the pool's mounted capacity
    (``None`` while unknown)."""
    data = query.cleaned_data
    samples = query.filters().apply(scope(OccupancySample.objects.all(), user))
    capacity = current_health().capacity_bytes
    return chargeback(samples, data["start"], data["end"], data["group_by"],
                      capacity_bytes=capacity if capacity else None)


def _parameters() -> list[OpenApiParameter]:
    """The query parameters of ``ChargebackQuery`` for the schema."""
    out = []
    for name, field in ChargebackQuery.base_fields.items():
        kind = OpenApiTypes.DATETIME if isinstance(field, StrictIsoDateTimeField) else OpenApiTypes.STR
        enum = list(GROUPINGS) if isinstance(field, forms.ChoiceField) else None
        out.append(OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=str(field.help_text), enum=enum))
    return out


class ChargebackRowSerializer(serializers.Serializer):
    """One group: its key fields (``null`` where the grouping does not split by it) and its use of the pool."""

    tenant_id = serializers.CharField(allow_null=True)
    served_model_name = serializers.CharField(allow_null=True, allow_blank=True)
    namespace = serializers.CharField(allow_null=True, allow_blank=True)
    request_group = serializers.CharField(allow_null=True, allow_blank=True,
                                          help_text='"" is the default group (instances without request groups).')
    byte_hours = serializers.FloatField(help_text="Bytes × hours over the period, summed over nodes.")
    gib_hours = serializers.FloatField(help_text="GiB (2**30 bytes) × hours.")
    average_bytes = serializers.FloatField(help_text="byte_hours / the period's hours.")
    capacity_share = serializers.FloatField(allow_null=True, help_text="byte_hours / capacity_byte_hours "
                                            "(null while the capacity is unknown).")


class ChargebackSerializer(serializers.Serializer):
    """A period's chargeback: the period, the pool's capacity over it, totals and rows (largest use first)."""

    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    hours = serializers.FloatField()
    group_by = serializers.ChoiceField(choices=list(GROUPINGS))
    max_gap_seconds = serializers.IntegerField(help_text="The longest a raw sample holds "
                                               "(KVPOOL_CHARGEBACK_MAX_GAP_SECONDS).")
    capacity_bytes = serializers.IntegerField(allow_null=True, help_text="The pool's mounted capacity at the "
                                              "newest master probe (master_total_capacity_bytes); null if unknown.")
    capacity_byte_hours = serializers.FloatField(allow_null=True, help_text="capacity_bytes × hours.")
    total_byte_hours = serializers.FloatField()
    total_gib_hours = serializers.FloatField()
    total_average_bytes = serializers.FloatField()
    total_capacity_share = serializers.FloatField(allow_null=True)
    rows = ChargebackRowSerializer(many=True)


def _valid_query(request: Request) -> ChargebackQuery:
    query = ChargebackQuery.from_query(request.query_params)
    if not query.is_valid():
        raise ApiValidationError(query.api_errors())
    return query


class ChargebackView(APIView):
    """Bytes·hours of the pool per group over a period, with the share of the pool's capacity."""

    @extend_schema(parameters=_parameters(), responses=ChargebackSerializer)
    def get(self, request: Request) -> Response:
        report = report_for(_valid_query(request), request.user)
        return Response(ChargebackSerializer(report.as_dict()).data)


class _JsonWhateverAccepted(BaseContentNegotiation):
    """Negotiation of the CSV download: the rows are CSV whatever ``Accept`` or ``?format=`` asks (no 406, no
    404), and an error is JSON like every other error of the API."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class ChargebackCsv(APIView):
    """The rows of ``chargeback/`` as a CSV download (``Content-Disposition: attachment``); errors are JSON."""

    renderer_classes = [JSONRenderer]
    content_negotiation_class = _JsonWhateverAccepted

    @extend_schema(parameters=_parameters(), responses={(200, "text/csv"): OpenApiTypes.STR})
    def get(self, request: Request) -> HttpResponse:
        report = report_for(_valid_query(request), request.user)
        response = HttpResponse(csv_text(report), content_type="text/csv; charset=utf-8")
        name = f"chargeback-{report.group_by}-{report.start:%Y%m%dT%H%M%SZ}-{report.end:%Y%m%dT%H%M%SZ}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
