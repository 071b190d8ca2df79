"""Read-mostly REST API of delivery and telemetry: node drift, config versions, occupancy, master quotas.

Routes (``dashboard/api/telemetry_urls.py``, under ``/api/v1/telemetry/``):
  ``nodes/``                    node states with drift flags; ``?drift=behind|silent|digest_mismatch|rejected|
                                out_of_sync`` filters
  ``nodes/<name>/``             one node: state, drift, newest document (signature not included), last 20 acks
  ``nodes/<name>/push/``        POST: render and send the node's document now (``{"force": true}`` re-sends)
  ``occupancy/``                samples; ``?tenant_id= &served_model_name= &namespace= &request_group= &node=
                                &level=raw|minute|hour &since= &until=`` (ISO-8601), newest first
  ``master/``                   per tenant: newest master read-back and the sync state (409 errors included)
  ``master/samples/``           master read-back series; ``?tenant_id= &since= &until=``

Lists filter through the FilterSets of ``dashboard.api.filtersets`` and order with ``?ordering=`` (the view's
``ordering_fields``), so a bad value is a 400 ``{parameter: [message]}`` as on the registry lists.
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

from dashboard.api.filtersets import (
    LEVELS,
    MasterQuotaSampleFilterSet,
    NodeStateFilterSet,
    OccupancySampleFilterSet,
    StrictOrderingFilter,
)
from dashboard.api.permissions import CanPushNodeConfig
from dashboard.models import (
    ConfigAck,
    ConfigVersion,
    MasterQuotaSample,
    MasterQuotaSync,
    NodeState,
    OccupancySample,
    Report,
)


def node_states():
    """``NodeState`` rows annotated with ``last_report_at`` (the newest report receipt of the node)."""
    newest = Report.objects.filter(node_name=OuterRef("node_name")).order_by("-sequence").values("sent_at")[:1]
    return NodeState.objects.annotate(last_report_at=Subquery(newest))


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

    force = serializers.BooleanField(default=False)


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
    """Base of the telemetry lists: a FilterSet and strict ``?ordering=`` (an unknown field is a 400 naming
    ``ordering``), like the registry lists."""

    filter_backends = [DjangoFilterBackend, StrictOrderingFilter]


class NodeStateList(TelemetryListView):
    """Nodes with desired vs acked version, heartbeat age and drift flags (``?drift=`` filters by a flag)."""

    serializer_class = NodeStateSerializer
    filterset_class = NodeStateFilterSet
    ordering_fields = ("node_name", "desired_version", "acked_version", "applied_version", "heartbeat_at",
                       "last_report_at")

    def get_queryset(self):
        return node_states()


class NodeStateDetail(APIView):
    """One node: state, drift, newest document (unsigned) and its last 20 acks."""

    @extend_schema(responses=NodeDetailSerializer)
    def get(self, request: Request, name: str) -> Response:
        state = get_object_or_404(node_states(), node_name=name)
        latest = ConfigVersion.objects.filter(node_name=name).order_by("-version").first()
        state.document = latest.document if latest else None
        state.acks = ConfigAck.objects.filter(node_name=name).order_by("-sent_at")[:20]
        return Response(NodeDetailSerializer(state).data)


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
    ordering_fields = ("ts", "node_name", "tenant_id", "served_model_name", "namespace", "request_group", "bytes",
                       "blocks")
    ordering = ("-ts", "node_name")
    queryset = OccupancySample.objects.all()


class MasterQuotaOverview(APIView):
    """Per tenant: the newest master read-back and the registry → master sync state."""

    @extend_schema(responses=MasterOverviewSerializer(many=True))
    def get(self, request: Request) -> Response:
        from django.db.models import Max

        newest = {row["tenant_id"]: row["ts"] for row in
                  MasterQuotaSample.objects.values("tenant_id").annotate(ts=Max("ts"))}
        samples = {s.tenant_id: s for s in MasterQuotaSample.objects.filter(ts__in=set(newest.values()))
                   if newest.get(s.tenant_id) == s.ts}
        syncs = {s.tenant_id: s for s in MasterQuotaSync.objects.all()}
        rows = [{"tenant_id": tenant_id, "master": samples.get(tenant_id), "sync": syncs.get(tenant_id)}
                for tenant_id in sorted(set(samples) | set(syncs))]
        return Response(MasterOverviewSerializer(rows, many=True).data)


class MasterQuotaSamples(TelemetryListView):
    """Master read-back series, newest first, filtered by tenant and time."""

    serializer_class = MasterQuotaSampleSerializer
    filterset_class = MasterQuotaSampleFilterSet
    ordering_fields = ("ts", "tenant_id", "charged_bytes")
    ordering = ("-ts", "tenant_id")
    queryset = MasterQuotaSample.objects.all()
