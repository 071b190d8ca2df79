#!/usr/bin/env python
"""Django's command-line utility for the KV-cache pool control plane.

A malformed setting (``DJANGO_DEBUG=maybe``, ``KVPOOL_GLOBAL_SEGMENT_SIZE=4GB``: ``ImproperlyConfigured`` while the
settings module is imported) is printed as one line on stderr and exits with status 2, like a command-line usage
error; any other exception keeps its traceback.
"""
import os
import sys

#: Exit status for settings that cannot be used (the environment is wrong, not the code).
EXIT_BAD_SETTINGS = 2


def load_settings() -> None:
    """Import the settings module now; exit 2 with the message alone when a setting is malformed.

    Django's own command-line utility would swallow ``ImproperlyConfigured`` here and report the project's
    commands as unknown, so the settings are loaded before it runs.
    """
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018 -- the attribute access imports the settings module
    except ImproperlyConfigured as exc:
        sys.stderr.write(f"Error: improperly configured: {exc}\n")
        sys.exit(EXIT_BAD_SETTINGS)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    load_settings()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
