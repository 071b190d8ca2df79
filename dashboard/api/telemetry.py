"""Read-mostly REST API of delivery and telemetry: node drift, config versions, occupancy, master quotas.

Routes (``dashboard/api/telemetry_urls.py``, under ``/api/v1/telemetry/``):
  ``nodes/``                    node states with drift flags; ``?drift=behind|silent|digest_mismatch|rejected|
                                out_of_sync`` filters
  ``nodes/<name>/``             one node: state, drift, newest document (signature not included), last 20 acks
  ``nodes/<name>/push/``        POST: render and send the node's document now (``{"force": true}`` re-sends)
  ``occupancy/``                samples; ``?tenant_id= &served_model_name= &namespace= &request_group= &node=
                                &level=raw|minute|hour &since= &until=`` (ISO-8601), newest first
  ``instances/``                real engine instances: the newest facts each agent reported (attribution counters,
                                engine metrics, hit ratios); ``?node= &instance_id= &tenant_id= &served_model_name=
                                &namespace= &engine=vllm|sglang &trouble=true|false &since= &until=`` (reported_at)
  ``instances/<node>/<id>/``    one instance's newest facts
  ``master/``                   per tenant: newest master read-back and the sync state (409 errors included)
  ``master/samples/``           master read-back series; ``?tenant_id= &since= &until=``
  ``chargeback/``, ``chargeback.csv``  bytes·hours per tenant / model / release / request group over a period
                                (``dashboard.api.chargeback``)

Lists filter through the FilterSets of ``dashboard.api.filtersets`` and order with ``?ordering=`` (the view's
``ordering_fields``), so a bad value is a 400 ``{parameter: [message]}`` as on the registry lists.

Tenant scoping (``tenants.access``): occupancy samples, engine instances and master quotas are rows of one tenant
each (by ``tenant_id``) and a user who is not a platform admin sees only their tenants' rows. Nodes are seen by
every user, but for such a user a node's document lists only their tenants' instances, and the node's error texts
(``push_error``, ``rejection_error``) and acks, which may name any tenant's instances, are left out (empty).
"""
from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.shortcuts import get_object_or_404
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboard.api.fields import StrictBooleanField
from dashboard.api.filtersets import (
    LEVELS,
    BoundedSearchFilter,
    InstanceStatsFilterSet,
    MasterQuotaSampleFilterSet,
    NodeStateFilterSet,
    OccupancySampleFilterSet,
    StrictOrderingFilter,
)
from dashboard.api.permissions import CanPushNodeConfig
from dashboard.models import (
    ConfigAck,
    ConfigVersion,
    InstanceStats,
    MasterQuotaSample,
    MasterQuotaSync,
    NodeState,
    OccupancySample,
    Report,
)
from tenants.access import is_platform_admin, scope, visible_tenant_ids


def node_states():
    """``NodeState`` rows annotated with ``last_report_at`` (the newest report receipt of the node)."""
    newest = Report.objects.filter(node_name=OuterRef("node_name")).order_by("-sequence").values("sent_at")[:1]
    return NodeState.objects.annotate(last_report_at=Subquery(newest))


#: A node's error texts, which may name any tenant's instances: shown to platform admins only.
NODE_ERROR_FIELDS = ("push_error", "rejection_error")


class NodeStateSerializer(serializers.ModelSerializer):
    """A node's delivery state, the time of its newest report, and its drift flags
    (``dashboard.rollout.push.drift``)."""

    drift = serializers.SerializerMethodField()
    last_report_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = NodeState
        exclude = ["id"]

    def get_drift(self, state: NodeState) -> dict:
        from dashboard.rollout.push import drift

        return drift(state)

    def to_representation(self, instance):
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is None or not is_platform_admin(request.user):
            for name in NODE_ERROR_FIELDS:
                if name in data:
                    data[name] = ""
        return data



class ConfigAckSerializer(serializers.ModelSerializer):
    class Meta:
        model = ConfigAck
        exclude = ["id"]


