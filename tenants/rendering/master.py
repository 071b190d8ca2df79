"""Mooncake master (0.3.13.post1) command lines in multi-tenant mode, alone or as an HA set, and their
``tenant_quotas.yaml`` policy."""
from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import yaml

from tenants.masters import MasterNode, MasterTopology, ha_configured
from tenants.quota import format_quota
from tenants.rendering.types import RenderedConfig, RenderTarget
from tenants.room import MasterEviction

#: File name of the quota policy under ``RenderTarget.config_dir``.
QUOTA_FILE_NAME = "tenant_quotas.yaml"


def render_tenant_quotas_yaml(tenants: Iterable) -> str:
    """The master's file policy: ``version: 1`` and ``tenants: [{name, quota}]`` sorted by name.

    Quotas are written in their exact unit form (``8MB``), which the master parses as binary units; names are
    YAML-quoted where needed (``'123'``, ``'yes'``, names with ``:`` or ``#``) so they load back unchanged.
    """
    entries = [
        {"name": tenant.tenant_id, "quota": format_quota(tenant.quota_bytes)}
        for tenant in sorted(tenants, key=lambda tenant: tenant.tenant_id)
    ]
    return yaml.safe_dump(
        {"version": 1, "tenants": entries}, sort_keys=False, allow_unicode=True, default_flow_style=False
    )


def _host_port(address: str, what: str) -> tuple[str, int]:
    parts = urlsplit(address if "//" in address else f"//{address}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"{what} {address!r} must be 'host:port' (or a URL with a port)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return host.strip("[]"), parts.port


def render_master(tenants: Iterable, endpoints: RenderTarget, *, binary: str = "mooncake_master",
                  eviction: MasterEviction | None = None, master: MasterNode | None = None,
                  topology: MasterTopology | None = None) -> RenderedConfig:
    """``mooncake_master`` flags for one master with multi-tenancy and the rendered quota policy file.

    Flags: ``--rpc_address``/``--rpc_port`` and ``--metrics_port`` from ``master`` (default: the one master of
    ``endpoints``, ``master_server_address`` and ``admin_url``); ``--enable_http_metadata_server=true`` with
    ``--http_metadata_server_host``/``_port`` when ``metadata_server`` is an ``http(s)://`` URL and the master runs
    alone; ``--enable_multi_tenants=true``, ``--tenant_quota_connector_type=file``,
    ``--tenant_quota_connector_uri=<config_dir>/tenant_quotas.yaml``; ``--eviction_high_watermark_ratio`` and
    ``--eviction_ratio`` from ``eviction`` (default: the settings, ``MasterEviction.from_settings()``: the watermark
    the budget checks and implicit budgets assume, ``tenants.room``); in HA mode (``topology.ha``) the set's flags
    (``MasterTopology.ha_argv``: ``--enable_ha=true --ha_backend_type=etcd --etcd_endpoints=… --enable_oplog=true``)
    and no HTTP metadata server (it would die with its master: HA clients use etcd or ``P2PHANDSHAKE``).

    Raises ``ValueError`` when an address has no port, or in HA mode without ``master`` (render each master of the
    set: ``render_masters``).
    """
    ha = topology is not None and topology.ha
    if ha and master is None:
        raise ValueError("an HA master set has one launch per master: pass master=, or use render_masters()")
    rpc = master.rpc_address if master is not None else endpoints.master_server_address
    admin = master.admin_url if master is not None else endpoints.admin_url
    rpc_host, rpc_port = _host_port(rpc, "master_server_address")
    quota_path = f"{endpoints.config_dir.rstrip('/')}/{QUOTA_FILE_NAME}"
    argv = [binary, f"--rpc_address={rpc_host}", f"--rpc_port={rpc_port}"]
    if not ha and endpoints.metadata_server.startswith(("http://", "https://")):
        meta_host, meta_port = _host_port(endpoints.metadata_server, "metadata_server")
        argv += [
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={meta_host}",
            f"--http_metadata_server_port={meta_port}",
        ]
    _, metrics_port = _host_port(admin, "admin_url")
    argv += [
        f"--metrics_port={metrics_port}",
        "--enable_multi_tenants=true",
        "--tenant_quota_connector_type=file",
        f"--tenant_quota_connector_uri={quota_path}",
        *(eviction or MasterEviction.from_settings()).argv(),
    ]
    meta: dict = {}
    if ha:
        assert topology is not None and master is not None
        argv += topology.ha_argv()
        meta = {"ha": True, "master_index": topology.masters.index(master), "masters": len(topology.masters),
                "rpc_address": master.rpc_address, "admin_url": master.admin_url}
    tenants = list(tenants)
    return RenderedConfig(
        kind="mooncake_master",
        argv=argv,
        files={quota_path: render_tenant_quotas_yaml(tenants)},
        meta={"tenants": sorted(tenant.tenant_id for tenant in tenants), **meta},
    )


def render_masters(tenants: Iterable, endpoints: RenderTarget, topology: MasterTopology | None = None, *,
                   binary: str = "mooncake_master", eviction: MasterEviction | None = None) -> list[RenderedConfig]:
    """Every master of ``topology`` (default: the settings', ``MasterTopology.from_settings()``), in order: one
    ``render_master`` each (an HA set's share the quota policy, the etcd endpoints and every flag but their own
    addresses). One master without HA renders as ``render_master(tenants, endpoints)`` does.

    Raises ``ValueError`` as ``render_master`` and ``MasterTopology.from_settings``.
    """
    if topology is None:
        topology = MasterTopology.from_settings() if ha_configured() else None
    tenants = list(tenants)
    if topology is None or not topology.ha:
        return [render_master(tenants, endpoints, binary=binary, eviction=eviction)]
    return [render_master(tenants, endpoints, binary=binary, eviction=eviction, master=master, topology=topology)
            for master in topology.masters]
