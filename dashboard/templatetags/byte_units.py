"""Template filter ``humanize_bytes`` (a builtin of the dashboard's templates: ``settings.TEMPLATES``).

``{{ value|humanize_bytes }}`` renders a byte count with ``tenants.quota.humanize_bytes`` (binary units, IEC
suffixes: ``268435456`` -> ``256 MiB``); ``None`` or a value that is not an integer renders as ``–``. Pages use it
instead of Django's ``filesizeformat``, which divides by 1024 but writes ``MB``.
"""
from __future__ import annotations

from django import template

from tenants.quota import humanize_bytes as _humanize_bytes

register = template.Library()


@register.filter
def humanize_bytes(value) -> str:
    """``value`` (bytes, an int) as ``"256 MiB"``; ``–`` for ``None`` or a non-integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "–"
    return _humanize_bytes(value)