class OccupancySampleSerializer(serializers.ModelSerializer):
    level = serializers.SerializerMethodField()

    class Meta:
        model = OccupancySample
        exclude = ["id"]

    def get_level(self, sample: OccupancySample) -> str:
        return {value: name for name, value in LEVELS.items()}[sample.level]


class InstanceStatsSerializer(serializers.ModelSerializer):
    """One engine instance's newest facts (``dashboard.models.InstanceStats``; counters since ``agent_started_at``,
    metrics in tokens) with the hit ratios and the sum of unknown blocks."""

    external_hit_ratio = serializers.FloatField(read_only=True, allow_null=True)
    prefix_hit_ratio = serializers.FloatField(read_only=True, allow_null=True)
    unknown_blocks = serializers.IntegerField(read_only=True)

    class Meta:
        model = InstanceStats
        exclude = ["id"]


class MasterQuotaSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = MasterQuotaSample
        exclude = ["id"]


class MasterQuotaSyncSerializer(serializers.ModelSerializer):
    class Meta:
        model = MasterQuotaSync
        exclude = ["id"]


class NodeDetailSerializer(NodeStateSerializer):
    """A node's state with its newest document (unsigned) and last 20 acks."""

    document = serializers.JSONField(allow_null=True, read_only=True)
    acks = ConfigAckSerializer(many=True, read_only=True)

    class Meta(NodeStateSerializer.Meta):
        pass


class PushRequestSerializer(serializers.Serializer):
    """Body of ``POST nodes/<name>/push/``: ``force`` re-sends an unchanged, acked document."""

    force = StrictBooleanField(default=False)


class PushResultSerializer(serializers.Serializer):
    """Counts of one push: versions created, documents sent, nodes missing from the registry, failures."""

    versions = serializers.IntegerField()
    sent = serializers.IntegerField()
    missing = serializers.IntegerField()
    failed = serializers.IntegerField()


class MasterOverviewSerializer(serializers.Serializer):
    """Per tenant: newest master read-back (or null) and sync state (or null)."""

    tenant_id = serializers.CharField()
    master = MasterQuotaSampleSerializer(allow_null=True)
    sync = MasterQuotaSyncSerializer(allow_null=True)


class TelemetryListView(generics.ListAPIView):
    """Base of the telemetry lists: rows scoped to the user's tenants (``tenants.access.scope``), a FilterSet and
    strict ``?ordering=`` (an unknown field is a 400 naming ``ordering``) and ``?search=`` over ``search_fields``, like
    the registry lists."""

    filter_backends = [DjangoFilterBackend, BoundedSearchFilter, StrictOrderingFilter]

    def get_queryset(self):
        return scope(super().get_queryset(), self.request.user)


class NodeStateList(TelemetryListView):
    """Nodes with desired vs acked version, heartbeat age and drift flags (``?drift=`` filters by a flag)."""

    serializer_class = NodeStateSerializer
    filterset_class = NodeStateFilterSet
    search_fields = ("node_name", "agent_hostname")
    ordering = ("node_name",)
    ordering_fields = ("node_name", "desired_version", "acked_version", "applied_version", "heartbeat_at",
                       "last_report_at")

    def get_queryset(self):
        return scope(node_states(), self.request.user)


class NodeStateDetail(APIView):
    """One node: state, drift, newest document (unsigned) and its last 20 acks. For a user who is not a platform
    admin the document lists only the instances of their tenants, and the acks are left out."""

    @extend_schema(responses=NodeDetailSerializer)
    def get(self, request: Request, name: str) -> Response:
        state = get_object_or_404(scope(node_states(), request.user), node_name=name)
        latest = ConfigVersion.objects.filter(node_name=name).order_by("-version").first()
        state.document = tenant_document(latest.document, request.user) if latest else None
        state.acks = scope(ConfigAck.objects.filter(node_name=name), request.user).order_by("-sent_at")[:20]
        return Response(NodeDetailSerializer(state, context={"request": request}).data)


