"""The ``budgets_fit`` check (issue 18 item 4): it fails when budgets let the master's prefix-blind eviction start
(a tenant's budgets above its effective quota, or all tenants' above the watermark of the mounted capacity), and
says which of the tenant's own budgets to lower to what."""
from __future__ import annotations

import pytest
from django.utils import timezone

from dashboard.checklist import check_budgets_fit, run_checks
from dashboard.models import MasterHealth
from tests.support.factories import make_group, make_model, make_release, make_tenant
from tests.support.rows import master_sample

pytestmark = pytest.mark.django_db
MiB = 1 << 20


def mounted(capacity: int) -> None:
    MasterHealth.objects.update_or_create(pk=1, defaults={"up": True, "checked_at": timezone.now(),
                                                          "capacity_bytes": capacity, "key_count": 0})


def test_budgets_within_the_requested_quota_pass_while_the_capacity_is_unknown(db):
    tenant = make_tenant("acme", quota=100 * MiB)
    make_release(make_model(tenant, "chat", "/m"), "v1", budget_bytes=60 * MiB)
    make_release(tenant.served_models.get(), "v2")
    result = check_budgets_fit(timezone.now())
    assert result.passed and result.summary.startswith("mounted capacity unknown")
    assert "budgets can hold 100 MiB of its requested quota 100 MiB" in result.details[0]
    assert "budgets_fit" in [check.key for check in run_checks()]


def test_budgets_above_a_scaled_down_effective_quota_fail_and_say_what_to_lower(db):
    acme = make_tenant("acme", quota=100 * MiB)
    make_tenant("globex", quota=100 * MiB)  # together 200 MiB requested into 100 MiB mounted: 50 MiB each
    make_release(make_model(acme, "chat", "/m"), "v1", budget_bytes=40 * MiB)
    make_group(acme, "gold", cache_salt="s", budget_bytes=20 * MiB)
    mounted(100 * MiB)
    result = check_budgets_fit(timezone.now())
    assert not result.passed
    line = result.details[0]
    assert "tenant 'acme' can hold 60 MiB, 10 MiB (10485760 bytes) above its effective quota of 50 MiB" in line
    assert "release 'chat/v1' from 40 MiB to 33.3 MiB" in line
    assert "request group 'gold' from 20 MiB to 16.7 MiB" in line
    assert "mount more memory" in line and "globex" not in line  # another tenant is not named to this one


def test_all_tenants_above_the_watermark_fail_with_each_tenants_share(db, settings):
    settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO = 0.9
    acme, globex = make_tenant("acme", quota=50 * MiB), make_tenant("globex", quota=50 * MiB)
    make_release(make_model(acme, "chat", "/m"), "v1", budget_bytes=50 * MiB)  # fits its 50 MiB quota
    mounted(100 * MiB)  # watermark 90 MiB: shares of 45 MiB each
    assert check_budgets_fit(timezone.now()).passed  # globex holds nothing: the pool cannot pass 90 MiB
    make_release(make_model(globex, "chat", "/m"), "g1")  # implicit budget: globex's share, 45 MiB
    result = check_budgets_fit(timezone.now())
    assert not result.passed
    assert result.details[0].startswith("all tenants can hold 95 MiB, 5 MiB above the pool's eviction watermark of "
                                        "90 MiB (0.9 of 100 MiB mounted)")
    assert "tenant 'acme' can hold 50 MiB, 5 MiB (5242880 bytes) above its share of the pool's eviction watermark of " \
           "45 MiB" in result.details[1] and "release 'chat/v1' from 50 MiB to 45 MiB" in result.details[1]
    assert not any("globex" in line for line in result.details[:2])


def test_tenants_only_the_master_holds_count_against_the_watermark(db):
    acme = make_tenant("acme", quota=40 * MiB)
    make_release(make_model(acme, "chat", "/m"), "v1", budget_bytes=40 * MiB)
    master_sample("acme", effective=40 * MiB, ago=1)
    mounted(100 * MiB)
    assert check_budgets_fit(timezone.now()).passed
    master_sample("legacy", effective=60 * MiB, requested=60 * MiB, ago=0)  # unknown to the registry
    result = check_budgets_fit(timezone.now())
    assert not result.passed and "tenants only the master holds: 60 MiB" in result.details[0]


def test_releases_left_without_room_are_reported(db):
    acme = make_tenant("acme", quota=40 * MiB)
    model = make_model(acme, "chat", "/m")
    make_release(model, "v1", budget_bytes=40 * MiB)
    make_release(model, "v2")
    result = check_budgets_fit(timezone.now())
    assert result.passed and "1 release(s) without a budget keep nothing" in result.details[0]
