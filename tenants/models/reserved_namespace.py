"""Reserved release namespace: the namespace of a deleted (or renamed) release, kept so no later release reuses it."""
from __future__ import annotations

from django.db import models

from agent.contract.keys import sglang_model_component
from tenants.choices import ReleaseState
from tenants.models.base import RegistryModel


class ReservedNamespace(RegistryModel):
    """A release namespace that may hold KV cache entries in the Store and may never be given to another release
    of the same model key in the same tenant.

    A release in any state (warming, serving, draining, retired) may have had engines write keys
    (``<cache_prefix>@<vLLM model name>@...`` for vLLM 0.33.0, ``<extra_backend_tag>_<served model name>_...`` for
    SGLang 0.5.23) that stay in the Mooncake Store until evicted or purged; a new release under the same
    namespace, with other weights or settings, would read them. So when a release is deleted, or its namespace
    or model changes, the old (tenant, model, namespace) is recorded here — written by the ``pre_delete`` /
    ``pre_save`` receivers ``reserve_deleted_release_namespace`` / ``reserve_renamed_release_namespace`` in the
    change's transaction, audited — and ``Release.clean`` refuses it for good, like a served release's namespace
    (which keeps its row) and a deleted request group's salt (``ReservedSalt``).

    ``tenant_id`` is the Mooncake tenant id as text (the tenant may be deleted later); ``served_model_name`` and
    ``vllm_model_name`` are the model's key names then; ``release_pk`` the id the release had (the purge
    requests of a deleted release are audited under it); ``purge_id`` the purge the dashboard requested for
    the namespace's keys when the release was deleted ("" when none could be sent).
    """

    class Reason(models.TextChoices):
        DELETED = "deleted", "Release deleted"
        RENAMED = "renamed", "Release moved to another namespace or model"

    tenant_id = models.CharField(max_length=255)
    served_model_name = models.CharField(max_length=255)
    vllm_model_name = models.CharField(max_length=1024)
    namespace = models.CharField(max_length=63)
    engine = models.CharField(max_length=16)
    fingerprint = models.CharField(max_length=64, blank=True)
    release_state = models.CharField(max_length=16, choices=ReleaseState.choices)
    release_pk = models.PositiveBigIntegerField(help_text="Id of the release that used the namespace.")
    reason = models.CharField(max_length=16, choices=Reason.choices)
    purge_id = models.CharField(max_length=64, blank=True, help_text="Purge requested for the namespace's keys.")

    class Meta:
        ordering = ["tenant_id", "served_model_name", "namespace"]
        constraints = [models.UniqueConstraint(fields=["tenant_id", "served_model_name", "namespace"],
                                               name="uniq_reserved_namespace")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.served_model_name}/{self.namespace} (reserved)"

    def blocks(self, served_model_name: str, vllm_model_name: str) -> bool:
        """True when a release of a model with these names under this namespace would meet the reserved keys:
        same served model name, same vLLM model name, or the same SGLang key component (``/`` -> ``-``)."""
        return (served_model_name == self.served_model_name or vllm_model_name == self.vllm_model_name
                or sglang_model_component(served_model_name) == sglang_model_component(self.served_model_name))


def reservation_for(tenant_id: str, namespace: str, served_model_name: str, vllm_model_name: str, *,
                    exclude_release_pk: int | None = None) -> ReservedNamespace | None:
    """The reservation a release with these names would collide with, or ``None``.

    ``exclude_release_pk`` leaves out what that release itself left behind (a model or tenant rename re-checks
    the model's existing releases, whose own keys are no one else's)."""
    reservations = ReservedNamespace.objects.filter(tenant_id=tenant_id, namespace=namespace)
    if exclude_release_pk is not None:
        reservations = reservations.exclude(release_pk=exclude_release_pk)
    for reservation in reservations:
        if reservation.blocks(served_model_name, vllm_model_name):
            return reservation
    return None


