from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Telemetry storage, pages, API and tasks of the control plane."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the receivers that push configs on commit and sync quotas to the master, and register the
        system checks of the settings (``dashboard.checks``, ids ``kvpool.E…``/``kvpool.W…``)."""
        from dashboard import checks, signals  # noqa: F401  (importing registers them)
