"""Serializers of the registry resources. Validation is the models' ``clean()`` (see ``base``)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dashboard.api.base import ValidatedModelSerializer
from dashboard.api.fields import ByteSizeSerializerField, StrictBooleanField
from tenants import budgets
from tenants.choices import Engine, HashAlgo, KVCacheDtype, ReleaseState
from tenants.models import (
    AuditEntry,
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ReservedNamespace,
    ServedModel,
    Tenant,
    TenantMembership,
)
from tenants.quota import format_quota
from tenants.validators import MAX_MODEL_ROOTS, MAX_PATH_LENGTH, validate_adapters

_TIMESTAMPS = ("created_at", "updated_at")


class TenantSerializer(ValidatedModelSerializer):
    """A Mooncake tenant; ``quota_bytes`` (the requested quota) accepts ``8MB``-style strings and is returned in
    bytes; ``effective_quota_bytes`` and ``charged_bytes`` are the newest read-back from the master.

    A write that raises the requested total above the pool's mounted capacity (or while the capacity is unknown)
    is refused with HTTP 400 on ``confirm_overcommit`` unless that is ``true`` (``dashboard.master.capacity``);
    a confirmed overcommit is audited.
    """

    quota = serializers.SerializerMethodField(help_text="quota_bytes in the master's policy notation, e.g. '8MB'.")
    budgeted_bytes = serializers.SerializerMethodField(help_text="Sum of the budgets given out inside the quota.")
    effective_quota_bytes = serializers.SerializerMethodField(
        help_text="Quota the master applies now (requested quota scaled down to the mounted capacity), from the "
        "newest master read-back; null before the first one.")
    charged_bytes = serializers.SerializerMethodField(
        help_text="Bytes the master charges the tenant now, from the newest master read-back; null before the "
        "first one.")
    confirm_overcommit = StrictBooleanField(
        write_only=True, required=False, default=False,
        help_text="Save even though the requested quotas then exceed the pool's mounted capacity (or the capacity "
        "is unknown): other tenants' effective quotas may drop. Audited.")

    class Meta:
        model = Tenant
        fields = ("id", "tenant_id", "quota_bytes", "quota", "effective_quota_bytes", "charged_bytes",
                  "budgeted_bytes", "engine_user", "description", "confirm_overcommit", *_TIMESTAMPS)

    def get_quota(self, obj: Tenant) -> str:
        return format_quota(obj.quota_bytes)

    def get_budgeted_bytes(self, obj: Tenant) -> int:
        """``budgets.budgeted_bytes`` of ``obj``; in a list, of every tenant of the page at once (two grouped
        queries per page, not two per tenant)."""
        page = getattr(self.parent, "instance", None)
        if not isinstance(page, list):
            return budgets.budgeted_bytes(obj)
        if "budgeted_bytes" not in self.context:
            self.context["budgeted_bytes"] = budgets.budgeted_bytes_by_tenant([tenant.pk for tenant in page])
        return self.context["budgeted_bytes"].get(obj.pk, 0)

    def _master_sample(self, obj: Tenant):
        if "master_quotas" not in self.context:
            from dashboard.telemetry.queries import latest_master_quotas

            self.context["master_quotas"] = latest_master_quotas()
        return self.context["master_quotas"].get(obj.tenant_id)

    def get_effective_quota_bytes(self, obj: Tenant) -> int | None:
        sample = self._master_sample(obj)
        return sample.effective_quota_bytes if sample is not None else None

    def get_charged_bytes(self, obj: Tenant) -> int | None:
        sample = self._master_sample(obj)
        return sample.charged_bytes if sample is not None else None

    def create(self, validated_data):
        confirmed = validated_data.pop("confirm_overcommit", False)
        return self._save_checked(Tenant(**validated_data), confirmed)

    def update(self, instance, validated_data):
        confirmed = validated_data.pop("confirm_overcommit", False)
        for name, value in validated_data.items():
            setattr(instance, name, value)
        return self._save_checked(instance, confirmed)

    def _save_checked(self, tenant: Tenant, confirmed: bool) -> Tenant:
        """Model rules first (a bad field is named as usual), then the capacity gate, then the save with the
        audit entry of a confirmed overcommit in its transaction."""
        from django.core.exceptions import ValidationError as DjangoValidationError
        from django.db import transaction

        from dashboard.api.base import drf_detail, save_or_400
        from dashboard.master.capacity import check_tenant_change, record_confirmation

        try:
            tenant.full_clean()
            plan = check_tenant_change(tenant, confirmed=confirmed)
        except DjangoValidationError as error:
            raise serializers.ValidationError(drf_detail(error)) from None
        with transaction.atomic():
            saved = save_or_400(tenant)
            record_confirmation(saved, plan)
        return saved


class QuotaPlanRequestSerializer(serializers.Serializer):
    """Input of ``POST /tenants/quota-plan/``: the tenant as it would be saved (``id`` for an existing one)."""

    id = serializers.IntegerField(required=False, min_value=1, help_text="Existing tenant being changed.")
    tenant_id = serializers.CharField(max_length=255)
    quota_bytes = ByteSizeSerializerField()


class QuotaPlanRowSerializer(serializers.Serializer):
    """One tenant of a quota plan (bytes; effective values null while the capacity is unknown)."""

    tenant_id = serializers.CharField()
    requested_before_bytes = serializers.IntegerField(allow_null=True)
    requested_after_bytes = serializers.IntegerField(allow_null=True)
    effective_before_bytes = serializers.IntegerField(allow_null=True)
    effective_after_bytes = serializers.IntegerField(allow_null=True)
    changed = serializers.BooleanField()
    lowered = serializers.BooleanField()


class QuotaPlanSerializer(serializers.Serializer):
    """What a quota change does to every tenant's effective quota (``tenants.capacity.QuotaPlan``)."""

    capacity_bytes = serializers.IntegerField(allow_null=True, help_text="Mounted capacity; null when unknown.")
    capacity_error = serializers.CharField(help_text="Why the capacity is unknown (empty when known).")
    requested_before_bytes = serializers.IntegerField()
    requested_after_bytes = serializers.IntegerField()
    overcommitted = serializers.BooleanField()
    needs_confirmation = serializers.BooleanField()
    reasons = serializers.ListField(child=serializers.CharField())
    tenants = QuotaPlanRowSerializer(many=True)


