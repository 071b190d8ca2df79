"""Rolling upgrade of a served model, as the seed describes it (Rolling Model Upgrades):

1. **start** — a new release namespace is created by copying the serving release's cache settings
   (``tenants.services.copy_release``; changed settings such as ``weights_revision`` may be given) and,
   optionally, its instance layout (same nodes, roles and ranks; ports shifted by an offset). Before anything
   is written the projected peak occupancy of the tenant — its other namespaces + the old release + the new
   release warmed up to the old one's size — is compared with the tenant's **effective** quota read back from
   the Mooncake master; a start that would not fit needs an explicit acceptance.
2. **warm** — the new release is ``warming``; both releases' occupancy is shown side by side.
3. **shift traffic** — the new release becomes ``serving`` and the old one ``draining`` (one transaction).
4. **retire** — allowed once every node that runs an instance of the old release has reported, after draining
   began, zero in-flight requests for it; the old release becomes ``retired`` and its instances are removed
   from their nodes. A purge of its keys is then offered (``dashboard.rollout.purge``).

The phase is derived from the states of the model's releases (no extra table): ``idle`` (one release
serving), ``warming`` (a warming release next to a serving one, or a first release warming alone) and
``draining`` (a draining release next to a serving one). Every write goes through the registry's model rules
(``validated_save``), so it is validated like the API and lands in the audit log under the acting user.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction

from agent.contract.scope import CacheScope
from dashboard.telemetry.queries import (
    OccupancyFilter,
    ReleaseNow,
    current_occupancy,
    latest_master_quotas,
)
from tenants.choices import ReleaseState
from tenants.models import AuditEntry, InstanceAssignment, Release, ServedModel, Tenant
from tenants.quota import humanize_bytes
from tenants.services import build_release_copy, copy_release, validated_save

log = logging.getLogger("kvpool.dashboard.upgrade")

PHASE_IDLE = "idle"
PHASE_WARMING = "warming"
PHASE_DRAINING = "draining"

_ASSIGNMENT_FIELDS = ("role", "tp_rank", "tp_size", "pp_rank", "pp_size", "pcp_rank", "pcp_size", "dcp_rank",
                      "dcp_size", "gpu_ids")


class UpgradeError(Exception):
    """A step of the rolling upgrade is refused now; the message says why and what to do."""


# --- quota and projection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantQuota:
    """A tenant's quota as the registry requests it and as the master applies it (bytes).

    ``effective_bytes``/``charged_bytes`` come from the newest master read-back (``None`` when none was
    sampled yet); ``limit_bytes`` is the effective quota when known, else the requested one.
    """

    tenant_id: str
    requested_bytes: int
    effective_bytes: int | None = None
    charged_bytes: int | None = None
    sampled_at: datetime | None = None
    admission_closed: bool = False
    over_quota: bool = False

    @property
    def limit_bytes(self) -> int:
        return self.effective_bytes if self.effective_bytes is not None else self.requested_bytes

    @property
    def scaled_down(self) -> bool:
        """The master applies less than the registry requests (the pool is overcommitted: ``tenants.capacity``)."""
        return self.effective_bytes is not None and self.effective_bytes < self.requested_bytes

    @property
    def charged_above_effective(self) -> bool:
        """The master charges the tenant more than its effective quota (its writes are refused)."""
        return (self.effective_bytes is not None and self.charged_bytes is not None
                and self.charged_bytes > self.effective_bytes)

    @property
    def source(self) -> str:
        if self.effective_bytes is None:
            return "requested quota (no read-back from the Mooncake master yet)"
        return f"effective quota read back from the Mooncake master at {self.sampled_at:%Y-%m-%d %H:%M:%S} UTC"


def tenant_quota(tenant: Tenant, samples: dict | None = None) -> TenantQuota:
    """The ``TenantQuota`` of ``tenant`` (``samples``: a ``latest_master_quotas()`` result to reuse)."""
    sample = (samples if samples is not None else latest_master_quotas()).get(tenant.tenant_id)
    if sample is None:
        return TenantQuota(tenant.tenant_id, tenant.quota_bytes)
    return TenantQuota(tenant.tenant_id, tenant.quota_bytes, sample.effective_quota_bytes, sample.charged_bytes,
                       sample.ts, sample.admission_closed, sample.over_quota)


def release_key(release: Release) -> CacheScope:
    """The occupancy key of a release: its whole-release ``CacheScope`` (``request_group`` ``None``: every row)."""
    return CacheScope(release.model.tenant.tenant_id, release.model.served_model_name, release.namespace)


@dataclass(frozen=True)
class Projection:
    """Projected peak occupancy of a tenant while an old and a new release overlap (bytes).

    ``projected_new_bytes`` assumes the new release warms up to the old one's size (it caches the same
    prefixes under its own keys): ``max(new_bytes, old_bytes)``. ``other_bytes`` is the tenant's occupancy
    outside the two releases.
    """

    quota: TenantQuota
    old_bytes: int
    new_bytes: int
    other_bytes: int

    @property
    def projected_new_bytes(self) -> int:
        return max(self.new_bytes, self.old_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.other_bytes + self.old_bytes + self.projected_new_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.quota.limit_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0

    def describe(self) -> str:
        """One sentence with the numbers, for messages and the checks page."""
        verdict = "fits within" if self.fits else "exceeds"
        return (f"projected peak {humanize_bytes(self.peak_bytes)} (other namespaces "
                f"{humanize_bytes(self.other_bytes)} + old {humanize_bytes(self.old_bytes)} + new "
                f"{humanize_bytes(self.projected_new_bytes)}) {verdict} the {self.quota.source} of tenant "
                f"'{self.quota.tenant_id}', {humanize_bytes(self.quota.limit_bytes)}")


def project(old: Release | None, new: Release | None = None, *,
            occupancy: dict[CacheScope, ReleaseNow] | None = None, samples: dict | None = None) -> Projection:
    """Projection of the overlap of ``old`` and ``new`` (both releases of one model; either may be None)."""
    release = old or new
    if release is None:
        raise ValueError("project() needs at least one release")
    tenant = release.model.tenant
    if occupancy is None:
        occupancy = current_occupancy(OccupancyFilter(tenant_id=tenant.tenant_id))
    tenant_total = sum(entry.bytes for key, entry in occupancy.items() if key.tenant_id == tenant.tenant_id)
    old_bytes = occupancy[release_key(old)].bytes if old is not None and release_key(old) in occupancy else 0
    new_bytes = occupancy[release_key(new)].bytes if new is not None and release_key(new) in occupancy else 0
    return Projection(tenant_quota(tenant, samples), old_bytes, new_bytes,
                      max(tenant_total - old_bytes - new_bytes, 0))


# --- phase ------------------------------------------------------------------------------------------------


@dataclass
class UpgradeState:
    """Where a model's rolling upgrade stands: ``phase`` and the ``old``/``new`` releases taking part."""

    model: ServedModel
    phase: str
    old: Release | None = None
    new: Release | None = None
    releases: list[Release] = field(default_factory=list)

    @property
    def retired(self) -> list[Release]:
        return [r for r in self.releases if r.state == ReleaseState.RETIRED]


