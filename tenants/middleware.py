"""Request-scoped audit context: every change made while serving a request is attributed to its user."""
from __future__ import annotations

import re

from tenants.audit import AuditContext, _current, new_request_id

_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class AuditContextMiddleware:
    """Give each request an id (``X-Request-ID`` when well-formed, else a fresh one), echo it in the response,
    and make it and the request's user the audit context of any change made while handling it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        supplied = request.headers.get("X-Request-ID", "")
        request_id = supplied if _REQUEST_ID_RE.fullmatch(supplied) else new_request_id()
        request.request_id = request_id
        token = _current.set(AuditContext(request_id=request_id, request=request))
        try:
            response = self.get_response(request)
        finally:
            _current.reset(token)
        response["X-Request-ID"] = request_id
        return response