class ServedModelSerializer(ValidatedModelSerializer):
    """A served model of a tenant; ``vllm_model_name`` is derived from ``model_path``."""

    tenant_id = serializers.CharField(source="tenant.tenant_id", read_only=True, help_text="Mooncake tenant id.")

    class Meta:
        model = ServedModel
        fields = (
            "id", "tenant", "tenant_id", "served_model_name", "model_path", "vllm_model_name", "description",
            *_TIMESTAMPS,
        )  # fmt: skip
        read_only_fields = ("vllm_model_name",)


@extend_schema_field({
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "path"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "description": "LoRA name requests ask for."},
            "path": {"type": "string", "nullable": True,
                     "description": "Absolute directory or hub id 'owner/name'; null only on adapters stored "
                                    "before paths were required (not launched)."},
            "rank": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 512,
                     "description": "LoRA rank (sets vLLM --max-lora-rank)."},
        },
    },
})
class AdapterListField(serializers.ListField):
    """LoRA adapters ``{"name", "path"[, "rank"]}``, passed through unchanged to the model rule
    ``validate_adapters`` (and ``Release.clean``), which words every refusal."""

    child = serializers.JSONField()


class ReleaseSerializer(ValidatedModelSerializer):
    """A release namespace with its cache settings; ``fingerprint`` and ``first_served_at`` are computed, and so
    are ``effective_budget_bytes`` / ``budget_is_implicit``: the budget the agents hold the release under (its own
    ``budget_bytes``, or for a live release without one its implicit budget, ``dashboard.master.room``)."""

    tenant = serializers.IntegerField(source="model.tenant_id", read_only=True)
    tenant_id = serializers.CharField(source="model.tenant.tenant_id", read_only=True)
    served_model_name = serializers.CharField(source="model.served_model_name", read_only=True)
    adapters = AdapterListField(required=False, validators=[validate_adapters])
    effective_budget_bytes = serializers.SerializerMethodField(
        help_text="Budget the agents hold the release under: budget_bytes, or for a live release without one its "
        "implicit budget (an even share of what the tenant's budgets leave under the point where the Mooncake "
        "master starts evicting: its effective quota or watermark share); null for a retired release without one.")
    budget_is_implicit = serializers.SerializerMethodField(
        help_text="True when effective_budget_bytes is the implicit budget (the release has no budget_bytes).")

    class Meta:
        model = Release
        fields = (
            "id", "model", "tenant", "tenant_id", "served_model_name", "namespace", "state",
            "weights_revision", "num_layers", "num_kv_heads", "head_dim", "block_size", "kv_dtype",
            "quantization", "adapters", "engine", "engine_version", "hash_algo", "hash_seed", "max_model_len",
            "fingerprint", "budget_bytes", "effective_budget_bytes", "budget_is_implicit", "first_served_at",
            "description", *_TIMESTAMPS,
        )  # fmt: skip
        read_only_fields = ("fingerprint", "first_served_at")

    def _budget(self, obj: Release):
        from dashboard.master.room import current_pool_room, effective_budget, release_budgets

        if obj.budget_bytes is None and "release_budgets" not in self.context:  # one pool read per response
            self.context["release_budgets"] = release_budgets(current_pool_room())
        return effective_budget(obj, self.context.get("release_budgets", {}))

    def get_effective_budget_bytes(self, obj: Release) -> int | None:
        return self._budget(obj).budget_bytes

    def get_budget_is_implicit(self, obj: Release) -> bool:
        return self._budget(obj).implicit


