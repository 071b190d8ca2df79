"""Type-ahead of names: ``GET /api/v1/names/<kind>/?q=prefix&limit=20`` -> the first registry names of that kind
starting with ``q``, among the objects the user may see (``tenants.access.scope``).

It feeds the filter inputs of the occupancy and chargeback pages (``templates/ui/_scope_filters.html``): at fleet
size (50 tenants, 200 served models, 2,000 release namespaces, 10,000 request groups, 1,000 nodes) a ``<select>``
of every name is too long to send and to use. A tenant member only ever gets the names of their tenants' objects
(nodes are every authenticated user's to see, as everywhere else).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboard.api.params import count_param
from tenants.access import scope
from tenants.models import Node, Release, RequestGroup, ServedModel, Tenant

#: Names returned when ``?limit=`` is absent, and the most one request may ask for.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
#: Longest ``?q=`` (characters): longer than any name of the registry.
MAX_PREFIX = 255


@dataclass(frozen=True)
class NameSource:
    """Where the names of one ``kind`` come from: ``model``'s ``field``, narrowed by the query parameters of
    ``narrowing`` (parameter -> lookup)."""

    model: type[Model]
    field: str
    narrowing: dict[str, str] = field(default_factory=dict)


#: ``kind`` in the path -> its ``NameSource``. The narrowing parameters are the occupancy filters' names (those of
#: ``GET /api/v1/telemetry/occupancy/``), so a page passes its other filters as they are.
KINDS: dict[str, NameSource] = {
    "tenants": NameSource(Tenant, "tenant_id"),
    "served-models": NameSource(ServedModel, "served_model_name", {"tenant_id": "tenant__tenant_id"}),
    "namespaces": NameSource(Release, "namespace", {"tenant_id": "model__tenant__tenant_id",
                                                    "served_model_name": "model__served_model_name"}),
    "request-groups": NameSource(RequestGroup, "name", {"tenant_id": "tenant__tenant_id"}),
    "nodes": NameSource(Node, "name"),
}


class NameQuerySerializer(serializers.Serializer):
    """Query parameters of the type-ahead (blank is absent)."""

    q = serializers.CharField(required=False, allow_blank=True, max_length=MAX_PREFIX, trim_whitespace=False,
                              help_text="Prefix of the names (case-insensitive); blank or absent: every name.")
    tenant_id = serializers.CharField(required=False, allow_blank=True, max_length=MAX_PREFIX,
                                      help_text="Only names in this tenant (served-models, namespaces, "
                                                "request-groups).")
    served_model_name = serializers.CharField(required=False, allow_blank=True, max_length=MAX_PREFIX,
                                              help_text="Only namespaces of this served model.")
    limit = serializers.IntegerField(required=False, min_value=1,
                                     help_text=f"How many names (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}).")


class NameListSerializer(serializers.Serializer):
    """The answer: names in order, and whether more start with the prefix."""

    kind = serializers.CharField()
    results = serializers.ListField(child=serializers.CharField())
    more = serializers.BooleanField(help_text="True when more names match than were returned.")


def suggest(kind: str, user, *, prefix: str = "", limit: int = DEFAULT_LIMIT,
            narrowing: dict[str, str] | None = None) -> tuple[list[str], bool]:
    """The first ``limit`` distinct names of ``kind`` (a ``KINDS`` key) that ``user`` may see and that start with
    ``prefix`` (case-insensitive), sorted; and whether more match. ``narrowing``: ``{parameter: value}`` of the
    kind's ``NameSource.narrowing`` (others are ignored, blank values too). One query."""
    source = KINDS[kind]
    rows = scope(source.model._default_manager.all(), user)
    if prefix:
        rows = rows.filter(**{f"{source.field}__istartswith": prefix})
    for name, value in (narrowing or {}).items():
        if value and name in source.narrowing:
            rows = rows.filter(**{source.narrowing[name]: value})
    names = list(rows.order_by(source.field).values_list(source.field, flat=True).distinct()[:limit + 1])
    return names[:limit], len(names) > limit


class NameSuggestions(APIView):
    """``GET /api/v1/names/<kind>/``: type-ahead of registry names (see the module docstring)."""

    @extend_schema(
        parameters=[NameQuerySerializer, OpenApiParameter("kind", OpenApiTypes.STR, OpenApiParameter.PATH,
                                                          enum=list(KINDS), description="Which names.")],
        responses=NameListSerializer)
    def get(self, request: Request, kind: str) -> Response:
        """The first names of ``kind`` starting with ``?q=`` (case-insensitive), sorted, among the objects the
        user may see; ``?tenant_id=`` / ``?served_model_name=`` narrow them. 404 for an unknown kind; 400 names
        a bad parameter."""
        if kind not in KINDS:
            raise NotFound(f"Unknown kind of names '{kind[:40]}': use one of {', '.join(KINDS)}.")
        params = {name: value for name, value in request.query_params.items() if value != ""}
        limit = count_param(params.pop("limit", None), "limit", minimum=1)
        data = NameQuerySerializer(data=params)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        names, more = suggest(kind, request.user, prefix=values.get("q", ""),
                              limit=min(limit or DEFAULT_LIMIT, MAX_LIMIT),
                              narrowing={name: values.get(name, "") for name in ("tenant_id", "served_model_name")})
        return Response({"kind": kind, "results": names, "more": more})
