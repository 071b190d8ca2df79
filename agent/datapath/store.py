"""Opening a Mooncake Store client for one tenant (mooncake-transfer-engine 0.3.13.post1), no Django.

:class:`agent.contract.messages.StoreEndpoints` says how to reach the store (the same fields as vLLM's
``MOONCAKE_CONFIG_PATH`` JSON and the agent's config document); :func:`open_store` returns a :class:`StoreClient`
bound to one ``tenant_id``, with this node's ``local_hostname``. The client is a thin layer over
``MooncakeDistributedStore``: batch calls return the store's per-key results unchanged (the connector decides
what a negative code means for a block), single-result calls raise the typed errors of
:mod:`agent.datapath.errors`.

Each process that opens a client mounts a segment of ``global_segment_size`` bytes into the pool and keeps it
while the client lives; objects stored in that segment disappear when the client closes.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from typing import Any

from agent.contract.master_address import format_host_port, parse_master_address
from agent.contract.messages import StoreEndpoints
from agent.datapath.errors import StoreUnavailable, error_name, raise_for_codes, store_error

log = logging.getLogger("kvpool.agent.store")

#: The address a client's transfer engine listens on unless the node says otherwise.
DEFAULT_LOCAL_HOSTNAME = "127.0.0.1"


def setup_config(endpoints: StoreEndpoints, tenant_id: str, local_hostname: str) -> dict[str, Any]:
    """The dict ``MooncakeDistributedStore.setup()`` takes (0.3.13.post1 spells the master ``master_server_addr``)."""
    return {
        "local_hostname": local_hostname,
        "metadata_server": endpoints.metadata_server,
        "global_segment_size": endpoints.global_segment_size,
        "local_buffer_size": endpoints.local_buffer_size,
        "protocol": endpoints.protocol,
        "master_server_addr": endpoints.master_server_address,
        "tenant_id": tenant_id,
        "device_name": endpoints.device_name,
    }


def check_endpoints(endpoints: StoreEndpoints) -> None:
    """Raises ``ValueError`` naming the field unless ``master_server_address`` is ``host:port`` (one master) or
    ``etcd://host:port[;...]`` (HA masters, ``agent.contract.master_address``) and ``metadata_server`` is set."""
    parse_master_address(endpoints.master_server_address)
    if not endpoints.metadata_server:
        raise ValueError("metadata_server: must not be empty")


def check_master_reachable(address: str, timeout: float = 3.0) -> None:
    """Open and close a TCP connection to the master (``host:port``) or, for an HA address, to one of its etcd
    endpoints; the Mooncake client itself waits ~90 s on a dead master.

    Raises:
        StoreUnavailable: nothing accepts connections there within ``timeout`` seconds.
        ValueError: not a master address (``agent.contract.master_address.parse_master_address``).
    """
    parsed = parse_master_address(address)
    errors: list[str] = []
    for host, port in parsed.endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            errors.append(f"{format_host_port(host, port)}: {exc}")
    what = "no etcd endpoint of the HA masters" if parsed.ha else "mooncake master"
    raise StoreUnavailable(f"{what} {address} is not reachable: {'; '.join(errors)}")


