"""One FilterSet per model listed by the API (registry and telemetry), and the ordering backend of those lists.

An invalid filter value is an HTTP 400 naming the parameter (``DjangoFilterBackend`` raises the FilterSet's form
errors as ``{parameter: [message]}``): ``?has_served=maybe`` -> ``{"has_served": ["'maybe' is not a boolean: use
true or false."]}``, ``?engine=foo`` -> ``{"engine": ["Select a valid choice. ..."]}``, ``?tenant=1.5`` -> not an
object id, ``?since=0001-01-01T00:00:00+05:00`` -> out of range (``dashboard.api.params``). So is an unknown
``?ordering=`` field (``StrictOrderingFilter``). Unknown parameter names are ignored, as DRF does; a blank value
means no filter.
"""
from __future__ import annotations

import django_filters as filters
from django_filters.fields import MultipleChoiceField
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.filters import OrderingFilter, SearchFilter

from dashboard.api.params import (
    StrictFilterSet,
    StrictIsoDateTimeFilter,
    StrictModelChoiceFilter,
)
from dashboard.models import InstanceStats, MasterQuotaSample, NodeState, OccupancySample
from tenants.choices import (
    AuditAction,
    Engine,
    HashAlgo,
    InstanceRole,
    NodeDevice,
    ReleaseState,
    StoreMode,
    TenantRole,
)
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
    TenantMembership,
)


@extend_schema_field({"type": "string", "enum": ["true", "false"]})
class StrictBooleanFilter(filters.TypedChoiceFilter):
    """A boolean query parameter, ``true`` or ``false`` (any other value is a 400 naming the parameter).

    django-filter's ``BooleanFilter`` turns an unrecognised value into "no filter", so a typo silently returns
    the whole list; a typed choice refuses it.
    """

    CHOICES = (("true", "true"), ("false", "false"))

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("choices", self.CHOICES)
        kwargs.setdefault("coerce", lambda value: value == "true")
        kwargs.setdefault("error_messages", {"invalid_choice": "'%(value)s' is not a boolean: use true or false."})
        super().__init__(*args, **kwargs)


class BlankIgnoringMultipleChoiceField(MultipleChoiceField):
    """django-filter's multiple-choice field, reading blank values as absent (``?state=`` lists everything, as a
    blank value of any other parameter does) instead of refusing them as a choice."""

    def to_python(self, value):
        return [item for item in super().to_python(value) if item != ""]


class StrictMultipleChoiceFilter(filters.MultipleChoiceFilter):
    """A repeatable choice parameter (``?state=warming&state=serving``); blank values are ignored."""

    field_class = BlankIgnoringMultipleChoiceField


class StrictOrderingFilter(OrderingFilter):
    """DRF's ``OrderingFilter``, but ``?ordering=`` naming a field the view does not order by is a 400.

    Terms are comma-separated field names of the view's ``ordering_fields``, ``-`` in front for descending.
    """

    def remove_invalid_fields(self, queryset, fields, view, request):
        valid = [name for name, _label in self.get_valid_fields(queryset, view, {"request": request})]
        fields = [term for term in fields if term]
        invalid = [term for term in fields if term.removeprefix("-") not in valid]
        if invalid:
            raise serializers.ValidationError({self.ordering_param: [
                f"Cannot order by {', '.join(repr(term) for term in invalid)}: use "
                f"{', '.join(valid)} (prefix '-' for descending)."]})
        return fields

    def get_ordering(self, request, queryset, view):
        """The requested (or the view's default) ordering with the primary key last, so that pages of a list
        sorted by a column with ties (``?ordering=state``) neither repeat nor skip rows between requests."""
        ordering = super().get_ordering(request, queryset, view)
        if ordering is None:
            ordering = list(queryset.query.order_by or queryset.model._meta.ordering or [])
        ordering = list(ordering)
        if not any(term.removeprefix("-") in ("pk", "id") for term in ordering):
            ordering.append("pk")
        return ordering


#: Longest ``?search=`` accepted (characters), and most terms in it.
MAX_SEARCH_LENGTH = 200
MAX_SEARCH_TERMS = 8


