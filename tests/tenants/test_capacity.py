"""``tenants.capacity``: the effective-quota rule (values measured on mooncake_master 0.3.13.post1, see
``test_capacity_master.py``) and the plan of a quota change (who is lowered, when a confirmation is needed)."""
from __future__ import annotations

import pytest

from tenants.capacity import effective_quotas, plan_quota_change

MiB = 1 << 20
C = 64 * MiB


@pytest.mark.parametrize(("requested", "effective"), [
    # observed on the master with 64 MiB mounted
    ({"a": 64 * MiB, "b": 32 * MiB}, {"a": 44739243, "b": 22369621}),
    ({"a": 100 * MiB, "b": 28 * MiB}, {"a": 52428800, "b": 14680064}),
    ({"a": 2**63 - 1, "b": 32 * MiB}, {"a": C, "b": 0}),
    ({"a": 1, "b": 64 * MiB}, {"a": 1, "b": 67108863}),
    ({"a": 10 * MiB, "b": 100 * MiB}, {"a": 6100806, "b": 61008058}),
    ({"a": 64 * MiB + 1, "b": 64 * MiB}, {"a": 33554432, "b": 33554432}),
    ({"zeta": C, "alpha": C, "mid": C}, {"alpha": 22369622, "mid": 22369621, "zeta": 22369621}),
    ({"B": C, "m10": C, "m9": C}, {"B": 22369622, "m10": 22369621, "m9": 22369621}),
    ({"zeta": 7, "alpha": 11, "mid": C - 17}, {"zeta": 7, "alpha": 11, "mid": C - 18}),
    ({"zeta": 7, "alpha": 11, "mid": C - 18}, {"zeta": 7, "alpha": 11, "mid": C - 18}),
    ({"a": 2**62 + 1, "B": 2**62, "z": 2**62}, {"a": 22369622, "B": 22369621, "z": 22369621}),
])
def test_effective_quotas_as_observed(requested, effective):
    assert effective_quotas(requested, C) == effective


def test_nothing_mounted_means_zero_and_bad_input_is_refused():
    assert effective_quotas({"a": 5, "b": 7}, 0) == {"a": 0, "b": 0}
    assert effective_quotas({}, C) == {}
    with pytest.raises(ValueError, match="capacity_bytes"):
        effective_quotas({"a": 1}, -1)
    with pytest.raises(ValueError, match="tenant 'a'"):
        effective_quotas({"a": 0}, C)


def test_huge_tenant_needs_confirmation_and_names_the_starved_tenants():
    plan = plan_quota_change({"acme": 32 * MiB, "globex": 16 * MiB}, {"huge": 2**63 - 1}, C)
    assert plan.needs_confirmation and plan.overcommitted
    assert {row.tenant_id for row in plan.lowered} == {"acme", "globex"}
    rows = {row.tenant_id: row for row in plan.rows}
    assert (rows["acme"].effective_before, rows["acme"].effective_after) == (32 * MiB, 0)
    assert rows["huge"].requested_before is None and rows["huge"].effective_after == C
    message = plan.message()
    assert "Overcommit" in message and "tenant 'acme' from 32 MiB to 0 B" in message and "confirm_overcommit" in message


def test_small_tenants_added_one_by_one_warn_once_the_pool_is_full():
    requested = {"a": 30 * MiB, "b": 30 * MiB}
    assert not plan_quota_change(requested, {"c": 4 * MiB}, C).needs_confirmation  # exactly fills the pool
    requested["c"] = 4 * MiB
    plan = plan_quota_change(requested, {"d": 1 * MiB}, C)
    assert plan.needs_confirmation and len(plan.lowered) == 3


def test_lowering_or_removing_never_needs_confirmation_even_when_overcommitted():
    requested = {"a": C, "b": C}
    assert not plan_quota_change(requested, {"a": C // 2}, C).needs_confirmation
    assert not plan_quota_change(requested, {"a": None}, C).needs_confirmation
    assert not plan_quota_change(requested, {"a": C}, C).needs_confirmation  # unchanged
    assert plan_quota_change(requested, {"a": C + 1}, C).needs_confirmation


def test_unknown_capacity_asks_for_confirmation_of_any_raise():
    plan = plan_quota_change({"a": 1}, {"b": 1}, None, capacity_error="master down")
    assert plan.needs_confirmation and not plan.capacity_known and "master down" in plan.message()
    assert plan.rows[1].effective_after is None
    assert not plan_quota_change({"a": 2}, {"a": 1}, None).needs_confirmation


def test_nothing_mounted_asks_for_confirmation():
    plan = plan_quota_change({}, {"a": 8 * MiB}, 0)
    assert plan.needs_confirmation and "nothing is mounted" in plan.message()


def test_rename_is_removal_plus_addition():
    plan = plan_quota_change({"old": 8 * MiB, "other": 8 * MiB}, {"old": None, "new": 8 * MiB}, C)
    assert not plan.needs_confirmation and plan.requested_after_bytes == 16 * MiB
    assert plan.as_dict()["tenants"][0]["tenant_id"] == "new"
