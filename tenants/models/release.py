"""Release namespace: one cache-compatible deployment of a served model (rolling upgrades, canaries)."""
from __future__ import annotations

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenants import budgets, collisions, placement
from tenants.choices import VLLM_KV_DTYPES, Engine, HashAlgo, KVCacheDtype, ReleaseState
from tenants.fields import ByteSizeField
from tenants.fingerprint import CACHE_SETTING_FIELDS, compute_fingerprint
from tenants.models.base import RegistryModel
from tenants.models.served_model import ServedModel
from tenants.validators import (
    MAX_ADAPTERS,
    MAX_HASH_SEED,
    LoraAdapter,
    lora_adapters,
    validate_adapters,
    validate_hash_seed,
    validate_new_adapter,
    validate_release_namespace,
    validate_token,
    validate_version,
    validate_weights_revision,
)

#: Upper bounds of the KV layout fields, far above any real model and inside a signed 32-bit column, so that
#: SQLite (which does not enforce column ranges) and PostgreSQL refuse the same values with the same message.
MAX_NUM_LAYERS = 4096
MAX_NUM_KV_HEADS = 4096
MAX_HEAD_DIM = 65535
#: Largest ``max_model_len`` (tokens): 2**31 - 1, what an int32 position index holds.
MAX_MODEL_LEN = (1 << 31) - 1

#: Fields that may not change once a release has served (the namespace, its model and the cache settings).
IMMUTABLE_AFTER_SERVING: tuple[str, ...] = ("model", "namespace", *CACHE_SETTING_FIELDS)


def generate_hash_seed() -> str:
    """A fresh ``PYTHONHASHSEED`` for a new release: decimal string in [0, 4294967295]."""
    return str(secrets.randbelow(MAX_HASH_SEED + 1))


