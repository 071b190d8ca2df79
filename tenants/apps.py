from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Registry of who shares which KV cache in the Mooncake Store."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from tenants import audit
        from tenants.models import InstanceAssignment, Node, Release, RequestGroup, ServedModel, Tenant
        from tenants.models.release import refuse_served_release_delete

        # The guard is connected first so a refused delete never reaches the audit receiver.
        pre_delete.connect(refuse_served_release_delete, sender=Release, dispatch_uid="kvpool-release-delete-guard")
        for model in (Tenant, ServedModel, Release, RequestGroup, Node, InstanceAssignment):
            audit.register(model)
