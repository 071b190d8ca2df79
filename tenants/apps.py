from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Registry of who shares which KV cache in the Mooncake Store."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from tenants import audit
        from tenants.models import (
            InstanceAssignment,
            Node,
            Release,
            RequestGroup,
            ReservedSalt,
            ServedModel,
            Tenant,
        )  # fmt: skip
        from tenants.models.release import refuse_served_release_delete
        from tenants.models.reserved_salt import reserve_deleted_group_salt

        # The guard is connected first so a refused delete never reaches the audit receiver.
        pre_delete.connect(refuse_served_release_delete, sender=Release, dispatch_uid="kvpool-release-delete-guard")
        # A deleted group's cache_salt stays reserved (the row is written, and audited, in the delete's transaction).
        pre_delete.connect(reserve_deleted_group_salt, sender=RequestGroup, dispatch_uid="kvpool-reserve-salt")
        for model in (Tenant, ServedModel, Release, RequestGroup, ReservedSalt, Node, InstanceAssignment):
            audit.register(model)
