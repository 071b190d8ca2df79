"""Header parameters are split in linear work (``dashboard.header_params``), with the standard library's results,
on every path that parses them before authentication: Django's ``Content-Type``, DRF's ``Accept``, multipart
part headers."""
from __future__ import annotations

import email.message

import pytest
from django.test import Client
from django.utils.http import parse_header_parameters
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard import header_params

HEADER = 64 << 10  # the longest header line `manage.py runserver` reads

#: Lines that made the standard library's splitter quadratic, or might make a splitter so.
HOSTILE = {
    "unterminated quote then semicolons": lambda n: 'application/json; a="' + ";" * n,
    "escaped quotes then semicolons": lambda n: 'application/json; a="' + '\\";' * (n // 3),
    "quote pairs between semicolons": lambda n: "application/json" + ';""' * (n // 3),
    "quote semicolon pairs": lambda n: "application/json; a=" + '";' * (n // 2),
    "many parameters": lambda n: "application/json" + "; a=b" * (n // 5),
    "backslashes and quotes": lambda n: "a/b; x=" + '\\\\"' * (n // 3),
}


def test_the_standard_library_splits_with_the_linear_splitter():
    assert email.message._parseparam is header_params.parseparam
    assert header_params.replaced is not None and header_params.replaced is not header_params.parseparam


@pytest.mark.parametrize("family", sorted(HOSTILE))
def test_splitting_is_linear_in_the_line(family):
    for size in (1 << 8, 1 << 12, HEADER, 1 << 20):
        line = HOSTILE[family](size)
        assert header_params.split_params(line)[1] <= 7 * (len(line) + 2), (family, size)


@pytest.mark.parametrize("family", sorted(HOSTILE))
def test_hostile_lines_split_as_the_standard_library_splits_them(family):
    line = HOSTILE[family](2000)  # small: the standard library's splitter is quadratic
    assert header_params.parseparam(line) == header_params.replaced(line)


@settings(max_examples=2000, deadline=None, derandomize=True, database=None)
@given(line=st.text(alphabet=st.sampled_from('";\\= aB\tn*\'%'), max_size=30))
def test_every_line_splits_as_the_standard_library_splits_it(line):
    assert header_params.parseparam(line) == header_params.replaced(line)


def test_django_reads_the_same_parameters():
    assert parse_header_parameters('multipart/form-data; boundary="a;b"; charset=UTF-8') == (
        "multipart/form-data", {"boundary": "a;b", "charset": "UTF-8"})
    assert parse_header_parameters('form-data; name="f\\";x"; filename="a.txt"') == (
        "form-data", {"name": 'f";x', "filename": "a.txt"})


@pytest.fixture
def counted(monkeypatch):
    """Every split of a header line, through the standard library, as ``[(length, steps)]``."""
    assert email.message._parseparam is header_params.parseparam  # what the request would have used
    splits: list[tuple[int, int]] = []

    def splitting(line):
        params, steps = header_params.split_params(line)
        splits.append((len(line), steps))
        return params

    monkeypatch.setattr(email.message, "_parseparam", splitting)
    return splits


def test_hostile_content_type_and_accept_headers_cost_linear_work_before_login(db, counted):
    content_type = HOSTILE["unterminated quote then semicolons"](HEADER)
    accept = HOSTILE["escaped quotes then semicolons"](HEADER)
    response = Client(raise_request_exception=False).generic(
        "POST", "/api/v1/auth-token/", b"{}", content_type=content_type, HTTP_ACCEPT=accept)
    assert response.status_code == 406  # DRF refuses the Accept header: nothing parsed the body
    assert sum(length for length, _ in counted) >= len(content_type) + len(accept)  # both went through it
    assert all(steps <= 7 * (length + 2) for length, steps in counted)


def test_a_hostile_multipart_login_form_costs_linear_work_before_login(db, counted):
    """The CSRF check reads the form before any view: 900 part headers of an unterminated quote and ``;`` took
    0.8 s in the standard library's splitter, 16 times a benign form of the same size."""
    parts = b"".join(b'--B\r\nContent-Disposition: form-data; name="f%d"; x="%s\r\n\r\nv\r\n' % (index, b";" * 900)
                     for index in range(900)) + b"--B--\r\n"
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = "a" * 32
    response = client.generic("POST", "/accounts/login/", parts, content_type="multipart/form-data; boundary=B")
    assert response.status_code == 403  # no CSRF token in the form
    assert len(counted) >= 900
    assert sum(steps for _, steps in counted) <= 7 * (len(parts) + 2 * len(counted))
