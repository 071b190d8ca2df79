"""Viewsets of the registry resources under ``/api/v1/``."""
from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from dashboard.api import filtersets
from dashboard.api import serializers as s
from dashboard.api.base import Conflict, ObjectIdLookupMixin, RegistryViewSet, TenantScopedMixin, drf_detail
from dashboard.api.filtersets import BoundedSearchFilter, StrictOrderingFilter
from dashboard.api.permissions import CanHandleNodeSecret, IsPlatformAdmin, RegistryModelPermissions
from tenants.access import platform_fields_changed
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ReservedNamespace,
    ServedModel,
    Tenant,
    TenantMembership,
)
from tenants.models.reserved_namespace import delete_consequences
from tenants.rendering import (
    RenderTarget,
    render_assignment,
    render_masters,
    render_release,
)
from tenants.services import copy_release
from tenants.validators import parse_object_id


class TenantViewSet(RegistryViewSet):
    """Mooncake tenants and their quotas."""

    queryset = Tenant.objects.all()
    serializer_class = s.TenantSerializer
    filterset_class = filtersets.TenantFilterSet
    search_fields = ("tenant_id", "description")
    ordering_fields = ("tenant_id", "quota_bytes", "created_at")
    ordering = ("tenant_id",)

    def perform_update(self, serializer):
        changed = platform_fields_changed(self.request.user, serializer.instance, serializer.validated_data)
        if changed:
            raise exceptions.PermissionDenied(
                f"changing a tenant's {' or '.join(changed)} is a platform admin's action (tenant_id names the "
                "tenant's objects in the Store, the quota is a share of the pool every tenant draws on, engine_user "
                "is the node account its engines run as); a tenant admin may change its description.")
        super().perform_update(serializer)

    @extend_schema(parameters=[s.QuotaPlanRequestSerializer], responses=s.QuotaPlanSerializer)
    @action(detail=False, methods=["get"], url_path="quota-plan",
            permission_classes=[permissions.IsAuthenticated, IsPlatformAdmin])
    def quota_plan(self, request):
        """What saving a tenant would do to every tenant's effective quota, before it is saved: ``?tenant_id=
        &quota_bytes=`` (and ``id=`` for an existing tenant); without parameters, the pool as it is. The mounted
        capacity is read from the master now; when it is unknown the plan says so (``capacity_bytes`` null).
        Platform admins only: the plan lists every tenant."""
        from dashboard.master.capacity import plan_tenant_change

        params = {name: value for name, value in request.query_params.items() if value != ""}
        if not params:
            return Response(plan_tenant_change(None).as_dict())
        data = s.QuotaPlanRequestSerializer(data=params)
        data.is_valid(raise_exception=True)
        stored = None
        if "id" in data.validated_data:
            stored = Tenant.objects.filter(pk=data.validated_data["id"]).first()
            if stored is None:
                raise serializers.ValidationError({"id": [f"No tenant has the id {data.validated_data['id']}."]})
        tenant = Tenant(pk=stored.pk if stored else None, tenant_id=data.validated_data["tenant_id"],
                        quota_bytes=data.validated_data["quota_bytes"])
        return Response(plan_tenant_change(tenant, stored=stored).as_dict())

    @extend_schema(responses=s.RenderedConfigSerializer, parameters=[OpenApiParameter(
        "master", int, description="HA mode: which master of the set to render (0-based, default 0; the answer's "
        "`masters` says how many there are).")])
    @action(detail=False, methods=["get"], url_path="master-config",
            permission_classes=[permissions.IsAuthenticated, IsPlatformAdmin])
    def master_config(self, request):
        """The ``mooncake_master`` command line and ``tenant_quotas.yaml`` for all tenants (platform admins only);
        in HA mode the one of master ``?master=`` (default 0)."""
        configs = render_masters(Tenant.objects.all(), RenderTarget.from_settings())
        raw = request.query_params.get("master", "0")
        index = int(raw) if raw.isascii() and raw.isdecimal() else -1
        if not 0 <= index < len(configs):
            raise serializers.ValidationError({"master": [
                f"Must be a master index from 0 to {len(configs) - 1}."]})
        return Response(configs[index].to_dict())


class ServedModelViewSet(RegistryViewSet):
    """Served models (per tenant)."""

    queryset = ServedModel.objects.select_related("tenant")
    serializer_class = s.ServedModelSerializer
    filterset_class = filtersets.ServedModelFilterSet
    search_fields = ("served_model_name", "vllm_model_name", "tenant__tenant_id")
    ordering_fields = ("served_model_name", "tenant__tenant_id", "created_at")
    ordering = ("tenant__tenant_id", "served_model_name")


