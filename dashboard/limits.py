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
* such a body declared in a charset other than UTF-8 (or its subset ASCII) -> HTTP 415: JSON is UTF-8 (RFC 8259),
  and the depth scan reads UTF-8 bytes; DRF would decode ``charset=cp500`` (EBCDIC, where ``[`` is not byte
  0x5B) and a body nested 5,000 deep passed the scan and ended in ``RecursionError``. A charset Python does not
  know is ignored, as Django and DRF do (the body is read as UTF-8).

Every check here is linear in the request's size, since it runs for anonymous callers before any throttling:
``scan_json_depth`` makes a fixed number of forward passes over the body (an earlier regular expression for JSON
strings retried at every quote and took quadratic time: a 40 KB body of ``\\"`` held a worker 17 s), and the
header parameters Django parses first are split by ``dashboard.header_params``.

Each refusal is a JSON body ``{"detail": "<reason>"}`` like DRF's own errors, on every path (API or page).
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.utils.mediatypes import media_type_matches

#: Defaults of ``KVPOOL_MAX_REQUEST_BYTES`` (bytes) and ``KVPOOL_MAX_JSON_DEPTH`` (levels of arrays/objects).
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_MAX_JSON_DEPTH = 32

_OPENERS = frozenset(b"[{")
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
#: Codec names (``codecs.lookup(...).name``) of the charsets a JSON body may declare: UTF-8 and its subset.
_JSON_CODECS = frozenset({"utf-8", "utf-8-sig", "ascii"})


@dataclass(frozen=True)
class JsonDepthScan:
    """What ``scan_json_depth`` found.

    Attributes:
        exceeds: the body nests arrays/objects more than the limit deep.
        depth: the deepest level seen, counted up to ``limit + 1`` (the scan stops there).
        steps: the work done, in bytes handled: each forward pass counts the length of its input, the walk over
            the brackets one step per bracket. At most ``6 * len(body)`` whatever the body holds.
    """

    exceeds: bool
    depth: int
    steps: int


def scan_json_depth(body: bytes, limit: int) -> JsonDepthScan:
    """How deep ``body`` (JSON text, UTF-8) nests arrays/objects, in a fixed number of forward passes.

    ``[]`` and ``{}`` are one level, ``[[1]]`` two; brackets inside strings do not count. The scan is over bytes,
    before decoding (no byte of a multi-byte UTF-8 character equals a bracket, a quote or a backslash):

    1. drop ``\\\\`` pairs, then ``\\"`` pairs (``bytes.replace`` pairs a run of backslashes from its left, as JSON
       escapes do), so every quote left opens or closes a string;
    2. split at the quotes and keep the pieces outside strings (the even ones);
    3. keep the brackets of those pieces and walk them, stopping at the first level past ``limit``.

    Each pass is a single forward pass of ``bytes.replace``/``split``/``join``/``translate`` (no backtracking), so
    the time is linear in ``len(body)`` for every input (``steps`` counts it). Malformed JSON is not judged here:
    up to the first error a parser would meet, the strings found are the parser's, so a body the parser would
    recurse into more than ``limit`` deep always ``exceeds``; the parser refuses the rest afterwards.
    """
    unpaired = body.replace(b"\\\\", b"")
    unescaped = unpaired.replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[0::2])
    brackets = outside.translate(None, _NOT_BRACKETS)
    steps = len(body) + len(unpaired) + 2 * len(unescaped) + len(outside)
    depth = deepest = 0
    for byte in brackets:
        steps += 1
        if byte in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest = depth
                if depth > limit:
                    return JsonDepthScan(exceeds=True, depth=depth, steps=steps)
        else:
            depth -= 1
    return JsonDepthScan(exceeds=False, depth=deepest, steps=steps)


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether ``body`` (JSON text, UTF-8) nests arrays/objects more than ``limit`` levels deep
    (``scan_json_depth``)."""
    return scan_json_depth(body, limit).exceeds


def json_charset_refused(request: HttpRequest) -> str | None:
    """The charset ``request`` declares for its body when it is not UTF-8 or ASCII, else ``None``.

    ``request.encoding`` is the ``charset`` parameter of its ``Content-Type`` when Python knows that codec (Django
    drops an unknown one, and DRF then reads UTF-8).
    """
    encoding = request.encoding
    if not encoding:
        return None
    return None if codecs.lookup(encoding).name in _JSON_CODECS else encoding


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
    if not (length and media_type_matches("application/json", request.META.get("CONTENT_TYPE", ""))):
        return None
    charset = json_charset_refused(request)
    if charset is not None:
        return _refusal(415, f"JSON bodies are read as UTF-8 (RFC 8259): charset {charset[:40]!r} is not accepted.")
    if json_depth_exceeds(request.body, max_depth):
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