def upgrade_state(model: ServedModel) -> UpgradeState:
    """Derive the phase from the states of ``model``'s releases (newest release wins a tie)."""
    releases = list(model.releases.select_related("model__tenant").order_by("created_at", "pk"))
    by_state: dict[str, list[Release]] = {}
    for release in releases:
        by_state.setdefault(release.state, []).append(release)
    serving = by_state.get(ReleaseState.SERVING, [])
    warming = by_state.get(ReleaseState.WARMING, [])
    draining = by_state.get(ReleaseState.DRAINING, [])
    if draining:
        return UpgradeState(model, PHASE_DRAINING, old=draining[-1], new=serving[-1] if serving else None,
                            releases=releases)
    if warming:
        return UpgradeState(model, PHASE_WARMING, old=serving[-1] if serving else None, new=warming[-1],
                            releases=releases)
    return UpgradeState(model, PHASE_IDLE, old=serving[-1] if serving else None, releases=releases)


# --- steps ------------------------------------------------------------------------------------------------


def quota_refusal(projection: Projection, accept_over_quota: bool = False) -> str | None:
    """Why a start with this ``projection`` is refused (``None``: it fits, or the overrun is accepted)."""
    if projection.fits or accept_over_quota:
        return None
    return (f"The {projection.describe()}. Old and new releases are both warm while they overlap: raise the "
            "quota, or accept that the master evicts (or refuses writes) during the upgrade.")


