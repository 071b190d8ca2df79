"""Pagination of every list endpoint under ``/api/v1/``: limit/offset with a bounded page and offset."""
from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

from dashboard.api.params import count_param


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """DRF ``LimitOffsetPagination`` whose ``limit`` and ``offset`` are checked, not silently ignored.

    ``?limit=N`` is a count of objects in ASCII digits, at least 1; values above ``max_limit`` (1000) are lowered
    to 1000; absent or blank means the default page size (``PAGE_SIZE``). ``?offset=N`` is an integer in
    ``[0, max_offset]`` (an unbounded integer would overflow the database's 64-bit ``LIMIT``/``OFFSET`` and end in
    a 500); absent or blank means 0. Anything else (``abc``, ``-1``, ``1.5``, ``limit=0``) is HTTP 400 naming the
    parameter: ``{"limit": ["'abc' is not valid: limit must be an integer of at least 1 (ASCII digits)."]}``.
    """

    max_limit = 1000
    max_offset = 2**31 - 1

    def get_limit(self, request) -> int | None:
        limit = count_param(request.query_params.get(self.limit_query_param), self.limit_query_param, minimum=1)
        if limit is None:
            return self.default_limit
        return min(limit, self.max_limit) if self.max_limit else limit

    def get_offset(self, request) -> int:
        offset = count_param(request.query_params.get(self.offset_query_param), self.offset_query_param,
                             minimum=0, maximum=self.max_offset)
        return offset or 0
