"""Budgets inside a tenant's quota: the byte budgets of its releases and request groups may not exceed it.

A budget is the most bytes a release namespace or a request group may occupy in the Store (the agent
enforces it before the master's global eviction). Retired releases do not count: retiring frees the budget.
Errors name the field and say by how many bytes the quota would be exceeded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db.models import Sum

from tenants.choices import ReleaseState
from tenants.quota import humanize_bytes

if TYPE_CHECKING:
    from tenants.models import Release, RequestGroup, Tenant


def budgeted_bytes(tenant: Tenant, *, exclude: object | None = None) -> int:
    """Sum of ``budget_bytes`` over the tenant's non-retired releases and its request groups, in bytes.

    ``exclude`` (a saved ``Release`` or ``RequestGroup``) is left out, so an object being edited is counted
    with its new value by the caller.
    """
    from tenants.models import Release, RequestGroup

    releases, groups = _budgeted_rows()
    releases, groups = releases.filter(model__tenant=tenant), groups.filter(tenant=tenant)
    if isinstance(exclude, Release) and exclude.pk is not None:
        releases = releases.exclude(pk=exclude.pk)
    if isinstance(exclude, RequestGroup) and exclude.pk is not None:
        groups = groups.exclude(pk=exclude.pk)
    total = releases.aggregate(total=Sum("budget_bytes"))["total"] or 0
    return total + (groups.aggregate(total=Sum("budget_bytes"))["total"] or 0)


def _budgeted_rows():
    """The rows budgets are summed over: non-retired releases and request groups, each with a budget."""
    from tenants.models import Release, RequestGroup

    releases = Release.objects.filter(budget_bytes__isnull=False).exclude(state=ReleaseState.RETIRED)
    return releases, RequestGroup.objects.filter(budget_bytes__isnull=False)


def budgeted_bytes_by_tenant(tenants=None) -> dict[int, int]:
    """``budgeted_bytes`` of many tenants in two grouped queries: ``{tenant pk: bytes}`` (tenants without a budget
    are left out). ``tenants``: a ``Tenant`` queryset (or pks) to limit them to; ``None`` = all."""
    releases, groups = _budgeted_rows()
    if tenants is not None:
        releases, groups = releases.filter(model__tenant__in=tenants), groups.filter(tenant__in=tenants)
    totals: dict[int, int] = {}
    for rows, link in ((releases, "model__tenant"), (groups, "tenant")):
        for tenant_pk, total in rows.order_by().values_list(link).annotate(total=Sum("budget_bytes")):
            totals[tenant_pk] = totals.get(tenant_pk, 0) + (total or 0)
    return totals


def budget_claims(tenant_ids=None) -> tuple[dict[str, dict[tuple[str, str], int]], dict[str, list]]:
    """The rows ``budgeted_bytes`` sums, for many tenants in two queries, and the live releases without a budget.

    Returns ``(claims, unbudgeted)``: ``claims[tenant_id]`` maps ``("release", "<served_model_name>/<namespace>")``
    and ``("request group", name)`` to budget bytes (non-retired releases and every request group with a budget,
    so ``sum(claims[t].values()) == budgeted_bytes(t)``); ``unbudgeted[tenant_id]`` lists the pks of its non-retired
    releases without a budget, ascending. ``tenant_ids`` limits both to those tenants (``None`` = all).
    """
    from tenants.models import Release, RequestGroup

    releases = Release.objects.exclude(state=ReleaseState.RETIRED)
    groups = RequestGroup.objects.filter(budget_bytes__isnull=False)
    if tenant_ids is not None:
        releases = releases.filter(model__tenant__tenant_id__in=list(tenant_ids))
        groups = groups.filter(tenant__tenant_id__in=list(tenant_ids))
    claims: dict[str, dict[tuple[str, str], int]] = {}
    unbudgeted: dict[str, list] = {}
    rows = releases.order_by("pk").values_list("pk", "model__tenant__tenant_id", "model__served_model_name",
                                               "namespace", "budget_bytes")
    for pk, tenant_id, model, namespace, budget in rows:
        if budget is None:
            unbudgeted.setdefault(tenant_id, []).append(pk)
        else:
            claims.setdefault(tenant_id, {})[("release", f"{model}/{namespace}")] = budget
    for tenant_id, name, budget in groups.values_list("tenant__tenant_id", "name", "budget_bytes"):
        claims.setdefault(tenant_id, {})[("request group", name)] = budget
    return claims, unbudgeted


def check_budget(obj: Release | RequestGroup, tenant: Tenant) -> None:
    """Raise ``ValidationError({"budget_bytes": ...})`` when ``obj``'s budget would push the tenant over quota."""
    budget = obj.budget_bytes
    if not isinstance(budget, int) or not isinstance(tenant.quota_bytes, int):
        return
    total = budgeted_bytes(tenant, exclude=obj) + budget
    excess = total - tenant.quota_bytes
    if excess > 0:
        raise ValidationError(
            {
                "budget_bytes": f"Budgets in tenant '{tenant.tenant_id}' would total {total} bytes, exceeding its "
                f"quota_bytes {tenant.quota_bytes} by {excess} bytes ({humanize_bytes(excess)}). Lower this "
                "budget or raise the tenant's quota."
            },
            code="over_quota",
        )


def check_quota(tenant: Tenant) -> None:
    """Raise ``ValidationError({"quota_bytes": ...})`` when the quota is below the budgets already given out."""
    total = budgeted_bytes(tenant)
    excess = total - tenant.quota_bytes
    if excess > 0:
        raise ValidationError(
            {
                "quota_bytes": f"quota_bytes {tenant.quota_bytes} is below the {total} bytes budgeted to releases "
                f"and request groups of tenant '{tenant.tenant_id}': the budgets would exceed it by {excess} "
                f"bytes ({humanize_bytes(excess)}). Lower those budgets first."
            },
            code="below_budgets",
        )
