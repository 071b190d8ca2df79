"""Rolling upgrade: projection against the effective quota before starting, warm -> shift traffic -> retire
(waiting for in-flight requests), abort, and the page's POST steps."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from dashboard.rollout import upgrade as flow
from tenants.models import AuditEntry, InstanceAssignment, Release
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.rows import master_sample, sample

pytestmark = pytest.mark.django_db
GB = 1 << 30


@pytest.fixture
def serving():
    tenant = make_tenant("acme", quota="100GB")
    model = make_model(tenant)
    old = make_release(model, "production-2026-07", state="serving", weights_revision="v1")
    node = make_node("node-a")
    make_assignment(node, old, port=8000, role="prefill", bootstrap_port=8998)
    make_assignment(node, old, port=8001, role="decode")
    return old


def test_projection_is_other_plus_old_plus_new_against_the_effective_quota(serving):
    sample(namespace="production-2026-07", size=30 * GB)
    sample(namespace="other-release", model="other-model", size=10 * GB)
    master_sample("acme", effective=80 * GB, requested=100 * GB)
    projection = flow.project(serving)
    assert (projection.other_bytes, projection.old_bytes, projection.projected_new_bytes) == (10 * GB, 30 * GB, 30 * GB)
    assert projection.peak_bytes == 70 * GB and projection.quota.limit_bytes == 80 * GB
    assert projection.fits and projection.headroom_bytes == 10 * GB
    assert "effective quota read back from the Mooncake master" in projection.describe()


def test_projection_falls_back_to_the_requested_quota_without_a_read_back(serving):
    sample(size=60 * GB)
    projection = flow.project(serving)
    assert projection.quota.effective_bytes is None and projection.quota.limit_bytes == 100 * GB
    assert not projection.fits and projection.peak_bytes == 120 * GB


def test_start_copies_settings_and_instances(serving):
    new = flow.start_upgrade(serving, "production-2026-08", overrides={"weights_revision": "v2"},
                             copy_instances=True, port_offset=100)
    assert new.state == "warming" and new.hash_seed == serving.hash_seed and new.weights_revision == "v2"
    assert new.fingerprint != serving.fingerprint
    copies = sorted(new.assignments.values_list("role", "port", "bootstrap_port"))
    assert copies == [("decode", 8101, None), ("prefill", 8100, 9098)]
    state = flow.upgrade_state(serving.model)
    assert (state.phase, state.old, state.new) == ("warming", serving, new)


def test_start_refuses_an_over_quota_projection_unless_accepted(serving):
    sample(size=60 * GB)
    master_sample("acme", effective=100 * GB)
    with pytest.raises(ValidationError) as info:
        flow.start_upgrade(serving, "production-2026-08")
    assert "exceeds the effective quota" in info.value.message_dict["accept_over_quota"][0]
    assert not Release.objects.filter(namespace="production-2026-08").exists()
    assert flow.start_upgrade(serving, "production-2026-08", accept_over_quota=True).state == "warming"


def test_start_refusals_write_nothing(serving):
    with pytest.raises(ValidationError) as info:
        flow.start_upgrade(serving, "production-2026-07")
    assert "namespace" in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=1)  # 8001 taken
    assert "port_offset" in info.value.message_dict
    assert Release.objects.count() == 1 and InstanceAssignment.objects.count() == 2


def test_only_one_upgrade_at_a_time(serving):
    flow.start_upgrade(serving, "production-2026-08")
    with pytest.raises(flow.UpgradeError, match="already warming"):
        flow.start_upgrade(serving, "production-2026-09")


def test_shift_needs_instances_then_moves_both_states(serving):
    new = flow.start_upgrade(serving, "production-2026-08")
    with pytest.raises(flow.UpgradeError, match="has no instances"):
        flow.shift_traffic(serving.model)
    make_assignment(serving.assignments.first().node, new, port=9000)
    state = flow.shift_traffic(serving.model)
    assert (state.phase, state.old.state, state.new.state) == ("draining", "draining", "serving")
    assert state.new.first_served_at is not None


def test_retire_waits_for_reports_without_in_flight_requests(serving):
    new = flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=100)
    sample(ts=timezone.now() - timedelta(seconds=5), namespace="production-2026-07", in_flight_requests=0)
    flow.shift_traffic(serving.model)
    readiness = flow.retire_readiness(serving)
    assert not readiness.ready and "node-a: no report since draining began" in readiness.reason
    with pytest.raises(flow.UpgradeError, match="Waiting for in-flight requests"):
        flow.retire(serving.model)
    sample(namespace="production-2026-07", group="app-a", in_flight_requests=2)
    assert "node-a: 2 in-flight requests" in flow.retire_readiness(serving).reason
    sample(ts=timezone.now() + timedelta(seconds=1), namespace="production-2026-07", in_flight_requests=0)
    assert flow.retire_readiness(serving).ready
    old = flow.retire(serving.model)
    assert old.state == "retired" and not old.assignments.exists()
    assert new.assignments.count() == 2
    assert flow.upgrade_state(serving.model).phase == "idle"
    deleted = AuditEntry.objects.filter(object_type="tenants.instanceassignment", action="delete").count()
    assert deleted == 2


def test_drain_start_comes_from_the_audit_log(serving):
    flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=100)
    before = timezone.now()
    flow.shift_traffic(serving.model)
    serving.refresh_from_db()
    serving.description = "edited while draining"
    serving.save()
    assert before <= flow.drain_started_at(serving) <= timezone.now()
    entry = AuditEntry.objects.filter(object_type="tenants.release", object_id=str(serving.pk),
                                      after__state="draining").order_by("timestamp").first()
    assert flow.drain_started_at(serving) == entry.timestamp


def test_abort_retires_the_warming_release(serving):
    new = flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=100)
    flow.abort_upgrade(serving.model)
    new.refresh_from_db()
    assert new.state == "retired" and not new.assignments.exists()
    assert flow.upgrade_state(serving.model).phase == "idle"
    with pytest.raises(flow.UpgradeError):
        flow.abort_upgrade(serving.model)


def test_tenant_overlaps_count_the_warm_up_still_to_come(serving):
    new = flow.start_upgrade(serving, "production-2026-08")
    sample(namespace="production-2026-07", size=40 * GB)
    sample(namespace="production-2026-08", size=10 * GB)
    master_sample("acme", effective=70 * GB)
    (overlap,) = flow.tenant_overlaps()
    assert overlap.current_bytes == 50 * GB and overlap.pending_bytes == 30 * GB
    assert overlap.peak_bytes == 80 * GB and not overlap.fits
    assert overlap.overlaps == (("qwen3-8b", "production-2026-07", new.namespace),)


# --- the page ------------------------------------------------------------------------------------------------


def test_page_walks_the_flow(ui, serving):
    model = serving.model
    url = reverse("ui:upgrade", args=[model.pk])
    sample(namespace="production-2026-07", size=2 * GB)
    page = ui.get(url)
    html = page.content.decode()
    assert page.status_code == 200 and 'data-phase="idle"' in html and 'id="start-upgrade"' in html
    assert 'id="projection" data-fits="true"' in html
    response = ui.post(reverse("ui:upgrade-start", args=[model.pk]), {
        "namespace": "production-2026-08", "weights_revision": "v2", "copy_instances": "on", "port_offset": "100"})
    assert response.status_code == 302 and response["Location"] == url
    new = Release.objects.get(namespace="production-2026-08")
    assert new.weights_revision == "v2" and new.assignments.count() == 2
    html = ui.get(url).content.decode()
    assert 'data-phase="warming"' in html and 'data-side="old"' in html and 'data-side="new"' in html
    ui.post(reverse("ui:upgrade-shift", args=[model.pk]))
    html = ui.get(url).content.decode()
    assert 'data-phase="draining"' in html and 'data-ready="false"' in html and "disabled" in html
    refused = ui.post(reverse("ui:upgrade-retire", args=[model.pk]), follow=True)
    assert "Waiting for in-flight requests" in refused.content.decode()
    sample(ts=timezone.now() + timedelta(seconds=1), namespace="production-2026-07", in_flight_requests=0)
    done = ui.post(reverse("ui:upgrade-retire", args=[model.pk]), follow=True).content.decode()
    assert "Retired &#x27;production-2026-07&#x27;" in done and 'data-phase="idle"' in done
    assert reverse("ui:purge", args=[serving.pk]) in done
    actors = set(AuditEntry.objects.filter(object_type="tenants.release").values_list("actor_repr", flat=True))
    assert actors == {"operator", "system"}  # the fixture's writes ran without a request


def test_page_start_form_errors_are_shown(ui, serving):
    response = ui.post(reverse("ui:upgrade-start", args=[serving.model.pk]),
                       {"namespace": "Bad_Name", "port_offset": "100"})
    assert response.status_code == 400
    assert "must not contain &#x27;_&#x27;" in response.content.decode()
    over = ui.post(reverse("ui:upgrade-start", args=[serving.model.pk]),
                   {"namespace": "ok-name", "port_offset": "100", "budget_bytes": "300GB"})
    assert over.status_code == 400 and "budget_bytes" in over.context["form"].errors


def test_page_steps_out_of_order_explain_themselves(ui, serving):
    model = serving.model
    shifted = ui.post(reverse("ui:upgrade-shift", args=[model.pk]), follow=True).content.decode()
    assert "is warming: there is no traffic to shift" in shifted
    retired = ui.post(reverse("ui:upgrade-retire", args=[model.pk]), follow=True).content.decode()
    assert "is draining: shift traffic first" in retired
    assert ui.get(reverse("ui:upgrade-shift", args=[model.pk])).status_code == 405


def test_page_projection_counts_both_releases_while_draining(ui, serving):
    new = flow.start_upgrade(serving, "production-2026-08", copy_instances=True, port_offset=100)
    flow.shift_traffic(serving.model)
    sample(namespace="production-2026-07", size=3 * GB)
    sample(namespace=new.namespace, size=1 * GB)
    response = ui.get(reverse("ui:upgrade", args=[serving.model.pk]))
    projection = response.context["projection"]
    assert (projection.other_bytes, projection.old_bytes, projection.new_bytes) == (0, 3 * GB, 1 * GB)
    assert projection.peak_bytes == 6 * GB


def test_over_quota_start_reports_the_new_releases_errors_too(serving):
    sample(size=60 * GB)
    master_sample("acme", effective=100 * GB)
    with pytest.raises(ValidationError) as info:
        flow.start_upgrade(serving, "production-2026-07")  # the namespace is taken
    errors = info.value.message_dict
    assert set(errors) == {"accept_over_quota", "namespace"}
    assert "already has a release with namespace" in errors["namespace"][0]
    assert Release.objects.count() == 1


def test_page_shows_every_start_error_at_once(ui, serving):
    sample(size=60 * GB)
    master_sample("acme", effective=100 * GB)
    url = reverse("ui:upgrade-start", args=[serving.model.pk])
    valid_form = ui.post(url, {"namespace": "production-2026-07", "port_offset": "100"})
    assert valid_form.status_code == 400
    assert set(valid_form.context["form"].errors) == {"accept_over_quota", "namespace"}
    invalid_form = ui.post(url, {"namespace": "production-2026-07", "port_offset": "100", "block_size": "many"})
    assert invalid_form.status_code == 400
    assert set(invalid_form.context["form"].errors) == {"accept_over_quota", "namespace", "block_size"}
    accepted = ui.post(url, {"namespace": "Bad_Name", "port_offset": "x", "accept_over_quota": "on"})
    assert set(accepted.context["form"].errors) == {"namespace", "port_offset"}
    html = accepted.content.decode()
    assert html.count("must not contain &#x27;_&#x27;") == 1
    assert Release.objects.count() == 1
