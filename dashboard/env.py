"""Typed parsers for settings read from the environment.

Each parser raises ``ImproperlyConfiguredValue`` (Django's ``ImproperlyConfigured`` and a ``ValueError``) naming
the variable when its value is malformed, so a broken deployment fails at start-up with a message instead of
misbehaving later; ``manage.py`` prints that message alone and exits 2.
"""
from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


class ImproperlyConfiguredValue(ImproperlyConfigured, ValueError):
    """An environment variable holds a value its parser cannot accept."""


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
