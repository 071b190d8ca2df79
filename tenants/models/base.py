"""Common base of registry models: timestamps, audit snapshot, field-keyed uniqueness checks."""
from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from tenants.validators import validate_text_length


class RegistryModel(models.Model):
    """Abstract base: ``created_at``/``updated_at`` and the snapshot the audit log records.

    Every domain rule lives in ``clean()`` of the concrete model, with errors keyed by field name, so the REST
    API (whose serializers call ``full_clean()``), the admin and the page forms refuse the same input with the
    same message. Multi-column uniqueness is checked there too (``unique_together_check``); the database
    constraints declared in ``Meta`` are the backstop against races, and Django's own constraint validation
    is skipped because it would report those as non-field errors with a generic message.

    ``audit_redact`` names fields whose values never reach the audit log (secrets).
    """

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    audit_redact: tuple[str, ...] = ()

    class Meta:
        abstract = True

    def validate_constraints(self, exclude=None):
        """Skipped on purpose: ``clean()`` checks each constraint with a field-specific message."""
        return None

    def clean_fields(self, exclude=None):
        """Django's field checks, plus the cap on free text: a ``TextField`` without ``max_length`` (every
        ``description``) holds at most ``MAX_TEXT_LENGTH`` characters."""
        errors: dict[str, list[ValidationError]] = {}
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as error:
            errors = error.update_error_dict(errors)
        for field in self._meta.concrete_fields:
            if not isinstance(field, models.TextField) or field.max_length is not None or field.name in errors:
                continue
            if exclude is not None and field.name in exclude:
                continue
            try:
                validate_text_length(field.value_from_object(self))
            except ValidationError as error:
                errors[field.name] = [error]
        if errors:
            raise ValidationError(errors)

    def stored(self):
        """The row as it is in the database now (``None`` for an unsaved object or a deleted row)."""
        if self.pk is None or self._state.adding:
            return None
        return type(self)._base_manager.filter(pk=self.pk).first()

    def unchanged_since(self, stored: RegistryModel) -> bool:
        """True when every concrete field except ``updated_at`` holds the same value as in ``stored`` (the row as
        it is in the database, see ``stored()``): saving ``self`` would change nothing but the timestamp."""
        return all(
            field.value_from_object(self) == field.value_from_object(stored)
            for field in self._meta.concrete_fields
            if field.name != "updated_at"
        )

    def unique_together_check(self, field: str, message: str, **lookup: Any) -> None:
        """Raise ``ValidationError({field: message})`` when another row matches ``lookup``."""
        if any(value is None for value in lookup.values()):
            return
        others = type(self)._base_manager.filter(**lookup)
        if self.pk is not None:
            others = others.exclude(pk=self.pk)
        if others.exists():
            raise ValidationError({field: message}, code="unique")

    def audit_snapshot(self) -> dict[str, Any]:
        """JSON-ready dict of the concrete fields (foreign keys as ids), secrets replaced by ``"<redacted>"``."""
        data: dict[str, Any] = {}
        for field in self._meta.concrete_fields:
            value = getattr(self, field.attname)
            data[field.attname] = "<redacted>" if field.name in self.audit_redact else value
        return json.loads(json.dumps(data, cls=DjangoJSONEncoder))

    def audit_secret_values(self) -> dict[str, Any]:
        """Raw values of the redacted fields, compared (never stored) to notice that a secret changed."""
        return {name: getattr(self, name) for name in self.audit_redact}
