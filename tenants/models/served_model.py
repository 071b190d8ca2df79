"""Served model: what SGLang calls ``--served-model-name`` and what vLLM derives from the model path."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from agent.contract.keys import sglang_model_component, vllm_model_name
from tenants import collisions, placement
from tenants.models.base import RegistryModel
from tenants.models.tenant import Tenant
from tenants.validators import (
    validate_model_location,
    validate_model_path,
    validate_served_model_name,
)


class ServedModel(RegistryModel):
    """A model served inside one tenant (a Mooncake tenant separates key spaces, so rules are per tenant).

    * ``served_model_name`` — SGLang 0.5.23 ``--served-model-name``; its key prefix replaces ``/`` by ``-``,
      so two names that differ only there are refused.
    * ``model_path`` — what both engines load: a hub id, or an absolute directory in normal form, which must lie
      under the ``model_roots`` of every node running the model (``tenants.placement``); a path set or changed
      now follows ``validate_model_location``, stored ones keep their value.
    * ``vllm_model_name`` — derived, stored, read-only: vLLM 0.33.0's key identifier (last path component).
      Two models of a tenant with the same ``vllm_model_name`` may exist only while their releases use
      distinct ``cache_prefix`` values (release namespaces).

    Note: the foreign key attribute ``tenant_id`` here is the tenant's primary key; the Mooncake name is
    ``tenant.tenant_id``. Once a release of the model has served, ``tenant``, ``served_model_name`` and
    ``model_path`` are immutable (they are part of every stored key).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="served_models")
    served_model_name = models.CharField(max_length=255, validators=[validate_served_model_name])
    model_path = models.CharField(max_length=1024, validators=[validate_model_path])
    vllm_model_name = models.CharField(max_length=1024, editable=False)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["tenant__tenant_id", "served_model_name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "served_model_name"], name="uniq_served_model_name_per_tenant")
        ]

    def __str__(self) -> str:
        return self.served_model_name

    @property
    def sglang_model_key(self) -> str:
        """The model part of SGLang 0.5.23 store keys: ``served_model_name`` with ``/`` replaced by ``-``."""
        return sglang_model_component(self.served_model_name)

    def _derive_vllm_model_name(self) -> None:
        """``vllm_model_name`` from ``model_path`` (``agent.contract.keys.vllm_model_name``); "" for a path without
        a last component, which ``validate_model_path`` refuses."""
        try:
            self.vllm_model_name = vllm_model_name(self.model_path or "")
        except ValueError:
            self.vllm_model_name = ""

    def has_served(self) -> bool:
        """True when one of this model's releases has ever served."""
        return self.pk is not None and self.releases.filter(first_served_at__isnull=False).exists()

    def save(self, *args, **kwargs):
        self._derive_vllm_model_name()
        super().save(*args, **kwargs)

    def _clean_new_model_path(self) -> None:
        """Rules for a model path set or changed now: its form (``validate_model_location``), and the model roots
        of the nodes that run the model's releases (``tenants.placement``). Raises ``ValidationError`` on
        ``model_path``; a path the field's own rule refuses is left to it."""
        try:
            validate_model_path(self.model_path)
        except ValidationError:
            return
        try:
            validate_model_location(self.model_path)
        except ValidationError as error:
            raise ValidationError({"model_path": error.messages}) from None
        refusal = placement.check_model_paths(self)
        if refusal is not None:
            raise ValidationError({"model_path": refusal})

    def clean(self) -> None:
        self._derive_vllm_model_name()
        if self.tenant_id is None or not self.served_model_name or not self.model_path:
            return
        stored = self.stored()
        if stored is not None and stored.has_served():
            changed = {
                name: value
                for name, value in (
                    ("tenant", stored.tenant_id != self.tenant_id),
                    ("served_model_name", stored.served_model_name != self.served_model_name),
                    ("model_path", stored.model_path != self.model_path),
                )
                if value
            }
            if changed:
                raise ValidationError(
                    {
                        name: f"{name} cannot change: releases of served model '{stored.served_model_name}' have "
                        "served and every cached key contains it. Create a new served model (with a new release "
                        "namespace) instead."
                        for name in changed
                    }
                )
        if stored is not None and stored.tenant_id != self.tenant_id and stored.releases.exists():
            raise ValidationError(
                {
                    "tenant": f"Served model '{stored.served_model_name}' has releases in tenant '{stored.tenant}' "
                    "(their budgets and cached keys belong to it); it cannot move to another tenant. Create the "
                    "model in the other tenant instead."
                }
            )
        self.unique_together_check(
            "served_model_name",
            f"Tenant '{self.tenant}' already has a served model named '{self.served_model_name}'.",
            tenant_id=self.tenant_id,
            served_model_name=self.served_model_name,
        )
        if stored is None or stored.model_path != self.model_path:
            self._clean_new_model_path()
        collisions.check_sglang_prefix(self)
        collisions.check_model_vllm_collisions(self)
        if stored is not None:
            moved = [name for name, attr in (("served_model_name", "served_model_name"), ("model_path", "model_path"),
                                             ("tenant", "tenant_id")) if getattr(stored, attr) != getattr(self, attr)]
            if moved:
                collisions.check_model_reserved_namespaces(self, self.tenant.tenant_id, moved[0])
