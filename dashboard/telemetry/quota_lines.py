"""The quota and budget lines of the occupancy chart: the limits the bytes shown are held against.

When the chart shows one tenant (its filter, or every series of one tenant) it draws that tenant's

* ``quota``: the registry's requested quota (``Tenant.quota_bytes``);
* ``effective_quota``: the effective quota of the newest master read-back (``MasterQuotaSample``, via
  ``queries.latest_master_quotas``), when there is one;

when it shows one release (every series is that release, or the filters name exactly one of the registry's) also

* ``budget``: the budget the release works under, its own ``budget_bytes`` or its implicit one
  (``dashboard.master.room.effective_budget``, the one implementation the config documents and
  ``kvpool_release_budget_bytes`` use; ``implicit`` says which);

and when a request group is selected

* ``request_group_budget``: that group's ``budget_bytes``, when it has one.

Only a tenant the viewer may see (``OccupancyFilter.tenant_ids``, from ``tenants.access``) gets lines. Sizes are
bytes.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from agent.contract.scope import CacheScope
from dashboard.telemetry.queries import OccupancyFilter, latest_master_quotas
from tenants.quota import humanize_bytes


@dataclass(frozen=True)
class QuotaLine:
    """One horizontal line: ``kind`` (``quota``, ``effective_quota``, ``budget``, ``request_group_budget``), the
    legend ``label`` (name and size, e.g. ``"quota (registry) 64 GiB"``), ``bytes``, and for a budget whether it is
    ``implicit``."""

    kind: str
    label: str
    bytes: int
    implicit: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quota_lines(filters: OccupancyFilter, shown: Iterable[CacheScope], *, summed: bool = False) -> list[QuotaLine]:
    """The lines of a chart filtered by ``filters`` whose series are the releases ``shown`` (their
    ``CacheScope.release_scope()``); empty when it shows several tenants or none the viewer may see. ``summed``:
    the chart also has the series of the releases beyond its cap summed (``SeriesSummary.other``), whose tenants
    it does not name: then only a tenant the filters name (or the only one the viewer may see) gets lines."""
    from dashboard.master.room import effective_budget
    from tenants.models import Release, RequestGroup, Tenant

    shown = {key.release_scope() for key in shown}
    if filters.tenant_id:
        tenant_ids = {filters.tenant_id}
    elif summed:  # the sum may hold any tenant the viewer may see: lines only if that is one tenant
        tenant_ids = set(filters.tenant_ids) if filters.tenant_ids is not None else set()
    else:
        tenant_ids = {key.tenant_id for key in shown}
    if len(tenant_ids) != 1:
        return []
    (tenant_id,) = tenant_ids
    if filters.tenant_ids is not None and tenant_id not in filters.tenant_ids:
        return []
    tenant = Tenant.objects.filter(tenant_id=tenant_id).first()
    if tenant is None:
        return []
    lines = [QuotaLine("quota", f"quota (registry) {humanize_bytes(tenant.quota_bytes)}", tenant.quota_bytes)]
    sample = latest_master_quotas().get(tenant_id)
    if sample is not None:
        effective = sample.effective_quota_bytes
        lines.append(QuotaLine("effective_quota", f"effective quota (master) {humanize_bytes(effective)}", effective))
    release = _one_release(Release.objects.filter(model__tenant=tenant).select_related("model"), filters, shown)
    if release is not None:
        budget = effective_budget(release)
        if budget.budget_bytes is not None:
            kind = "implicit budget" if budget.implicit else "budget"
            lines.append(QuotaLine("budget", f"{kind} of {release.namespace} {humanize_bytes(budget.budget_bytes)}",
                                   budget.budget_bytes, implicit=budget.implicit))
    if filters.request_group:
        group = RequestGroup.objects.filter(tenant=tenant, name=filters.request_group).first()
        if group is not None and group.budget_bytes is not None:
            lines.append(QuotaLine("request_group_budget",
                                   f"budget of request group {group.name} {humanize_bytes(group.budget_bytes)}",
                                   group.budget_bytes))
    return lines


def _one_release(releases, filters: OccupancyFilter, shown: set[CacheScope]):
    """The one ``Release`` (of ``releases``, the tenant's) the chart shows: the only series, else the only release
    the filters name; ``None`` otherwise."""
    if len(shown) == 1:
        (key,) = shown
        return releases.filter(model__served_model_name=key.served_model_name, namespace=key.namespace).first()
    if shown or not filters.namespace:
        return None
    if filters.served_model_name:
        releases = releases.filter(model__served_model_name=filters.served_model_name)
    matches = list(releases.filter(namespace=filters.namespace)[:2])
    return matches[0] if len(matches) == 1 else None
