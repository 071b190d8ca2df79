"""Implicit budgets in config documents (issue 18 item 4): a live release without a budget gets what its tenant's
budgets leave under the master's eviction point (``tenants.room``), rendered like an explicit budget (each node's
``budget_share``), and the documents follow quota, budget, state and capacity changes."""
from __future__ import annotations

from unittest import mock

import pytest
from django.utils import timezone

from dashboard.master.room import current_pool_room, effective_budget, release_budgets
from dashboard.models import MasterHealth, MasterQuotaSample
from dashboard.rollout.push import render_contents
from tenants.capacity import effective_quotas
from tenants.room import MasterEviction
from tenants.services import validated_save
from tests.support.factories import make_assignment, make_group, make_model, make_node, make_release, make_tenant

pytestmark = pytest.mark.django_db
MiB = 1 << 20


def _set(obj, **values):
    for name, value in values.items():
        setattr(obj, name, value)
    return validated_save(obj)


def budgets_of(contents, node: str) -> dict[str, int | None]:
    return {spec["namespace"]: spec["node_budget_bytes"] for spec in contents[node]["instances"]}


@pytest.fixture
def acme():
    """Quota 100 MiB; explicit budgets 40 MiB (release) + 10 MiB (group); two unbudgeted live releases (serving
    on two writer nodes, warming on one), one retired release without a budget."""
    tenant = make_tenant("acme", quota=100 * MiB)
    model = make_model(tenant, "chat", "/models/chat")
    budgeted = make_release(model, "v1", budget_bytes=40 * MiB)
    serving = make_release(model, "v2", state="serving")
    warming = make_release(model, "v3")
    retired = make_release(model, "v0", state="serving")
    make_group(tenant, "gold", cache_salt="s-gold", budget_bytes=10 * MiB)
    a, b = make_node("node-a"), make_node("node-b", hostname="10.0.0.2")
    make_assignment(a, budgeted, port=8000)
    make_assignment(a, serving, port=8001)
    make_assignment(b, serving, port=8001)
    make_assignment(b, warming, port=8002)
    make_assignment(b, retired, port=8003)
    _set(retired, state="draining")
    _set(retired, state="retired")
    return tenant, (budgeted, serving, warming, retired), (a, b)


def test_unbudgeted_live_releases_share_the_room_the_explicit_budgets_leave(acme):
    tenant, (budgeted, serving, warming, retired), nodes = acme
    contents = render_contents(nodes)
    implicit = (100 * MiB - 50 * MiB) // 2  # capacity unknown: the eviction point is the requested quota
    assert budgets_of(contents, "node-a") == {"v1": 40 * MiB, "v2": implicit // 2}  # v2 has a writer on each node
    assert budgets_of(contents, "node-b") == {"v2": implicit // 2, "v3": implicit, "v0": None}
    assert effective_budget(serving).budget_bytes == implicit and effective_budget(serving).implicit
    assert effective_budget(budgeted).budget_bytes == 40 * MiB and not effective_budget(budgeted).implicit
    assert effective_budget(retired).budget_bytes is None
    room = current_pool_room().tenants["acme"]
    assert room.held_bytes == 100 * MiB and not room.quota_excess_bytes


def test_the_eviction_point_follows_the_mounted_capacity_and_the_watermark(acme, settings):
    tenant, (budgeted, serving, warming, retired), nodes = acme
    make_tenant("other", quota=60 * MiB)
    now = timezone.now()
    MasterQuotaSample.objects.create(ts=now, tenant_id="outside", requested_quota_bytes=40 * MiB,
                                     effective_quota_bytes=0, charged_bytes=0)
    MasterHealth.objects.create(pk=1, up=True, checked_at=now, capacity_bytes=150 * MiB, key_count=0)
    settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO = 0.8
    effective = effective_quotas({"acme": 100 * MiB, "other": 60 * MiB, "outside": 40 * MiB}, 150 * MiB)
    watermark = MasterEviction(0.8).watermark_bytes(150 * MiB)
    point = watermark * effective["acme"] // sum(effective.values())  # 200 MiB requested into 150: shares apply
    room = current_pool_room().tenants["acme"]
    assert (room.effective_quota_bytes, room.eviction_point_bytes) == (effective["acme"], point)
    assert room.eviction_point_source == "watermark share"
    assert budgets_of(render_contents(nodes), "node-b")["v3"] == (point - 50 * MiB) // 2
    MasterHealth.objects.filter(pk=1).update(capacity_bytes=0)  # nothing mounted: effective quotas are all 0 then
    assert budgets_of(render_contents(nodes), "node-b")["v3"] == 25 * MiB  # back to the requested quota


def test_budgets_at_the_eviction_point_leave_nothing_for_unbudgeted_releases(acme):
    tenant, (budgeted, serving, warming, retired), nodes = acme
    _set(budgeted, budget_bytes=90 * MiB)
    assert release_budgets(current_pool_room()) == {serving.pk: effective_budget(serving), warming.pk:
                                                    effective_budget(warming)}
    assert effective_budget(serving).budget_bytes == effective_budget(warming).budget_bytes == 0
    assert budgets_of(render_contents(nodes), "node-b")["v3"] == 0  # keeps nothing: the check says so


def test_changes_that_move_implicit_budgets_re_render_their_nodes(acme, django_capture_on_commit_callbacks):
    tenant, (budgeted, serving, warming, retired), (a, b) = acme
    model = budgeted.model
    lone = make_release(model, "v9", budget_bytes=1 * MiB)  # no instance: nothing to push for itself
    other = make_tenant("other", quota=60 * MiB)
    elsewhere = make_node("node-c", hostname="10.0.0.3")
    make_assignment(elsewhere, make_release(make_model(other, "m", "/models/m"), "x1", budget_bytes=MiB), port=8000)

    def pushed(change) -> list[str]:
        with (mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
              django_capture_on_commit_callbacks(execute=True)):
            change()
        return sorted(name for call in push.call_args_list for name in call.kwargs["args"][0])

    # another tenant's quota moves acme's effective quota when the pool is overcommitted
    assert pushed(lambda: _set(other, quota_bytes=70 * MiB)) == ["node-a", "node-b", "node-c"]
    # a budget of a release with no instance moves the implicit budgets of the tenant's other releases
    assert pushed(lambda: _set(lone, budget_bytes=2 * MiB)) == ["node-a", "node-b"]
    assert pushed(lambda: lone.delete()) == ["node-a", "node-b"]


def test_a_capacity_change_seen_by_the_master_probe_re_renders_nodes_with_implicit_budgets(
        acme, django_capture_on_commit_callbacks):
    from dashboard import tasks
    from dashboard.master.health import MasterReading

    def probe(capacity: int):
        reading = MasterReading(key_count=0, capacity_bytes=capacity, allocated_bytes=0, counters_total=1.0,
                                remounts_total=0.0)
        with (mock.patch("dashboard.master.health.read_master_metrics", return_value=reading),
              mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
              django_capture_on_commit_callbacks(execute=True)):
            tasks.probe_master()
        return sorted(name for call in push.call_args_list for name in call.kwargs["args"][0])

    assert probe(64 * MiB) == ["node-a", "node-b"]  # first reading: capacity unknown -> 64 MiB
    assert probe(64 * MiB) == []  # unchanged
    assert probe(96 * MiB) == ["node-a", "node-b"]