def tenant_document(document: dict, user) -> dict:
    """``document`` (a node's config document as stored) with only the instances of ``user``'s tenants (all of
    them for a platform admin)."""
    names = visible_tenant_ids(user)
    if names is None or not isinstance(document, dict):
        return document
    instances = [spec for spec in document.get("instances") or [] if spec.get("tenant_id") in names]
    return {**document, "instances": instances}


class NodePush(APIView):
    """POST: render the node's document from the registry and send it (``force`` re-sends an unchanged one).

    Needs ``tenants.change_node`` (403 naming it otherwise).
    """

    permission_classes = [IsAuthenticated, CanPushNodeConfig]

    @extend_schema(request=PushRequestSerializer, responses=PushResultSerializer)
    def post(self, request: Request, name: str) -> Response:
        from dashboard.rollout.push import push_nodes
        from tenants.models import Node

        get_object_or_404(Node, name=name)
        body = PushRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(PushResultSerializer(push_nodes([name], force=body.validated_data["force"])).data)


class OccupancyList(TelemetryListView):
    """Occupancy samples, newest first, filtered by tenant, model, namespace, request group, node, level and time."""

    serializer_class = OccupancySampleSerializer
    filterset_class = OccupancySampleFilterSet
    search_fields = ("node_name", "tenant_id", "served_model_name", "namespace", "request_group")
    ordering_fields = ("ts", "node_name", "tenant_id", "served_model_name", "namespace", "request_group", "bytes",
                       "blocks")
    ordering = ("-ts", "node_name")
    queryset = OccupancySample.objects.all()


class InstanceStatsList(TelemetryListView):
    """Real engine instances as their agents last reported them, by node and instance id; filtered by node,
    instance, tenant, model, namespace, engine, trouble and report time."""

    serializer_class = InstanceStatsSerializer
    filterset_class = InstanceStatsFilterSet
    search_fields = ("node_name", "instance_id", "tenant_id", "served_model_name", "namespace")
    ordering_fields = ("node_name", "instance_id", "tenant_id", "namespace", "reported_at", "last_event_at",
                       "blocks_seen", "attributed", "hash_mismatch", "unknown_salt", "seq_gaps",
                       "external_prefix_cache_hits")
    ordering = ("node_name", "instance_id")
    queryset = InstanceStats.objects.all()


class InstanceStatsDetail(generics.RetrieveAPIView):
    """One engine instance's newest facts (404 when its agent never reported it)."""

    serializer_class = InstanceStatsSerializer
    queryset = InstanceStats.objects.all()

    def get_object(self) -> InstanceStats:
        return get_object_or_404(scope(InstanceStats.objects.all(), self.request.user), node_name=self.kwargs["name"],
                                 instance_id=self.kwargs["instance_id"])


class MasterQuotaOverview(APIView):
    """Per tenant: the newest master read-back and the registry → master sync state."""

    @extend_schema(responses=MasterOverviewSerializer(many=True))
    def get(self, request: Request) -> Response:
        from django.db.models import Max

        visible = scope(MasterQuotaSample.objects.all(), request.user)
        newest = {row["tenant_id"]: row["ts"] for row in visible.values("tenant_id").annotate(ts=Max("ts"))}
        samples = {s.tenant_id: s for s in visible.filter(ts__in=set(newest.values()))
                   if newest.get(s.tenant_id) == s.ts}
        syncs = {s.tenant_id: s for s in scope(MasterQuotaSync.objects.all(), request.user)}
        rows = [{"tenant_id": tenant_id, "master": samples.get(tenant_id), "sync": syncs.get(tenant_id)}
                for tenant_id in sorted(set(samples) | set(syncs))]
        return Response(MasterOverviewSerializer(rows, many=True).data)


class MasterQuotaSamples(TelemetryListView):
    """Master read-back series, newest first, filtered by tenant and time."""

    serializer_class = MasterQuotaSampleSerializer
    filterset_class = MasterQuotaSampleFilterSet
    search_fields = ("tenant_id",)
    ordering_fields = ("ts", "tenant_id", "charged_bytes")
    ordering = ("-ts", "tenant_id")
    queryset = MasterQuotaSample.objects.all()
