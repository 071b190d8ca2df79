"""One FilterSet per registry model, shared by the API lists and the dashboard pages."""
from __future__ import annotations

import django_filters as filters

from tenants.choices import AuditAction, Engine, HashAlgo, InstanceRole, ReleaseState
from tenants.models import AuditEntry, InstanceAssignment, Node, Release, RequestGroup, ServedModel, Tenant


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
    has_served = filters.BooleanFilter(field_name="first_served_at", lookup_expr="isnull", exclude=True)

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
