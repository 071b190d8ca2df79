"""Domain operations that span more than one save: validated writes under a tenant lock, release copies.

Each runs in one transaction and locks the owning tenant row first (``SELECT ... FOR UPDATE`` on PostgreSQL;
SQLite serialises writers anyway), so two concurrent budget changes cannot both pass the budget check, then the
nodes whose placement rules the write checks (``tenants.placement``: GPUs, instance caps, model roots), so two
tenants' concurrent assignments cannot both take one GPU or the last place on a node.
"""
from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from tenants import placement
from tenants.choices import ReleaseState
from tenants.fingerprint import CACHE_SETTING_FIELDS
from tenants.models import (
    InstanceAssignment,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tenants.models.base import RegistryModel


def owning_tenant_pk(obj: Any) -> int | None:
    """Primary key of the tenant whose budgets or key space ``obj`` affects (``None`` for nodes)."""
    if isinstance(obj, Tenant):
        return obj.pk
    if isinstance(obj, (ServedModel, RequestGroup)):
        return obj.tenant_id
    if isinstance(obj, Release) and obj.model_id is not None:
        return ServedModel.objects.filter(pk=obj.model_id).values_list("tenant_id", flat=True).first()
    if isinstance(obj, InstanceAssignment) and obj.release_id is not None:
        return Release.objects.filter(pk=obj.release_id).values_list("model__tenant_id", flat=True).first()
    return None


def lock_tenant(tenant_pk: int | None) -> None:
    """Lock the tenant row until the end of the current transaction (no-op for ``None``)."""
    if tenant_pk is not None:
        list(Tenant.objects.select_for_update().filter(pk=tenant_pk).values_list("pk", flat=True))


def validated_save(obj: Any, **save_kwargs: Any) -> Any:
    """``full_clean()`` then ``save()`` inside one transaction holding the owning tenant's lock and the locks of the
    nodes it places instances on (``tenants.placement.placement_node_pks``); returns ``obj``.

    Raises Django ``ValidationError`` (keyed by field) and writes nothing when a rule refuses the change. An
    update that changes no field (after ``clean()`` derived its values) is not saved at all: ``updated_at``
    keeps its value, no audit entry is written and no config push is scheduled.
    """
    with transaction.atomic():
        lock_tenant(owning_tenant_pk(obj))
        placement.lock_nodes(placement.placement_node_pks(obj))
        obj.full_clean()
        stored = obj.stored() if isinstance(obj, RegistryModel) else None
        if stored is not None and obj.unchanged_since(stored):
            return obj
        obj.save(**save_kwargs)
    return obj


def build_release_copy(
    release: Release,
    namespace: str,
    *,
    state: str = ReleaseState.WARMING,
    budget_bytes: int | None = None,
    description: str | None = None,
    **overrides: Any,
) -> Release:
    """The unsaved release ``copy_release`` would create (same arguments); ``full_clean()`` it to see its errors.

    Raises ``ValidationError`` keyed by the name of each override that is not a cache setting.
    """
    unknown = sorted(set(overrides) - set(CACHE_SETTING_FIELDS))
    if unknown:
        raise ValidationError(
            {
                name: f"'{name}' is not a cache setting of a release; it cannot be overridden in a copy."
                for name in unknown
            }
        )
    settings = {name: getattr(release, name) for name in CACHE_SETTING_FIELDS}
    settings["adapters"] = list(settings["adapters"] or [])
    settings.update(overrides)
    return Release(
        model_id=release.model_id,
        namespace=namespace,
        state=state,
        budget_bytes=budget_bytes,
        description=release.description if description is None else description,
        max_model_len=release.max_model_len,
        **settings,
    )


def copy_release(
    release: Release,
    namespace: str,
    *,
    state: str = ReleaseState.WARMING,
    budget_bytes: int | None = None,
    description: str | None = None,
    **overrides: Any,
) -> Release:
    """Create a release of the same model under ``namespace`` with ``release``'s cache settings.

    This is the first step of a rolling upgrade: the copy starts ``warming`` (or ``state``), keeps the hash
    seed, ``max_model_len`` and every setting of ``tenants.fingerprint.CACHE_SETTING_FIELDS`` unless
    ``overrides`` replaces some (e.g. ``weights_revision="v2"``), and gets ``budget_bytes`` (default: none, so
    the copy does not take the old release's budget twice). Raises ``ValidationError`` for unknown override
    names and for any rule the new release breaks (namespace taken, collisions, budget over quota); nothing is
    written then.
    """
    copy = build_release_copy(release, namespace, state=state, budget_bytes=budget_bytes, description=description,
                              **overrides)
    return validated_save(copy)