class BoundedSearchFilter(SearchFilter):
    """DRF's ``SearchFilter`` (``?search=``: every whitespace-separated term must occur, case-insensitively, in one
    of the view's ``search_fields``), bounded: more than ``MAX_SEARCH_LENGTH`` characters or ``MAX_SEARCH_TERMS``
    terms is a 400 naming ``search`` (each term is one more ``OR`` over the fields in the SQL)."""

    def get_search_terms(self, request):
        raw = request.query_params.get(self.search_param, "")
        if len(raw) > MAX_SEARCH_LENGTH:
            raise serializers.ValidationError({self.search_param: [
                f"Must be at most {MAX_SEARCH_LENGTH} characters of text."]})
        terms = super().get_search_terms(request)
        if len(terms) > MAX_SEARCH_TERMS:
            raise serializers.ValidationError({self.search_param: [
                f"Use at most {MAX_SEARCH_TERMS} words ({len(terms)} given)."]})
        return terms


class TenantFilterSet(StrictFilterSet):
    """``?tenant_id=`` exact, ``?tenant_id__icontains=`` substring."""

    class Meta:
        model = Tenant
        fields = {"tenant_id": ["exact", "icontains"]}


class ServedModelFilterSet(StrictFilterSet):
    """By tenant (``tenant`` = pk, ``tenant_id`` = Mooncake name), served / vLLM model name."""

    tenant_id = filters.CharFilter(field_name="tenant__tenant_id")

    class Meta:
        model = ServedModel
        fields = {"tenant": ["exact"], "served_model_name": ["exact", "icontains"], "vllm_model_name": ["exact"]}


