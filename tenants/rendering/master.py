"""Mooncake master (0.3.13.post1) command line in multi-tenant mode and its ``tenant_quotas.yaml`` policy."""
from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import yaml

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
                  eviction: MasterEviction | None = None) -> RenderedConfig:
    """``mooncake_master`` flags for ``endpoints`` with multi-tenancy and the rendered quota policy file.

    Flags: ``--rpc_address``/``--rpc_port`` from ``master_server_address``; ``--enable_http_metadata_server=true``
    with ``--http_metadata_server_host``/``_port`` when ``metadata_server`` is an ``http(s)://`` URL;
    ``--metrics_port`` from ``admin_url``; ``--enable_multi_tenants=true``,
    ``--tenant_quota_connector_type=file``, ``--tenant_quota_connector_uri=<config_dir>/tenant_quotas.yaml``;
    ``--eviction_high_watermark_ratio`` and ``--eviction_ratio`` from ``eviction`` (default: the settings,
    ``MasterEviction.from_settings()``: the watermark the budget checks and implicit budgets assume,
    ``tenants.room``). Raises ``ValueError`` when an address has no port.
    """
    rpc_host, rpc_port = _host_port(endpoints.master_server_address, "master_server_address")
    quota_path = f"{endpoints.config_dir.rstrip('/')}/{QUOTA_FILE_NAME}"
    argv = [binary, f"--rpc_address={rpc_host}", f"--rpc_port={rpc_port}"]
    if endpoints.metadata_server.startswith(("http://", "https://")):
        meta_host, meta_port = _host_port(endpoints.metadata_server, "metadata_server")
        argv += [
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={meta_host}",
            f"--http_metadata_server_port={meta_port}",
        ]
    _, metrics_port = _host_port(endpoints.admin_url, "admin_url")
    argv += [
        f"--metrics_port={metrics_port}",
        "--enable_multi_tenants=true",
        "--tenant_quota_connector_type=file",
        f"--tenant_quota_connector_uri={quota_path}",
        *(eviction or MasterEviction.from_settings()).argv(),
    ]
    tenants = list(tenants)
    return RenderedConfig(
        kind="mooncake_master",
        argv=argv,
        files={quota_path: render_tenant_quotas_yaml(tenants)},
        meta={"tenants": sorted(tenant.tenant_id for tenant in tenants)},
    )
