"""Limits every request meets before anything parses it: body size, JSON nesting, no NUL in the URL.

``RequestLimitsMiddleware`` runs right after Django's ``SecurityMiddleware``, before sessions, CSRF,
authentication and any view, so an anonymous caller (the token endpoint, the login page) meets the same limits
as a logged-in one:

* ``Content-Length`` above ``KVPOOL_MAX_REQUEST_BYTES`` (default 1 MiB) -> HTTP 413; the body is not read.
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is set to the same number, so Django's own form parsing agrees.
* a ``Content-Length`` that is not a decimal byte count -> HTTP 400.
* a NUL character in the path or in a query parameter (``%00``) -> HTTP 400: no name or id holds one, and
  PostgreSQL refuses it in any query (a view looking up ``/telemetry/nodes/%00/`` ended in a 500).
* a body that DRF's ``JSONParser`` would parse (``Content-Type: application/json``, ``application/*``, ``*/*``)
  nested deeper than ``KVPOOL_MAX_JSON_DEPTH`` arrays/objects (default 32) -> HTTP 400. Python's ``json`` module
  recurses once per level and a body nested about 1,000 deep ended in ``RecursionError`` (HTTP 500); the deepest
  document the API takes (a release's LoRA adapters) is 3 levels.

Each refusal is a JSON body ``{"detail": "<reason>"}`` like DRF's own errors, on every path (API or page).
"""
from __future__ import annotations

import re

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.utils.mediatypes import media_type_matches

#: Defaults of ``KVPOOL_MAX_REQUEST_BYTES`` (bytes) and ``KVPOOL_MAX_JSON_DEPTH`` (levels of arrays/objects).
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_MAX_JSON_DEPTH = 32

# A complete JSON string (escapes included); its content never counts as nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPENERS = frozenset(b"[{")
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether ``body`` (JSON text, UTF-8) nests arrays/objects more than ``limit`` levels deep.

    ``[]`` and ``{}`` are one level, ``[[1]]`` two; brackets inside strings do not count. The scan is over
    bytes, before decoding (no byte of a multi-byte UTF-8 character equals a bracket or a quote), and stops at
    the first level past ``limit``. Malformed JSON is not judged here: the parser refuses it afterwards.
    """
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depth = 0
    for byte in brackets:
        if byte in _OPENERS:
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _refusal(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


def check_request(request: HttpRequest, *, max_bytes: int, max_depth: int) -> HttpResponse | None:
    """The response refusing ``request`` (413 or 400, see the module docstring), or ``None`` when it passes."""
    if "\x00" in request.path or any("\x00" in key or "\x00" in value
                                     for key, values in request.GET.lists() for value in values):
        return _refusal(400, "The URL holds a NUL character (%00).")
    raw_length = request.META.get("CONTENT_LENGTH") or ""
    if raw_length.strip() == "":
        return None  # no body (Django reads none without a length)
    if not (raw_length.isascii() and raw_length.isdigit()):
        return _refusal(400, f"Content-Length {raw_length[:40]!r} is not a byte count.")
    length = int(raw_length)
    if length > max_bytes:
        return _refusal(413, f"Request body of {length} bytes exceeds the limit of {max_bytes} bytes.")
    parsed_as_json = media_type_matches("application/json", request.META.get("CONTENT_TYPE", ""))
    if length and parsed_as_json and json_depth_exceeds(request.body, max_depth):
        return _refusal(400, f"JSON body is nested more than {max_depth} arrays/objects deep.")
    return None


class RequestLimitsMiddleware:
    """Apply ``check_request`` with ``settings.KVPOOL_MAX_REQUEST_BYTES`` and ``KVPOOL_MAX_JSON_DEPTH``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refusal = check_request(
            request,
            max_bytes=getattr(settings, "KVPOOL_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES),
            max_depth=getattr(settings, "KVPOOL_MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH),
        )
        return refusal if refusal is not None else self.get_response(request)
