"""Effective tenant quotas and the capacity plan of a quota change (pure functions: no database, no network).

The Mooncake master (``mooncake_master`` 0.3.13.post1, ``--enable_multi_tenants=true``) admits writes against
each tenant's **effective** quota, which it derives from every tenant's **requested** quota and the pool's
mounted capacity (``master_total_capacity_bytes``: the sum of the segments mounted now). ``effective_quotas``
is that rule, measured against the released binary (``tests/tenants/test_capacity_master.py``):

* total requested <= capacity: every effective quota equals the requested one;
* otherwise the capacity is shared in proportion to the requested quotas by the largest-remainder method:
  each tenant gets ``floor(capacity * requested / total)`` bytes, and the bytes left over (fewer than the
  number of tenants) go one each to the tenants with the largest remainders ``capacity * requested mod
  total``; equal remainders go to the tenant ids in ascending byte order. The arithmetic is exact (a
  ``2**62 + 1`` byte request beats a ``2**62`` one), so the effective quotas sum to the capacity;
* nothing mounted (capacity 0): every effective quota is 0.

So one tenant created with ``9223372036854775807B`` takes the whole pool and every other tenant's effective quota
drops to 0 (or a byte): the master then refuses their writes. ``plan_quota_change`` shows, before a change is
saved, what each tenant's effective quota becomes and whether the change needs an explicit confirmation.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tenants.quota import humanize_bytes


def effective_quotas(requested: Mapping[str, int], capacity_bytes: int) -> dict[str, int]:
    """``tenant_id -> effective quota bytes`` as the Mooncake 0.3.13.post1 master computes it (module docstring).

    ``requested`` maps every tenant the master knows to its requested quota (bytes, ``>= 1``);
    ``capacity_bytes`` is the mounted capacity (``master_total_capacity_bytes``, ``>= 0``). Raises ``ValueError``
    for a negative capacity or a requested quota below 1.
    """
    if capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
    for tenant_id, quota in requested.items():
        if quota < 1:
            raise ValueError(f"requested quota of tenant {tenant_id!r} must be >= 1 byte, got {quota}")
    total = sum(requested.values())
    if total <= capacity_bytes:
        return dict(requested)
    shares = {tenant_id: divmod(capacity_bytes * quota, total) for tenant_id, quota in requested.items()}
    effective = {tenant_id: share for tenant_id, (share, _) in shares.items()}
    left = capacity_bytes - sum(effective.values())
    by_remainder = sorted(shares, key=lambda tenant_id: (-shares[tenant_id][1], tenant_id.encode()))
    for tenant_id in by_remainder[:left]:
        effective[tenant_id] += 1
    return effective


@dataclass(frozen=True)
class QuotaRow:
    """One tenant in a ``QuotaPlan``: requested and effective quota before and after the change (bytes).

    ``requested_after`` is ``None`` for a tenant the change removes; the effective values are ``None`` while
    the capacity is unknown.
    """

    tenant_id: str
    requested_before: int | None
    requested_after: int | None
    effective_before: int | None
    effective_after: int | None
    changed: bool = False

    @property
    def lowered(self) -> bool:
        """True when the change lowers this tenant's effective quota."""
        if self.effective_before is None or self.effective_after is None:
            return False
        return self.effective_after < self.effective_before

    @property
    def scaled(self) -> bool:
        """True when the effective quota after the change is below the requested one."""
        return (self.requested_after is not None and self.effective_after is not None
                and self.effective_after < self.requested_after)


