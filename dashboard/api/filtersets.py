"""One FilterSet per registry model for the API lists, and the ordering backend of those lists.

An invalid filter value is an HTTP 400 naming the parameter (``DjangoFilterBackend`` raises the FilterSet's form
errors): ``?has_served=maybe`` -> ``{"has_served": ["'maybe' is not a boolean: use true or false."]}``,
``?engine=foo`` -> ``{"engine": ["Select a valid choice. ..."]}``. So is an unknown ``?ordering=`` field
(``StrictOrderingFilter``). Unknown parameter names are ignored, as DRF does.
"""
from __future__ import annotations

import django_filters as filters
from rest_framework import serializers
from rest_framework.filters import OrderingFilter

from tenants.choices import AuditAction, Engine, HashAlgo, InstanceRole, ReleaseState
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)


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


class TenantFilterSet(filters.FilterSet):
    """``?tenant_id=`` exact, ``?tenant_id__icontains=`` substring."""

    class Meta:
        model = Tenant
        fields = {"tenant_id": ["exact", "icontains"]}


class ServedModelFilterSet(filters.FilterSet):
    """By tenant (``tenant`` = pk, ``tenant_id`` = Mooncake name), served / vLLM model name."""

    tenant_id = filters.CharFilter(field_name="tenant__tenant_id")

    class Meta:
        model = ServedModel
        fields = {"tenant": ["exact"], "served_model_name": ["exact", "icontains"], "vllm_model_name": ["exact"]}


class ReleaseFilterSet(filters.FilterSet):
    """By model, tenant, namespace, state (repeatable), engine, hash algorithm, fingerprint, served or not."""

    tenant = filters.NumberFilter(field_name="model__tenant")
    tenant_id = filters.CharFilter(field_name="model__tenant__tenant_id")
    served_model_name = filters.CharFilter(field_name="model__served_model_name")
    state = filters.MultipleChoiceFilter(choices=ReleaseState.choices)
    engine = filters.ChoiceFilter(choices=Engine.choices)
    hash_algo = filters.ChoiceFilter(choices=HashAlgo.choices)
    has_served = StrictBooleanFilter(field_name="first_served_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = Release
        fields = {"model": ["exact"], "namespace": ["exact", "icontains"], "fingerprint": ["exact"]}


class RequestGroupFilterSet(filters.FilterSet):
    """By tenant and name."""

    tenant_id = filters.CharFilter(field_name="tenant__tenant_id")

    class Meta:
        model = RequestGroup
        fields = {"tenant": ["exact"], "name": ["exact", "icontains"], "cache_salt": ["exact"]}


class NodeFilterSet(filters.FilterSet):
    """By name and host name."""

    class Meta:
        model = Node
        fields = {"name": ["exact", "icontains"], "hostname": ["exact"]}


class InstanceAssignmentFilterSet(filters.FilterSet):
    """By node (pk or ``node_name``), release (pk or ``namespace``), tenant, engine and role."""

    node_name = filters.CharFilter(field_name="node__name")
    namespace = filters.CharFilter(field_name="release__namespace")
    tenant_id = filters.CharFilter(field_name="release__model__tenant__tenant_id")
    engine = filters.ChoiceFilter(choices=Engine.choices)
    role = filters.ChoiceFilter(choices=InstanceRole.choices)

    class Meta:
        model = InstanceAssignment
        fields = {"node": ["exact"], "release": ["exact"]}


class AuditEntryFilterSet(filters.FilterSet):
    """By action, object, actor, request id and time window (``since``/``until``, ISO 8601)."""

    action = filters.ChoiceFilter(choices=AuditAction.choices)
    since = filters.IsoDateTimeFilter(field_name="timestamp", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="timestamp", lookup_expr="lte")

    class Meta:
        model = AuditEntry
        fields = {"object_type": ["exact"], "object_id": ["exact"], "actor_repr": ["exact"], "request_id": ["exact"]}
