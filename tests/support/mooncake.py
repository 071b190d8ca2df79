"""Shared fixtures. Service fixtures (mooncake_master, redis, workers) start real processes on free ports.

Mooncake fixtures (agent/sim/master.py):

* ``mooncake_master`` (session): one multi-tenant master on loopback with tenants ``MASTER_TENANTS``
  (``alpha`` and ``beta`` with 1 GiB each, ``tiny`` with 64 KiB). Tests sharing it must use their own release
  namespaces (``unique_name``) so their keys never meet.
* ``mooncake_master_factory`` (function): ``start(tenants, **MasterProcess kwargs)`` for a master with custom
  quotas or eviction flags; every master it started is stopped after the test.
* ``store_client_factory`` (session): ``open(master, tenant_id, name="", **endpoint overrides)`` -> an open
  ``StoreClient``, cached per (master, tenant, name, overrides) and closed at session end before the session
  master stops (closing a client drops the objects in its segment, so tests share clients).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

MASTER_TENANTS = {"alpha": 1 << 30, "beta": 1 << 30, "tiny": 64 << 10}


@pytest.fixture(scope="session")
def mooncake_master() -> Iterator[Any]:
    """A running ``agent.sim.master.MasterProcess`` shared by the session (tenants in ``MASTER_TENANTS``)."""
    from agent.sim.master import MasterProcess

    with MasterProcess(MASTER_TENANTS) as master:
        yield master


@pytest.fixture
def mooncake_master_factory() -> Iterator[Callable[..., Any]]:
    """``start(tenants: dict[str, int], **kwargs) -> MasterProcess`` (stopped after the test)."""
    from agent.sim.master import MasterProcess

    started: list[MasterProcess] = []

    def start(tenants: dict[str, int], **kwargs: Any) -> MasterProcess:
        master = MasterProcess(tenants, **kwargs).start()
        started.append(master)
        return master

    yield start
    for master in reversed(started):
        master.stop()


@pytest.fixture(scope="session")
def store_client_factory(mooncake_master: Any) -> Iterator[Callable[..., Any]]:
    """``open(master, tenant_id, name="", **endpoint_overrides) -> StoreClient``, cached and closed at the end.

    ``name`` tells apart two clients of one tenant (e.g. a prefill and a decode instance). Clients are closed
    while their master still runs (~2 s each; a client whose master is gone takes 10 s or more to close, also
    at interpreter exit), so use it for the session ``mooncake_master``; with a factory master, open your own
    client and close it before the master stops.
    """
    from agent.datapath.store import open_store

    clients: dict[tuple[Any, ...], Any] = {}

    def open_client(master: Any, tenant_id: str, name: str = "", **overrides: Any) -> Any:
        key = (id(master), master.rpc_address, tenant_id, name, tuple(sorted(overrides.items())))
        client = clients.get(key)
        if client is None or client.closed or not master.running:
            client = open_store(master.endpoints(**overrides), tenant_id)
            clients[key] = client
        return client

    yield open_client
    for client in clients.values():
        if not client.closed:
            client.close()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """``unique_name("rel")`` -> ``"rel-1a2b3c4d"``: a release namespace no other test uses."""
    return lambda prefix="ns": f"{prefix}-{uuid.uuid4().hex[:8]}"
