"""Who may write the registry through the API: Django model permissions under the tenant rules of
``tenants.access``; reads are scoped by the viewsets (``tenants.access.scope``).

A write needs the model permission of its HTTP method — ``POST`` ``tenants.add_<model>``, ``PUT``/``PATCH``
``tenants.change_<model>``, ``DELETE`` ``tenants.delete_<model>``. A platform admin needs it granted in the Django
admin (users or groups; superusers have every permission); any other user needs a role in the object's tenant
that grants it (``tenants.access.ROLE_PERMISSIONS``): checked on the stored object, and for a create or a change on
the object as it would be saved. ``GET``/``HEAD``/``OPTIONS`` need only an authenticated user and see only the
rows of the user's tenants. The dashboard pages (``dashboard.views.base.permission_denied``) apply the same rules.
"""
from __future__ import annotations

from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import (
    SAFE_METHODS,
    BasePermission,
    DjangoModelPermissions,
)

from tenants.access import is_platform_admin, tenant_pk_of

_WHERE = "ask an administrator to grant it (a role in the tenant, or for a platform admin the Django admin)."


def missing_message(method: str, model, missing: list[str], obj=None) -> str:
    """The 403 message of a refused write: which permissions are missing, and in which tenant."""
    where = ""
    if obj is not None:
        tenant_pk = tenant_pk_of(obj)
        tenant = _tenant_name(tenant_pk) if tenant_pk is not None else None
        where = f" in tenant '{tenant}'" if tenant else " (a platform admin's action)"
    return (f"{method} on {model._meta.verbose_name_plural} needs the permission {', '.join(missing)}{where}; "
            + _WHERE)


def _tenant_name(tenant_pk: int) -> str | None:
    from tenants.models import Tenant

    return Tenant.objects.filter(pk=tenant_pk).values_list("tenant_id", flat=True).first()


def check_object_write(request, model, obj, method: str | None = None) -> None:
    """Raise ``PermissionDenied`` (HTTP 403 naming the permissions and the tenant) unless the user may make the
    write of ``method`` (default: the request's) on ``obj`` — a stored object, or one about to be saved."""
    method = method or request.method
    perms = RegistryModelPermissions().get_required_permissions(method, model)
    missing = [perm for perm in perms if not request.user.has_perm(perm, obj)]
    if missing:
        raise PermissionDenied(missing_message(method, model, missing, obj))


class RegistryModelPermissions(DjangoModelPermissions):
    """DRF's ``DjangoModelPermissions`` under the tenant rules, whose 403 names the missing permissions.

    ``has_permission`` asks whether the user may make the write in some tenant (a platform admin: at all);
    ``has_object_permission`` whether in the object's tenant. Creates and changes are checked once more on the
    object as it would be saved (``check_object_write``, called by ``RegistryViewSet``), so nothing moves into a
    tenant the user may not write. Custom actions follow their method: ``POST releases/{id}/copy/`` needs
    ``tenants.add_release`` in the release's tenant.
    """

    def has_permission(self, request, view) -> bool:
        if super().has_permission(request, view):
            return True
        user = request.user
        if user and user.is_authenticated:
            model = self._queryset(view).model
            missing = [perm for perm in self.get_required_permissions(request.method, model)
                       if not user.has_perm(perm)]
            self.message = missing_message(request.method, model, missing)
        return False

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in SAFE_METHODS:
            return True
        missing = [perm for perm in self.get_required_permissions(request.method, type(obj))
                   if not request.user.has_perm(perm, obj)]
        if missing:
            self.message = missing_message(request.method, type(obj), missing, obj)
            return False
        return True


class CanPushNodeConfig(BasePermission):
    """``POST telemetry/nodes/<name>/push/`` sends configuration to a node's agent: it needs ``tenants.change_node``
    (a platform admin's permission: no tenant role grants it).

    Reads (``GET``/``HEAD``/``OPTIONS``) pass; pair it with ``IsAuthenticated``.
    """

    permission = "tenants.change_node"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS or request.user.has_perm(self.permission):
            return True
        self.message = (f"pushing a node's configuration needs the permission {self.permission}; ask an "
                        "administrator to grant it (Django admin: users or groups).")
        return False


class CanHandleNodeSecret(BasePermission):
    """``nodes/{id}/secret/``: reading a node's signing secret needs a staff user who is a platform admin
    (``tenants.access.is_platform_admin``); rotating it (``POST``) needs ``tenants.change_node`` too, since a
    rotation cuts the node's agent off (the messages and documents signed with one secret fail the other's check)
    until it restarts with the new secret.

    Pair it with ``IsAuthenticated``; the 403 says what is missing.
    """

    permission = "tenants.change_node"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user.is_staff or not is_platform_admin(user):
            self.message = "a node's signing secret is only for staff users who are platform admins."
            return False
        if request.method in SAFE_METHODS or user.has_perm(self.permission):
            return True
        self.message = (f"rotating a node's signing secret needs the permission {self.permission} (the agent is cut "
                        "off until it restarts with the new secret); ask an administrator to grant it (Django admin: "
                        "users or groups).")
        return False


class IsPlatformAdmin(BasePermission):
    """Platform admins only (``tenants.access.is_platform_admin``): views whose answer spans every tenant (the
    master configuration, the quota plan) or manages access (memberships). Pair it with ``IsAuthenticated``."""

    message = "this is for platform admins only (a superuser, or a user holding tenants.platform_admin)."

    def has_permission(self, request, view) -> bool:
        return is_platform_admin(request.user)