@dataclass(frozen=True)
class QuotaPlan:
    """What a quota change does to the pool: every tenant's requested and effective quota before and after.

    ``capacity_bytes`` is the mounted capacity (``None`` when unknown, with ``capacity_error`` saying why).
    ``needs_confirmation`` is True when the change raises the requested total and the capacity is unknown or
    the new total exceeds it (overcommit: some effective quota falls below its requested quota); ``reasons``
    says why, one sentence each.
    """

    capacity_bytes: int | None
    rows: tuple[QuotaRow, ...]
    capacity_error: str = ""
    reasons: tuple[str, ...] = field(default=())

    @property
    def requested_before_bytes(self) -> int:
        return sum(row.requested_before or 0 for row in self.rows)

    @property
    def requested_after_bytes(self) -> int:
        return sum(row.requested_after or 0 for row in self.rows)

    @property
    def capacity_known(self) -> bool:
        return self.capacity_bytes is not None

    @property
    def overcommitted(self) -> bool:
        """True when the requested total after the change exceeds the known capacity."""
        return self.capacity_bytes is not None and self.requested_after_bytes > self.capacity_bytes

    @property
    def lowered(self) -> tuple[QuotaRow, ...]:
        """Tenants other than the changed ones whose effective quota the change lowers."""
        return tuple(row for row in self.rows if row.lowered and not row.changed)

    @property
    def needs_confirmation(self) -> bool:
        return bool(self.reasons)

    def message(self) -> str:
        """One paragraph for an error or a confirmation prompt: the reasons, then what to do."""
        if not self.reasons:
            return ""
        return " ".join(self.reasons) + (" Confirm the overcommit to save anyway (API: confirm_overcommit=true; "
                                         "page: the confirmation checkbox); the confirmation is audited.")

    def as_dict(self) -> dict:
        """JSON-ready form (API responses and the audit entry of a confirmed overcommit)."""
        return {
            "capacity_bytes": self.capacity_bytes, "capacity_error": self.capacity_error,
            "requested_before_bytes": self.requested_before_bytes,
            "requested_after_bytes": self.requested_after_bytes,
            "overcommitted": self.overcommitted, "needs_confirmation": self.needs_confirmation,
            "reasons": list(self.reasons),
            "tenants": [{"tenant_id": row.tenant_id, "requested_before_bytes": row.requested_before,
                         "requested_after_bytes": row.requested_after, "effective_before_bytes": row.effective_before,
                         "effective_after_bytes": row.effective_after, "changed": row.changed,
                         "lowered": row.lowered} for row in self.rows],
        }


def plan_quota_change(requested: Mapping[str, int], changes: Mapping[str, int | None],
                      capacity_bytes: int | None, *, capacity_error: str = "") -> QuotaPlan:
    """The ``QuotaPlan`` of applying ``changes`` to the pool.

    ``requested``: every tenant's requested quota now (bytes; registry tenants and tenants only the master
    holds). ``changes``: tenant_id -> new requested quota, or ``None`` to remove the tenant (a rename is a
    removal plus an addition). ``capacity_bytes``: the mounted capacity, ``None`` when it could not be read
    (``capacity_error`` says why). Raises ``ValueError`` like ``effective_quotas``.
    """
    before = dict(requested)
    after = dict(requested)
    for tenant_id, quota in changes.items():
        if quota is None:
            after.pop(tenant_id, None)
        else:
            after[tenant_id] = quota
    if capacity_bytes is not None:
        effective_before = effective_quotas(before, capacity_bytes)
        effective_after = effective_quotas(after, capacity_bytes)
    else:
        effective_before, effective_after = {}, {}
    changed = {tenant_id for tenant_id in changes if before.get(tenant_id) != after.get(tenant_id)}
    rows = tuple(
        QuotaRow(tenant_id, before.get(tenant_id), after.get(tenant_id), effective_before.get(tenant_id),
                 effective_after.get(tenant_id), tenant_id in changed)
        for tenant_id in sorted(set(before) | set(after))
    )
    raised = any((after.get(tenant_id) or 0) > (before.get(tenant_id) or 0) for tenant_id in changed)
    reasons: list[str] = []
    total = sum(after.values())
    if raised and capacity_bytes is None:
        reasons.append(
            f"The pool's mounted capacity is unknown ({capacity_error or 'the master did not answer'}), so the "
            "effective quotas after this change cannot be computed: the master scales every tenant down when the "
            f"requested quotas (then {total} bytes, {humanize_bytes(total)}) exceed the mounted memory.")
    elif raised and capacity_bytes is not None and total > capacity_bytes:
        reasons.append(
            f"Overcommit: the requested quotas would total {total} bytes ({humanize_bytes(total)}), above the "
            f"{capacity_bytes} bytes ({humanize_bytes(capacity_bytes)}) mounted in the pool"
            + (" (nothing is mounted now: every effective quota is 0 until segments mount)."
               if capacity_bytes == 0 else ", so the master scales every tenant's effective quota down."))
        lowered = [row for row in rows if row.lowered and not row.changed]
        if lowered:
            reasons.append("It lowers the effective quota of " + ", ".join(
                f"tenant '{row.tenant_id}' from {humanize_bytes(row.effective_before or 0)} to "
                f"{humanize_bytes(row.effective_after or 0)}" for row in lowered) + ".")
        scaled = [row for row in rows if row.changed and row.scaled]
        for row in scaled:
            reasons.append(f"Tenant '{row.tenant_id}' itself would get {humanize_bytes(row.effective_after or 0)} "
                           f"of the {humanize_bytes(row.requested_after or 0)} it requests.")
    return QuotaPlan(capacity_bytes, rows, capacity_error, tuple(reasons))
