from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Registry of who shares which KV cache in the Mooncake Store."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete, pre_save

        from tenants import audit
        from tenants.models import (
            InstanceAssignment,
            Node,
            Release,
            RequestGroup,
            ReservedNamespace,
            ReservedSalt,
            ServedModel,
            Tenant,
            TenantMembership,
        )  # fmt: skip
        from tenants.models.release import refuse_served_release_delete
        from tenants.models.reserved_namespace import (
            reserve_deleted_release_namespace,
            reserve_renamed_model_namespaces,
            reserve_renamed_release_namespace,
            reserve_renamed_tenant_namespaces,
        )
        from tenants.models.reserved_salt import reserve_deleted_group_salt

        # The guard is connected first so a refused delete never reaches the audit receiver.
        pre_delete.connect(refuse_served_release_delete, sender=Release, dispatch_uid="kvpool-release-delete-guard")
        # A deleted group's cache_salt stays reserved (the row is written, and audited, in the delete's transaction).
        pre_delete.connect(reserve_deleted_group_salt, sender=RequestGroup, dispatch_uid="kvpool-reserve-salt")
        # Likewise the namespace a release leaves (deleted, renamed, its model or tenant renamed): its keys may stay
        # in the Store, so no later release of the same model key may use it (tenants.models.ReservedNamespace).
        pre_delete.connect(reserve_deleted_release_namespace, sender=Release,
                           dispatch_uid="kvpool-reserve-deleted-namespace")
        pre_save.connect(reserve_renamed_release_namespace, sender=Release,
                         dispatch_uid="kvpool-reserve-renamed-namespace")
        pre_save.connect(reserve_renamed_model_namespaces, sender=ServedModel,
                         dispatch_uid="kvpool-reserve-renamed-model-namespaces")
        pre_save.connect(reserve_renamed_tenant_namespaces, sender=Tenant,
                         dispatch_uid="kvpool-reserve-renamed-tenant-namespaces")
        for model in (Tenant, ServedModel, Release, RequestGroup, ReservedSalt, ReservedNamespace, Node,
                      InstanceAssignment, TenantMembership):
            audit.register(model)
