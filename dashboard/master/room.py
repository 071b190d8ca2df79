"""The pool's room under the master's eviction points, from the database (``tenants.room`` fed with live values).

Inputs, all read from rows the dashboard already keeps (no call to the master here):

* the mounted capacity: ``MasterHealth.capacity_bytes`` of the newest successful master probe
  (``dashboard.master.health``, ``master_total_capacity_bytes``; unknown before the first probe, and 0 while
  nothing is mounted, which ``tenants.room`` treats as unknown);
* the master's flags: ``KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO`` / ``KVPOOL_MASTER_EVICTION_RATIO`` (what
  ``render_master`` renders);
* every tenant's requested quota: the registry's, plus the tenants only the master holds (the newest master
  read-back round, ``MasterQuotaSample``), so effective quotas follow a quota change at once instead of after the
  next sync and sample;
* the budgets: ``tenants.budgets.budget_claims``; charged bytes: the newest read-back of each tenant.

``current_pool_room()`` gives the ``tenants.room.PoolRoom``; ``release_budgets(room)`` the budget each live release
works under (explicit, or implicit: ``ReleaseBudget``), which ``dashboard.rollout.push`` renders into documents.
"""
from __future__ import annotations

from dataclasses import dataclass

from tenants.budgets import budget_claims
from tenants.room import MasterEviction, PoolRoom, pool_room


@dataclass(frozen=True)
class ReleaseBudget:
    """The budget a release works under: ``budget_bytes`` (``None``: none, a retired release without one) and
    whether it is ``implicit`` (``tenants.room.implicit_budgets``) rather than the release's own."""

    budget_bytes: int | None
    implicit: bool = False


def _newest_round(samples: dict) -> dict:
    """Of each tenant's newest read-back (``latest_master_quotas``), those of the newest round: a tenant missing
    from it is one the master no longer holds."""
    if not samples:
        return {}
    newest = max(sample.ts for sample in samples.values())
    return {tenant_id: sample for tenant_id, sample in samples.items() if sample.ts == newest}


def current_pool_room() -> PoolRoom:
    """Every registry tenant's ``TenantRoom`` against the master as the dashboard last saw it (module docstring)."""
    from dashboard.master.health import current_health
    from dashboard.telemetry.queries import latest_master_quotas
    from tenants.models import Tenant

    samples = latest_master_quotas()
    quotas = dict(Tenant.objects.values_list("tenant_id", "quota_bytes"))
    requested = {tenant_id: sample.requested_quota_bytes for tenant_id, sample in _newest_round(samples).items()
                 if tenant_id not in quotas and sample.requested_quota_bytes >= 1}
    requested.update(quotas)
    claims, unbudgeted = budget_claims()
    tenants = {
        tenant_id: {"budgeted_bytes": sum(claims.get(tenant_id, {}).values()),
                    "budgets": claims.get(tenant_id, {}), "unbudgeted": tuple(unbudgeted.get(tenant_id, ())),
                    "charged_bytes": samples[tenant_id].charged_bytes if tenant_id in samples else None}
        for tenant_id in quotas
    }
    return pool_room(requested, current_health().capacity_bytes, MasterEviction.from_settings(), tenants)


def release_budgets(room: PoolRoom) -> dict[int, ReleaseBudget]:
    """Release pk -> its implicit ``ReleaseBudget`` for every live release without a budget of its own (a release
    missing here works under its own ``budget_bytes``: see ``effective_budget``)."""
    return {pk: ReleaseBudget(budget, implicit=True)
            for tenant in room.tenants.values() for pk, budget in tenant.implicit_budgets.items()}


def effective_budget(release, budgets: dict[int, ReleaseBudget] | None = None) -> ReleaseBudget:
    """The budget ``release`` works under: its own ``budget_bytes`` when set (or when it is retired), else its
    implicit budget (``budgets`` from ``release_budgets``; read now when not given)."""
    if release.budget_bytes is not None:
        return ReleaseBudget(release.budget_bytes)
    if budgets is None:
        budgets = release_budgets(current_pool_room())
    return budgets.get(release.pk, ReleaseBudget(None))
