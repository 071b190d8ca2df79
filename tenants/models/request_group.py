"""Request group: one isolation domain of requests that share a stable vLLM ``cache_salt``."""
from __future__ import annotations

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from tenants import budgets
from tenants.fields import ByteSizeField
from tenants.models.base import RegistryModel
from tenants.models.tenant import Tenant
from tenants.validators import validate_dns_label, validate_no_whitespace

#: Why a salt held by another tenant (a live group or a deleted one's reservation) is refused: the message names
#: nothing outside the caller's tenant, and is the same whether the other group exists or was deleted.
SALT_NOT_AVAILABLE = "This cache_salt is not available; omit cache_salt to get a fresh one."


def generate_cache_salt() -> str:
    """A fresh, unguessable salt (32 lower-case hex characters)."""
    return secrets.token_hex(16)


class RequestGroup(RegistryModel):
    """A group of requests that may reuse each other's cached prefixes (vLLM 0.33.0 request ``cache_salt``).

    vLLM puts the salt into the first block hash, so every later block hash differs between salts. The salt is
    generated once when the group is created without one and never changes afterwards; an explicitly empty
    salt means the default shared cache (one such group per tenant). Non-empty salts are unique. ``budget_bytes``
    (optional) is the group's share of the tenant quota. A tenant has at most ``KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT``
    groups (each is in the config document of every node running one of its instances).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="request_groups")
    name = models.CharField(max_length=63, validators=[validate_dns_label])
    cache_salt = models.CharField(
        max_length=128,
        blank=True,
        default=generate_cache_salt,
        validators=[validate_no_whitespace],
        help_text="Generated when omitted; empty means the default shared cache. Never changes.",
    )
    budget_bytes = ByteSizeField(null=True, blank=True, help_text="Share of the tenant quota, in bytes.")
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["tenant__tenant_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="uniq_request_group_name_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "cache_salt"], name="uniq_request_group_salt_per_tenant"),
            models.UniqueConstraint(
                fields=["cache_salt"], condition=~Q(cache_salt=""), name="uniq_nonempty_cache_salt"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.tenant_id is None:
            return
        stored = self.stored()
        if stored is not None:
            errors = {}
            if stored.cache_salt != self.cache_salt:
                errors["cache_salt"] = (
                    "cache_salt is stable once the group exists: changing it would split the group's cached "
                    "prefixes. Create a new request group instead."
                )
            if stored.tenant_id != self.tenant_id:
                errors["tenant"] = "A request group cannot move to another tenant; create one in that tenant."
            if errors:
                raise ValidationError(errors)
        if self.name:
            self.unique_together_check(
                "name",
                f"Tenant '{self.tenant}' already has a request group named '{self.name}'.",
                tenant_id=self.tenant_id,
                name=self.name,
            )
        if self.cache_salt == "":
            self.unique_together_check(
                "cache_salt",
                f"Tenant '{self.tenant}' already has the default shared group (empty cache_salt); "
                "there is only one default shared cache per tenant.",
                tenant_id=self.tenant_id,
                cache_salt="",
            )
        elif self.cache_salt is not None:
            if stored is None or stored.cache_salt != self.cache_salt:
                self._refuse_reserved_salt()
            self._refuse_used_salt()
        if stored is None:
            self._refuse_over_cap()
        budgets.check_budget(self, self.tenant)

    def _refuse_over_cap(self) -> None:
        """Raise ``ValidationError`` on ``tenant`` when the tenant already has ``KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT``
        groups: every instance of the tenant carries all of them in the config document of its node, which the
        node's other tenants' instances share."""
        cap = settings.KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT
        if RequestGroup._base_manager.filter(tenant_id=self.tenant_id).count() >= cap:
            raise ValidationError(
                {"tenant": f"Tenant '{self.tenant}' already has {cap} request groups, the most one tenant may have "
                           "(KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT). Delete one first."},
                code="max_count",
            )

    def _refuse_reserved_salt(self) -> None:
        """Raise ``ValidationError`` on ``cache_salt`` when it belonged to a deleted group (see ``ReservedSalt``).

        A salt of a deleted group of this tenant is named with that group; one of another tenant gets
        ``SALT_NOT_AVAILABLE`` (nothing of the other tenant, nor whether its group still exists)."""
        from tenants.models.reserved_salt import ReservedSalt

        reserved = ReservedSalt.objects.filter(cache_salt=self.cache_salt).first()
        if reserved is None:
            return
        if reserved.tenant_id != self.tenant.tenant_id:
            raise ValidationError({"cache_salt": SALT_NOT_AVAILABLE}, code="unique")
        raise ValidationError(
            {
                "cache_salt": f"This cache_salt belonged to this tenant's deleted request group "
                f"'{reserved.group_name}'; a new group with it would read that group's cached prefixes. Salts stay "
                "reserved forever: omit cache_salt to get a fresh one.",
            },
            code="reserved",
        )

    def _refuse_used_salt(self) -> None:
        """Raise ``ValidationError`` on ``cache_salt`` when another group holds it (salts are unique across
        tenants): naming the group when it is this tenant's, else ``SALT_NOT_AVAILABLE``."""
        other = RequestGroup._base_manager.filter(cache_salt=self.cache_salt).exclude(pk=self.pk).first()
        if other is None:
            return
        if other.tenant_id != self.tenant_id:
            raise ValidationError({"cache_salt": SALT_NOT_AVAILABLE}, code="unique")
        raise ValidationError(
            {"cache_salt": f"Request group '{other.name}' of this tenant already uses this cache_salt; salts must "
                           "be unique."},
            code="unique",
        )
