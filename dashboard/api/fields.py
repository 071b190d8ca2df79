"""Serializer fields shared by the API modules."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.utils import html

from tenants.quota import QuotaError, parse_quota


@extend_schema_field(
    {
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": "^[0-9]+(B|KB|MB|GB|TB)?$"}],
        "description": "Bytes, as an integer or a string with a binary unit as the Mooncake master parses it "
        "('8MB' = 8388608). Returned as an integer.",
    }
)
class ByteSizeSerializerField(serializers.Field):
    """Bytes in ``[1, 2**63 - 1]``, written as an integer or ``'8MB'``/``'200GB'``; read back as an integer."""

    default_error_messages = {"invalid": "{message}"}

    def __init__(self, **kwargs):
        # ModelSerializer passes the model field's range as min_value/max_value; parse_quota enforces it.
        kwargs.pop("min_value", None)
        kwargs.pop("max_value", None)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        try:
            return parse_quota(data)
        except QuotaError as error:
            self.fail("invalid", message=str(error))

    def to_representation(self, value):
        return int(value)



class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean, exactly ``true`` or ``false``: DRF's ``BooleanField`` also takes ``"yes"``, ``"on"``, ``1``,
    ``"True"`` ..., so a typo could confirm a destructive or audited action. HTML form input (the browsable
    API's forms) keeps DRF's parsing of a checkbox's text."""

    default_error_messages = {"invalid": "{input!r} is not a boolean: use true or false."}

    def to_internal_value(self, data):
        if isinstance(data, bool):
            return data
        if html.is_html_input(getattr(self.root, "initial_data", None)):
            return super().to_internal_value(data)
        self.fail("invalid", input=data)
