"""The pool's mounted capacity as the master reports it, and the capacity check of a tenant quota change.

``read_pool()`` reads ``master_total_capacity_bytes`` from the master's Prometheus ``/metrics`` and every tenant's
requested quota from its admin API (``GET /api/v1/tenant_quotas``; both on the metrics port of
``mooncake_master`` 0.3.13.post1, ``settings.KVPOOL_MASTER_ADMIN_URL``). ``plan_tenant_change()`` turns a tenant
about to be saved (or deleted) into a ``tenants.capacity.QuotaPlan``: the registry's quotas (what the quota sync
gives the master) plus the tenants only the master holds, with the change applied. Nothing is guessed: when the
master does not answer, the plan says the capacity is unknown and any raise needs a confirmation.

``check_tenant_change()`` is the one gate the REST API, the pages and the admin use; ``record_confirmation()``
writes the audit entry (``object_type`` ``dashboard.quotaconfirmation``) of a confirmed change, in the same
transaction as the save.
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ValidationError
from prometheus_client.parser import text_string_to_metric_families

from dashboard.master.quota_sync import MasterAdminClient, MasterAdminError
from tenants.audit import current_context
from tenants.capacity import QuotaPlan, plan_quota_change
from tenants.choices import AuditAction
from tenants.models import AuditEntry, Tenant

log = logging.getLogger("kvpool.dashboard.master")

#: ``object_type`` of the audit entry that records a confirmed overcommit.
CONFIRMATION_TYPE = "dashboard.quotaconfirmation"
#: Name of the confirmation field in the API, the page form and the admin form.
CONFIRM_FIELD = "confirm_overcommit"


@dataclass(frozen=True)
class PoolState:
    """The master's view of the pool: mounted capacity and requested quota per tenant (bytes).

    ``capacity_bytes`` is ``None`` (with ``error`` saying why) when the master's metrics could not be read;
    ``master_requested`` is empty when its admin API did not answer.
    """

    capacity_bytes: int | None
    master_requested: dict[str, int] = field(default_factory=dict)
    error: str = ""


def read_metrics(base_url: str, timeout: float) -> dict[str, float]:
    """Every unlabelled sample of ``<base_url>/metrics`` (Prometheus text) as ``name -> value``.

    Raises ``OSError`` (``urllib.error.URLError`` included) when the master does not answer and ``ValueError``
    when the text is not Prometheus exposition.
    """
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as response:
        text = response.read().decode("utf-8", errors="replace")
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def read_pool(client: MasterAdminClient | None = None) -> PoolState:
    """Read the mounted capacity and the master's tenants from the master's admin URL now (in HA mode the
    leader's, ``dashboard.master.leader``)."""
    from dashboard.master.leader import NoLeader, leader_admin_url

    try:
        base_url = leader_admin_url()
    except NoLeader as exc:
        return PoolState(None, error=str(exc))
    timeout = settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS
    try:
        metrics = read_metrics(base_url, timeout)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return PoolState(None, error=f"master metrics at {base_url.rstrip('/')}/metrics unavailable: {reason}")
    if "master_total_capacity_bytes" not in metrics:
        return PoolState(None, error=f"master metrics at {base_url.rstrip('/')}/metrics have no "
                                     "master_total_capacity_bytes")
    capacity = int(metrics["master_total_capacity_bytes"])
    client = client or MasterAdminClient(base_url, timeout=timeout)
    try:
        requested = {snapshot.tenant_id: snapshot.requested_quota_bytes for snapshot in client.list_quotas()}
    except MasterAdminError as exc:
        return PoolState(None, error=f"the master's tenant quotas could not be read: {exc}")
    return PoolState(capacity, requested)


def registry_requested(pool: PoolState) -> dict[str, int]:
    """Requested quota per tenant as the master will hold it after the quota sync: every registry tenant's
    ``quota_bytes`` plus the tenants only the master holds (the sync leaves those alone)."""
    requested = dict(pool.master_requested)
    requested.update(Tenant.objects.values_list("tenant_id", "quota_bytes"))
    return requested


def plan_tenant_change(tenant: Tenant | None, *, stored: Tenant | None = None, delete: bool = False,
                       pool: PoolState | None = None) -> QuotaPlan:
    """The ``QuotaPlan`` of saving ``tenant`` (new values; ``stored`` = the row as it is, ``None`` for a new
    tenant) or, with ``delete=True``, of deleting ``stored``. ``tenant=None`` and ``stored=None`` gives the
    plan of no change (the pool as it is). ``pool`` defaults to ``read_pool()``."""
    pool = pool if pool is not None else read_pool()
    requested = registry_requested(pool)
    changes: dict[str, int | None] = {}
    if stored is not None and (delete or tenant is None or stored.tenant_id != tenant.tenant_id):
        changes[stored.tenant_id] = None
    if tenant is not None and not delete and isinstance(tenant.quota_bytes, int) and tenant.tenant_id:
        changes[tenant.tenant_id] = tenant.quota_bytes
    return plan_quota_change(requested, changes, pool.capacity_bytes, capacity_error=pool.error)


def check_tenant_change(tenant: Tenant, *, confirmed: bool, pool: PoolState | None = None) -> QuotaPlan:
    """Gate of a tenant save: its ``QuotaPlan``; raises ``ValidationError({"confirm_overcommit": ...})`` when the
    plan needs a confirmation that ``confirmed`` does not give."""
    plan = plan_tenant_change(tenant, stored=tenant.stored(), pool=pool)
    if plan.needs_confirmation and not confirmed:
        raise ValidationError({CONFIRM_FIELD: plan.message()}, code="overcommit")
    return plan


def record_confirmation(tenant: Tenant, plan: QuotaPlan) -> AuditEntry | None:
    """Audit a confirmed overcommit of ``tenant`` (saved): who confirmed what, with the whole plan.

    Writes nothing (returns ``None``) when the plan needed no confirmation. Call it inside the save's transaction.
    The entry belongs to no tenant (``tenant_pk`` ``None``): the plan lists every tenant's quota and the pool's
    capacity, so only platform admins see it (``tenants.access``).
    """
    if not plan.needs_confirmation:
        return None
    context = current_context()
    user, actor_repr = context.resolve_actor()
    entry = AuditEntry.objects.create(
        actor=user, actor_repr=actor_repr[:255], action=AuditAction.UPDATE, object_type=CONFIRMATION_TYPE,
        object_id=str(tenant.pk), object_repr=f"tenant {tenant.tenant_id}: overcommit confirmed"[:255],
        before=None, after={CONFIRM_FIELD: True, "tenant_id": tenant.tenant_id, **plan.as_dict()},
        request_id=context.request_id, tenant_pk=None,
    )
    log.warning("tenant %s: overcommit confirmed by %s: %s", tenant.tenant_id, actor_repr, plan.message())
    return entry