def start_upgrade(old: Release, namespace: str, *, overrides: dict | None = None, budget_bytes: int | None = None,
                  description: str | None = None, copy_instances: bool = False, port_offset: int = 0,
                  accept_over_quota: bool = False) -> Release:
    """Create the new release (``warming``) from ``old`` under ``namespace``; see the module docstring.

    ``overrides`` are changed cache settings (``tenants.fingerprint.CACHE_SETTING_FIELDS``). With
    ``copy_instances`` every instance of ``old`` is assigned again to the new release on the same node with
    ports (and bootstrap ports) shifted by ``port_offset``. Raises ``UpgradeError`` when ``old`` is not the
    model's serving release or an upgrade is already under way, and ``ValidationError`` keyed by field
    (``namespace``, a setting, ``budget_bytes``, ``port_offset`` for a refused instance copy,
    ``accept_over_quota`` when the projection exceeds the quota — together with the new release's own errors);
    nothing is written then.
    """
    state = upgrade_state(old.model)
    if old.state != ReleaseState.SERVING:
        raise UpgradeError(f"Release '{old.namespace}' is {old.state}; only a serving release can be upgraded.")
    if state.phase != PHASE_IDLE:
        raise UpgradeError(
            f"An upgrade of '{old.model}' is already {state.phase} (release '{(state.new or state.old).namespace}'); "
            "finish or abort it first.")
    projection = project(old)
    refusal = quota_refusal(projection, accept_over_quota)
    if refusal is not None:
        # Report the new release's own errors (namespace taken, settings, budget) with the quota at once.
        errors = {"accept_over_quota": [refusal]}
        try:
            build_release_copy(old, namespace, budget_bytes=budget_bytes, description=description,
                               **(overrides or {})).full_clean()
        except ValidationError as error:
            for name, messages in error.message_dict.items():
                errors.setdefault(name, []).extend(messages)
        raise ValidationError(errors)
    with transaction.atomic():
        new = copy_release(old, namespace, budget_bytes=budget_bytes, description=description,
                           **(overrides or {}))
        if copy_instances:
            for assignment in old.assignments.select_related("node").order_by("node__name", "port"):
                _copy_assignment(assignment, new, port_offset)
    log.info("upgrade of %s: started release %s from %s (%s)", old.model, new.namespace, old.namespace,
             projection.describe())
    return new


def _copy_assignment(assignment: InstanceAssignment, new: Release, offset: int) -> InstanceAssignment:
    copy = InstanceAssignment(node=assignment.node, release=new, port=assignment.port + offset,
                              bootstrap_port=(assignment.bootstrap_port + offset
                                              if assignment.bootstrap_port is not None else None),
                              **{name: getattr(assignment, name) for name in _ASSIGNMENT_FIELDS})
    try:
        return validated_save(copy)
    except ValidationError as error:
        detail = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in error.message_dict.items())
        raise ValidationError({"port_offset": (
            f"Copying instance {assignment.role} on {assignment.node}:{assignment.port} to port "
            f"{copy.port} was refused ({detail}). Choose another port offset.")}) from None


