"""Django admin for every registry model. Validation is the models' ``clean()``: same rules as the API."""
from __future__ import annotations

from django.contrib import admin

from tenants import budgets
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ReservedEngineUser,
    ReservedNamespace,
    ReservedSalt,
    ReservedTenantId,
    ServedModel,
    Tenant,
    TenantMembership,
)  # fmt: skip
from tenants.quota import format_quota


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("tenant_id", "quota", "budgeted", "created_at")
    search_fields = ("tenant_id", "description")
    readonly_fields = ("created_at", "updated_at")

    @admin.display(description="quota", ordering="quota_bytes")
    def quota(self, obj: Tenant) -> str:
        return format_quota(obj.quota_bytes)

    @admin.display(description="budgeted bytes")
    def budgeted(self, obj: Tenant) -> int:
        return budgets.budgeted_bytes(obj)


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ("served_model_name", "tenant", "model_path", "vllm_model_name")
    list_filter = ("tenant",)
    search_fields = ("served_model_name", "model_path", "vllm_model_name")
    readonly_fields = ("vllm_model_name", "created_at", "updated_at")


@admin.register(Release)
class ReleaseAdmin(admin.ModelAdmin):
    list_display = ("namespace", "model", "state", "engine", "engine_version", "short_fingerprint", "first_served_at")
    list_filter = ("state", "engine", "hash_algo", "model__tenant")
    search_fields = ("namespace", "model__served_model_name", "fingerprint")
    readonly_fields = ("fingerprint", "first_served_at", "created_at", "updated_at")

    @admin.display(description="fingerprint")
    def short_fingerprint(self, obj: Release) -> str:
        return obj.fingerprint[:12]

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.has_served:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(RequestGroup)
class RequestGroupAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "cache_salt", "budget_bytes")
    list_filter = ("tenant",)
    search_fields = ("name", "cache_salt")
    readonly_fields = ("created_at", "updated_at")

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "tenant", "cache_salt") if obj is not None else fields


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "device", "store_mode", "kv_events_port", "queue_name", "created_at")
    list_filter = ("device", "store_mode")
    search_fields = ("name", "hostname")
    readonly_fields = ("queue_name", "created_at", "updated_at")

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "name") if obj is not None else fields


@admin.register(InstanceAssignment)
class InstanceAssignmentAdmin(admin.ModelAdmin):
    list_display = ("release", "node", "engine", "role", "tp_rank", "tp_size", "pp_rank", "pp_size", "port")
    list_filter = ("engine", "role", "node")
    search_fields = ("release__namespace", "node__name")
    readonly_fields = ("created_at", "updated_at")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Admin pages that show rows and never add, change or delete them (append-only records)."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("timestamp", "actor_repr", "action", "object_type", "object_repr", "request_id")
    list_filter = ("action", "object_type")
    search_fields = ("object_repr", "object_id", "actor_repr", "request_id")


@admin.register(ReservedSalt)
class ReservedSaltAdmin(ReadOnlyAdmin):
    """Salts of deleted request groups: read only, never deleted (deleting one would allow its reuse)."""

    list_display = ("cache_salt", "group_name", "tenant_id", "created_at")
    search_fields = ("cache_salt", "group_name", "tenant_id")


@admin.register(ReservedNamespace)
class ReservedNamespaceAdmin(ReadOnlyAdmin):
    """Namespaces of deleted or renamed releases: read only, never deleted (deleting one would allow its reuse
    while the old release's keys may still be in the Store)."""

    list_display = ("namespace", "served_model_name", "tenant_id", "reason", "release_state", "purge_id", "created_at")
    list_filter = ("reason", "release_state")
    search_fields = ("namespace", "served_model_name", "vllm_model_name", "tenant_id")


@admin.register(ReservedTenantId)
class ReservedTenantIdAdmin(ReadOnlyAdmin):
    """Every tenant_id ever given to a tenant: read only, never deleted (deleting one would let another tenant take
    the id and see what the old tenant left under it)."""

    list_display = ("tenant_id", "tenant_pk", "created_at")
    search_fields = ("tenant_id",)


@admin.register(ReservedEngineUser)
class ReservedEngineUserAdmin(ReadOnlyAdmin):
    """Every engine_user ever given to a tenant: read only, never deleted (deleting one would let another tenant's
    engines run as the account the old tenant's engines and files still use)."""

    list_display = ("engine_user", "tenant_pk", "created_at")
    search_fields = ("engine_user",)


@admin.register(TenantMembership)
class TenantMembershipAdmin(admin.ModelAdmin):
    """Who holds which role in which tenant (``tenants.access``); the platform admin flag itself is the permission
    "Platform admin" (``tenants.platform_admin``) on the user or group pages."""

    list_display = ("user", "tenant", "role", "created_at")
    list_filter = ("role", "tenant")
    search_fields = ("user__username", "tenant__tenant_id")
    autocomplete_fields = ("user",)
    readonly_fields = ("created_at", "updated_at")
