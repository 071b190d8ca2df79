"""Reserved engine user: every node account name the registry ever gave a tenant as its ``engine_user``, so no other
tenant gets it."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

#: Why an ``engine_user`` held or once held by another tenant is refused; it names nothing of that tenant.
ENGINE_USER_NOT_AVAILABLE = "engine_user '{name}' is not available."


class ReservedEngineUser(models.Model):
    """An ``engine_user`` given to the tenant with primary key ``tenant_pk``, for good.

    A tenant's engines run as its engine account on every node (``LaunchSpec.user``; README "Users and permissions
    on a node"). When a tenant moves to another account its engines go on running as the old one until each node
    applies the new document and the engines restart, and files the old account made stay its own: a second tenant
    given that name would share a uid with them (signals, ``/proc/<pid>/environ``, instance files). So a name is
    never given to a second tenant: ``Tenant.save`` records every ``engine_user`` a tenant takes (on create and on
    each change, in the same transaction; the unique constraint settles races) and ``Tenant.clean`` refuses a name
    recorded for another tenant with ``ENGINE_USER_NOT_AVAILABLE`` (HTTP 400 on ``engine_user``). A tenant may take
    back a name it held before. ``tenant_pk`` is ``None`` for names migration ``0014`` found only in the audit log of
    a deleted tenant it could not tell: no tenant may take those. Rows are never deleted; the tenant's own audit
    entries record each name it held.
    """

    engine_user = models.CharField(max_length=32, unique=True)
    tenant_pk = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Primary key of the tenant that holds or held the name (None: not known).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["engine_user"]
        verbose_name = "reserved engine user"

    def __str__(self) -> str:
        return f"{self.engine_user} (tenant #{self.tenant_pk})" if self.tenant_pk is not None else self.engine_user


def refuse_reserved_engine_user(tenant) -> None:
    """Raise ``ValidationError`` on ``engine_user`` when ``tenant`` (saved or not) would take a name held now by
    another tenant or recorded for one (or for an unknown one). Blank names and names the field's validators refuse
    are left alone."""
    from tenants.models.tenant import Tenant

    name = tenant.engine_user
    if not name or "\x00" in name:
        return
    others = Tenant._base_manager.filter(engine_user=name)
    held = (others.exclude(pk=tenant.pk) if tenant.pk is not None else others).exists()
    row = ReservedEngineUser.objects.filter(engine_user=name).first()
    if held or (row is not None and (tenant.pk is None or row.tenant_pk != tenant.pk)):
        raise ValidationError({"engine_user": ENGINE_USER_NOT_AVAILABLE.format(name=name)}, code="reserved")


def record_engine_user(tenant) -> None:
    """Record ``tenant.engine_user`` (a saved tenant; nothing when blank) as given to it; called by ``Tenant.save``
    in its transaction.

    Raises ``ValidationError`` on ``engine_user`` when the name is recorded for another tenant (a write that skipped
    ``full_clean``, or lost a race to it), which rolls the save back.
    """
    if not tenant.engine_user:
        return
    row, _created = ReservedEngineUser.objects.get_or_create(engine_user=tenant.engine_user,
                                                             defaults={"tenant_pk": tenant.pk})
    if row.tenant_pk != tenant.pk:
        raise ValidationError({"engine_user": ENGINE_USER_NOT_AVAILABLE.format(name=tenant.engine_user)},
                              code="reserved")