class ReleaseCopySerializer(serializers.Serializer):
    """Input of ``POST /releases/{id}/copy/``: the new namespace and optional changed cache settings."""

    namespace = serializers.CharField()
    state = serializers.ChoiceField(choices=ReleaseState.choices, default=ReleaseState.WARMING)
    budget_bytes = ByteSizeSerializerField(required=False, allow_null=True)
    description = serializers.CharField(required=False, allow_blank=True)
    weights_revision = serializers.CharField(required=False, allow_blank=True)
    num_layers = serializers.IntegerField(required=False)
    num_kv_heads = serializers.IntegerField(required=False)
    head_dim = serializers.IntegerField(required=False)
    block_size = serializers.IntegerField(required=False)
    kv_dtype = serializers.ChoiceField(choices=KVCacheDtype.choices, required=False)
    quantization = serializers.CharField(required=False, allow_blank=True)
    adapters = AdapterListField(required=False)
    engine = serializers.ChoiceField(choices=Engine.choices, required=False)
    engine_version = serializers.CharField(required=False)
    hash_algo = serializers.ChoiceField(choices=HashAlgo.choices, required=False)
    hash_seed = serializers.CharField(required=False)


class RequestGroupSerializer(ValidatedModelSerializer):
    """A request group; ``cache_salt`` is generated when omitted, ``""`` means the default shared cache."""

    tenant_id = serializers.CharField(source="tenant.tenant_id", read_only=True)

    class Meta:
        model = RequestGroup
        fields = ("id", "tenant", "tenant_id", "name", "cache_salt", "budget_bytes", "description", *_TIMESTAMPS)
        extra_kwargs = {"cache_salt": {"trim_whitespace": False}}


class NodeSerializer(ValidatedModelSerializer):
    """A node; its signing secret is never part of this representation (see ``/nodes/{id}/secret/``).

    ``store_segment_bytes`` accepts ``8MB``-style strings and is returned in bytes (required, at least 16MB,
    when ``store_mode`` is ``standalone-store``); ``model_roots`` lists the directories its engines may load
    from (``tenants.placement``)."""

    queue_name = serializers.CharField(read_only=True, help_text="Celery queue of the node's agent.")
    model_roots = serializers.ListField(
        child=serializers.CharField(max_length=MAX_PATH_LENGTH, trim_whitespace=False), max_length=MAX_MODEL_ROOTS,
        required=False,
        help_text="Absolute directories in normal form (e.g. \"/models\") the node's engines may load models and "
        "adapters from: an absolute model_path or adapter path of an instance on the node must lie under one. "
        "Empty (the default for a new node): hub ids only.")

    class Meta:
        model = Node
        fields = (
            "id", "name", "hostname", "device", "kv_events_port", "store_mode", "store_segment_bytes",
            "store_client_port", "cpu_kvcache_space_gib", "model_roots", "queue_name", "description", *_TIMESTAMPS,
        )  # fmt: skip


