"""Budgets of releases and request groups may not exceed the tenant quota; errors say by how much."""
from __future__ import annotations

import pytest

from tenants import budgets
from tenants.models import RequestGroup
from tenants.services import validated_save
from tests.support.factories import (
    make_group,
    make_model,
    make_release,
    make_tenant,
    refused,
    refused_save,
)

pytestmark = pytest.mark.django_db
MB = 1 << 20


@pytest.fixture
def small_tenant(db):
    return make_tenant("small", quota="10MB")


def test_budgets_within_quota_accepted(small_tenant):
    model = make_model(small_tenant)
    make_release(model, budget_bytes=6 * MB)
    make_group(small_tenant, budget_bytes=4 * MB)
    assert budgets.budgeted_bytes(small_tenant) == 10 * MB


def test_budget_over_quota_refused_with_excess(small_tenant):
    make_release(make_model(small_tenant), budget_bytes=6 * MB)
    errors = refused(RequestGroup(tenant=small_tenant, name="g", budget_bytes=5 * MB))
    assert errors["budget_bytes"] == [
        "Budgets in tenant 'small' would total 11534336 bytes, exceeding its quota_bytes 10485760 by 1048576 bytes "
        "(1 MiB). Lower this budget or raise the tenant's quota."
    ]


def test_release_budget_over_quota_refused_and_not_written(small_tenant):
    model = make_model(small_tenant)
    make_group(small_tenant, budget_bytes=8 * MB)
    release = make_release(model)
    release.budget_bytes = 3 * MB
    errors = refused_save(release)
    assert errors["budget_bytes"][0].startswith("Budgets in tenant 'small' would total 11534336 bytes")
    release.refresh_from_db()
    assert release.budget_bytes is None


def test_editing_a_budget_counts_it_once(small_tenant):
    group = make_group(small_tenant, budget_bytes=9 * MB)
    group.budget_bytes = 10 * MB
    validated_save(group)


def test_lowering_quota_below_budgets_refused(small_tenant):
    make_group(small_tenant, budget_bytes=8 * MB)
    make_release(make_model(small_tenant), budget_bytes=2 * MB)
    small_tenant.quota_bytes = 9 * MB
    assert refused_save(small_tenant)["quota_bytes"] == [
        "quota_bytes 9437184 is below the 10485760 bytes budgeted to releases and request groups of tenant 'small': "
        "the budgets would exceed it by 1048576 bytes (1 MiB). Lower those budgets first."
    ]
    small_tenant.refresh_from_db()
    assert small_tenant.quota_bytes == 10 * MB
    small_tenant.quota_bytes = 10 * MB + 1
    validated_save(small_tenant)


def test_retired_release_frees_its_budget(small_tenant):
    release = make_release(make_model(small_tenant), budget_bytes=8 * MB)
    refused_save(RequestGroup(tenant=small_tenant, name="g", budget_bytes=4 * MB))
    for state in ("serving", "draining", "retired"):
        release.state = state
        validated_save(release)
    make_group(small_tenant, budget_bytes=4 * MB)


def test_budgets_of_other_tenants_do_not_count(small_tenant):
    make_group(make_tenant("big", quota="1TB"), budget_bytes=512 << 30)
    make_group(small_tenant, budget_bytes=10 * MB)


def test_budget_claims_are_the_rows_budgeted_bytes_sums(small_tenant):
    """``budget_claims`` (many tenants at once, for the room and implicit budgets) counts what ``budgeted_bytes``
    counts: non-retired releases and request groups with a budget; it lists the live releases without one."""
    from tenants.services import validated_save

    model = make_model(small_tenant)
    make_release(model, "v1", budget_bytes=3 * MB)
    gone = make_release(model, "v0", state="serving", budget_bytes=2 * MB)
    for state in ("draining", "retired"):
        gone.state = state
        validated_save(gone)
    open_release = make_release(model, "v2")
    make_group(small_tenant, "g", budget_bytes=1 * MB)
    make_group(small_tenant, "free")
    other = make_tenant("other", quota="10MB")
    make_group(other, "x", budget_bytes=4 * MB)
    claims, unbudgeted = budgets.budget_claims()
    assert claims["small"] == {("release", "qwen3-8b/v1"): 3 * MB, ("request group", "g"): 1 * MB}
    assert sum(claims["small"].values()) == budgets.budgeted_bytes(small_tenant)
    assert sum(claims["other"].values()) == budgets.budgeted_bytes(other) == 4 * MB
    assert unbudgeted == {"small": [open_release.pk]}
    assert budgets.budget_claims(["other"]) == ({"other": {("request group", "x"): 4 * MB}}, {})
