"""Which master leads (mooncake_master 0.3.13.post1 in HA mode, ``/health`` on each master's metrics port).

Every master answers ``GET /health`` with ``role`` (``leader``/``standby``), ``ha_state`` (``standby``,
``candidate``, ``leader_warmup`` for about 5 s after winning the election, then ``serving``), ``service_ready``,
``leader_address`` (the RPC address of the leader it knows) and ``view_version`` (the election's counter in etcd,
``mooncake-store/mooncake_cluster/master_view``). Only the serving leader answers the admin API: a standby answers
``/api/v1/tenant_quotas`` with ``-1011 service plane is not active``, and its ``/metrics`` counts nothing.

``read_masters`` reads every master of ``tenants.masters.MasterTopology`` (bounded: ``MAX_HEALTH_BYTES`` per
answer, one timeout each); ``leader_admin_url`` is the admin URL the dashboard's quota sync, sampling and
capacity reads use: the one master's in single mode, the serving leader's in HA mode.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

#: Most bytes read from one ``/health`` answer (it is about 150).
MAX_HEALTH_BYTES = 4096


class NoLeader(Exception):
    """No master of the HA set serves as leader (an election or a warm-up is under way, or every master is down)."""


@dataclass(frozen=True)
class MasterState:
    """One master as its ``/health`` described it: ``error`` is why it could not be read ("" when it was)."""

    admin_url: str
    rpc_address: str
    role: str = ""
    ha_state: str = ""
    service_ready: bool = False
    leader_address: str = ""
    view_version: int | None = None
    error: str = ""

    @property
    def up(self) -> bool:
        """Its ``/health`` answered."""
        return not self.error

    @property
    def serving_leader(self) -> bool:
        """It leads and serves clients (``role`` leader, ``service_ready``)."""
        return self.up and self.role == "leader" and self.service_ready

    @property
    def standby(self) -> bool:
        """It answers as a standby (ready to take over)."""
        return self.up and self.role == "standby"


@dataclass(frozen=True)
class MastersView:
    """Every master of the set at one moment, in the topology's order."""

    masters: tuple[MasterState, ...]

    @property
    def leader(self) -> MasterState | None:
        """The serving leader (the one with the highest ``view_version`` should two claim it), else None."""
        leaders = [m for m in self.masters if m.serving_leader]
        return max(leaders, key=lambda m: m.view_version or 0) if leaders else None

    @property
    def elected(self) -> MasterState | None:
        """The master that won the newest election, serving or still warming up (``role`` leader), else None."""
        leaders = [m for m in self.masters if m.up and m.role == "leader"]
        return max(leaders, key=lambda m: m.view_version or 0) if leaders else None

    @property
    def standbys(self) -> int:
        """Masters answering as standbys."""
        return sum(1 for m in self.masters if m.standby)

    @property
    def down(self) -> tuple[MasterState, ...]:
        """Masters whose ``/health`` did not answer."""
        return tuple(m for m in self.masters if not m.up)


def _parse_health(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    version = data.get("view_version")
    return {
        "role": str(data.get("role", ""))[:32],
        "ha_state": str(data.get("ha_state", ""))[:32],
        "service_ready": data.get("service_ready") is True,
        "leader_address": str(data.get("leader_address", ""))[:300],
        "view_version": version if isinstance(version, int) and not isinstance(version, bool) else None,
    }


def read_health(admin_url: str, rpc_address: str = "", *, timeout: float = 3.0) -> MasterState:
    """``GET <admin_url>/health`` of one master; a master that does not answer (or not with a JSON object) gives a
    ``MasterState`` with ``error`` set, never an exception."""
    try:
        with urllib.request.urlopen(f"{admin_url.rstrip('/')}/health", timeout=timeout) as response:
            raw = response.read(MAX_HEALTH_BYTES + 1)
        if len(raw) > MAX_HEALTH_BYTES:
            raise ValueError(f"answer longer than {MAX_HEALTH_BYTES} bytes")
        fields = _parse_health(json.loads(raw))
    except (urllib.error.URLError, OSError) as exc:
        return MasterState(admin_url, rpc_address, error=f"unreachable: {getattr(exc, 'reason', exc)}")
    except ValueError as exc:
        return MasterState(admin_url, rpc_address, error=f"/health is not a master's answer: {exc}")
    return MasterState(admin_url, rpc_address, **fields)


def read_masters(topology: Any = None, *, timeout: float | None = None) -> MastersView:
    """``read_health`` of every master of ``topology`` (default ``MasterTopology.from_settings()``)."""
    from django.conf import settings

    from tenants.masters import MasterTopology

    topology = topology or MasterTopology.from_settings()
    timeout = settings.KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS if timeout is None else timeout
    return MastersView(tuple(read_health(m.admin_url, m.rpc_address, timeout=timeout) for m in topology.masters))


def leader_admin_url(topology: Any = None) -> str:
    """The admin URL to send quota calls and metric reads to: ``KVPOOL_MASTER_ADMIN_URL`` with one master, the
    serving leader's in HA mode (read now from every master's ``/health``).

    Raises:
        NoLeader: HA mode and no master serves as leader at the moment (the message says what each answered).
    """
    from django.conf import settings

    from tenants.masters import MasterTopology, ha_configured

    if topology is None and not ha_configured():
        return settings.KVPOOL_MASTER_ADMIN_URL
    topology = topology or MasterTopology.from_settings()
    if not topology.ha:
        return topology.masters[0].admin_url
    view = read_masters(topology)
    if view.leader is None:
        raise NoLeader(f"no master serves as leader: {describe(view)}")
    return view.leader.admin_url


def describe(view: MastersView) -> str:
    """``127.0.0.1:50051 leader/serving, 127.0.0.1:50052 down (unreachable: ...)``: one phrase per master."""
    parts = []
    for master in view.masters:
        state = f"down ({master.error})" if master.error else f"{master.role or '?'}/{master.ha_state or '?'}"
        parts.append(f"{master.rpc_address or master.admin_url} {state}")
    return ", ".join(parts)