class ReleaseFilterSet(StrictFilterSet):
    """By model, tenant, namespace, state (repeatable), engine, hash algorithm, fingerprint, served or not."""

    tenant = StrictModelChoiceFilter(field_name="model__tenant", queryset=Tenant.objects.all())
    tenant_id = filters.CharFilter(field_name="model__tenant__tenant_id")
    served_model_name = filters.CharFilter(field_name="model__served_model_name")
    state = StrictMultipleChoiceFilter(choices=ReleaseState.choices)
    engine = filters.ChoiceFilter(choices=Engine.choices)
    hash_algo = filters.ChoiceFilter(choices=HashAlgo.choices)
    has_served = StrictBooleanFilter(field_name="first_served_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = Release
        fields = {"model": ["exact"], "namespace": ["exact", "icontains"], "fingerprint": ["exact"]}


class RequestGroupFilterSet(StrictFilterSet):
    """By tenant and name."""

    tenant_id = filters.CharFilter(field_name="tenant__tenant_id")

    class Meta:
        model = RequestGroup
        fields = {"tenant": ["exact"], "name": ["exact", "icontains"], "cache_salt": ["exact"]}


class NodeFilterSet(StrictFilterSet):
    """By name, host name, device and store mode."""

    device = filters.ChoiceFilter(choices=NodeDevice.choices)
    store_mode = filters.ChoiceFilter(choices=StoreMode.choices)

    class Meta:
        model = Node
        fields = {"name": ["exact", "icontains"], "hostname": ["exact"]}


class InstanceAssignmentFilterSet(StrictFilterSet):
    """By node (pk or ``node_name``), release (pk or ``namespace``), tenant, engine and role."""

    node_name = filters.CharFilter(field_name="node__name")
    namespace = filters.CharFilter(field_name="release__namespace")
    tenant_id = filters.CharFilter(field_name="release__model__tenant__tenant_id")
    engine = filters.ChoiceFilter(choices=Engine.choices)
    role = filters.ChoiceFilter(choices=InstanceRole.choices)

    class Meta:
        model = InstanceAssignment
        fields = {"node": ["exact"], "release": ["exact"]}


class TenantMembershipFilterSet(StrictFilterSet):
    """By tenant (``tenant`` = pk, ``tenant_id`` = Mooncake name), user (``user`` = pk, ``username``) and role."""

    tenant_id = filters.CharFilter(field_name="tenant__tenant_id")
    username = filters.CharFilter(field_name="user__username")
    role = filters.ChoiceFilter(choices=TenantRole.choices)

    class Meta:
        model = TenantMembership
        fields = {"tenant": ["exact"], "user": ["exact"]}


class AuditEntryFilterSet(StrictFilterSet):
    """By action, object, actor, request id and time window (``since``/``until``, ISO 8601)."""

    action = filters.ChoiceFilter(choices=AuditAction.choices)
    since = StrictIsoDateTimeFilter(field_name="timestamp", lookup_expr="gte")
    until = StrictIsoDateTimeFilter(field_name="timestamp", lookup_expr="lte")

    class Meta:
        model = AuditEntry
        fields = {"object_type": ["exact"], "object_id": ["exact"], "actor_repr": ["exact"], "request_id": ["exact"]}


# --- telemetry ------------------------------------------------------------------------------------------------

#: ``?level=`` of occupancy samples -> ``OccupancySample.Level``.
LEVELS = {"raw": OccupancySample.Level.RAW, "minute": OccupancySample.Level.MINUTE,
          "hour": OccupancySample.Level.HOUR}
#: ``?drift=`` of node states: a flag of ``dashboard.rollout.push.drift`` or ``out_of_sync`` (not ``in_sync``).
DRIFT_FILTERS = ("behind", "silent", "digest_mismatch", "rejected", "out_of_sync")


def _one_of(names) -> dict[str, str]:
    return {"invalid_choice": f"'%(value)s' is not one of {', '.join(names)}."}


class NodeStateFilterSet(StrictFilterSet):
    """``?drift=behind|silent|digest_mismatch|rejected|out_of_sync``: nodes with that drift flag."""

    drift = filters.ChoiceFilter(choices=[(name, name) for name in DRIFT_FILTERS], method="filter_drift",
                                 error_messages=_one_of(DRIFT_FILTERS))

    class Meta:
        model = NodeState
        fields: list[str] = []

    def filter_drift(self, queryset, name: str, value: str):
        from dashboard.rollout.push import drift

        def wanted(state) -> bool:
            flags = drift(state)
            return not flags["in_sync"] if value == "out_of_sync" else flags[value]

        return queryset.filter(node_name__in=[state.node_name for state in queryset if wanted(state)])


class OccupancySampleFilterSet(StrictFilterSet):
    """By tenant, model, release namespace, request group, node (``?node=`` = node name), ``?level=raw|minute|hour``
    (raw when absent or blank) and time (``since`` inclusive, ``until`` exclusive, ISO 8601)."""

    node = filters.CharFilter(field_name="node_name")
    level = filters.ChoiceFilter(choices=[(name, name) for name in LEVELS], method="filter_level",
                                 error_messages=_one_of(LEVELS))
    since = StrictIsoDateTimeFilter(field_name="ts", lookup_expr="gte")
    until = StrictIsoDateTimeFilter(field_name="ts", lookup_expr="lt")

    class Meta:
        model = OccupancySample
        fields = ["tenant_id", "served_model_name", "namespace", "request_group"]

    def __init__(self, data=None, *args, **kwargs):
        if data is not None and not data.get("level"):
            data = data.copy()
            data["level"] = "raw"
        super().__init__(data, *args, **kwargs)

    def filter_level(self, queryset, name: str, value: str):
        return queryset.filter(level=LEVELS[value])


class MasterQuotaSampleFilterSet(StrictFilterSet):
    """By tenant and time (``since`` inclusive, ``until`` exclusive, ISO 8601)."""

    since = StrictIsoDateTimeFilter(field_name="ts", lookup_expr="gte")
    until = StrictIsoDateTimeFilter(field_name="ts", lookup_expr="lt")

    class Meta:
        model = MasterQuotaSample
        fields = ["tenant_id"]


#: ``?engine=`` of instance stats.
STATS_ENGINES = ("vllm", "sglang")


class InstanceStatsFilterSet(StrictFilterSet):
    """By node (``?node=`` = node name), instance id, tenant, model, release namespace, ``?engine=vllm|sglang``,
    time of the report (``since`` inclusive, ``until`` exclusive, ISO 8601) and ``?trouble=true`` (instances with
    hash mismatches, unknown salts or adapters, lost or malformed event messages)."""

    node = filters.CharFilter(field_name="node_name")
    engine = filters.ChoiceFilter(choices=[(name, name) for name in STATS_ENGINES],
                                  error_messages=_one_of(STATS_ENGINES))
    since = StrictIsoDateTimeFilter(field_name="reported_at", lookup_expr="gte")
    until = StrictIsoDateTimeFilter(field_name="reported_at", lookup_expr="lt")
    trouble = StrictBooleanFilter(method="filter_trouble")

    class Meta:
        model = InstanceStats
        fields = ["instance_id", "tenant_id", "served_model_name", "namespace"]

    def filter_trouble(self, queryset, name: str, value: bool):
        from django.db.models import Q

        from agent.contract.messages import InstanceStats as Stats

        bad = (Q(hash_mismatch__gt=0) | Q(unknown_salt__gt=0) | Q(unknown_adapter__gt=0) | Q(seq_gaps__gt=0)
               | Q(decode_errors__gt=0) | Q(events_status__in=Stats.UNTRUSTED_EVENTS) | Q(topic_mismatch__gt=0))
        return queryset.filter(bad) if value else queryset.exclude(bad)
