"""Reserved tenant id: every Mooncake ``tenant_id`` the registry ever gave a tenant, so no other tenant gets it."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

#: Why a ``tenant_id`` once held by another tenant (deleted, or renamed away from it) is refused.
TENANT_ID_RESERVED = (
    "tenant_id '{tenant_id}' belonged to a tenant that was deleted or renamed. The Mooncake Store keys objects by "
    "tenant_id, and the registry keeps that tenant's reserved namespaces, reserved salts and telemetry under it, so "
    "a new tenant with this id would see them. Tenant ids stay reserved forever: choose another tenant_id."
)


class ReservedTenantId(models.Model):
    """A ``tenant_id`` given to the tenant with primary key ``tenant_pk``, for good.

    Mooncake 0.3.13.post1 keeps a tenant's objects, quota and policy under the ``tenant_id`` string (a writer
    under a reused id reads and charges the old objects), and the registry keys rows that outlive the tenant by
    the same string: ``ReservedNamespace``, ``ReservedSalt``, the dashboard's occupancy, engine facts and master
    quota rows. So a ``tenant_id`` is never given to a second tenant: ``Tenant.save`` records every id a tenant
    takes (on create and on each rename, in the same transaction; the unique constraint settles races) and
    ``Tenant.clean`` refuses an id recorded for another tenant with ``TENANT_ID_RESERVED`` (HTTP 400 on
    ``tenant_id``). A tenant may take back an id it held before. ``tenant_pk`` is ``None`` for ids migration
    ``0011`` found only in rows a deleted tenant left (reserved namespaces and salts, master quota syncs): no tenant
    may take those. Rows are never deleted; the tenant's own audit entries record each id it held, so these rows
    are not audited separately.
    """

    tenant_id = models.CharField(max_length=255, unique=True)
    tenant_pk = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Primary key of the tenant that holds or held the id (None: not known).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant_id"]
        verbose_name = "reserved tenant id"

    def __str__(self) -> str:
        return f"{self.tenant_id} (tenant #{self.tenant_pk})" if self.tenant_pk is not None else self.tenant_id


def refuse_reserved_tenant_id(tenant) -> None:
    """Raise ``ValidationError`` on ``tenant_id`` when ``tenant`` (saved or not) would take an id recorded for
    another tenant (or for an unknown one); an id a live tenant holds now is left to the unique check."""
    from tenants.models.tenant import Tenant

    if not tenant.tenant_id or "\x00" in tenant.tenant_id:  # no id, or one the field's validators refuse (PostgreSQL
        return                                           # cannot even compare a NUL)
    if Tenant._base_manager.filter(tenant_id=tenant.tenant_id).exclude(pk=tenant.pk).exists():
        return
    row = ReservedTenantId.objects.filter(tenant_id=tenant.tenant_id).first()
    if row is not None and (tenant.pk is None or row.tenant_pk != tenant.pk):
        raise ValidationError({"tenant_id": TENANT_ID_RESERVED.format(tenant_id=tenant.tenant_id)}, code="reserved")


def record_tenant_id(tenant) -> None:
    """Record ``tenant.tenant_id`` (a saved tenant) as given to it; called by ``Tenant.save`` in its transaction.

    Raises ``ValidationError`` on ``tenant_id`` when the id is recorded for another tenant (a write that skipped
    ``full_clean``, or lost a race to it), which rolls the save back.
    """
    row, _created = ReservedTenantId.objects.get_or_create(tenant_id=tenant.tenant_id,
                                                           defaults={"tenant_pk": tenant.pk})
    if row.tenant_pk != tenant.pk:
        raise ValidationError({"tenant_id": TENANT_ID_RESERVED.format(tenant_id=tenant.tenant_id)}, code="reserved")
