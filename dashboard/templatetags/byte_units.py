"""Template filter ``humanize_bytes`` (a builtin of the dashboard's templates: ``settings.TEMPLATES``).

``{{ value|humanize_bytes }}`` renders a byte count with ``tenants.quota.humanize_bytes`` (binary units, IEC
suffixes: ``268435456`` -> ``256 MiB``); ``None`` or a value that is not an integer renders as ``–``. Pages use it
instead of Django's ``filesizeformat``, which divides by 1024 but writes ``MB``.
"""
from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from tenants.quota import humanize_bytes as _humanize_bytes

register = template.Library()


@register.filter
def humanize_bytes(value) -> str:
    """``value`` (bytes, an int) as ``"256 MiB"``; ``–`` for ``None`` or a non-integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "–"
    return _humanize_bytes(value)


@register.simple_tag
def bytes_cell(value) -> str:
    """A byte count as the pages show it in a cell: ``<span data-bytes="N" title="N bytes">256 MiB</span>``, or a
    muted ``–`` for ``None``. The one place of that markup (``ui/_bytes.html`` calls it); tables of thousands of
    cells call the tag directly (an ``include`` per cell costs far more than the markup)."""
    if value is None:
        return mark_safe('<span class="muted">–</span>')  # noqa: S308 (a constant)
    return format_html('<span data-bytes="{}" title="{} bytes">{}</span>', value, value, humanize_bytes(value))