class Release(RegistryModel):
    """A release namespace of a served model, with the settings that decide KV cache compatibility.

    ``namespace`` is SGLang 0.5.23 ``extra_backend_tag`` and vLLM 0.33.0 ``cache_prefix`` (unique per model).
    Cache settings (``tenants.fingerprint.CACHE_SETTING_FIELDS``): ``weights_revision``, KV layout
    ``num_layers``/``num_kv_heads``/``head_dim``/``block_size`` (tokens per block; vLLM ``--block-size``,
    SGLang ``--page-size``), ``kv_dtype``, ``quantization``, ``adapters`` (LoRA adapters, each
    ``{"name", "path"[, "rank"]}``, see ``tenants.validators.LoraAdapter``), ``engine``,
    ``engine_version``, ``hash_algo`` (vLLM ``--prefix-caching-hash-algo``) and ``hash_seed``
    (``PYTHONHASHSEED``, generated once when not given). ``fingerprint`` is the SHA-256 hex of their canonical
    encoding, recomputed on every save.

    ``state`` follows ``ReleaseState`` transitions; entering ``serving`` stamps ``first_served_at``. From then
    on the namespace, the model and every cache setting are immutable (seed: change the namespace before a
    cache-incompatible deployment), and the release cannot be deleted (its namespace stays reserved). An
    adapter's ``rank`` is not a cache setting and may change; its name and path may not. ``max_model_len`` (the
    engine's context limit, optional) is a launch setting, not a cache setting: it may change at any time.

    Every new adapter needs a path. An adapter stored without one (name-only, from before migration 0005) stays
    valid while it is unchanged, is listed by ``adapters_without_path`` and is left out of the rendered launch
    lines; to launch it, copy the release under a new namespace with the adapter's path. Likewise an adapter
    added or changed now may not have ``;`` in its name or path (``validate_new_adapter``), while a stored one
    keeps its value as long as its name and path stay the same.
    ``budget_bytes`` (optional) is the release's share of its tenant's quota; retired releases free it.
    """

    model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="releases")
    namespace = models.CharField(
        max_length=63,
        validators=[validate_release_namespace],
        help_text="SGLang extra_backend_tag and vLLM cache_prefix, e.g. 'production-2026-07'.",
    )
    state = models.CharField(max_length=16, choices=ReleaseState.choices, default=ReleaseState.WARMING)
    weights_revision = models.CharField(max_length=255, blank=True, validators=[validate_weights_revision])
    num_layers = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_NUM_LAYERS)],
        help_text=f"Transformer layers holding KV cache, 1 to {MAX_NUM_LAYERS}.",
    )
    num_kv_heads = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_NUM_KV_HEADS)],
        help_text=f"KV heads per layer (before tensor parallelism), 1 to {MAX_NUM_KV_HEADS}.",
    )
    head_dim = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_HEAD_DIM)],
        help_text=f"Elements per head, 1 to {MAX_HEAD_DIM}.",
    )
    block_size = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(1 << 20)], help_text="Tokens per KV block / page."
    )
    kv_dtype = models.CharField(max_length=32, choices=KVCacheDtype.choices, default=KVCacheDtype.AUTO)
    quantization = models.CharField(max_length=64, blank=True, validators=[validate_token])
    max_model_len = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_MODEL_LEN)],
        help_text=f"Longest context (prompt + output tokens) an instance serves, 1 to {MAX_MODEL_LEN}: vLLM "
        "--max-model-len, SGLang --context-length; blank = the model's own. Not part of the fingerprint (it "
        "changes no block hash).",
    )
    adapters = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_adapters],
        help_text='LoRA adapters: [{"name": "sql-lora", "path": "/adapters/sql-v1" or "org/sql-lora", '
        '"rank": 16 (optional)}].',
    )
    engine = models.CharField(max_length=16, choices=Engine.choices)
    engine_version = models.CharField(max_length=64, validators=[validate_version])
    hash_algo = models.CharField(max_length=16, choices=HashAlgo.choices, default=HashAlgo.SHA256)
    hash_seed = models.CharField(max_length=10, default=generate_hash_seed, validators=[validate_hash_seed])
    fingerprint = models.CharField(max_length=64, editable=False)
    budget_bytes = ByteSizeField(null=True, blank=True, help_text="Share of the tenant quota, in bytes.")
    first_served_at = models.DateTimeField(null=True, blank=True, editable=False)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["model__tenant__tenant_id", "model__served_model_name", "namespace"]
        constraints = [models.UniqueConstraint(fields=["model", "namespace"], name="uniq_release_namespace_per_model")]

    def __str__(self) -> str:
        return self.namespace

    @property
    def tenant(self):
        """The Mooncake tenant of the release (through its served model)."""
        return self.model.tenant

    @property
    def has_served(self) -> bool:
        """True once the release has entered ``serving``."""
        return self.first_served_at is not None

    @property
    def lora_adapters(self) -> list[LoraAdapter]:
        """``adapters`` as ``LoraAdapter`` values, in stored order (raises ``TypeError`` when malformed)."""
        return lora_adapters(self.adapters)

    @property
    def adapters_without_path(self) -> list[str]:
        """Names of adapters recorded without a path (before migration 0005); they cannot be launched."""
        try:
            return [adapter.name for adapter in self.lora_adapters if adapter.path is None]
        except TypeError:
            return []

    def cache_settings(self) -> dict:
        """The cache-affecting settings as a plain dict (input of the fingerprint)."""
        return {name: getattr(self, name) for name in CACHE_SETTING_FIELDS}

    def compute_fingerprint(self) -> str:
        """Fingerprint of the current (possibly unsaved) settings; see ``tenants.fingerprint``."""
        return compute_fingerprint(self.cache_settings())

    def save(self, *args, **kwargs):
        self.fingerprint = self.compute_fingerprint()
        if self.state == ReleaseState.SERVING and self.first_served_at is None:
            self.first_served_at = timezone.now()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if self.model_id is None:
            return
        stored = self.stored()
        self._clean_state(stored)
        if stored is not None and stored.has_served:
            changed = [name for name in IMMUTABLE_AFTER_SERVING if _differs(stored, self, name)]
            if changed:
                raise ValidationError(
                    {
                        name: f"Release '{stored.namespace}' has served, so its namespace and fingerprint are "
                        f"immutable: changing {name} would change which KV cache entries it reads. A new release "
                        "namespace is required: copy this release under a new namespace with the new settings."
                        for name in changed
                    }
                )
        self._clean_new_adapters(stored)
        if stored is not None and _differs(stored, self, "adapters"):
            refusal = placement.check_release_paths(self)
            if refusal is not None:
                raise ValidationError({"adapters": refusal})
        if (self.engine == Engine.VLLM and self.kv_dtype in KVCacheDtype.values and self.kv_dtype not in VLLM_KV_DTYPES
                and (stored is None or (stored.engine, stored.kv_dtype) != (self.engine, self.kv_dtype))):
            raise ValidationError({"kv_dtype": f"vLLM 0.33.0 has no '{self.kv_dtype}' KV cache (--kv-cache-dtype); "
                                   f"choose one of {', '.join(sorted(VLLM_KV_DTYPES))}."})
        if self.engine == Engine.SGLANG and self.hash_algo != HashAlgo.SHA256:
            raise ValidationError(
                {"hash_algo": "SGLang 0.5.23 hashes pages with SHA-256; hash_algo must be 'sha256' for SGLang."}
            )
        if self.namespace:
            self.unique_together_check(
                "namespace",
                f"Served model '{self.model}' already has a release with namespace '{self.namespace}'.",
                model_id=self.model_id,
                namespace=self.namespace,
            )
            collisions.check_release_vllm_collision(self)
            if stored is None or stored.namespace != self.namespace or stored.model_id != self.model_id:
                collisions.check_release_reserved_namespace(self)
        if self.state != ReleaseState.RETIRED:
            budgets.check_budget(self, self.model.tenant)
        try:
            self.fingerprint = self.compute_fingerprint()
        except (TypeError, ValueError):
            pass  # invalid settings are reported by clean_fields; save() recomputes

    def _clean_new_adapters(self, stored: Release | None) -> None:
        """Rules for adapters added or changed now; what is stored stays valid unchanged (nothing stored is lost).

        A new adapter needs a path (one stored without a path may stay as it is), an adapter whose (name, path)
        pair is not stored follows ``validate_new_adapter`` (no ``;``), and a release lists at most
        ``MAX_ADAPTERS`` adapters (one stored with more may keep them, not add any).
        """
        try:
            validate_adapters(self.adapters)
        except ValidationError:
            return  # reported by clean_fields
        stored_count = len(stored.lora_adapters) if stored is not None and _adapter_identity(stored.adapters) else 0
        if len(self.lora_adapters) > max(MAX_ADAPTERS, stored_count):
            raise ValidationError({"adapters": f"A release loads at most {MAX_ADAPTERS} LoRA adapters (it lists "
                                               f"{len(self.lora_adapters)})."})
        stored_pairs = set(_adapter_identity(stored.adapters) or []) if stored is not None else set()
        for adapter in self.lora_adapters:
            if (adapter.name, adapter.path) not in stored_pairs:
                try:
                    validate_new_adapter(adapter)
                except ValidationError as error:
                    raise ValidationError({"adapters": error.messages}) from None
        pathless = self.adapters_without_path
        if not pathless:
            return
        kept = set(stored.adapters_without_path) if stored is not None else set()
        new = [name for name in pathless if name not in kept]
        if new:
            raise ValidationError(
                {
                    "adapters": f"adapter '{new[0]}' needs a path: the absolute directory (e.g. '/adapters/sql-v1') "
                    "or hub id ('org/sql-lora') the engines load it from. vLLM puts the path into every block "
                    "hash of the adapter's requests, so it is part of the release's cache identity."
                }
            )

    def _clean_state(self, stored: Release | None) -> None:
        if self.state not in ReleaseState.values:
            return
        if stored is None:
            if self.state not in ReleaseState.initial():
                raise ValidationError(
                    {"state": f"A new release must start as 'warming' or 'serving', not '{self.state}'."}
                )
            return
        if self.state != stored.state and self.state not in ReleaseState.allowed_next(stored.state):
            allowed = ", ".join(f"'{s}'" for s in ReleaseState.allowed_next(stored.state)) or "none (final state)"
            raise ValidationError(
                {"state": f"A release cannot move from '{stored.state}' to '{self.state}'; allowed: {allowed}."}
            )


