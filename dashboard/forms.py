"""Forms of the dashboard pages. Registry forms are ModelForms: they reach each model's ``clean()`` (the one place
the domain rules live, also used by the REST API's ``ValidatedModelSerializer``), so a page refuses the same
input with the same message as the API. Saving goes through ``tenants.services.validated_save`` — the API's
write path: one transaction holding the owning tenant's lock — and the audit middleware attributes the change
to the logged-in user.
"""
from __future__ import annotations

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError

from tenants.fields import ByteSizeFormField
from tenants.models import (
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tenants.services import validated_save

#: The API's message for a write that lost a race on a database constraint (``dashboard.api.base``).
CONFLICT_MESSAGE = "The change conflicts with a concurrent change to the registry; retry."


def add_validation_error(form: forms.Form, error: ValidationError) -> None:
    """Put a Django ``ValidationError`` on ``form``: errors of fields the form shows go on the field, the others
    become non-field errors prefixed with the field name (the message itself is unchanged). A message the form
    already shows there (a field's message also counts above the form, and the other way round) is not added
    again."""
    items = error.message_dict.items() if hasattr(error, "error_dict") else [(NON_FIELD_ERRORS, error.messages)]
    for name, messages in items:
        for message in messages:
            if name == NON_FIELD_ERRORS or name in form.fields:
                target, text = (None if name == NON_FIELD_ERRORS else name), message
            else:
                target, text = None, f"{name}: {message}"
            if not _shown(form, target, message, text):
                form.add_error(target, text)


def _shown(form: forms.Form, target: str | None, message: str, text: str) -> bool:
    """True when ``form`` already shows ``message`` (or ``text``) where it would go: for a field, on that field
    or above the form; for a non-field error, anywhere on the form."""
    names = list(form.errors) if target is None else [NON_FIELD_ERRORS, target]
    shown = {shown for name in names for shown in form.errors.get(name, [])}
    return message in shown or text in shown


class RegistryModelForm(forms.ModelForm):
    """Base of the registry forms: model-rule errors on fields the form lacks become non-field errors."""

    def _update_errors(self, errors: ValidationError) -> None:
        if hasattr(errors, "error_dict"):
            foreign = {name: errors.error_dict.pop(name) for name in list(errors.error_dict)
                       if name != NON_FIELD_ERRORS and name not in self.fields}
            for name, error_list in foreign.items():
                for error in error_list:
                    message = error.message % error.params if error.params else error.message
                    errors.error_dict.setdefault(NON_FIELD_ERRORS, []).append(
                        ValidationError(f"{name}: {message}", code=error.code))
        super()._update_errors(errors)

    def save_validated(self) -> bool:
        """Write the instance through ``validated_save``; on refusal put the errors on the form, return False."""
        try:
            validated_save(self.instance)
        except ValidationError as error:
            add_validation_error(self, error)
            return False
        except IntegrityError:
            self.add_error(None, CONFLICT_MESSAGE)
            return False
        return True


class TenantForm(RegistryModelForm):
    """A tenant and its requested quota, with the pool's capacity gate (``dashboard.master.capacity``): a change
    that raises the requested total above the mounted capacity (or while the capacity is unknown) is saved only
    with ``confirm_overcommit`` ticked; the page then shows every tenant's effective quota before and after, and
    the confirmation is audited."""

    confirm_overcommit = forms.BooleanField(
        required=False, label="Save even though other tenants' effective quotas may drop (overcommit)",
        help_text="Needed when the requested quotas would exceed the pool's mounted memory, or when the master "
        "cannot say how much is mounted. Recorded in the audit log.")

    class Meta:
        model = Tenant
        fields = ("tenant_id", "quota_bytes", "engine_user", "description")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.quota_plan = None

    @property
    def pool_plan(self):
        """The plan the page shows: the one of the submitted change, else the pool as it is (read now)."""
        if self.quota_plan is None:
            from dashboard.master.capacity import plan_tenant_change

            self.quota_plan = plan_tenant_change(None)
        return self.quota_plan

    def save_validated(self) -> bool:
        """``validated_save`` behind the capacity gate; the confirmation's audit entry is written with the save."""
        from django.db import transaction

        from dashboard.master.capacity import CONFIRM_FIELD, plan_tenant_change, record_confirmation

        plan = self.quota_plan = plan_tenant_change(self.instance, stored=self.instance.stored())
        if plan.needs_confirmation and not self.cleaned_data.get(CONFIRM_FIELD):
            self.add_error(CONFIRM_FIELD, plan.message())
            return False
        try:
            with transaction.atomic():
                validated_save(self.instance)
                record_confirmation(self.instance, plan)
        except ValidationError as error:
            add_validation_error(self, error)
            return False
        except IntegrityError:
            self.add_error(None, CONFLICT_MESSAGE)
            return False
        return True


class ServedModelForm(RegistryModelForm):
    class Meta:
        model = ServedModel
        fields = ("tenant", "served_model_name", "model_path", "description")


class AdaptersField(forms.CharField):
    """LoRA adapters as one comma-separated line of ``name=path`` items, each optionally ``;rank=N``; cleans to
    ``[{"name", "path"[, "rank"]}]`` for the model rules (``validate_adapters``, ``Release.clean``). An item
    without ``=`` is an adapter without a path (only kept on adapters stored that way before paths were required).

    The line reads back what it shows: for every adapter list the rules accept for new adapters (names without
    ``,`` ``=`` ``;``, paths without ``,`` ``;``), ``to_python(prepare_value(adapters))`` equals it (a
    ``"rank": null`` reads back as no rank, the same adapter). An adapter stored before ``;`` was refused may show
    ambiguously (path ``/a;rank=5`` shows as ``x=/a;rank=5``); ``keep_stored`` returns the stored adapter for an
    item submitted as it was shown, so editing another field never changes a stored path or the fingerprint.
    """

    _RANK = ";rank="

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return ", ".join(self._item_text(item) for item in value)
        return value

    def _item_text(self, item) -> str:
        if not isinstance(item, dict):
            return str(item)
        text = str(item.get("name", "")) if item.get("path") is None else f"{item.get('name', '')}={item['path']}"
        return text if item.get("rank") is None else f"{text}{self._RANK}{item['rank']}"

    def to_python(self, value):
        if isinstance(value, (list, tuple)):
            return list(value)
        text = super().to_python(value)
        return [self._item(part.strip()) for part in text.split(",")] if text.strip() else []

    def _item(self, text: str) -> dict:
        # The last ";rank=" starts the rank: a stored path holding ";rank=" (allowed before ';' was refused) keeps
        # its text when the item also shows a rank.
        head, has_rank, rank = text.rpartition(self._RANK)
        if has_rank:
            text = head
        name, has_path, path = text.partition("=")
        item: dict = {"name": name.strip(), "path": path.strip() if has_path else None}
        if has_rank:
            rank = rank.strip()
            item["rank"] = int(rank) if rank.isascii() and rank.isdigit() else rank
        return item

    def keep_stored(self, items: list, stored: object) -> list:
        """``items`` (as cleaned) with each item that reads the same as a stored adapter replaced by that adapter.

        ``stored`` is the release's stored ``adapters`` (anything else, e.g. ``None`` on a new release, keeps
        ``items``). When the whole line reads as the stored list, the stored list is returned as it is.
        """
        if not isinstance(stored, list) or not stored:
            return items
        if self.to_python(self.prepare_value(stored)) == items:
            return list(stored)
        shown: dict[tuple, dict] = {}
        for entry in stored:
            if isinstance(entry, dict):
                shown.setdefault(_adapter_key(self._item(self._item_text(entry))), entry)
        return [shown.get(_adapter_key(item), item) if isinstance(item, dict) else item for item in items]

    def has_changed(self, initial, data) -> bool:
        if self.disabled:
            return False
        try:
            current = self.keep_stored(self.to_python(data), initial)
        except ValidationError:
            return True
        return current != (initial or [])


def _adapter_key(item: dict) -> tuple:
    return tuple(sorted(item.items()))


class ReleaseForm(RegistryModelForm):
    adapters = AdaptersField(
        required=False,
        help_text="LoRA adapters, comma-separated name=path (an absolute directory or a hub id owner/name), "
        "optionally name=path;rank=N (vLLM --max-lora-rank).",
    )

    class Meta:
        model = Release
        fields = ("model", "namespace", "state", "weights_revision", "num_layers", "num_kv_heads", "head_dim",
                  "block_size", "kv_dtype", "quantization", "adapters", "engine", "engine_version", "hash_algo",
                  "hash_seed", "max_model_len", "budget_bytes", "description")

    def clean_adapters(self) -> list:
        """The adapters as submitted, with the stored adapters the line shows unchanged kept exactly as stored."""
        stored = self.instance.adapters if self.instance.pk is not None else None
        return self.fields["adapters"].keep_stored(self.cleaned_data["adapters"], stored)


class RequestGroupForm(RegistryModelForm):
    class Meta:
        model = RequestGroup
        fields = ("tenant", "name", "cache_salt", "budget_bytes", "description")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Like the API (trim_whitespace=False): a salt with surrounding spaces is refused by the model rule,
        # not silently trimmed.
        self.fields["cache_salt"].strip = False


class ModelRootsField(forms.CharField):
    """``Node.model_roots`` as text: one absolute directory per line (blank lines ignored); the model's rule
    (``validate_model_roots``) checks each."""

    widget = forms.Textarea(attrs={"rows": 3})

    def __init__(self, **kwargs):
        kwargs.setdefault("strip", False)
        kwargs.setdefault("help_text", "One absolute directory per line (e.g. /models) the node's engines may load "
                          "models and adapters from; empty: hub ids only.")
        super().__init__(**kwargs)

    def to_python(self, value):
        text = super().to_python(value)
        return [line.strip() for line in text.splitlines() if line.strip()]

    def prepare_value(self, value):
        return "\n".join(value) if isinstance(value, list) else value


class NodeForm(RegistryModelForm):
    #: Settings with a model default that a post may leave out (as the API may): the node keeps its value, a
    #: new node gets the default.
    OPTIONAL_WITH_DEFAULT = ("device", "kv_events_port", "store_mode", "store_client_port", "cpu_kvcache_space_gib",
                             "model_roots")

    model_roots = ModelRootsField()

    class Meta:
        model = Node
        fields = ("name", "hostname", "device", "kv_events_port", "store_mode", "store_segment_bytes",
                  "store_client_port", "cpu_kvcache_space_gib", "model_roots", "description")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.OPTIONAL_WITH_DEFAULT:
            self.fields[name].required = False


class InstanceAssignmentForm(RegistryModelForm):
    class Meta:
        model = InstanceAssignment
        fields = ("node", "release", "engine", "role", "tp_rank", "tp_size", "pp_rank", "pp_size", "pcp_rank",
                  "pcp_size", "dcp_rank", "dcp_size", "port", "bootstrap_port", "gpu_ids")


class DeleteForm(forms.Form):
    """Explicit confirmation of a delete."""

    confirm = forms.BooleanField(label="Yes, delete it", required=True)

    def confirms(self, obj) -> bool:
        """Whether the (valid) form confirms deleting ``obj``; errors go on the form."""
        return True


class ReleaseDeleteForm(DeleteForm):
    """Delete of a release: its namespace is reserved for good and its keys purged, so the operator also types the
    namespace (as ``confirm_namespace`` in the REST API). A delete the registry refuses anyway (a served release,
    instances left) needs only the checkbox, to show the reason."""

    confirm_namespace = forms.CharField(
        label="Type the release namespace to confirm", max_length=63, required=False,
        help_text="The namespace stays reserved for good and the tenant's agents purge its keys.")

    def confirms(self, obj) -> bool:
        if obj.has_served or obj.assignments.exists():
            return True
        if self.cleaned_data.get("confirm_namespace", "").strip() != obj.namespace:
            self.add_error("confirm_namespace", f"Type the release namespace '{obj.namespace}' to confirm the delete.")
            return False
        return True


#: Cache settings (``tenants.fingerprint.CACHE_SETTING_FIELDS``) the upgrade form can change for the new
#: release (blank keeps the old value).
UPGRADE_OVERRIDES = ("weights_revision", "engine_version", "kv_dtype", "quantization", "block_size")


class StartUpgradeForm(forms.Form):
    """Start of a rolling upgrade: the new release namespace and what differs from the old release."""

    namespace = forms.CharField(max_length=63, help_text="New release namespace (extra_backend_tag / cache_prefix), "
                                                         "e.g. 'production-2026-08'.")
    weights_revision = forms.CharField(required=False, help_text="Blank keeps the old release's value.")
    engine_version = forms.CharField(required=False, help_text="Blank keeps the old release's value.")
    kv_dtype = forms.CharField(required=False, help_text="Blank keeps the old release's value.")
    quantization = forms.CharField(required=False, help_text="Blank keeps the old release's value.")
    block_size = forms.IntegerField(required=False, help_text="Tokens per block; blank keeps the old value.")
    budget_bytes = ByteSizeFormField(required=False, help_text="Budget of the new release, e.g. '40GB' (optional).")
    copy_instances = forms.BooleanField(required=False, initial=True,
                                        help_text="Assign the new release to the same nodes, roles and ranks.")
    port_offset = forms.IntegerField(initial=100, min_value=-65534, max_value=65534,
                                     help_text="Added to each copied instance's port and bootstrap port.")
    accept_over_quota = forms.BooleanField(
        required=False, label="Start even if the projected peak exceeds the effective quota",
        help_text="The master then evicts or refuses writes while both releases are warm.")

    def overrides(self) -> dict:
        """The changed cache settings (non-blank override fields)."""
        return {name: self.cleaned_data[name] for name in UPGRADE_OVERRIDES
                if self.cleaned_data.get(name) not in (None, "")}


class PurgeForm(forms.Form):
    """Confirmation of a purge: the operator types the release namespace."""

    confirm = forms.CharField(label="Type the release namespace to confirm", max_length=63)
