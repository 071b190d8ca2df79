"""Where the Mooncake master starts evicting, and the room budgets leave under it (pure functions).

Measured on ``mooncake_master`` 0.3.13.post1 (``tests/tenants/test_eviction_point_master.py``; ``docs/eviction.md``,
"When the master evicts"):

* **Inside a tenant** (``--enable_multi_tenants=true``): a put that would take the tenant's charged bytes above its
  *effective* quota (``tenants.capacity.effective_quotas``) makes the master evict objects of that tenant at once,
  just the put's bytes, in no access order (``mooncake_tenant_evict_bytes_total``). The watermark and ratio flags
  play no part: a tenant fills its whole effective quota first.
* **Across the pool**: once the allocated bytes pass ``--eviction_high_watermark_ratio`` of the mounted capacity
  (``master_total_capacity_bytes``), a background round evicts ``ceil(max(r, u - w + r) * n)`` of the ``n``
  objects, least recently used first, whatever their tenant (``master_evicted_key_count``).

Either way the master chooses blindly (prefix-blind: a chain can lose a parent and keep its children). The agents
choose well (leaves first, ``agent.datapath.budget``) only while the budgets keep every tenant below both points:

* a tenant's **eviction point** is its effective quota, or its **watermark share** when smaller: the pool's
  watermark (``MasterEviction.watermark_bytes``) split in proportion to the effective quotas, once those add up to
  more than it (``eviction_points``);
* a release without a budget of its own gets an **implicit budget**: the room under its tenant's eviction point
  that the explicit budgets (the registry's sum rule, ``tenants.budgets.budgeted_bytes``) leave, split evenly over
  the tenant's unbudgeted live releases (``implicit_budgets``), so budgets bound everything a tenant may hold;
* ``TenantRoom`` / ``PoolRoom`` say what is left under each point, and by how much budgets exceed it
  (``lowered_budgets`` says which budget to lower to what).
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

#: ``mooncake_master`` 0.3.13.post1 defaults of ``--eviction_high_watermark_ratio`` and ``--eviction_ratio``.
DEFAULT_HIGH_WATERMARK_RATIO = 0.9
DEFAULT_EVICTION_RATIO = 0.05


@dataclass(frozen=True)
class MasterEviction:
    """The master's global eviction flags: ``high_watermark_ratio`` (``--eviction_high_watermark_ratio``, share of
    the mounted capacity above which a round starts) and ``eviction_ratio`` (``--eviction_ratio``). Both in
    ``(0, 1]``; ``ValueError`` names the flag otherwise."""

    high_watermark_ratio: float = DEFAULT_HIGH_WATERMARK_RATIO
    eviction_ratio: float = DEFAULT_EVICTION_RATIO

    def __post_init__(self) -> None:
        for flag, value in (("eviction_high_watermark_ratio", self.high_watermark_ratio),
                            ("eviction_ratio", self.eviction_ratio)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"{flag} must be a number in (0, 1], got {value!r}")

    @classmethod
    def from_settings(cls) -> MasterEviction:
        """From Django settings ``KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO`` and ``KVPOOL_MASTER_EVICTION_RATIO``."""
        from django.conf import settings

        return cls(settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO, settings.KVPOOL_MASTER_EVICTION_RATIO)

    def argv(self) -> list[str]:
        """The two ``mooncake_master`` flags (``--eviction_high_watermark_ratio=0.9``, ``--eviction_ratio=0.05``)."""
        return [f"--eviction_high_watermark_ratio={float(self.high_watermark_ratio)!r}",
                f"--eviction_ratio={float(self.eviction_ratio)!r}"]

    def watermark_bytes(self, capacity_bytes: int) -> int:
        """The most bytes the pool holds without a global round: the master evicts once ``allocated / capacity``
        (doubles) exceeds the ratio, so the largest ``allocated`` for which it does not, computed the same way."""
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if capacity_bytes == 0:
            return 0
        ratio, capacity = float(self.high_watermark_ratio), float(capacity_bytes)
        allowed = min(capacity_bytes, math.floor(ratio * capacity_bytes))
        while allowed < capacity_bytes and not float(allowed + 1) / capacity > ratio:
            allowed += 1
        while allowed > 0 and float(allowed) / capacity > ratio:
            allowed -= 1
        return allowed

    def round_objects(self, objects: int, allocated_bytes: int, capacity_bytes: int) -> int:
        """Objects one global round evicts of the ``objects`` evictable ones, as measured:
        ``ceil(max(r, u - w + r) * n)`` with ``u = allocated / capacity``; 0 while ``u <= w``."""
        if capacity_bytes <= 0 or allocated_bytes <= self.watermark_bytes(capacity_bytes):
            return 0
        used = allocated_bytes / capacity_bytes
        target = max(self.eviction_ratio, used - self.high_watermark_ratio + self.eviction_ratio)
        return min(objects, math.ceil(target * objects))


def eviction_points(effective: Mapping[str, int], capacity_bytes: int, eviction: MasterEviction) -> dict[str, int]:
    """``tenant_id -> eviction point`` (bytes): the effective quota, or the tenant's watermark share when the
    effective quotas of every tenant the master holds add up to more than the watermark. The share is
    ``floor(watermark * effective / total)``, so the shares sum to at most the watermark.

    ``effective``: every tenant's effective quota (``tenants.capacity.effective_quotas``; tenants only the master
    holds included, they fill the pool too); ``capacity_bytes``: the mounted capacity (``> 0``).
    """
    watermark = eviction.watermark_bytes(capacity_bytes)
    total = sum(effective.values())
    if total <= watermark:
        return dict(effective)
    return {tenant_id: watermark * quota // total for tenant_id, quota in effective.items()}


def implicit_budgets(eviction_point_bytes: int, budgeted_bytes: int, releases: Sequence[K]) -> dict[K, int]:
    """The implicit budget of each release without a budget of its own (``releases``, the tenant's live ones):
    ``floor(max(0, eviction point - budgeted) / len(releases))`` bytes each, so explicit and implicit budgets
    together never pass the eviction point (0 each when the explicit budgets already reach it)."""
    if not releases:
        return {}
    share = max(0, eviction_point_bytes - budgeted_bytes) // len(releases)
    return dict.fromkeys(releases, share)


def lowered_budgets(budgets: Mapping[K, int], limit_bytes: int) -> dict[K, int]:
    """The budgets scaled down so they sum to at most ``limit_bytes``: ``floor(budget * limit / total)`` each
    (the budgets unchanged when they already fit; all 0 for a limit <= 0). What the checks suggest."""
    total = sum(budgets.values())
    if total <= limit_bytes:
        return dict(budgets)
    if limit_bytes <= 0:
        return dict.fromkeys(budgets, 0)
    return {key: budget * limit_bytes // total for key, budget in budgets.items()}


@dataclass(frozen=True)
class TenantRoom:
    """One tenant against the master's eviction points (bytes).

    ``effective_quota_bytes`` / ``watermark_share_bytes`` are ``None`` while the mounted capacity is unknown (or
    0: nothing mounted, every effective quota 0 until segments mount): the eviction point is then the requested
    quota, the most the master could ever give. ``budgeted_bytes`` is the registry's sum of explicit budgets
    (releases and request groups, ``tenants.budgets.budgeted_bytes``); ``budgets`` names them (``("release",
    namespace)`` / ``("request group", name)`` -> bytes) for suggestions. ``unbudgeted`` are the tenant's live
    releases without a budget (keys as the caller chose them). ``charged_bytes``: the newest master read-back.
    """

    tenant_id: str
    requested_quota_bytes: int
    effective_quota_bytes: int | None
    watermark_share_bytes: int | None
    budgeted_bytes: int
    unbudgeted: tuple = ()
    budgets: Mapping[tuple[str, str], int] = field(default_factory=dict)
    charged_bytes: int | None = None

    @property
    def capacity_known(self) -> bool:
        return self.effective_quota_bytes is not None

    @property
    def eviction_point_bytes(self) -> int:
        """Bytes the tenant may hold before the master evicts blindly (inside it, or across the pool)."""
        if self.effective_quota_bytes is None:
            return self.requested_quota_bytes
        share = self.watermark_share_bytes if self.watermark_share_bytes is not None else self.effective_quota_bytes
        return min(self.effective_quota_bytes, share)

    @property
    def eviction_point_source(self) -> str:
        """Which limit the eviction point is: ``effective quota``, ``watermark share`` or ``requested quota``."""
        if self.effective_quota_bytes is None:
            return "requested quota"
        return ("watermark share" if self.watermark_share_bytes is not None
                and self.watermark_share_bytes < self.effective_quota_bytes else "effective quota")

    @property
    def implicit_budgets(self) -> dict:
        """Unbudgeted release -> its implicit budget (``implicit_budgets``)."""
        return implicit_budgets(self.eviction_point_bytes, self.budgeted_bytes, self.unbudgeted)

    @property
    def unbudgeted_room_bytes(self) -> int:
        """What the explicit budgets leave under the eviction point (shared by the implicit budgets)."""
        return max(0, self.eviction_point_bytes - self.budgeted_bytes)

    @property
    def held_bytes(self) -> int:
        """The most the budgets let the tenant hold: explicit plus implicit budgets."""
        return self.budgeted_bytes + sum(self.implicit_budgets.values())

    @property
    def quota_excess_bytes(self) -> int:
        """Bytes by which the budgets pass the effective quota (the master evicts inside the tenant); 0 when
        they fit or the capacity is unknown."""
        if self.effective_quota_bytes is None:
            return max(0, self.held_bytes - self.requested_quota_bytes)
        return max(0, self.held_bytes - self.effective_quota_bytes)

    @property
    def watermark_excess_bytes(self) -> int:
        """Bytes by which the budgets pass the tenant's watermark share (0 when they fit or it is unknown)."""
        if self.watermark_share_bytes is None:
            return 0
        return max(0, min(self.held_bytes, self.effective_quota_bytes or 0) - self.watermark_share_bytes)

    @property
    def quota_room_bytes(self) -> int | None:
        """Effective quota minus charged bytes (negative: over; ``None`` when either is unknown)."""
        if self.effective_quota_bytes is None or self.charged_bytes is None:
            return None
        return self.effective_quota_bytes - self.charged_bytes

    @property
    def watermark_room_bytes(self) -> int | None:
        """Watermark share minus charged bytes (``None`` when either is unknown)."""
        if self.watermark_share_bytes is None or self.charged_bytes is None:
            return None
        return self.watermark_share_bytes - self.charged_bytes

    def advice(self, limit: str = "quota") -> str:
        """What to do when the budgets pass the effective quota (``limit="quota"``) or the watermark share
        (``limit="watermark"``); "" when they fit. Names only this tenant's own releases and request groups: which
        budgets to lower to what (``lowered_budgets``)."""
        from tenants.quota import humanize_bytes

        if limit == "quota":
            excess, where = self.quota_excess_bytes, (
                "its effective quota" if self.effective_quota_bytes is not None else "its requested quota")
            limit_bytes = (self.effective_quota_bytes if self.effective_quota_bytes is not None
                           else self.requested_quota_bytes)
        else:
            excess, where = self.watermark_excess_bytes, "its share of the pool's eviction watermark"
            limit_bytes = self.watermark_share_bytes or 0
        if not excess:
            return ""
        lowered = lowered_budgets(dict(self.budgets), limit_bytes)
        steps = [f"{kind} '{name}' from {humanize_bytes(budget)} to {humanize_bytes(lowered[(kind, name)])}"
                 for (kind, name), budget in sorted(self.budgets.items(), key=lambda item: (-item[1], item[0]))
                 if lowered[(kind, name)] < budget]
        when = ("where the master starts evicting inside the tenant" if limit == "quota" else
                "the most it may hold when every tenant fills its share without the master evicting across the pool")
        text = (f"the budgets of tenant '{self.tenant_id}' can hold {humanize_bytes(self.held_bytes)}, "
                f"{humanize_bytes(excess)} ({excess} bytes) above {where} of {humanize_bytes(limit_bytes)}, {when} "
                "(prefix-blind): lower them by that much")
        if steps:
            text += " (e.g. " + ", ".join(steps[:5]) + (", ..." if len(steps) > 5 else "") + ")"
        if limit == "quota" and self.effective_quota_bytes is not None \
                and self.effective_quota_bytes < self.requested_quota_bytes:
            text += (", or mount more memory: the master scales the requested quota down to the pool's mounted "
                     "capacity")
        return text


@dataclass(frozen=True)
class PoolRoom:
    """Every tenant against the master's eviction points: ``capacity_bytes`` mounted (``None``: unknown or
    nothing mounted), the flags, ``tenants`` (registry tenants' ``TenantRoom``) and ``others`` (effective quotas of
    tenants only the master holds: nothing bounds them but their quota)."""

    capacity_bytes: int | None
    eviction: MasterEviction
    tenants: Mapping[str, TenantRoom]
    others: Mapping[str, int] = field(default_factory=dict)

    @property
    def watermark_bytes(self) -> int | None:
        return self.eviction.watermark_bytes(self.capacity_bytes) if self.capacity_bytes is not None else None

    @property
    def held_bytes(self) -> int:
        """The most all tenants may hold: each registry tenant's budgets (at most its effective quota, the master
        allows no more) plus the effective quotas of the tenants only the master holds."""
        held = 0
        for room in self.tenants.values():
            cap = room.effective_quota_bytes if room.effective_quota_bytes is not None else room.held_bytes
            held += min(room.held_bytes, cap)
        return held + sum(self.others.values())

    @property
    def watermark_excess_bytes(self) -> int:
        """Bytes by which everything the tenants may hold passes the pool's watermark (0: fits or unknown)."""
        watermark = self.watermark_bytes
        return 0 if watermark is None else max(0, self.held_bytes - watermark)

    @property
    def fits(self) -> bool:
        """No budget lets the master's eviction start: every tenant within its effective quota, all within the
        watermark (what the ``budgets_fit`` check and ``kvpool_budgets_fit`` say)."""
        return not self.watermark_excess_bytes and not any(room.quota_excess_bytes for room in self.tenants.values())


def pool_room(requested: Mapping[str, int], capacity_bytes: int | None, eviction: MasterEviction,
              tenants: Mapping[str, dict]) -> PoolRoom:
    """The ``PoolRoom`` of a pool: ``requested`` holds every tenant's requested quota (registry tenants and those
    only the master holds), ``capacity_bytes`` the mounted capacity (``None`` or 0: unknown), ``tenants`` per
    registry tenant the keyword arguments of its ``TenantRoom`` besides the quota fields (``budgeted_bytes``,
    ``unbudgeted``, ``budgets``, ``charged_bytes``)."""
    from tenants.capacity import effective_quotas

    known = capacity_bytes if capacity_bytes else None
    effective = effective_quotas(requested, known) if known is not None else {}
    points = eviction_points(effective, known, eviction) if known is not None else {}
    rooms = {
        tenant_id: TenantRoom(tenant_id, requested[tenant_id], effective.get(tenant_id), points.get(tenant_id),
                              **fields)
        for tenant_id, fields in tenants.items()
    }
    others = {tenant_id: quota for tenant_id, quota in effective.items() if tenant_id not in tenants}
    return PoolRoom(known, eviction, rooms, others)