class ReleaseViewSet(RegistryViewSet):
    """Release namespaces with their cache settings; rendered config and copies as sub-resources."""

    queryset = Release.objects.select_related("model__tenant")
    serializer_class = s.ReleaseSerializer
    filterset_class = filtersets.ReleaseFilterSet
    search_fields = ("namespace", "model__served_model_name", "model__tenant__tenant_id", "=fingerprint")
    ordering_fields = ("namespace", "state", "model__served_model_name", "model__tenant__tenant_id", "created_at",
                       "first_served_at")
    ordering = ("model__tenant__tenant_id", "model__served_model_name", "namespace")

    @extend_schema(parameters=[OpenApiParameter(
        "confirm_namespace", str, description="The release's namespace, typed again: confirms that the namespace "
        "is reserved for good and its keys purged. Without it the delete answers 409 saying what it would do.")])
    def destroy(self, request, *args, **kwargs):
        """Delete a release that never served and has no instances: only with ``confirm_namespace`` (409 without
        it); its namespace stays reserved for good (``tenants.models.ReservedNamespace``) and the tenant's agents
        are asked to purge its keys after the commit. A served release, or one with instances, answers 409 with
        the reason."""
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance):
        if instance.has_served or instance.assignments.exists():
            return super().perform_destroy(instance)  # refused: 409 with the reason (served / instances left)
        confirm = self.request.query_params.get("confirm_namespace")
        if confirm is None and isinstance(self.request.data, dict):
            confirm = self.request.data.get("confirm_namespace")
        if confirm in (None, ""):
            raise Conflict(f"{delete_consequences(instance)} Repeat the request with "
                           f"confirm_namespace={instance.namespace} to delete it, or retire the release instead "
                           "(a retired release keeps its namespace and can be purged from its page).")
        if confirm != instance.namespace:
            raise serializers.ValidationError({"confirm_namespace": [
                f"Must be the release namespace '{instance.namespace}' to confirm the delete."]})
        return super().perform_destroy(instance)

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
        raw = request.query_params.get("assignment", "")
        if raw != "":  # blank is absent, as for every query parameter (dashboard.api.params)
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
    search_fields = ("name", "tenant__tenant_id", "=cache_salt")
    ordering_fields = ("name", "tenant__tenant_id", "created_at")
    ordering = ("tenant__tenant_id", "name")


class NodeViewSet(RegistryViewSet):
    """Nodes running agents and engine instances."""

    queryset = Node.objects.all()
    serializer_class = s.NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    search_fields = ("name", "hostname")
    ordering_fields = ("name", "hostname", "created_at")
    ordering = ("name",)

    @extend_schema(request=None, responses=s.NodeSecretSerializer)
    @action(detail=True, methods=["get", "post"],
            permission_classes=[permissions.IsAuthenticated, CanHandleNodeSecret])
    def secret(self, request, pk=None):
        """Staff platform admins only: ``GET`` returns the node's signing secret; ``POST`` (with
        ``tenants.change_node``) rotates it and returns the new one."""
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
    search_fields = ("node__name", "release__namespace", "release__model__served_model_name",
                     "release__model__tenant__tenant_id")
    ordering_fields = ("port", "node__name", "release__namespace", "role", "created_at")
    ordering = ("node__name", "port")


class ReservedNamespaceViewSet(TenantScopedMixin, ObjectIdLookupMixin, viewsets.ReadOnlyModelViewSet):
    """Namespaces of deleted or renamed releases, reserved for good (read only): no release of the same model key
    in the tenant may use one again. Scoped to the user's tenants (by tenant name)."""

    queryset = ReservedNamespace.objects.all()
    filter_backends = [BoundedSearchFilter, StrictOrderingFilter]
    serializer_class = s.ReservedNamespaceSerializer
    search_fields = ("namespace", "served_model_name", "tenant_id")
    ordering_fields = ("created_at", "namespace", "tenant_id")
    ordering = ("tenant_id", "served_model_name", "namespace")


class AuditEntryViewSet(TenantScopedMixin, ObjectIdLookupMixin, viewsets.ReadOnlyModelViewSet):
    """The audit log (read only): a platform admin sees every entry, anyone else the entries about their tenants
    (``AuditEntry.tenant_pk``)."""

    queryset = AuditEntry.objects.select_related("actor")
    filter_backends = [DjangoFilterBackend, BoundedSearchFilter, StrictOrderingFilter]
    serializer_class = s.AuditEntrySerializer
    filterset_class = filtersets.AuditEntryFilterSet
    search_fields = ("object_repr", "actor_repr", "object_type")
    ordering_fields = ("timestamp",)
    ordering = ("-timestamp",)


class TenantMembershipViewSet(RegistryViewSet):
    """Who holds which role in which tenant (``tenants.models.TenantMembership``). Platform admins only; writes
    need ``tenants.add/change/delete_tenantmembership`` too."""

    queryset = TenantMembership.objects.select_related("user", "tenant")
    serializer_class = s.TenantMembershipSerializer
    filterset_class = filtersets.TenantMembershipFilterSet
    permission_classes = [permissions.IsAuthenticated, IsPlatformAdmin, RegistryModelPermissions]
    search_fields = ("user__username", "tenant__tenant_id")
    ordering_fields = ("created_at", "role", "user__username", "tenant__tenant_id")
    ordering = ("tenant__tenant_id", "user__username")
