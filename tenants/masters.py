"""The pool's Mooncake masters (mooncake_master 0.3.13.post1): one master, or an HA set that elects its leader in
etcd. Everything that names a master is rendered from this (``tenants.rendering``: the masters' launch lines,
every client's ``master_server_address``) and the dashboard reaches the masters through it
(``dashboard.master.leader``: health of each, the admin API on the leader only).

Settings (``MasterTopology.from_settings``; ``docs/ha.md``):

* one master — ``KVPOOL_MASTER_ADDRESS`` (RPC ``host:port``) and ``KVPOOL_MASTER_ADMIN_URL`` (``--metrics_port``);
* HA — ``KVPOOL_MASTER_HA_ETCD_ENDPOINTS`` (``host:port`` separated by ``;`` or ``,``; set = HA mode),
  ``KVPOOL_MASTER_HA_ADDRESSES`` and ``KVPOOL_MASTER_HA_ADMIN_URLS`` (each master's RPC address and admin URL, in
  the same order) and ``KVPOOL_MASTER_HA_OPLOG`` (``--enable_oplog``: standbys replay the leader's metadata from
  etcd, so objects, segments and leases survive a failover).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent.contract.master_address import (
    ENDPOINT_SEPARATOR,
    format_host_port,
    ha_master_address,
    parse_etcd_endpoints,
    parse_host_port,
)


def _admin_url(url: str, what: str) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port
    except (TypeError, ValueError):
        port, parts = None, None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port is None
            or parts.path not in ("", "/") or parts.query or parts.fragment):
        raise ValueError(f"{what} {url!r} must be http(s)://host:port (the master's --metrics_port)")
    return url.rstrip("/")


@dataclass(frozen=True)
class MasterNode:
    """One ``mooncake_master`` process: ``rpc_address`` (``host:port``, ``--rpc_address``/``--rpc_port``) and
    ``admin_url`` (``http://host:metrics_port``: ``/health``, ``/metrics``, ``/api/v1/tenant_quotas``)."""

    rpc_address: str
    admin_url: str

    def __post_init__(self) -> None:
        host, port = parse_host_port(self.rpc_address, "master RPC address")
        object.__setattr__(self, "rpc_address", format_host_port(host, port))
        object.__setattr__(self, "admin_url", _admin_url(self.admin_url, "master admin URL"))


@dataclass(frozen=True)
class MasterTopology:
    """The pool's masters: ``masters`` (one, or the HA set in order), ``etcd_endpoints`` (``host:port`` each; empty
    = one master without HA) and ``oplog`` (HA only: ``--enable_oplog``).

    Raises (constructor):
        ValueError: no master, several masters without etcd endpoints, a malformed address or URL, or two masters
            on one RPC address or admin URL.
    """

    masters: tuple[MasterNode, ...]
    etcd_endpoints: tuple[str, ...] = ()
    oplog: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "masters", tuple(self.masters))
        if self.etcd_endpoints:
            object.__setattr__(self, "etcd_endpoints", parse_etcd_endpoints(self.etcd_endpoints))
        if not self.masters:
            raise ValueError("at least one master is needed")
        if len(self.masters) > 1 and not self.etcd_endpoints:
            raise ValueError(f"{len(self.masters)} masters without etcd endpoints: several masters need HA mode "
                             "(KVPOOL_MASTER_HA_ETCD_ENDPOINTS)")
        for attribute in ("rpc_address", "admin_url"):
            values = [getattr(master, attribute) for master in self.masters]
            twice = sorted({value for value in values if values.count(value) > 1})
            if twice:
                raise ValueError(f"two masters share the {attribute.replace('_', ' ')} {twice[0]!r}")

    @property
    def ha(self) -> bool:
        """Whether the masters run in HA mode (leader elected in etcd)."""
        return bool(self.etcd_endpoints)

    @property
    def client_master_address(self) -> str:
        """What every Store client gets as ``master_server_address``: ``etcd://a:2379;b:2379`` in HA mode (clients
        follow the leader through etcd), else the one master's ``host:port``."""
        return ha_master_address(self.etcd_endpoints) if self.ha else self.masters[0].rpc_address

    @property
    def admin_urls(self) -> tuple[str, ...]:
        """Every master's admin URL, in order."""
        return tuple(master.admin_url for master in self.masters)

    def ha_argv(self) -> list[str]:
        """The HA flags every master of the set gets (none without HA): ``--enable_ha=true
        --ha_backend_type=etcd --etcd_endpoints=a:2379;b:2379`` and ``--enable_oplog=true`` when ``oplog``."""
        if not self.ha:
            return []
        argv = ["--enable_ha=true", "--ha_backend_type=etcd",
                f"--etcd_endpoints={ENDPOINT_SEPARATOR.join(self.etcd_endpoints)}"]
        if self.oplog:
            argv.append("--enable_oplog=true")
        return argv

    @classmethod
    def single(cls, rpc_address: str, admin_url: str) -> MasterTopology:
        """One master without HA."""
        return cls((MasterNode(rpc_address, admin_url),))

    @classmethod
    def ha_set(cls, etcd_endpoints: str | Sequence[str], rpc_addresses: Sequence[str], admin_urls: Sequence[str],
               *, oplog: bool = True) -> MasterTopology:
        """An HA set: ``rpc_addresses[i]`` and ``admin_urls[i]`` are master ``i``'s.

        Raises:
            ValueError: the two lists differ in length, or as the constructor.
        """
        if len(rpc_addresses) != len(admin_urls):
            raise ValueError(f"{len(rpc_addresses)} master RPC address(es) but {len(admin_urls)} admin URL(s): "
                             "give each master both, in the same order")
        if not rpc_addresses:
            raise ValueError("HA mode needs the masters' RPC addresses and admin URLs")
        endpoints = parse_etcd_endpoints(etcd_endpoints, "KVPOOL_MASTER_HA_ETCD_ENDPOINTS")
        nodes = []
        for index, (address, url) in enumerate(zip(rpc_addresses, admin_urls, strict=True)):
            try:
                nodes.append(MasterNode(address, url))
            except ValueError as exc:
                raise ValueError(f"HA master {index} (KVPOOL_MASTER_HA_ADDRESSES / KVPOOL_MASTER_HA_ADMIN_URLS): "
                                 f"{exc}") from None
        return cls(tuple(nodes), endpoints, oplog)

    @classmethod
    def from_settings(cls) -> MasterTopology:
        """From Django settings (module docstring). ``KVPOOL_MASTER_HA_ETCD_ENDPOINTS`` empty: one master from
        ``KVPOOL_MASTER_ADDRESS`` / ``KVPOOL_MASTER_ADMIN_URL``; set: the HA set.

        Raises:
            ValueError: as the constructor, the message naming the setting.
        """
        from django.conf import settings

        if not ha_configured():
            return cls.single(settings.KVPOOL_MASTER_ADDRESS, settings.KVPOOL_MASTER_ADMIN_URL)
        return cls.ha_set(settings.KVPOOL_MASTER_HA_ETCD_ENDPOINTS,
                          list(getattr(settings, "KVPOOL_MASTER_HA_ADDRESSES", [])),
                          list(getattr(settings, "KVPOOL_MASTER_HA_ADMIN_URLS", [])),
                          oplog=bool(getattr(settings, "KVPOOL_MASTER_HA_OPLOG", True)))


def ha_configured() -> bool:
    """Whether the settings put the masters in HA mode (``KVPOOL_MASTER_HA_ETCD_ENDPOINTS`` set)."""
    from django.conf import settings

    etcd = getattr(settings, "KVPOOL_MASTER_HA_ETCD_ENDPOINTS", "") or ""
    return not (isinstance(etcd, str) and not etcd.strip())


def client_master_address_from_settings() -> str:
    """The ``master_server_address`` rendered into every client: ``etcd://…`` of
    ``KVPOOL_MASTER_HA_ETCD_ENDPOINTS`` in HA mode, else ``KVPOOL_MASTER_ADDRESS`` as set (the renderers and
    ``kvpool.E006`` judge it).

    Raises:
        ValueError: HA mode with malformed etcd endpoints.
    """
    from django.conf import settings

    if not ha_configured():
        return settings.KVPOOL_MASTER_ADDRESS
    return ha_master_address(settings.KVPOOL_MASTER_HA_ETCD_ENDPOINTS, "KVPOOL_MASTER_HA_ETCD_ENDPOINTS")
