"""Mooncake tenant: a logical object namespace of the Store with its own quota."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models, transaction

from tenants import budgets, collisions
from tenants.fields import ByteSizeField
from tenants.models.base import RegistryModel
from tenants.validators import validate_tenant_id


class Tenant(RegistryModel):
    """A Mooncake tenant (master ``--enable_multi_tenants=true``; client ``tenant_id``) and its quota.

    ``tenant_id`` follows the master's rules (see ``tenants.validators.validate_tenant_id``); ``quota_bytes``
    is the requested quota in bytes, 1..2**63-1. Served models, request groups (and through the models,
    releases) belong to one tenant; the budgets of its releases and request groups may not exceed the quota.
    ``tenant_id`` cannot change once one of its releases has served: its cached objects live under that name.
    A ``tenant_id`` once given to a tenant is never given to another one, even after that tenant is deleted or
    renamed (``ReservedTenantId``).
    """

    tenant_id = models.CharField(
        max_length=255,
        unique=True,
        validators=[validate_tenant_id],
        error_messages={"unique": "A tenant with this tenant_id already exists."},
        help_text="Mooncake tenant id: non-empty, not starting with '_', no control characters.",
    )
    quota_bytes = ByteSizeField(
        help_text="Requested Mooncake quota in bytes; accepts '8MB', '200GB' (binary units B/KB/MB/GB/TB)."
    )
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["tenant_id"]

    def __str__(self) -> str:
        return self.tenant_id

    def has_served(self) -> bool:
        """True when a release of one of this tenant's models has ever served."""
        from tenants.models.release import Release

        return Release.objects.filter(model__tenant=self, first_served_at__isnull=False).exists()

    def save(self, *args, **kwargs):
        update_fields = kwargs.get("update_fields")
        with transaction.atomic():
            super().save(*args, **kwargs)
            if update_fields is None or "tenant_id" in update_fields:
                from tenants.models.reserved_tenant_id import record_tenant_id

                record_tenant_id(self)

    def clean(self) -> None:
        from tenants.models.reserved_tenant_id import refuse_reserved_tenant_id

        stored = self.stored()
        if stored is None or stored.tenant_id != self.tenant_id:
            refuse_reserved_tenant_id(self)
        if stored is not None and stored.tenant_id != self.tenant_id and stored.has_served():
            raise ValidationError(
                {
                    "tenant_id": f"tenant_id cannot change from '{stored.tenant_id}': releases of this tenant have "
                    "served and their cached objects live under that Mooncake tenant. Create a new tenant instead."
                }
            )
        if stored is not None and stored.tenant_id != self.tenant_id and self.tenant_id:
            collisions.check_tenant_reserved_namespaces(self)
        if stored is not None and isinstance(self.quota_bytes, int):
            budgets.check_quota(self)
