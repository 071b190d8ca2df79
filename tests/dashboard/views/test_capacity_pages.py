"""Pages: the tenant form's capacity gate (the master is unreachable here, so the capacity is unknown), the pool
table on the tenant form, the quota flags of the overview and tenant page, the ``quota_capacity`` check and its
metrics, and the confirmed delete of a release that reserves its namespace."""
from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboard.checklist import check_quota_capacity
from dashboard.master.capacity import CONFIRMATION_TYPE
from dashboard.telemetry.metrics import render
from tenants.models import AuditEntry, Release, ReservedNamespace, Tenant
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant
from tests.support.rows import master_sample

pytestmark = pytest.mark.django_db


# --- tenant form -----------------------------------------------------------------------------------------------


def test_tenant_form_asks_for_confirmation_while_the_capacity_is_unknown(ui):
    page = ui.get(reverse("ui:tenant-new")).content.decode()
    assert 'id="quota-plan"' in page and "capacity unknown" in page and 'name="confirm_overcommit"' in page
    response = ui.post(reverse("ui:tenant-new"), {"tenant_id": "acme", "quota_bytes": "64GB"})
    assert response.status_code == 400 and not Tenant.objects.exists()
    errors = response.context["form"].errors
    assert list(errors) == ["confirm_overcommit"] and "mounted capacity is unknown" in errors["confirm_overcommit"][0]
    html = response.content.decode()
    assert "64 GiB" in html.split('id="quota-plan-rows"')[1]  # the change is in the table before it is saved
    response = ui.post(reverse("ui:tenant-new"), {"tenant_id": "acme", "quota_bytes": "64GB",
                                                  "confirm_overcommit": "on"})
    assert response.status_code == 302
    tenant = Tenant.objects.get()
    entry = AuditEntry.objects.get(object_type=CONFIRMATION_TYPE)
    assert entry.object_id == str(tenant.pk) and entry.actor_repr == "operator"
    assert entry.after["tenants"][0]["requested_after_bytes"] == 64 << 30


def test_api_and_page_refuse_with_the_same_message(ui, api):
    body = {"tenant_id": "acme", "quota_bytes": "8MB"}
    api_message = api.post("/api/v1/tenants/", body, format="json").json()["confirm_overcommit"]
    page = ui.post(reverse("ui:tenant-new"), body).context["form"].errors["confirm_overcommit"]
    # the master's port differs between the two reads only if settings changed: same text
    assert list(page) == api_message


# --- quota flags, check, metrics --------------------------------------------------------------------------------


def test_scaled_down_and_over_effective_are_flagged_everywhere(ui):
    acme, globex = make_tenant("acme", "64MB"), make_tenant("globex", "64MB")
    now = timezone.now()
    from dashboard.models import MasterQuotaSample

    MasterQuotaSample.objects.create(ts=now, tenant_id="acme", requested_quota_bytes=64 << 20,
                                     effective_quota_bytes=32 << 20, charged_bytes=40 << 20)
    MasterQuotaSample.objects.create(ts=now, tenant_id="globex", requested_quota_bytes=64 << 20,
                                     effective_quota_bytes=32 << 20, charged_bytes=0)
    master_sample("gone", effective=0, requested=5, ago=60)  # an older round: a tenant the master dropped
    result = check_quota_capacity(now)
    assert not result.passed and result.summary == "3 quota problem(s): effective below requested or below charged"
    assert any(line.startswith("tenant acme: charged 40 MiB is above its effective quota 32 MiB") for line in
               result.details)
    assert not any("gone" in line for line in result.details)
    checks = ui.get(reverse("ui:checks")).content.decode()
    assert "Quotas fit the pool" in checks
    overview = ui.get(reverse("ui:overview")).content.decode().split('id="tenant-quotas"')[1].split("</table>")[0]
    assert overview.count("scaled down") == 2 and "charged above effective" in overview
    detail = ui.get(reverse("ui:tenant", args=[acme.pk])).content.decode()
    assert 'id="quota-scaled-down"' in detail and "refuses the tenant's writes" in detail
    series = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
              for family in text_string_to_metric_families(render().decode()) for sample in family.samples}
    assert series[("kvpool_tenant_quota_scaled_down", (("tenant_id", "acme"),))] == 1
    assert series[("kvpool_tenant_quota_effective_below_charged", (("tenant_id", "acme"),))] == 1
    assert series[("kvpool_tenant_quota_effective_below_charged", (("tenant_id", "globex"),))] == 0
    assert ("kvpool_tenant_quota_scaled_down", (("tenant_id", "gone"),)) not in series
    assert series[("kvpool_pool_requested_quota_bytes", ())] == 128 << 20 == acme.quota_bytes + globex.quota_bytes
    assert series[("kvpool_pool_effective_quota_bytes", ())] == 64 << 20
    assert series[("kvpool_master_tenant_quota_charged_bytes", (("tenant_id", "acme"),))] == 40 << 20


def test_quota_check_passes_when_every_tenant_gets_its_quota():
    make_tenant("acme", "64MB")
    assert check_quota_capacity(timezone.now()).summary.startswith("no read-back from the Mooncake master yet")
    master_sample("acme", effective=64 << 20, charged=1 << 20)
    result = check_quota_capacity(timezone.now())
    assert result.passed and result.summary == "1 tenant(s) get their requested quota and are charged within it"


# --- release delete page -----------------------------------------------------------------------------------------


def test_release_delete_page_needs_the_namespace_and_reserves_it(ui):
    model = make_model(make_tenant())
    release = make_release(model, "canary")
    url = reverse("ui:release-delete", args=[release.pk])
    page = ui.get(url).content.decode()
    assert 'id="delete-consequences"' in page and "reserves namespace &#x27;canary&#x27;" in page
    response = ui.post(url, {"confirm": "on"})
    assert response.status_code == 400
    assert response.context["form"].errors["confirm_namespace"] == [
        "Type the release namespace 'canary' to confirm the delete."]
    assert ui.post(url, {"confirm": "on", "confirm_namespace": "canary"}).status_code == 302
    assert not Release.objects.filter(pk=release.pk).exists()
    assert ReservedNamespace.objects.get().namespace == "canary"
    model_page = ui.get(reverse("ui:model", args=[model.pk])).content.decode()
    assert 'id="reserved-namespaces"' in model_page and "<code>canary</code>" in model_page
    response = ui.post(reverse("ui:release-new"), {"model": model.pk, "namespace": "canary", "state": "warming",
                                                    "num_layers": 36, "num_kv_heads": 8, "head_dim": 128,
                                                    "block_size": 16, "kv_dtype": "auto", "engine": "vllm",
                                                    "engine_version": "0.33.0", "hash_algo": "sha256"})
    assert response.status_code == 400 and "is reserved" in response.context["form"].errors["namespace"][0]


def test_refused_release_delete_needs_only_the_checkbox_to_show_why(ui):
    release = make_release(make_model(make_tenant()), "canary")
    make_assignment(make_node(), release)
    response = ui.post(reverse("ui:release-delete", args=[release.pk]), {"confirm": "on"})
    assert response.status_code == 400 and "still referenced by 1 instance" in response.content.decode()
