"""Who may write the registry through the API: Django model permissions; reads stay open to every user.

A write needs the model permission of its HTTP method — ``POST`` ``tenants.add_<model>``, ``PUT``/``PATCH``
``tenants.change_<model>``, ``DELETE`` ``tenants.delete_<model>`` — granted per user or group in the Django
admin; superusers have every permission. ``GET``/``HEAD``/``OPTIONS`` need only an authenticated user. The
dashboard pages (``dashboard.views.base.permission_denied``) apply the same permissions to their forms.
"""
from __future__ import annotations

from rest_framework.permissions import (
    SAFE_METHODS,
    BasePermission,
    DjangoModelPermissions,
)


class RegistryModelPermissions(DjangoModelPermissions):
    """DRF's ``DjangoModelPermissions`` whose 403 names the missing permissions.

    Custom actions follow their method: ``POST releases/{id}/copy/`` needs ``tenants.add_release``.
    """

    def has_permission(self, request, view) -> bool:
        if super().has_permission(request, view):
            return True
        user = request.user
        if user and user.is_authenticated:
            model = self._queryset(view).model
            missing = [perm for perm in self.get_required_permissions(request.method, model)
                       if not user.has_perm(perm)]
            self.message = (f"{request.method} on {model._meta.verbose_name_plural} needs the permission "
                            f"{', '.join(missing)}; ask an administrator to grant it (Django admin: users or groups).")
        return False


class CanPushNodeConfig(BasePermission):
    """``POST telemetry/nodes/<name>/push/`` sends configuration to a node's agent: it needs ``tenants.change_node``.

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
    """``nodes/{id}/secret/``: reading a node's signing secret needs a staff user; rotating it (``POST``) needs a
    staff user with ``tenants.change_node`` too, since a rotation cuts the node's agent off (the messages and
    documents signed with one secret fail the other's check) until it restarts with the new secret.

    Pair it with ``IsAuthenticated``; the 403 says which of the two is missing.
    """

    permission = "tenants.change_node"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user.is_staff:
            self.message = "a node's signing secret is only for staff users."
            return False
        if request.method in SAFE_METHODS or user.has_perm(self.permission):
            return True
        self.message = (f"rotating a node's signing secret needs the permission {self.permission} (the agent is cut "
                        "off until it restarts with the new secret); ask an administrator to grant it (Django admin: "
                        "users or groups).")
        return False
