"""Path converters of the page routes."""
from __future__ import annotations

from tenants.validators import parse_object_id


class ObjectIdConverter:
    """``<id:pk>``: an object id as every id in a URL is taken (``tenants.validators.parse_object_id``): ASCII
    digits in ``[1, 2**63 - 1]``. Django's ``<int:>`` also matches ``0`` and ids past 64 bits, which no row has
    and which overflow the database's integers; those are HTTP 404 here, as a non-numeric id is."""

    regex = "[0-9]+"

    def to_python(self, value: str) -> int:
        object_id = parse_object_id(value)
        if object_id is None:
            raise ValueError(f"{value!r} is not an object id")  # Django: this route does not match -> 404
        return object_id

    def to_url(self, value: int | str) -> str:
        return str(int(value))
