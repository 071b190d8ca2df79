"""Strict parsing of query parameters: the one place where ids, date-times and counts in a URL are checked.

The ORM and the database would otherwise take a value the caller did not mean: django-filter's
``NumberFilter`` turns ``?tenant=1.5`` into tenant 1 and ``1e5`` into 100000, an id above ``2**63 - 1`` or a
date-time that leaves years 1-9999 once converted to UTC overflows SQLite's adapters (HTTP 500), and DRF's
pagination ignores ``?limit=abc``. Every list of ``/api/v1/`` (registry and telemetry) filters through
``StrictFilterSet`` subclasses and pages through ``dashboard.api.pagination``, which use these classes, so each
such value is an HTTP 400 naming the parameter.
"""
from __future__ import annotations

import datetime as dt

import django_filters as filters
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django_filters.fields import IsoDateTimeField, ModelChoiceField
from django_filters.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from rest_framework.exceptions import ValidationError as ApiValidationError

from tenants.access import scope
from tenants.validators import MAX_OBJECT_ID, parse_object_id

#: Digits of the largest count read as written (2**63 - 1: nothing in the database is larger); a longer one reads as
#: ``_HUGE_COUNT``, above every maximum.
_MAX_COUNT_DIGITS = len(str(MAX_OBJECT_ID))
_HUGE_COUNT = 10**_MAX_COUNT_DIGITS
#: Message of an id parameter that is not ASCII digits in ``[1, MAX_OBJECT_ID]``.
INVALID_ID = (f"'%(value)s' is not an object id: use a positive integer in ASCII digits (at most "
              f"{MAX_OBJECT_ID}).")
#: Message of a date-time that is valid ISO 8601 but outside years 1-9999 once converted to UTC.
OUT_OF_RANGE_DATETIME = ("'%(value)s' is out of range: a date-time must lie between 0001-01-01T00:00:00Z and "
                         "9999-12-31T23:59:59Z once converted to UTC.")


class StrictModelChoiceField(ModelChoiceField):
    """django-filter's related-object field, taking only an id in ASCII digits (``MAX_OBJECT_ID`` at most).

    Django's ``ModelChoiceField`` passes the text to ``int()``, which also accepts ``" 1"``, ``"+1"`` and
    ``"١"``; those are refused here with ``INVALID_ID``. An id no object has stays "Select a valid choice".
    """

    default_error_messages = {**ModelChoiceField.default_error_messages, "invalid_id": INVALID_ID}

    def to_python(self, value):
        if value not in self.empty_values and not isinstance(value, models.Model) and parse_object_id(value) is None:
            raise ValidationError(self.error_messages["invalid_id"], code="invalid_id", params={"value": value})
        return super().to_python(value)


class StrictModelChoiceFilter(filters.ModelChoiceFilter):
    """``?<relation>=<id>``: the related object with that id (see ``StrictModelChoiceField``), among the objects the
    requesting user may see (``tenants.access.scope``): another tenant's id is "Select a valid choice", as an id no
    object has."""

    field_class = StrictModelChoiceField

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if queryset is None:
            return None
        return scope(queryset, getattr(request, "user", None)) if request is not None else queryset.none()


class StrictIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time (``2026-11-30T12:00:00Z``; without an offset it is UTC), cleaned to an aware UTC
    ``datetime``.

    Converting to UTC here, not in the database adapter, turns a value such as ``0001-01-01T00:00:00+05:00``
    (year 0 in UTC) into ``OUT_OF_RANGE_DATETIME`` instead of an ``OverflowError`` (HTTP 500) on SQLite, and
    PostgreSQL, which would accept it, then refuses the same values.
    """

    default_error_messages = {**IsoDateTimeField.default_error_messages, "out_of_range": OUT_OF_RANGE_DATETIME}

    def to_python(self, value):
        result = super().to_python(value)
        if result is None:
            return None
        try:
            return _utc(result)
        except OverflowError:
            raise ValidationError(self.error_messages["out_of_range"], code="out_of_range",
                                  params={"value": value}) from None


def _utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; a naive value is read in the current time zone. Raises ``OverflowError`` out of range."""
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value.astimezone(dt.UTC)


class StrictIsoDateTimeFilter(filters.IsoDateTimeFilter):
    """A date-time parameter (see ``StrictIsoDateTimeField``)."""

    field_class = StrictIsoDateTimeField


def _strict_defaults() -> dict:
    defaults = dict(FILTER_FOR_DBFIELD_DEFAULTS)
    for relation in (models.ForeignKey, models.OneToOneField):
        defaults[relation] = {**defaults[relation], "filter_class": StrictModelChoiceFilter}
    defaults[models.DateTimeField] = {"filter_class": StrictIsoDateTimeFilter}
    return defaults


class StrictFilterSet(filters.FilterSet):
    """Base of every API FilterSet: filters generated from ``Meta.fields`` use the strict classes above for
    relations (ids in ASCII digits) and date-times (ISO 8601, in range); declare explicit filters with them too.
    """

    FILTER_DEFAULTS = _strict_defaults()


def count_param(raw: str | None, name: str, *, minimum: int, maximum: int | None = None) -> int | None:
    """A count in a query parameter (``?limit=``, ``?offset=``): ``None`` when absent or blank, else the integer.

    Args:
        raw: the parameter's text as received.
        name: the parameter name, used in the error.
        minimum: smallest accepted value.
        maximum: largest accepted value; ``None`` for no bound (the caller caps it).

    Raises:
        rest_framework.exceptions.ValidationError: ``raw`` is not ASCII digits or is out of range; the body is
            ``{name: [message]}`` (HTTP 400).
    """
    if raw is None or raw == "":
        return None
    value = None
    if raw.isascii() and raw.isdigit():
        # Past 19 digits a count is beyond any table; int() would raise ValueError past 4,300 digits.
        value = int(raw) if len(raw.lstrip("0")) <= _MAX_COUNT_DIGITS else _HUGE_COUNT
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"of at least {minimum}"
        raise ApiValidationError({name: [f"'{raw}' is not valid: {name} must be an integer {bound} (ASCII "
                                         "digits)."]})
    return value