def shift_traffic(model: ServedModel) -> UpgradeState:
    """Warm → serving for the new release and serving → draining for the old one, in one transaction.

    Raises ``UpgradeError`` outside the ``warming`` phase or when the new release has no instance yet.
    """
    state = upgrade_state(model)
    if state.phase != PHASE_WARMING or state.new is None:
        raise UpgradeError(f"No release of '{model}' is warming: there is no traffic to shift.")
    new, old = state.new, state.old
    if not new.assignments.exists():
        raise UpgradeError(f"Release '{new.namespace}' has no instances: assign its prefill and decode instances "
                           "before shifting traffic to it.")
    with transaction.atomic():
        new.state = ReleaseState.SERVING
        validated_save(new)
        if old is not None:
            old.state = ReleaseState.DRAINING
            validated_save(old)
    log.info("upgrade of %s: traffic shifted to %s%s", model, new.namespace,
             f", {old.namespace} draining" if old else "")
    return upgrade_state(model)


def drain_started_at(release: Release) -> datetime:
    """When ``release`` last entered ``draining`` (from the audit log; its ``updated_at`` when not logged)."""
    entries = (AuditEntry.objects.filter(object_type="tenants.release", object_id=str(release.pk),
                                         after__state=ReleaseState.DRAINING)
               .order_by("-timestamp", "-pk").values_list("timestamp", "before"))
    for timestamp, before in entries:
        if not before or before.get("state") != ReleaseState.DRAINING:
            return timestamp
    return release.updated_at


@dataclass(frozen=True)
class NodeDrain:
    """One node's last word on the old release since draining began (``reported_at`` None: not yet)."""

    node: str
    reported_at: datetime | None
    in_flight_requests: int

    @property
    def done(self) -> bool:
        return self.reported_at is not None and self.in_flight_requests == 0


@dataclass(frozen=True)
class RetireReadiness:
    """Whether the draining release may retire: every serving node reported zero in-flight requests."""

    release: Release
    since: datetime
    nodes: tuple[NodeDrain, ...]

    @property
    def ready(self) -> bool:
        return all(node.done for node in self.nodes)

    @property
    def reason(self) -> str:
        waiting = [n for n in self.nodes if not n.done]
        if not waiting:
            return f"No in-flight requests for '{self.release.namespace}' on any node."
        parts = [f"{n.node}: no report since draining began" if n.reported_at is None
                 else f"{n.node}: {n.in_flight_requests} in-flight requests" for n in waiting]
        return f"Waiting for in-flight requests of '{self.release.namespace}' to finish ({'; '.join(parts)})."


def retire_readiness(release: Release) -> RetireReadiness:
    """Per node running an instance of ``release``: its newest report since draining began (raw samples)."""
    from dashboard.models import OccupancySample

    since = drain_started_at(release)
    tenant_id, model, namespace, _ = release_key(release)
    nodes = sorted(set(release.assignments.values_list("node__name", flat=True)))
    rows = (OccupancySample.objects.filter(level=OccupancySample.Level.RAW, tenant_id=tenant_id,
                                           served_model_name=model, namespace=namespace, node_name__in=nodes,
                                           ts__gte=since)
            .values_list("node_name", "ts", "in_flight_requests"))
    newest: dict[str, tuple[datetime, int]] = {}
    for node, ts, flight in rows:
        current = newest.get(node)
        if current is None or ts > current[0]:
            newest[node] = (ts, flight)
        elif ts == current[0]:
            newest[node] = (ts, current[1] + flight)
    drains = tuple(NodeDrain(node, newest[node][0] if node in newest else None,
                             newest[node][1] if node in newest else 0) for node in nodes)
    return RetireReadiness(release, since, drains)


