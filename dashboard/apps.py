from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Telemetry storage, pages, API and tasks of the control plane."""

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the receivers that push configs on commit and sync quotas to the master, register the
        system checks of the settings (``dashboard.checks``, ids ``kvpool.E…``/``kvpool.W…``), and split header
        parameters in linear time (``dashboard.header_params``) before the first request is parsed."""
        from dashboard import checks, header_params, signals  # noqa: F401  (importing registers them)

        header_params.install()
