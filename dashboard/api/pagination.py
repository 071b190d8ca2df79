"""Pagination of every list endpoint under ``/api/v1/``: limit/offset with a bounded page and offset."""
from __future__ import annotations

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """DRF ``LimitOffsetPagination`` whose ``limit`` is capped and whose ``offset`` is range-checked.

    ``?limit=N`` is a count of objects: values above ``max_limit`` (1000) are lowered to 1000, non-numeric or
    non-positive values fall back to the default page size (``PAGE_SIZE``). ``?offset=N`` must be an integer in
    ``[0, max_offset]``; anything larger is refused with HTTP 400 naming ``offset`` (an unbounded integer would
    overflow the database's 64-bit ``LIMIT``/``OFFSET`` and end in a 500). A non-numeric offset means 0 (DRF's
    behaviour).
    """

    max_limit = 1000
    max_offset = 2**31 - 1

    def get_offset(self, request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is not None and raw.isascii() and raw.strip().isdigit() and int(raw) > self.max_offset:
            raise serializers.ValidationError(
                {self.offset_query_param: [f"Must be an integer between 0 and {self.max_offset}."]}
            )
        return super().get_offset(request)
