"""Base classes of the API: one serializer base that runs the model rules, one viewset base for writes.

NetBox-style: every rule lives in the model's ``clean()``; ``ValidatedModelSerializer`` calls
``full_clean()`` (DRF does not) through ``tenants.services.validated_save`` — one transaction holding the
owning tenant's lock — and turns Django ``ValidationError`` into an HTTP 400 keyed by field. DRF's own
uniqueness validators are removed so that uniqueness messages are the model's.
"""
from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.validators import UniqueTogetherValidator, UniqueValidator

from dashboard.api.fields import ByteSizeSerializerField
from dashboard.api.filtersets import StrictOrderingFilter
from dashboard.api.permissions import RegistryModelPermissions
from tenants.fields import ByteSizeField
from tenants.services import validated_save
from tenants.validators import MAX_OBJECT_ID, parse_object_id


class Conflict(exceptions.APIException):
    """HTTP 409: the change conflicts with existing objects (e.g. a delete of something still referenced)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state of the registry."
    default_code = "conflict"


def drf_detail(error: DjangoValidationError) -> dict[str, list[str]]:
    """Django ``ValidationError`` -> DRF error dict; non-field errors under ``non_field_errors``."""
    if hasattr(error, "error_dict"):
        return {
            ("non_field_errors" if field == NON_FIELD_ERRORS else field): messages
            for field, messages in error.message_dict.items()
        }
    return {"non_field_errors": error.messages}


def save_or_400(instance):
    """``validated_save(instance)``; rule violations become HTTP 400, races on constraints too."""
    try:
        return validated_save(instance)
    except DjangoValidationError as error:
        raise serializers.ValidationError(drf_detail(error)) from None
    except IntegrityError:
        raise serializers.ValidationError(
            {"non_field_errors": ["The change conflicts with a concurrent change to the registry; retry."]}
        ) from None


class StrictPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A related object's id: a JSON integer or a string of ASCII digits, in ``[1, 2**63 - 1]``.

    DRF's ``PrimaryKeyRelatedField`` hands the value to the ORM, which truncates ``1.5`` (or ``"1.9"``, ``true``)
    to ``1`` and silently picks another object; this field refuses such values with HTTP 400 naming the field.
    """

    default_error_messages = {
        **serializers.PrimaryKeyRelatedField.default_error_messages,
        "incorrect_type": "Incorrect type. Expected an object id (a positive integer), received {data_type}.",
    }

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("incorrect_type", data_type=type(data).__name__)
        object_id = data if isinstance(data, int) else parse_object_id(data)
        if object_id is None or not 0 < object_id <= MAX_OBJECT_ID:
            self.fail("does_not_exist", pk_value=data)
        return super().to_internal_value(object_id)


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Model serializer whose writes go through ``full_clean()`` and a transaction (see module docstring).

    Foreign keys are ``StrictPrimaryKeyRelatedField`` (integers only, no silent truncation of ``1.5``).
    """

    serializer_related_field = StrictPrimaryKeyRelatedField
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        ByteSizeField: ByteSizeSerializerField,
    }

    def get_fields(self):
        fields = super().get_fields()
        for field in fields.values():
            field.validators = [v for v in field.validators if not isinstance(v, UniqueValidator)]
        return fields

    def get_validators(self):
        return [v for v in super().get_validators() if not isinstance(v, UniqueTogetherValidator)]

    def create(self, validated_data):
        return save_or_400(self.Meta.model(**validated_data))

    def update(self, instance, validated_data):
        for name, value in validated_data.items():
            setattr(instance, name, value)
        return save_or_400(instance)


def protected_message(instance, error: ProtectedError) -> str:
    """Readable reason for a refused delete."""
    protected = list(error.protected_objects)
    if instance in protected:
        return str(error.args[0])
    counts: dict[str, int] = {}
    for obj in protected:
        counts[obj._meta.model_name] = counts.get(obj._meta.model_name, 0) + 1
    kinds = [
        f"{count} {obj._meta.verbose_name if count == 1 else obj._meta.verbose_name_plural}"
        for obj in {type(o): o for o in protected}.values()
        for count in [counts[obj._meta.model_name]]
    ]
    names = ", ".join(str(obj) for obj in protected[:5]) + (" ..." if len(protected) > 5 else "")
    return f"'{instance}' is still referenced by {' and '.join(kinds)} ({names}); remove them first."


class RegistryViewSet(viewsets.ModelViewSet):
    """CRUD viewset of a registry model.

    Reads for any authenticated user, writes with the model's add/change/delete permission
    (``RegistryModelPermissions``); an invalid filter or ``ordering`` value is a 400 naming the parameter;
    deletes run in a transaction and a refused delete answers 409 with the reason.
    """

    permission_classes = [RegistryModelPermissions]
    filter_backends = [DjangoFilterBackend, StrictOrderingFilter]

    def perform_destroy(self, instance):
        try:
            with transaction.atomic():
                instance.delete()
        except ProtectedError as error:
            raise Conflict(protected_message(instance, error)) from None
