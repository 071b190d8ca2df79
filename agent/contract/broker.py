"""The broker URL both sides accept (``kvpool-agent run --broker``, the dashboard's ``CELERY_BROKER_URL``); no Django.

:func:`broker_url` raises ``argparse.ArgumentTypeError`` with the offending text, so an argparse ``type=`` prints
``error: --broker: ...`` and exits 2 instead of a traceback; the dashboard turns it into a configuration error.
"""
from __future__ import annotations

import argparse
from urllib.parse import urlsplit

#: Broker URL schemes the agent's Celery/kombu set-up supports (``memory://`` only for tests).
BROKER_SCHEMES: tuple[str, ...] = ("redis", "rediss", "memory")


def broker_url(text: str, schemes: tuple[str, ...] = BROKER_SCHEMES) -> str:
    """A broker URL with one of ``schemes`` and a host (``memory://`` needs none); returned unchanged.

    Without this check kombu fails later with ``KeyError: No such transport`` (unknown scheme) or reads a bare
    word as ``amqp://WORD:5672`` and retries forever.
    """
    try:
        parts = urlsplit(text)
        hostname = parts.hostname
        parts.port  # noqa: B018  (raises ValueError on a non-numeric or out-of-range port)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid URL: {exc}") from None
    allowed = ", ".join(f"{scheme}://" for scheme in schemes)
    if "://" not in text or parts.scheme.lower() not in schemes:
        raise argparse.ArgumentTypeError(f"{text!r} is not a supported broker URL (use {allowed}, "
                                         "e.g. redis://127.0.0.1:6379/0)")
    if parts.scheme.lower() != "memory" and not hostname:
        raise argparse.ArgumentTypeError(f"{text!r} names no host (e.g. redis://127.0.0.1:6379/0)")
    db = parts.path.strip("/")
    if parts.scheme.lower() in ("redis", "rediss") and db and not (db.isascii() and db.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: the Redis database {db!r} is not a number "
                                         "(e.g. redis://127.0.0.1:6379/0)")
    return text
