"""Quota parsing and formatting exactly as the Mooncake master 0.3.13.post1 reads its policy file."""
from __future__ import annotations

import pytest

from tenants.quota import (
    MAX_QUOTA_BYTES,
    QuotaError,
    format_quota,
    humanize_bytes,
    parse_quota,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8MB", 8388608),
        ("200GB", 214748364800),
        ("1B", 1),
        ("8", 8),
        ("8KB", 8192),
        ("8TB", 8 << 40),
        ("08MB", 8388608),  # the master accepts leading zeros
        (" 8MB ", 8388608),  # YAML strips surrounding blanks
        ("9223372036854775807", MAX_QUOTA_BYTES),
        ("8589934591GB", 8589934591 << 30),
        (4096, 4096),
    ],
)
def test_accepted_values(text, expected):
    assert parse_quota(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("8 MB", "is not a byte size"),
        ("1.5GB", "is not a byte size"),
        ("-1", "is not a byte size"),
        ("+8MB", "is not a byte size"),
        ("", "is not a byte size"),
        ("8mb", "has the unit 'mb'"),
        ("8MiB", "has the unit 'MiB'"),
        ("8K", "has the unit 'K'"),
        ("8PB", "has the unit 'PB'"),
        ("0", "at least 1 byte"),
        (0, "at least 1 byte"),
        (-5, "at least 1 byte"),
        ("9223372036854775808", "at most 2^63-1"),
        ("8589934592GB", "at most 2^63-1"),
        ("8388608TB", "at most 2^63-1"),
        ("9" * 5000 + "TB", "at most 2^63-1"),
        (True, "got bool"),
        (1.5, "got float"),
        (None, "got NoneType"),
    ],
)
def test_refused_values_name_the_problem(value, message):
    with pytest.raises(QuotaError, match=None) as info:
        parse_quota(value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [(8388608, "8MB"), (214748364800, "200GB"), (1000, "1000B"), (1024, "1KB"), (1536, "1536B"), (3 << 40, "3TB")],
)
def test_format_uses_the_largest_exact_unit(num_bytes, text):
    assert format_quota(num_bytes) == text
    assert parse_quota(format_quota(num_bytes)) == num_bytes


@pytest.mark.parametrize("num_bytes", [1, 1023, 1025, 123456789, MAX_QUOTA_BYTES, 1 << 62, (1 << 40) * 7 + 1])
def test_format_round_trips(num_bytes):
    assert parse_quota(format_quota(num_bytes)) == num_bytes


def test_format_refuses_out_of_range():
    with pytest.raises(QuotaError):
        format_quota(0)
    with pytest.raises(QuotaError):
        format_quota(MAX_QUOTA_BYTES + 1)


@pytest.mark.parametrize("num_bytes, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (1000 * 1024**2, "1000 MiB"),
    (1023 * 1024**2, "1023 MiB"), (1024**3, "1 GiB"), (int(12.345 * 1024**3), "12.3 GiB"),
    (20000 * 1024**4, "19.5 PiB"), (2**63 - 1, "8192 PiB"),
])
def test_humanize_bytes_never_uses_exponents(num_bytes, text):
    assert humanize_bytes(num_bytes) == text
