"""Model and form field for byte quantities (quotas, budgets) written as ``8MB`` / ``200GB`` or plain bytes."""
from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.quota import MAX_QUOTA_BYTES, QuotaError, format_quota, parse_quota


class ByteSizeFormField(forms.CharField):
    """Form field accepting what the Mooncake master accepts (see ``tenants.quota``); cleans to ``int`` bytes.

    Shows stored values in their exact unit form (``8388608`` as ``8MB``).
    """

    def prepare_value(self, value):
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_QUOTA_BYTES:
            return format_quota(value)
        return value

    def to_python(self, value):
        value = super().to_python(value)
        if value in self.empty_values:
            return None
        try:
            return parse_quota(value)
        except QuotaError as error:
            raise ValidationError(str(error), code="invalid_byte_size") from None


class ByteSizeField(models.BigIntegerField):
    """``BigIntegerField`` of bytes in ``[1, 2**63 - 1]`` whose forms accept ``8MB``-style strings."""

    default_validators = [MinValueValidator(1), MaxValueValidator(MAX_QUOTA_BYTES)]

    def formfield(self, **kwargs):
        defaults = {"form_class": ByteSizeFormField}
        defaults.update(kwargs)
        return super(models.BigIntegerField, self).formfield(**defaults)
