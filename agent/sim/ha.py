"""An HA set of real ``mooncake_master`` processes (Mooncake 0.3.13.post1) electing their leader in a real etcd, on
loopback: for tests, benchmarks and the demo.

:class:`HAMasterSet` starts an :class:`agent.sim.etcd.EtcdProcess` and ``count`` :class:`agent.sim.master.MasterProcess`
in HA mode (``--enable_ha=true --ha_backend_type=etcd``, ``--enable_oplog=true`` unless told otherwise), each with
its own work directory and quota policy file (as on separate hosts). The first one started leads; the others wait
as standbys. Clients reach whichever leads through ``etcd://<etcd>`` (:meth:`HAMasterSet.endpoints`).

Measured here (``docs/ha.md``): after the leader is SIGKILLed a standby is elected in about 6 s and serves about
5 s later (its warm-up).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.contract.messages import StoreEndpoints
from agent.sim.etcd import EtcdProcess
from agent.sim.master import MasterError, MasterProcess


class HAMasterSet:
    """``count`` HA masters and their etcd.

    Args:
        tenants: tenant_id -> quota bytes in every master's policy file.
        count: masters in the set (at least 2 for a failover).
        workdir: parent of ``etcd/`` and ``master-<i>/`` (temporary directories when None).
        enable_oplog: ``--enable_oplog`` on every master.
        startup_timeout: seconds to wait for etcd, for the first master to serve, and for each standby.
        master_kwargs: further :class:`MasterProcess` arguments (eviction flags, lease TTL, ...).

    Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, tenants: Mapping[str, int] | None = None, *, count: int = 2,
                 workdir: str | Path | None = None, enable_oplog: bool = True, startup_timeout: float = 60.0,
                 **master_kwargs: Any) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        self.tenants = dict(tenants or {})
        self.count = count
        self.workdir = Path(workdir) if workdir is not None else None
        self.enable_oplog = enable_oplog
        self.startup_timeout = startup_timeout
        self.master_kwargs = master_kwargs
        self.etcd = EtcdProcess(workdir=self.workdir / "etcd" if self.workdir else None,
                                startup_timeout=startup_timeout)
        self.masters: list[MasterProcess] = []

    # --- addresses ------------------------------------------------------------------------------------------

    @property
    def client_address(self) -> str:
        """``etcd://host:port``: every client's ``master_server_address``."""
        return f"etcd://{self.etcd.endpoint}"

    @property
    def metadata_server(self) -> str:
        """``etcd://host:port``: the clients' transfer-engine metadata lives in the same etcd."""
        return f"etcd://{self.etcd.endpoint}"

    def endpoints(self, **overrides: Any) -> StoreEndpoints:
        """Client endpoints for the set (as :meth:`MasterProcess.endpoints`, through etcd)."""
        return self.masters[0].endpoints(**overrides)

    # --- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> HAMasterSet:
        """Start etcd, the first master (waits until it serves as leader), then the standbys.

        Raises:
            MasterError: etcd or a master did not start, or the first master did not come to lead.
        """
        self.etcd.start()
        for index in range(self.count):
            master = MasterProcess(self.tenants, etcd_endpoint=self.etcd.endpoint, enable_oplog=self.enable_oplog,
                                   workdir=self.workdir / f"master-{index}" if self.workdir else None,
                                   startup_timeout=self.startup_timeout, **self.master_kwargs)
            self.masters.append(master.start())
            if index == 0:
                self.wait_leader(self.startup_timeout)
        return self

    def leader(self) -> MasterProcess | None:
        """The master that serves as leader now, else None."""
        return next((m for m in self.masters if m.serving), None)

    def wait_leader(self, timeout: float, *, other_than: MasterProcess | None = None) -> MasterProcess:
        """Block until a master (not ``other_than``) serves as leader; returns it.

        Raises:
            MasterError: none did within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader()
            if leader is not None and leader is not other_than:
                return leader
            if time.monotonic() > deadline:
                raise MasterError(f"no master leads after {timeout:.0f}s: "
                                  + "; ".join(m.log_tail(3) for m in self.masters))
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every master, then etcd."""
        for master in reversed(self.masters):
            master.stop()
        self.etcd.stop()

    def __enter__(self) -> HAMasterSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the leader's admin API and metrics -----------------------------------------------------------------

    def _leader(self) -> MasterProcess:
        leader = self.leader()
        if leader is None:
            raise OSError("no master serves as leader now")
        return leader

    def tenant_quotas(self) -> list[dict[str, Any]]:
        """The leader's ``GET /api/v1/tenant_quotas`` (``OSError`` while none leads)."""
        return self._leader().tenant_quotas()

    def metrics(self) -> dict[str, float]:
        """The leader's Prometheus samples (``OSError`` while none leads)."""
        return self._leader().metrics()