def reserve_release_namespace(release, reason: str) -> ReservedNamespace:
    """Record the namespace of ``release`` (as stored now) as reserved; returns the (possibly existing) row."""
    model = release.model
    reservation, _ = ReservedNamespace.objects.get_or_create(
        tenant_id=model.tenant.tenant_id, served_model_name=model.served_model_name, namespace=release.namespace,
        defaults={"vllm_model_name": model.vllm_model_name, "engine": release.engine,
                  "fingerprint": release.fingerprint, "release_state": release.state, "release_pk": release.pk,
                  "reason": reason},
    )
    return reservation


def reserve_deleted_release_namespace(sender, instance, **kwargs) -> None:
    """``pre_delete`` receiver of ``Release``: reserve its namespace (every delete path: API, pages, admin,
    querysets). Connected after the served-release guard, so a refused delete reserves nothing."""
    stored = type(instance)._base_manager.select_related("model__tenant").filter(pk=instance.pk).first()
    if stored is not None:
        reserve_release_namespace(stored, ReservedNamespace.Reason.DELETED)


def reserve_namespaces_of(releases, reason: str) -> int:
    """Reserve the namespace of every release in ``releases`` (a queryset, read as stored); returns the count."""
    count = 0
    for release in releases.select_related("model__tenant"):
        reserve_release_namespace(release, reason)
        count += 1
    return count


def reserve_renamed_model_namespaces(sender, instance, raw=False, **kwargs) -> None:
    """``pre_save`` receiver of ``ServedModel``: when a stored model changes its key names (served model name,
    model path) or tenant, reserve its releases' namespaces under the old names."""
    if raw or instance.pk is None:
        return
    stored = type(instance)._base_manager.filter(pk=instance.pk).first()
    if stored is None:
        return
    moved = (stored.served_model_name != instance.served_model_name or stored.model_path != instance.model_path
             or stored.tenant_id != instance.tenant_id)
    if moved:
        from tenants.models.release import Release

        reserve_namespaces_of(Release.objects.filter(model_id=instance.pk), ReservedNamespace.Reason.RENAMED)


def reserve_renamed_tenant_namespaces(sender, instance, raw=False, **kwargs) -> None:
    """``pre_save`` receiver of ``Tenant``: when a stored tenant changes its ``tenant_id``, reserve its releases'
    namespaces under the old id (their keys stay in that Mooncake tenant)."""
    if raw or instance.pk is None:
        return
    old = type(instance)._base_manager.filter(pk=instance.pk).values_list("tenant_id", flat=True).first()
    if old is not None and old != instance.tenant_id:
        from tenants.models.release import Release

        reserve_namespaces_of(Release.objects.filter(model__tenant_id=instance.pk), ReservedNamespace.Reason.RENAMED)


def reserve_renamed_release_namespace(sender, instance, raw=False, **kwargs) -> None:
    """``pre_save`` receiver of ``Release``: when a stored release moves to another namespace or model, reserve
    the namespace it leaves (its engines may have written keys there)."""
    if raw or instance.pk is None:
        return
    stored = type(instance)._base_manager.select_related("model__tenant").filter(pk=instance.pk).first()
    if stored is not None and (stored.namespace != instance.namespace or stored.model_id != instance.model_id):
        reserve_release_namespace(stored, ReservedNamespace.Reason.RENAMED)


def delete_consequences(release) -> str:
    """What a confirmed delete of ``release`` does, for the confirmation prompt of the API, the pages and the admin."""
    model = release.model
    return (
        f"Release '{release.namespace}' ({release.state}) of served model '{model.served_model_name}' (tenant "
        f"'{model.tenant.tenant_id}') may hold KV cache entries in the Store under its namespace. Deleting it "
        f"reserves namespace '{release.namespace}' for this model for good (no later release may use it, so none "
        "reads those entries) and asks the tenant's agents to purge its keys; the delete and the purge are audited."
    )