def retire(model: ServedModel) -> Release:
    """Retire the draining release once ``retire_readiness`` allows it, removing its instances from their nodes.

    Raises ``UpgradeError`` outside the ``draining`` phase or while requests are still in flight.
    """
    state = upgrade_state(model)
    if state.phase != PHASE_DRAINING or state.old is None:
        raise UpgradeError(f"No release of '{model}' is draining: shift traffic first.")
    old = state.old
    readiness = retire_readiness(old)
    if not readiness.ready:
        raise UpgradeError(readiness.reason)
    _retire_release(old)
    log.info("upgrade of %s: retired %s", model, old.namespace)
    return old


def abort_upgrade(model: ServedModel) -> Release:
    """Give up a warming release: retire it and remove its instances (the serving release is untouched).

    Raises ``UpgradeError`` outside the ``warming`` phase.
    """
    state = upgrade_state(model)
    if state.phase != PHASE_WARMING or state.new is None:
        raise UpgradeError(f"No release of '{model}' is warming: there is nothing to abort.")
    new = state.new
    _retire_release(new)
    log.info("upgrade of %s: aborted %s", model, new.namespace)
    return new


def _retire_release(release: Release) -> None:
    """Remove every instance of ``release`` from its node and mark it ``retired``, in one transaction (one
    instance at a time, so each removal goes through the model's delete, its signals and the audit log)."""
    with transaction.atomic():
        for assignment in list(release.assignments.all()):
            assignment.delete()
        release.state = ReleaseState.RETIRED
        validated_save(release)


# --- overlap across a tenant (checks page) ----------------------------------------------------------------


@dataclass(frozen=True)
class TenantOverlap:
    """A tenant's projected peak while its models' upgrades overlap (bytes).

    ``current_bytes`` is what its namespaces hold now; ``pending_bytes`` what the warming releases still need
    to reach their old release's size; ``overlaps`` names the (model, old, new) pairs.
    """

    quota: TenantQuota
    current_bytes: int
    pending_bytes: int
    overlaps: tuple[tuple[str, str, str], ...]

    @property
    def peak_bytes(self) -> int:
        return self.current_bytes + self.pending_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.quota.limit_bytes and not self.quota.over_quota


def tenant_overlaps(*, occupancy: dict[CacheScope, ReleaseNow] | None = None,
                    samples: dict | None = None) -> list[TenantOverlap]:
    """One ``TenantOverlap`` per tenant with a model in the ``warming`` or ``draining`` phase.

    ``occupancy`` and ``samples`` default to ``current_occupancy()`` of those tenants only and
    ``latest_master_quotas()``; neither is read when no model is in either phase (the usual case)."""
    results: list[TenantOverlap] = []
    models = ServedModel.objects.filter(
        releases__state__in=[ReleaseState.WARMING, ReleaseState.DRAINING]).select_related("tenant").distinct()
    by_tenant: dict[int, list[UpgradeState]] = {}
    for model in models:
        by_tenant.setdefault(model.tenant_id, []).append(upgrade_state(model))
    if not by_tenant:
        return results
    tenants = list(Tenant.objects.filter(pk__in=list(by_tenant)).order_by("tenant_id"))
    if occupancy is None:
        occupancy = current_occupancy(OccupancyFilter(tenant_ids=frozenset(t.tenant_id for t in tenants)))
    samples = samples if samples is not None else latest_master_quotas()
    for tenant in tenants:
        current = sum(entry.bytes for key, entry in occupancy.items() if key.tenant_id == tenant.tenant_id)
        pending, pairs = 0, []
        for state in by_tenant[tenant.pk]:
            if state.old is None or state.new is None:
                continue
            old_bytes = occupancy.get(release_key(state.old))
            new_bytes = occupancy.get(release_key(state.new))
            if state.phase == PHASE_WARMING:
                pending += max((old_bytes.bytes if old_bytes else 0) - (new_bytes.bytes if new_bytes else 0), 0)
            pairs.append((state.model.served_model_name, state.old.namespace, state.new.namespace))
        if pairs:
            results.append(TenantOverlap(tenant_quota(tenant, samples), current, pending, tuple(pairs)))
    return results
