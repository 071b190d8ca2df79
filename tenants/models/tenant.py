"""Mooncake tenant: a logical object namespace of the Store with its own quota."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models, transaction

from tenants import budgets, collisions
from tenants.fields import ByteSizeField
from tenants.models.base import RegistryModel
from tenants.validators import validate_engine_user, validate_tenant_id

#: Account an instance of a tenant without its own ``engine_user`` runs as on its nodes: ``kvpool-t<tenant pk>``
#: (primary keys are never reused, so a new tenant never inherits a deleted one's account or files).
DEFAULT_ENGINE_USER = "kvpool-t{pk}"


class Tenant(RegistryModel):
    """A Mooncake tenant (master ``--enable_multi_tenants=true``; client ``tenant_id``) and its quota.

    ``tenant_id`` follows the master's rules (see ``tenants.validators.validate_tenant_id``); ``quota_bytes``
    is the requested quota in bytes, 1..2**63-1. Served models, request groups (and through the models,
    releases) belong to one tenant; the budgets of its releases and request groups may not exceed the quota.
    ``tenant_id`` cannot change once one of its releases has served: its cached objects live under that name.
    A ``tenant_id`` once given to a tenant is never given to another one, even after that tenant is deleted or
    renamed (``ReservedTenantId``).

    ``engine_user`` is the unprivileged node account the tenant's engine instances run as (``LaunchSpec.user``;
    README "Users and permissions on a node"); blank = ``kvpool-t<pk>`` (:attr:`engine_account`). Only a platform
    admin may change it (``tenants.access.PLATFORM_TENANT_FIELDS``). Two tenants never share one, not even one after
    the other (``ReservedEngineUser``): their engines could read each other's seeds and publish each other's KV
    events. Names of the control plane's and well-known system accounts are refused
    (``tenants.validators.validate_engine_user``, ``settings.KVPOOL_RESERVED_ACCOUNTS``).
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
    engine_user = models.CharField(
        max_length=32,
        blank=True,
        default="",
        validators=[validate_engine_user],
        help_text="Node account the tenant's engine instances run as (a POSIX user name); blank = kvpool-t<id>.",
    )
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["engine_user"], condition=~models.Q(engine_user=""),
                                    name="uniq_tenant_engine_user",
                                    violation_error_message="This engine_user is not available."),
        ]

    def __str__(self) -> str:
        return self.tenant_id

    @property
    def engine_account(self) -> str:
        """The account the tenant's engine instances run as: ``engine_user``, else ``kvpool-t<pk>``."""
        return self.engine_user or DEFAULT_ENGINE_USER.format(pk=self.pk)

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
            if update_fields is None or "engine_user" in update_fields:
                from tenants.models.reserved_engine_user import record_engine_user

                record_engine_user(self)

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
        if stored is None or stored.engine_user != self.engine_user:
            from tenants.models.reserved_engine_user import refuse_reserved_engine_user

            refuse_reserved_engine_user(self)
