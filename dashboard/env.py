"""Typed parsers for settings read from the environment.

Each parser raises ``ImproperlyConfiguredValue`` (Django's ``ImproperlyConfigured`` and a ``ValueError``) naming
the variable when its value is malformed, so a broken deployment fails at start-up with a message instead of
misbehaving later; ``manage.py``, the WSGI application and the Celery app print that message alone and exit 2
(``load_settings_or_exit``).
"""
from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


class ImproperlyConfiguredValue(ImproperlyConfigured, ValueError):
    """An environment variable holds a value its parser cannot accept."""


#: Exit status for settings that cannot be used (the environment is wrong, not the code), as for a usage error.
EXIT_BAD_SETTINGS = 2
#: gunicorn 27's "App failed to load" worker status: its arbiter stops on it instead of respawning the worker.
EXIT_GUNICORN_APP_LOAD_ERROR = 4


def load_settings_or_exit() -> None:
    """Import the settings module now; on ``ImproperlyConfigured`` (``DJANGO_SECRET_KEY`` unset, a malformed
    variable) print ``Error: improperly configured: <message>`` alone on stderr and exit ``EXIT_BAD_SETTINGS``
    (``EXIT_GUNICORN_APP_LOAD_ERROR`` inside a gunicorn worker, so the server stops rather than respawning it).

    The entry points call it before anything else imports the settings: ``manage.py``, ``dashboard.wsgi``
    (gunicorn), ``dashboard.celery`` (``celery -A dashboard.celery worker|beat``).
    """
    import sys

    from django.conf import settings

    try:
        settings.INSTALLED_APPS  # noqa: B018 -- the attribute access imports the settings module
    except ImproperlyConfigured as exc:
        sys.stderr.write(f"Error: improperly configured: {exc}\n")
        sys.stderr.flush()
        sys.exit(EXIT_GUNICORN_APP_LOAD_ERROR if "gunicorn.workers.base" in sys.modules else EXIT_BAD_SETTINGS)


def env_str(name: str, default: str) -> str:
    """Return ``$name`` or ``default`` when unset or empty."""
    value = os.environ.get(name, "")
    return value if value != "" else default


def env_bool(name: str, default: bool) -> bool:
    """Parse ``$name`` as a boolean (``1/true/yes/on`` or ``0/false/no/off``, case-insensitive)."""
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfiguredValue(f"{name}={raw!r} is not a boolean (use true/false)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """Parse ``$name`` as a decimal integer, at least ``minimum`` when given."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfiguredValue(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredValue(f"{name}={value} is below the minimum {minimum}")
    return value


def env_ratio(name: str, default: float) -> float:
    """Parse ``$name`` as a decimal ratio in ``(0, 1]`` (``0.9``), as the Mooncake master's ratio flags take."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfiguredValue(f"{name}={raw!r} is not a number") from None
    if not 0 < value <= 1:  # also refuses nan
        raise ImproperlyConfiguredValue(f"{name}={raw} must be in (0, 1]")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Parse ``$name`` as a comma-separated list; blanks are dropped."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_database(name: str, default: str, **options) -> dict:
    """Parse ``$name`` as a database URL (``dj_database_url.parse`` with ``options``) into a DATABASES entry.

    Raises ImproperlyConfiguredValue for an unknown scheme or a malformed URL (e.g. a non-numeric port).
    """
    import dj_database_url

    raw = env_str(name, default)
    try:
        return dj_database_url.parse(raw, **options)
    except ValueError as exc:  # UnknownSchemeError, ParseError
        raise ImproperlyConfiguredValue(f"{name} is not a database URL Django can use: {exc}") from None


def env_broker(name: str, default: str) -> str:
    """Parse ``$name`` as a Celery broker URL: ``redis://``/``rediss://`` with a host and a numeric database
    (``agent.contract.broker.broker_url``, the check the agent applies to ``--broker``).

    Raises ImproperlyConfiguredValue otherwise.
    """
    import argparse

    from agent.contract.broker import broker_url

    raw = env_str(name, default)
    try:
        return broker_url(raw, schemes=("redis", "rediss"))
    except argparse.ArgumentTypeError as exc:
        raise ImproperlyConfiguredValue(f"{name}: {exc}") from None


#: The development key used only with ``DJANGO_DEBUG`` on; outside DEBUG it is refused like an unset key.
DEV_SECRET_KEY = "insecure-dev-key-change-me"


def env_secret_key(name: str, *, debug: bool) -> str:
    """``$name`` as Django's ``SECRET_KEY``; with ``debug`` on, a development key when unset.

    Raises ImproperlyConfiguredValue outside DEBUG when ``$name`` is unset, blank or the development key: sessions,
    password-reset links and CSRF tokens signed with a key anyone can read could be forged.
    """
    value = os.environ.get(name, "").strip()
    if value and (debug or value != DEV_SECRET_KEY):
        return value
    if debug:
        return DEV_SECRET_KEY
    what = "is the development key" if value else "is not set"
    raise ImproperlyConfiguredValue(
        f"{name} {what}: outside DJANGO_DEBUG the dashboard needs a secret key of its own (50+ random characters, "
        f"e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(50))')"
    )


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """Parse ``$name`` = ``Header-Name: value`` (e.g. ``X-Forwarded-Proto: https``) into Django's
    ``SECURE_PROXY_SSL_HEADER`` (``("HTTP_X_FORWARDED_PROTO", "https")``); ``None`` when unset or blank.

    Set it only behind a proxy that terminates TLS and always sets (or strips) that header. Raises
    ImproperlyConfiguredValue when there is no ``:``, or the name or the value is empty or holds spaces.
    """
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return None
    header, _, value = (part.strip() for part in raw.partition(":"))
    if not header or not value or any(char.isspace() for char in header + value) or not header.isascii():
        raise ImproperlyConfiguredValue(f"{name}={raw!r} is not 'Header-Name: value' (e.g. 'X-Forwarded-Proto: https')")
    return "HTTP_" + header.upper().replace("-", "_"), value


def env_rate(name: str, default: str) -> str:
    """Parse ``$name`` as a DRF throttle rate ``N/period``: N a positive integer, period one of ``s``, ``sec``,
    ``m``, ``min``, ``h``, ``hour``, ``d``, ``day`` (DRF reads only its first letter). Default when unset."""
    value = env_str(name, default).strip()
    count, _, period = value.partition("/")
    if not (count.isascii() and count.isdigit() and int(count) > 0
            and period in ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")):
        raise ImproperlyConfiguredValue(f"{name}={value!r} is not a rate like '10/min' (a count, '/', and s, min, "
                                        "hour or day)")
    return value
