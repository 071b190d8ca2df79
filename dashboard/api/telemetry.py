"""Read-mostly REST API of delivery and telemetry: node drift, config versions, occupancy, master quotas.

Routes (``dashboard/api/telemetry_urls.py``, under ``/api/v1/telemetry/``):
  ``nodes/``                    node states with drift flags; ``?drift=behind|silent|digest_mismatch|rejected|
                                out_of_sync`` filters
  ``nodes/<name>/``             one node: state, drift, newest document (signature not included), last 20 acks
  ``nodes/<name>/push/``        POST: render and send the node's document now (``{"force": true}`` re-sends)
  ``occupancy/``                samples; ``?tenant_id= &namespace= &node= &level=raw|minute|hour
                                &since= &until=`` (ISO-8601), newest first
  ``master/``                   per tenant: newest master read-back and the sync state (409 errors included)
  ``master/samples/``           master read-back series; ``?tenant_id= &since= &until=``
"""
from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.shortcuts import get_object_or_404
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

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

DRIFT_FILTERS = ("behind", "silent", "digest_mismatch", "rejected", "out_of_sync")
LEVELS = {"raw": OccupancySample.Level.RAW, "minute": OccupancySample.Level.MINUTE,
          "hour": OccupancySample.Level.HOUR}


def _time_param(request: Request, name: str):
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    value = parse_datetime(raw)
    if value is None:
        raise ValidationError({name: f"'{raw}' is not an ISO-8601 date-time (e.g. 2026-11-30T12:00:00Z)."})
    return value


def node_states():
    """``NodeState`` rows annotated with ``last_report_at`` (the newest report receipt of the node)."""
    newest = Report.objects.filter(node_name=OuterRef("node_name")).order_by("-sequence").values("sent_at")[:1]
    return NodeState.objects.annotate(last_report_at=Subquery(newest))


class NodeStateSerializer(serializers.ModelSerializer):
    """A node's delivery state, the time of its newest report, and its drift flags (``dashboard.push.drift``)."""

    drift = serializers.SerializerMethodField()
    last_report_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = NodeState
        exclude = ["id"]

    def get_drift(self, state: NodeState) -> dict:
        from dashboard.push import drift

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


class NodeStateList(generics.ListAPIView):
    """Nodes with desired vs acked version, heartbeat age and drift flags."""

    serializer_class = NodeStateSerializer

    def get_queryset(self):
        return node_states()

    def list(self, request: Request, *args, **kwargs) -> Response:
        wanted = request.query_params.get("drift")
        if wanted and wanted not in DRIFT_FILTERS:
            raise ValidationError({"drift": f"'{wanted}' is not one of {', '.join(DRIFT_FILTERS)}."})
        if not wanted:
            return super().list(request, *args, **kwargs)
        from dashboard.push import drift

        states = []
        for state in self.get_queryset():
            flags = drift(state)
            if (not flags["in_sync"]) if wanted == "out_of_sync" else flags[wanted]:
                states.append(state)
        page = self.paginate_queryset(states)
        data = self.get_serializer(page if page is not None else states, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)


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
        from dashboard.push import push_nodes
        from tenants.models import Node

        get_object_or_404(Node, name=name)
        body = PushRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(PushResultSerializer(push_nodes([name], force=body.validated_data["force"])).data)


class OccupancyList(generics.ListAPIView):
    """Occupancy samples, newest first, filtered by tenant, namespace, node, level and time."""

    serializer_class = OccupancySampleSerializer

    def get_queryset(self):
        params = self.request.query_params
        level_name = params.get("level", "raw")
        if level_name not in LEVELS:
            raise ValidationError({"level": f"'{level_name}' is not one of raw, minute, hour."})
        queryset = OccupancySample.objects.filter(level=LEVELS[level_name])
        for param, field in (("tenant_id", "tenant_id"), ("namespace", "namespace"), ("node", "node_name"),
                             ("served_model_name", "served_model_name"), ("salt_group", "salt_group")):
            if params.get(param) not in (None, ""):
                queryset = queryset.filter(**{field: params[param]})
        since, until = _time_param(self.request, "since"), _time_param(self.request, "until")
        if since:
            queryset = queryset.filter(ts__gte=since)
        if until:
            queryset = queryset.filter(ts__lt=until)
        return queryset.order_by("-ts", "node_name")


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


class MasterQuotaSamples(generics.ListAPIView):
    """Master read-back series, newest first."""

    serializer_class = MasterQuotaSampleSerializer

    def get_queryset(self):
        queryset = MasterQuotaSample.objects.all()
        tenant_id = self.request.query_params.get("tenant_id")
        if tenant_id:
            queryset = queryset.filter(tenant_id=tenant_id)
        since, until = _time_param(self.request, "since"), _time_param(self.request, "until")
        if since:
            queryset = queryset.filter(ts__gte=since)
        if until:
            queryset = queryset.filter(ts__lt=until)
        return queryset.order_by("-ts", "tenant_id")
