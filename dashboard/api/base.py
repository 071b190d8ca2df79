"""Base classes of the API: one serializer base that runs the model rules, one viewset base for writes.

NetBox-style: every rule lives in the model's ``clean()``; ``ValidatedModelSerializer`` calls
``full_clean()`` (DRF does not) through ``tenants.services.validated_save`` — one transaction holding the
owning tenant's lock — and turns Django ``ValidationError`` into an HTTP 400 keyed by field. DRF's own
uniqueness validators are removed so that uniqueness messages are the model's.
"""
from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import ProtectedError
from django.http import Http404
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.validators import UniqueTogetherValidator, UniqueValidator

from dashboard.api.fields import ByteSizeSerializerField
from dashboard.api.filtersets import BoundedSearchFilter, StrictOrderingFilter
from dashboard.api.permissions import RegistryModelPermissions, check_object_write
from tenants.access import scope
from tenants.fields import ByteSizeField
from tenants.services import validated_save
from tenants.validators import MAX_OBJECT_ID, MAX_TEXT_LENGTH, parse_object_id


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
    Only objects the requesting user may see are taken (``tenants.access.scope``): another tenant's id is "does not
    exist", as an id no object has.
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

    def get_queryset(self):
        queryset = super().get_queryset()
        request = self.context.get("request")
        return scope(queryset, request.user) if request is not None and queryset is not None else queryset


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Model serializer whose writes go through ``full_clean()`` and a transaction (see module docstring).

    Foreign keys are ``StrictPrimaryKeyRelatedField`` (integers only, no silent truncation of ``1.5``); free text
    (a ``TextField`` without ``max_length``: every ``description``) takes at most ``MAX_TEXT_LENGTH`` characters,
    the cap ``RegistryModel.clean_fields`` applies, so the schema documents it as ``maxLength``.
    """

    serializer_related_field = StrictPrimaryKeyRelatedField
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        ByteSizeField: ByteSizeSerializerField,
    }

    def build_standard_field(self, field_name, model_field):
        field_class, kwargs = super().build_standard_field(field_name, model_field)
        if isinstance(model_field, models.TextField) and model_field.max_length is None and model_field.editable:
            kwargs["max_length"] = MAX_TEXT_LENGTH
        return field_class, kwargs

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


class ObjectIdLookupMixin:
    """Detail routes (``/{id}/``) of a viewset take the id the way every id parameter is taken
    (``tenants.validators.parse_object_id``): ASCII digits in ``[1, 2**63 - 1]``. Anything else (``١``, ``+1``,
    ``01x``, an id past 64 bits) is HTTP 404 before any query, as an id no object has is: the ORM would otherwise
    turn ``١`` into object 1."""

    def get_object(self):
        lookup = self.lookup_url_kwarg or self.lookup_field
        if lookup in self.kwargs and parse_object_id(self.kwargs[lookup]) is None:
            name = self.get_queryset().model._meta.verbose_name
            raise Http404(f"No {name} has the id {self.kwargs[lookup][:40]!r}.")
        return super().get_object()


class TenantScopedMixin:
    """``get_queryset`` narrowed to the rows the user may see (``tenants.access.scope``): another tenant's object
    is not listed, and its detail route is HTTP 404 as for an id no object has."""

    def get_queryset(self):
        return scope(super().get_queryset(), self.request.user)


class RegistryViewSet(TenantScopedMixin, ObjectIdLookupMixin, viewsets.ModelViewSet):
    """CRUD viewset of a registry model.

    Reads for any authenticated user, scoped to the user's tenants (``TenantScopedMixin``); writes with the
    model's add/change/delete permission in the object's tenant (``RegistryModelPermissions``), checked again on
    the object as it would be saved, so that nothing is created in or moved into a tenant the user may not write;
    ``?search=`` looks for words in the view's ``search_fields`` (``BoundedSearchFilter``); an invalid filter,
    ``search`` or ``ordering`` value is a 400 naming the parameter; pages keep a stable order (primary key
    last); deletes run in a transaction and a
    refused delete answers 409 with the reason; ids in the path follow ``ObjectIdLookupMixin``.
    """

    permission_classes = [RegistryModelPermissions]
    filter_backends = [DjangoFilterBackend, BoundedSearchFilter, StrictOrderingFilter]

    def perform_create(self, serializer):
        model = serializer.Meta.model
        check_object_write(self.request, model, proposed_object(model, serializer.validated_data))
        serializer.save()

    def perform_update(self, serializer):
        instance = serializer.instance
        check_object_write(self.request, type(instance),
                           proposed_object(type(instance), serializer.validated_data, instance))
        serializer.save()

    def perform_destroy(self, instance):
        try:
            with transaction.atomic():
                instance.delete()
        except ProtectedError as error:
            raise Conflict(protected_message(instance, error)) from None


def proposed_object(model, data: dict, stored=None):
    """An unsaved ``model`` object: ``stored``'s field values (when given) with the model fields of ``data`` (a
    serializer's ``validated_data``) over them — what a write would save, to check permissions on."""
    names = {field.name for field in model._meta.concrete_fields}
    values = {field.attname: getattr(stored, field.attname) for field in model._meta.concrete_fields} if stored else {}
    proposed = model(**values)
    for name, value in data.items():
        if name in names:
            setattr(proposed, name, value)
    return proposed