def _differs(stored: Release, current: Release, name: str) -> bool:
    if name == "model":
        return stored.model_id != current.model_id
    if name == "adapters":
        return _adapter_identity(stored.adapters) != _adapter_identity(current.adapters)
    return getattr(stored, name) != getattr(current, name)


def _adapter_identity(value: object) -> list[tuple[str, str | None]] | None:
    """What of the adapters decides the cache: (name, path) pairs sorted by name; ``None`` when malformed."""
    try:
        pairs = [(adapter.name, adapter.path) for adapter in lora_adapters(value)]
    except TypeError:
        return None
    return sorted(pairs, key=repr)


def refuse_served_release_delete(sender, instance: Release, **kwargs) -> None:
    """``pre_delete`` guard: a release that has served keeps its row so its namespace is never reused.

    Raises ``django.db.models.ProtectedError``; connected in ``TenantsConfig.ready`` so that queryset and
    cascade deletes are refused too.
    """
    stored_first_served = type(instance)._base_manager.filter(pk=instance.pk).values_list(
        "first_served_at", flat=True
    ).first()
    if stored_first_served is not None:
        raise models.ProtectedError(
            f"Release '{instance.namespace}' has served and cannot be deleted: retire it instead, so that its "
            "namespace stays reserved and no later release reads its cached KV.",
            {instance},
        )
