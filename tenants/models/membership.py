"""Who may see and change which tenant: a user's role in one tenant (``tenants.access`` applies it)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.choices import TenantRole
from tenants.models.base import RegistryModel
from tenants.models.tenant import Tenant

#: ``<app_label>.<codename>`` of the platform admin flag (a Django permission, granted to users or groups).
PLATFORM_ADMIN_PERMISSION = "tenants.platform_admin"


class TenantMembership(RegistryModel):
    """``user`` holds ``role`` (``TenantRole``) in ``tenant``: one membership per user and tenant.

    A user who is neither a superuser nor a platform admin (the permission ``tenants.platform_admin``, declared
    here) sees only the tenants they are a member of, and may change in each only what its role grants
    (``tenants.access.ROLE_PERMISSIONS``); their model permissions granted in the Django admin do not apply to
    tenants. Memberships are managed by platform admins (Django admin, ``/api/v1/memberships/``); deleting the
    user or the tenant deletes its memberships.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=TenantRole.choices, default=TenantRole.VIEWER)

    class Meta:
        ordering = ["tenant__tenant_id", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="uniq_membership_per_user_tenant")]
        permissions = [("platform_admin", "Platform admin: sees every tenant (each write still needs its model "
                                          "permission)")]

    def __str__(self) -> str:
        user = self.user.get_username() if self.user_id is not None else "?"
        tenant = self.tenant.tenant_id if self.tenant_id is not None else "?"
        return f"{user} {self.role} of {tenant}"

    def clean(self) -> None:
        if self.user_id is not None and self.tenant_id is not None:
            self.unique_together_check(
                "user", f"User '{self.user.get_username()}' already has a role in tenant '{self.tenant}'; change "
                "that membership instead.", user_id=self.user_id, tenant_id=self.tenant_id)
