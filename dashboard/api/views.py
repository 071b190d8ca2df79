"""Viewsets of the registry resources under ``/api/v1/``."""
from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from dashboard.api import filtersets
from dashboard.api import serializers as s
from dashboard.api.base import RegistryViewSet, drf_detail
from dashboard.api.filtersets import StrictOrderingFilter
from dashboard.api.permissions import CanHandleNodeSecret
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tenants.rendering import (
    RenderTarget,
    render_assignment,
    render_master,
    render_release,
)
from tenants.services import copy_release
from tenants.validators import parse_object_id


class TenantViewSet(RegistryViewSet):
    """Mooncake tenants and their quotas."""

    queryset = Tenant.objects.all()
    serializer_class = s.TenantSerializer
    filterset_class = filtersets.TenantFilterSet
    ordering_fields = ("tenant_id", "quota_bytes", "created_at")

    @extend_schema(responses=s.RenderedConfigSerializer)
    @action(detail=False, methods=["get"], url_path="master-config")
    def master_config(self, request):
        """The ``mooncake_master`` command line and ``tenant_quotas.yaml`` for all tenants."""
        return Response(render_master(Tenant.objects.all(), RenderTarget.from_settings()).to_dict())


class ServedModelViewSet(RegistryViewSet):
    """Served models (per tenant)."""

    queryset = ServedModel.objects.select_related("tenant")
    serializer_class = s.ServedModelSerializer
    filterset_class = filtersets.ServedModelFilterSet
    ordering_fields = ("served_model_name", "created_at")


class ReleaseViewSet(RegistryViewSet):
    """Release namespaces with their cache settings; rendered config and copies as sub-resources."""

    queryset = Release.objects.select_related("model__tenant")
    serializer_class = s.ReleaseSerializer
    filterset_class = filtersets.ReleaseFilterSet
    ordering_fields = ("namespace", "state", "created_at", "first_served_at")

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "assignment", int, description="Render only this instance assignment (returns one object)."
            )
        ],
        responses=s.ReleaseConfigSerializer,
    )
    @action(detail=True, methods=["get"])
    def config(self, request, pk=None):
        """Rendered engine configuration: every instance of the release, or ``?assignment=ID`` only."""
        release = self.get_object()
        endpoints = RenderTarget.from_settings()
        raw = request.query_params.get("assignment")
        if raw is not None:
            assignment_id = parse_object_id(raw)
            if assignment_id is None:
                raise serializers.ValidationError(
                    {"assignment": ["Must be an instance assignment id (a positive integer in ASCII digits)."]}
                )
            assignment = (
                release.assignments.select_related("node", "release__model__tenant").filter(pk=assignment_id).first()
            )
            if assignment is None:
                raise serializers.ValidationError(
                    {"assignment": [f"Instance assignment {raw} does not belong to release '{release.namespace}'."]}
                )
            return Response(render_assignment(assignment, endpoints).to_dict())
        return Response(
            {
                "release": release.pk,
                "namespace": release.namespace,
                "fingerprint": release.fingerprint,
                "instances": [config.to_dict() for config in render_release(release, endpoints)],
            }
        )

    @extend_schema(request=s.ReleaseCopySerializer, responses={201: s.ReleaseSerializer})
    @action(detail=True, methods=["post"])
    def copy(self, request, pk=None):
        """Create a new release of the same model under a new namespace with the same (or changed) settings."""
        release = self.get_object()
        data = s.ReleaseCopySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        options = dict(data.validated_data)
        try:
            new = copy_release(release, options.pop("namespace"), **options)
        except DjangoValidationError as error:
            raise serializers.ValidationError(drf_detail(error)) from None
        data = s.ReleaseSerializer(new, context=self.get_serializer_context()).data
        return Response(data, status=status.HTTP_201_CREATED)


class RequestGroupViewSet(RegistryViewSet):
    """Request groups (stable ``cache_salt`` per isolation domain)."""

    queryset = RequestGroup.objects.select_related("tenant")
    serializer_class = s.RequestGroupSerializer
    filterset_class = filtersets.RequestGroupFilterSet
    ordering_fields = ("name", "created_at")


class NodeViewSet(RegistryViewSet):
    """Nodes running agents and engine instances."""

    queryset = Node.objects.all()
    serializer_class = s.NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    ordering_fields = ("name", "created_at")

    @extend_schema(request=None, responses=s.NodeSecretSerializer)
    @action(detail=True, methods=["get", "post"],
            permission_classes=[permissions.IsAuthenticated, CanHandleNodeSecret])
    def secret(self, request, pk=None):
        """Staff only: ``GET`` returns the node's signing secret; ``POST`` (staff with ``tenants.change_node``)
        rotates it and returns the new one."""
        node = self.get_object()
        secret = node.rotate_secret() if request.method == "POST" else node.signing_secret
        response = Response({"node": node.name, "signing_secret": secret})
        response["Cache-Control"] = "no-store"
        return response


class InstanceAssignmentViewSet(RegistryViewSet):
    """Which node runs which release instance, with engine, role, ranks and ports."""

    queryset = InstanceAssignment.objects.select_related("node", "release__model__tenant")
    serializer_class = s.InstanceAssignmentSerializer
    filterset_class = filtersets.InstanceAssignmentFilterSet
    ordering_fields = ("port", "created_at")


class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log (read only, for every authenticated user)."""

    queryset = AuditEntry.objects.select_related("actor")
    filter_backends = [DjangoFilterBackend, StrictOrderingFilter]
    serializer_class = s.AuditEntrySerializer
    filterset_class = filtersets.AuditEntryFilterSet
    ordering_fields = ("timestamp",)
