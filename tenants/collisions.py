"""Key-space collision rules between models of one tenant (a Mooncake tenant separates key spaces).

* vLLM 0.33.0 keys start with ``[<cache_prefix>@]<vllm model name>@``: two models whose model paths end in the
  same component (``Qwen/Qwen3-8B`` and ``/models/Qwen3-8B``) write the same keys unless their releases use
  distinct ``cache_prefix`` values. Refused on the release's ``namespace`` (or the model's ``model_path``).
* SGLang 0.5.23 keys start with ``<extra_backend_tag>_<served model name, '/' -> '-'>_``: ``org/m`` and
  ``org-m`` write the same keys. Refused on ``served_model_name``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db.models import Value
from django.db.models.functions import Replace

from agent.contract.keys import sglang_model_component

if TYPE_CHECKING:
    from tenants.models import Release, ServedModel


def _collision_message(model: ServedModel, other: Release) -> str:
    return (
        f"vLLM model name '{model.vllm_model_name}' collides with served model "
        f"'{other.model.served_model_name}' (model_path '{other.model.model_path}') of tenant "
        f"'{other.model.tenant}', whose release already uses cache_prefix '{other.namespace}': models with the "
        "same vLLM model name write the same store keys, so their releases need distinct cache_prefix values "
        "(release namespaces)."
    )


def check_sglang_prefix(model: ServedModel) -> None:
    """Refuse a served model name whose SGLang key part (``/`` -> ``-``) equals another model's in the tenant."""
    from tenants.models import ServedModel

    key = sglang_model_component(model.served_model_name)
    other = (
        ServedModel.objects.filter(tenant_id=model.tenant_id)
        .exclude(pk=model.pk)
        .exclude(served_model_name=model.served_model_name)
        .annotate(sglang_key=Replace("served_model_name", Value("/"), Value("-")))
        .filter(sglang_key=key)
        .first()
    )
    if other is not None:
        raise ValidationError(
            {
                "served_model_name": f"served_model_name '{model.served_model_name}' and served model "
                f"'{other.served_model_name}' give the same SGLang key prefix '{key}' (SGLang replaces '/' "
                "by '-'), so their KV cache entries would mix. Choose a distinct name."
            }
        )


def check_release_vllm_collision(release: Release) -> None:
    """Refuse a release namespace already used by a release of another model with the same vLLM model name."""
    from tenants.models import Release

    model = release.model
    other = (
        Release.objects.filter(
            model__tenant_id=model.tenant_id,
            model__vllm_model_name=model.vllm_model_name,
            namespace=release.namespace,
        )
        .exclude(model_id=model.pk)
        .select_related("model__tenant")
        .first()
    )
    if other is not None:
        raise ValidationError({"namespace": _collision_message(model, other)})


def check_model_vllm_collisions(model: ServedModel) -> None:
    """Refuse a model path whose vLLM name collides with another model that shares one of its namespaces."""
    from tenants.models import Release

    if model.pk is None:
        return
    namespaces = list(Release.objects.filter(model_id=model.pk).values_list("namespace", flat=True))
    if not namespaces:
        return
    other = (
        Release.objects.filter(
            model__tenant_id=model.tenant_id,
            model__vllm_model_name=model.vllm_model_name,
            namespace__in=namespaces,
        )
        .exclude(model_id=model.pk)
        .select_related("model__tenant")
        .first()
    )
    if other is not None:
        raise ValidationError({"model_path": _collision_message(model, other)})


def _reserved_message(reservation, namespace: str) -> str:
    when = f"{reservation.created_at:%Y-%m-%d}" if reservation.created_at else "earlier"
    verb = "was deleted" if reservation.reason == "deleted" else "moved away from it"
    return (
        f"Namespace '{namespace}' is reserved: release '{reservation.namespace}' of served model "
        f"'{reservation.served_model_name}' (tenant '{reservation.tenant_id}', {reservation.release_state}) {verb} "
        f"on {when}, and its KV cache entries may still be in the Store under this namespace; a release with other "
        "weights or settings here would read them. Namespaces stay reserved forever: choose a new namespace."
    )


def check_release_reserved_namespace(release: Release) -> None:
    """Refuse a release namespace reserved by a deleted or renamed release of the same model key (tenant, served
    model name, vLLM model name or SGLang key component): ``tenants.models.ReservedNamespace``."""
    from tenants.models.reserved_namespace import reservation_for

    model = release.model
    reservation = reservation_for(model.tenant.tenant_id, release.namespace, model.served_model_name,
                                  model.vllm_model_name)
    if reservation is not None:
        raise ValidationError({"namespace": _reserved_message(reservation, release.namespace)}, code="reserved")


def check_model_reserved_namespaces(model: ServedModel, tenant_id: str, field: str) -> None:
    """Refuse a served model change (``field``: its name, path or tenant) that would put one of its releases'
    namespaces on reserved keys (``tenant_id``: the Mooncake tenant id the model would have)."""
    from tenants.models import Release
    from tenants.models.reserved_namespace import reservation_for

    if model.pk is None:
        return
    for release_pk, namespace in Release.objects.filter(model_id=model.pk).values_list("pk", "namespace"):
        reservation = reservation_for(tenant_id, namespace, model.served_model_name, model.vllm_model_name,
                                      exclude_release_pk=release_pk)
        if reservation is not None:
            raise ValidationError({field: _reserved_message(reservation, namespace)}, code="reserved")


def check_tenant_reserved_namespaces(tenant) -> None:
    """Refuse a ``tenant_id`` change that would put one of the tenant's release namespaces on keys reserved under
    the new id (error on ``tenant_id``)."""
    from tenants.models import ServedModel

    if tenant.pk is None:
        return
    for model in ServedModel.objects.filter(tenant_id=tenant.pk):
        check_model_reserved_namespaces(model, tenant.tenant_id, "tenant_id")
