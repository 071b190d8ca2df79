"""Byte quantities as the Mooncake master's tenant quota policy writes them.

Matches ``mooncake_master`` 0.3.13.post1 (PyPI non-CUDA wheel), checked against the binary on this machine:
a quota in ``tenant_quotas.yaml`` is either a YAML integer or a string of decimal digits followed by one of
the units ``B``, ``KB``, ``MB``, ``GB``, ``TB`` — case-sensitive, **binary** (``8MB`` = 8 * 2**20 = 8388608,
``200GB`` = 214748364800), no space between number and unit, no sign, no fraction. The value must lie in
``[1, 2**63 - 1]`` bytes. The master refuses anything else and does not start (``unsupported quota unit``,
``quota must start with an integer``, ``quota must be positive``, ``quota exceeds maximum supported tenant
charge``).

The same grammar is used for every byte field of the registry (tenant quota, release and request-group
budgets), so the API, the admin and the pages accept exactly what the master accepts.
"""
from __future__ import annotations

import re

#: Largest quota the master accepts (its tenant charge is a signed 64-bit counter).
MAX_QUOTA_BYTES = 2**63 - 1

#: Units in the order ``format_quota`` tries them, largest first, with their byte multipliers.
UNITS: tuple[tuple[str, int], ...] = (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10), ("B", 1))
_MULTIPLIER = dict(UNITS)
_QUOTA_RE = re.compile(r"(?P<number>[0-9]+)(?P<unit>[A-Za-z]*)")


class QuotaError(ValueError):
    """A byte quantity that the Mooncake master would refuse; the message says why and what is accepted."""


def parse_quota(value: int | str) -> int:
    """Return the number of bytes ``value`` stands for.

    ``value`` is an ``int`` (bytes) or a string such as ``"8388608"``, ``"8MB"`` or ``"200GB"``; surrounding
    whitespace is ignored (YAML strips it too). Raises ``QuotaError`` for booleans, floats, signs, fractions,
    unknown or lower-case units, a space before the unit, and values outside ``[1, 2**63 - 1]``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise QuotaError(
            f"must be an integer number of bytes or a string like '8MB' (got {type(value).__name__})"
        )
    if isinstance(value, int):
        number = value
    else:
        text = value.strip()
        match = _QUOTA_RE.fullmatch(text)
        if match is None:
            raise QuotaError(
                f"'{value}' is not a byte size: use digits followed by an optional unit B, KB, MB, GB or TB "
                "(binary, case-sensitive, no space), e.g. '8MB' or '200GB'"
            )
        if len(match["number"].lstrip("0")) > 20:  # longer than 2**63 in any unit; int() of huge strings is slow
            raise QuotaError(f"must be at most 2^63-1 = {MAX_QUOTA_BYTES} bytes (got '{value}')")
        unit = match["unit"] or "B"
        if unit not in _MULTIPLIER:
            raise QuotaError(
                f"'{value}' has the unit '{match['unit']}', which the Mooncake master does not accept: "
                "use B, KB, MB, GB or TB (binary: 1KB = 1024 bytes)"
            )
        number = int(match["number"]) * _MULTIPLIER[unit]
    if number < 1:
        raise QuotaError(f"must be at least 1 byte (got {number})")
    if number > MAX_QUOTA_BYTES:
        raise QuotaError(f"must be at most 2^63-1 = {MAX_QUOTA_BYTES} bytes (got {number})")
    return number


def format_quota(num_bytes: int) -> str:
    """Render ``num_bytes`` in the largest unit that represents it exactly: ``8388608`` -> ``"8MB"``.

    Values that are not a multiple of 1024 come out with the ``B`` unit (``"1000B"``). The result is what
    ``parse_quota`` and the master's policy loader both read back as ``num_bytes``. Raises ``QuotaError``
    when ``num_bytes`` is outside ``[1, 2**63 - 1]``.
    """
    num_bytes = parse_quota(num_bytes)
    for unit, multiplier in UNITS:
        if num_bytes % multiplier == 0:
            return f"{num_bytes // multiplier}{unit}"
    raise AssertionError("unreachable: every integer is a multiple of 1 byte")


#: Units of ``humanize_bytes``, largest first: binary, with IEC suffixes (the units Mooncake counts in).
IEC_UNITS: tuple[tuple[str, int], ...] = (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20),
                                          ("KiB", 1 << 10))


def humanize_bytes(num_bytes: int) -> str:
    """Short human reading of a byte count for pages and messages: binary units with IEC suffixes and about three
    significant digits, trailing zeros dropped (``268435456`` -> ``"256 MiB"``, ``1536`` -> ``"1.5 KiB"``,
    ``1023`` -> ``"1023 B"``). The one byte formatter of the dashboard (template filter ``humanize_bytes``, and
    ``dashboard.js``'s ``humanBytes`` follows the same rule); not for parsing (quotas are written ``8MB``:
    ``format_quota``)."""
    for unit, multiplier in IEC_UNITS:
        if abs(num_bytes) >= multiplier:
            value = num_bytes / multiplier
            decimals = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0  # about 3 significant digits
            text = f"{value:.{decimals}f}"
            return f"{text.rstrip('0').rstrip('.') if '.' in text else text} {unit}"
    return f"{num_bytes} B"
