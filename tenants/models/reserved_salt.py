"""Reserved cache salt: the ``cache_salt`` of a deleted request group, kept so no later group reuses it."""
from __future__ import annotations

from django.db import models

from tenants.models.base import RegistryModel


class ReservedSalt(RegistryModel):
    """A ``cache_salt`` that belonged to a deleted request group and may never be given to another group.

    vLLM 0.33.0 mixes the salt into the first block hash of every request, so a new group with an old group's
    salt would compute the same block hashes and read the deleted group's cached prefixes still in the Mooncake
    Store. Like a served release namespace, a salt therefore stays reserved forever. Rows are written by the
    ``pre_delete`` receiver ``reserve_deleted_group_salt`` (in the delete's transaction) and are audited.
    ``tenant_id`` is the Mooncake tenant id as text, so the tenant itself may later be deleted.
    """

    cache_salt = models.CharField(max_length=128, unique=True)
    group_name = models.CharField(max_length=63, help_text="Name of the deleted request group.")
    tenant_id = models.CharField(max_length=255, help_text="Mooncake tenant id of the deleted request group.")

    class Meta:
        ordering = ["tenant_id", "group_name"]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.group_name} (deleted)"


def reserve_deleted_group_salt(sender, instance, **kwargs) -> None:
    """``pre_delete`` receiver of ``RequestGroup``: record its non-empty ``cache_salt`` as reserved.

    The empty salt (the tenant's default shared cache) is not reserved: it is shared by definition.
    """
    if not instance.cache_salt:
        return
    ReservedSalt.objects.get_or_create(
        cache_salt=instance.cache_salt,
        defaults={"group_name": instance.name, "tenant_id": instance.tenant.tenant_id},
    )
