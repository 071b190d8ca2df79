from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Registry of who shares which KV cache in the Mooncake Store."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"