class NodeSecretSerializer(serializers.Serializer):
    """The node's HMAC signing secret (admin only)."""

    node = serializers.CharField()
    signing_secret = serializers.CharField()


class InstanceAssignmentSerializer(ValidatedModelSerializer):
    """One engine instance of a release on a node; ``engine`` defaults to the release's engine."""

    node_name = serializers.CharField(source="node.name", read_only=True)
    namespace = serializers.CharField(source="release.namespace", read_only=True)

    class Meta:
        model = InstanceAssignment
        fields = (
            "id", "node", "node_name", "release", "namespace", "engine", "role",
            "tp_rank", "tp_size", "pp_rank", "pp_size", "pcp_rank", "pcp_size", "dcp_rank", "dcp_size",
            "port", "bootstrap_port", "gpu_ids", *_TIMESTAMPS,
        )  # fmt: skip


class ReservedNamespaceSerializer(serializers.ModelSerializer):
    """A release namespace reserved for good (its release was deleted or moved away), read only."""

    class Meta:
        model = ReservedNamespace
        fields = ("id", "tenant_id", "served_model_name", "vllm_model_name", "namespace", "engine", "fingerprint",
                  "release_state", "release_pk", "reason", "purge_id", "created_at")
        read_only_fields = fields


class AuditEntrySerializer(serializers.ModelSerializer):
    """A read-only audit log entry."""

    changed_fields = serializers.SerializerMethodField()

    class Meta:
        model = AuditEntry
        fields = (
            "id", "timestamp", "actor", "actor_repr", "action", "object_type", "object_id", "object_repr",
            "changed_fields", "before", "after", "request_id",
        )  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_changed_fields(self, obj: AuditEntry) -> list[str]:
        return obj.changed_fields()


class RenderedConfigSerializer(serializers.Serializer):
    """One rendered process: argv, env, files (absolute path -> content) and what it was rendered from."""

    kind = serializers.CharField()
    argv = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(child=serializers.CharField())
    files = serializers.DictField(child=serializers.CharField())
    command_line = serializers.CharField()
    shell_line = serializers.CharField()
    assignment = serializers.IntegerField(required=False)
    node = serializers.CharField(required=False)
    engine = serializers.CharField(required=False)
    role = serializers.CharField(required=False)
    release = serializers.IntegerField(required=False)
    namespace = serializers.CharField(required=False)
    fingerprint = serializers.CharField(required=False)
    tenant_id = serializers.CharField(required=False)
    served_model_name = serializers.CharField(required=False)
    vllm_model_name = serializers.CharField(required=False)
    adapters_without_path = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="LoRA adapters stored without a path (before paths were required): not in the launch line.")
    ha = serializers.BooleanField(required=False, help_text="Master in HA mode (one launch per master).")
    master_index = serializers.IntegerField(required=False, help_text="HA mode: this master's index in the set.")
    masters = serializers.IntegerField(required=False, help_text="HA mode: how many masters the set has.")
    rpc_address = serializers.CharField(required=False, help_text="HA mode: this master's RPC host:port.")
    admin_url = serializers.CharField(required=False, help_text="HA mode: this master's admin URL.")


class ReleaseConfigSerializer(serializers.Serializer):
    """Every instance of a release, rendered."""

    release = serializers.IntegerField()
    namespace = serializers.CharField()
    fingerprint = serializers.CharField()
    instances = RenderedConfigSerializer(many=True)


class TenantMembershipSerializer(ValidatedModelSerializer):
    """A user's ``role`` (viewer, operator, admin) in a tenant; ``username`` and ``tenant_id`` echo the ids."""

    username = serializers.CharField(source="user.get_username", read_only=True)
    tenant_id = serializers.CharField(source="tenant.tenant_id", read_only=True)

    class Meta:
        model = TenantMembership
        fields = ("id", "user", "username", "tenant", "tenant_id", "role", *_TIMESTAMPS)