class StoreClient:
    """A Mooncake Store client of one tenant (wraps ``MooncakeDistributedStore``).

    Batch methods take parallel lists and return the store's per-key integers unchanged. Use as a context
    manager or call :meth:`close`. Only registration bookkeeping is locked here; data calls go straight to the
    Mooncake client.

    ``local_hostname`` is the address this client's transfer engine listens on (the node's own).

    Raises (constructor):
        StoreUnavailable: master unreachable or ``setup()`` returned non-zero (the code is in the message).
        ValueError: empty ``tenant_id``, or endpoints without a ``host:port`` master or a metadata server.
    """

    def __init__(self, endpoints: StoreEndpoints, tenant_id: str, *, local_hostname: str = DEFAULT_LOCAL_HOSTNAME,
                 connect_timeout: float = 3.0) -> None:
        if not tenant_id:
            raise ValueError("tenant_id: must not be empty")
        check_endpoints(endpoints)
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self.endpoints = endpoints
        self.tenant_id = tenant_id
        self.local_hostname = local_hostname
        self._replicate_config_cls = ReplicateConfig
        check_master_reachable(endpoints.master_server_address, connect_timeout)
        store = MooncakeDistributedStore()
        rc = store.setup(setup_config(endpoints, tenant_id, local_hostname))
        if rc != 0:
            raise StoreUnavailable(
                f"mooncake setup for tenant {tenant_id!r} at {endpoints.master_server_address} returned "
                f"{error_name(rc)} ({rc}); check global_segment_size (>= 16 MiB) and the metadata server "
                f"{endpoints.metadata_server}")
        self.raw = store
        self._registered: dict[int, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------------------------

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Unregister buffers and close the client (its mounted segment and the objects in it leave the pool)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for ptr in list(self._registered):
                self.raw.unregister_buffer(ptr)
            self._registered.clear()
        self.raw.close()

    # --- memory registration --------------------------------------------------------------------------------

    def register(self, ptr: int, size: int) -> None:
        """Register ``size`` bytes at ``ptr`` for zero-copy transfers.

        A region inside an already registered one needs nothing. A registered region that overlaps the new one
        only partly must belong to memory that was freed since (live allocations never overlap), so it is
        unregistered first; the store refuses overlapping registrations.

        Raises:
            StoreError: the store refused the region.
        """
        end = ptr + size
        with self._lock:
            for base, length in self._registered.items():
                if base <= ptr and end <= base + length:
                    return
            for base, length in list(self._registered.items()):
                if base < end and ptr < base + length:
                    log.debug("unregistering stale region 0x%x+%d overlapping 0x%x+%d", base, length, ptr, size)
                    self.raw.unregister_buffer(base)
                    del self._registered[base]
            rc = self.raw.register_buffer(ptr, size)
            if rc != 0:
                raise store_error("register_buffer", [(f"0x{ptr:x}+{size}", rc)], tenant_id=self.tenant_id)
            self._registered[ptr] = size

    def unregister(self, ptr: int) -> None:
        """Unregister a region registered by :meth:`register` (no-op for unknown pointers)."""
        with self._lock:
            if self._registered.pop(ptr, None) is not None:
                self.raw.unregister_buffer(ptr)

    # --- data -----------------------------------------------------------------------------------------------

    def replicate_config(self, *, replica_num: int = 1, group_ids: Sequence[str] | None = None,
                         soft_pin: bool = False) -> Any:
        """A ``ReplicateConfig`` (``group_ids``: one entry per key of the batch it goes with)."""
        cfg = self._replicate_config_cls()
        cfg.replica_num = replica_num
        if group_ids is not None:
            cfg.group_ids = list(group_ids)
        if soft_pin:
            from mooncake.store import SoftPinAction

            cfg.soft_pin_action = SoftPinAction.ENABLE
        return cfg

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int], config: Any = None) -> list[int]:
        """``batch_put_from``: one contiguous region per key; per key 0 or a negative code."""
        if config is None:
            return self.raw.batch_put_from(keys, ptrs, sizes)
        return self.raw.batch_put_from(keys, ptrs, sizes, config)

    def put_from_multi(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                       config: Any = None) -> list[int]:
        """``batch_put_from_multi_buffers``: several regions per key, concatenated in order."""
        if config is None:
            return self.raw.batch_put_from_multi_buffers(keys, ptrs, sizes)
        return self.raw.batch_put_from_multi_buffers(keys, ptrs, sizes, config)

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        """``batch_get_into``: per key the bytes read, or a negative code (-704 when absent)."""
        return self.raw.batch_get_into(keys, ptrs, sizes)

    def get_into_multi(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        """``batch_get_into_multi_buffers``: per key the total bytes read, or a negative code."""
        return self.raw.batch_get_into_multi_buffers(keys, ptrs, sizes)

    def exists(self, keys: list[str]) -> list[int]:
        """``batch_is_exist``: per key 1 (present), 0 (absent) or -1 (error)."""
        if not keys:
            return []
        return self.raw.batch_is_exist(keys)

    def size_of(self, key: str) -> int:
        """``get_size``: bytes of one object, or a negative code (-704 when absent)."""
        return self.raw.get_size(key)

    def remove(self, keys: list[str], *, force: bool = True) -> list[int]:
        """``batch_remove``: per key 0, or a negative code (-704 when it was already gone)."""
        if not keys:
            return []
        return self.raw.batch_remove(keys, force)

    def remove_by_regex(self, pattern: str, *, force: bool = True) -> int:
        """Remove every key of this tenant matching ``pattern`` (ECMAScript regex); returns how many.

        Raises:
            StoreError: the store returned a negative code.
        """
        count = self.raw.remove_by_regex(pattern, force)
        if count < 0:
            raise store_error("remove_by_regex", [(pattern, count)], tenant_id=self.tenant_id)
        return count

    def check(self, op: str, keys: Sequence[str], codes: Sequence[int]) -> None:
        """Raise the typed :class:`agent.datapath.errors.StoreError` for negative per-key ``codes`` of ``op``."""
        raise_for_codes(op, keys, codes, tenant_id=self.tenant_id)


def open_store(endpoints: StoreEndpoints, tenant_id: str, *, local_hostname: str = DEFAULT_LOCAL_HOSTNAME,
               connect_timeout: float = 3.0) -> StoreClient:
    """Open a :class:`StoreClient` for ``tenant_id`` (see its constructor for errors)."""
    return StoreClient(endpoints, tenant_id, local_hostname=local_hostname, connect_timeout=connect_timeout)
