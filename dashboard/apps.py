from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Telemetry storage, pages, API and tasks of the control plane."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"
