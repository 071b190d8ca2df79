"""The JSON depth check of ``dashboard.limits`` runs before authentication: linear work on every body (counted in
steps, never timed), the depth a JSON parser would meet, and bodies in other charsets refused before it."""
from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.limits import DEFAULT_MAX_JSON_DEPTH, scan_json_depth

MIB = 1 << 20
LIMIT = DEFAULT_MAX_JSON_DEPTH

#: Bodies that made the regular expression of the first version quadratic, or might make a scanner so.
HOSTILE = {
    "unterminated escaped quotes": lambda n: b'"' + b'\\"' * (n // 2),
    "escaped quote runs in a string": lambda n: b'["' + (b'\\"' * 50 + b"x") * (n // 101) + b'"]',
    "escaped quotes after an open bracket": lambda n: b"[" * LIMIT + b'"' + b'\\"' * (n // 2),
    "brackets inside a string": lambda n: b'["' + b"[{" * (n // 2) + b'"]',
    "brackets inside an unterminated string": lambda n: b'"' + b"[" * n,
    "backslash run": lambda n: b'["' + b"\\" * n,
    "backslash pairs and quotes": lambda n: b'["' + b'\\\\"' * (n // 3),
    "empty strings": lambda n: b"[" + b'"",' * (n // 3) + b'""]',
    "shallow brackets": lambda n: b"[" + b"[]," * (n // 3) + b"[]]",
    "deep brackets": lambda n: b"[" * n,
}


@pytest.mark.parametrize("family", sorted(HOSTILE))
def test_the_depth_scan_is_linear_in_the_body(family):
    for size in (1 << 10, 1 << 14, 1 << 18, MIB):
        body = HOSTILE[family](size)
        assert scan_json_depth(body, LIMIT).steps <= 6 * len(body), (family, size)


def test_the_hostile_bodies_get_the_depth_a_parser_would_meet():
    expected = {"unterminated escaped quotes": 0, "escaped quote runs in a string": 1,
                "escaped quotes after an open bracket": LIMIT, "brackets inside a string": 1,
                "brackets inside an unterminated string": 0, "backslash run": 1, "backslash pairs and quotes": 1,
                "empty strings": 1, "shallow brackets": 2, "deep brackets": LIMIT + 1}
    for family, depth in expected.items():
        scan = scan_json_depth(HOSTILE[family](MIB), LIMIT)
        assert (scan.depth, scan.exceeds) == (depth, depth > LIMIT), family


def _nesting(value) -> int:
    if isinstance(value, list):
        return 1 + max((_nesting(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_nesting(item) for item in value.values()), default=0)
    return 0


_TEXT = st.text(alphabet=st.sampled_from('"\\[]{}/ aé\u2028\U0001f600\n'), max_size=12)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                     max_leaves=40)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(document=_JSON, ascii_only=st.booleans(), limit=st.integers(min_value=0, max_value=6))
def test_the_depth_of_any_json_document_is_its_nesting(document, ascii_only, limit):
    body = json.dumps(document, ensure_ascii=ascii_only).encode()
    scan = scan_json_depth(body, limit)
    assert scan.depth == min(_nesting(document), limit + 1)
    assert scan.exceeds is (_nesting(document) > limit)


def _parser_depth(body: bytes) -> int:
    """The deepest level a JSON parser reaches on ``body`` before its first error it can see here: one byte at a
    time, strings with their escapes, stopping at a backslash outside a string (no parser goes past it)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string = False
        elif byte == ord('"'):
            in_string = True
        elif byte == ord("\\"):
            break
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(body=st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b",", b"\xc3\xa9"]),
                     max_size=40).map(b"".join))
def test_no_body_a_parser_would_recurse_into_passes(body):
    assert scan_json_depth(body, 3).exceeds or _parser_depth(body) <= 3


def test_a_megabyte_of_escaped_quotes_is_answered_anonymously(db):
    """The first version took 17 s on 40 KB of this, and hours on 1 MiB; the body is not JSON (a 400 from the
    parser, not from the limits)."""
    body = HOSTILE["unterminated escaped quotes"](MIB - 16)
    response = Client().post("/api/v1/auth-token/", body, content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


@pytest.mark.parametrize("charset", ["cp500", "utf-16", "utf-32-le", "latin-1"])
def test_a_json_body_in_another_charset_is_a_415(db, charset):
    """In EBCDIC (cp500) ``[`` is not byte 0x5B: 5,000 levels passed the depth scan and DRF's decoder handed them
    to the parser (``RecursionError``, HTTP 500)."""
    body = ("[" * 5000 + "]" * 5000).encode(charset)
    response = Client(raise_request_exception=False).generic(
        "POST", "/api/v1/auth-token/", body, content_type=f"application/json; charset={charset}")
    assert response.status_code == 415
    assert response.json() == {"detail": f"JSON bodies are read as UTF-8 (RFC 8259): charset '{charset}' is not "
                                         "accepted."}


@pytest.mark.parametrize("charset", ["utf-8", "UTF8", "us-ascii", "no-such-codec"])
def test_a_json_body_in_utf8_or_an_unknown_charset_is_read_as_utf8(db, charset):
    response = Client().generic("POST", "/api/v1/auth-token/", b'{"username": "x", "password": "y"}',
                                content_type=f"application/json; charset={charset}")
    assert response.status_code == 400
    assert response.json() == {"non_field_errors": ["Unable to log in with provided credentials."]}
