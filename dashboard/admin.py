"""Admin pages that need the dashboard's view of the pool: the tenant admin behind the capacity gate.

``tenants.admin`` registers every registry model (the registry knows nothing of the master); the tenant admin is
re-registered here with ``confirm_overcommit`` (``dashboard.master.capacity``), so the admin refuses an overcommit
the REST API and the pages refuse, with the same message, and audits a confirmed one.
"""
from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from dashboard.master.capacity import CONFIRM_FIELD, plan_tenant_change, record_confirmation
from tenants.admin import TenantAdmin as RegistryTenantAdmin
from tenants.models import Tenant


class TenantAdminForm(forms.ModelForm):
    """The tenant admin form with the capacity gate (checked once the quota and tenant_id are valid)."""

    confirm_overcommit = forms.BooleanField(
        required=False, label="Confirm overcommit",
        help_text="Save even though the requested quotas then exceed the pool's mounted memory (or the master cannot "
        "say how much is mounted): other tenants' effective quotas may drop. Recorded in the audit log.")

    class Meta:
        model = Tenant
        fields = ("tenant_id", "quota_bytes", "description")

    quota_plan = None

    def clean(self):
        cleaned = super().clean()
        quota, tenant_id = cleaned.get("quota_bytes"), cleaned.get("tenant_id")
        if isinstance(quota, int) and tenant_id:
            stored = self.instance.stored()
            proposed = Tenant(pk=self.instance.pk, tenant_id=tenant_id, quota_bytes=quota)
            self.quota_plan = plan_tenant_change(proposed, stored=stored)
            if self.quota_plan.needs_confirmation and not cleaned.get(CONFIRM_FIELD):
                raise ValidationError({CONFIRM_FIELD: self.quota_plan.message()}, code="overcommit")
        return cleaned


admin.site.unregister(Tenant)


@admin.register(Tenant)
class TenantAdmin(RegistryTenantAdmin):
    form = TenantAdminForm

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)  # inside the admin's transaction
        if form.quota_plan is not None:
            record_confirmation(obj, form.quota_plan)
