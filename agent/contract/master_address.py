"""The master address a Mooncake Store client takes (Mooncake 0.3.13.post1): one master, or an HA master set.

* one master: ``host:rpc_port`` (``[::1]:50051`` for IPv6);
* HA (``mooncake_master --enable_ha=true --ha_backend_type=etcd``): ``etcd://host:port[;host:port...]``, the etcd
  endpoints the client reads the current leader from (key ``mooncake-store/mooncake_cluster/master_view``) and
  follows after a failover.

The same string is ``MooncakeDistributedStore.setup()``'s ``master_server_addr``, ``mooncake_client
--master_server_address`` and the ``master_server_address`` of vLLM's ``MOONCAKE_CONFIG_PATH`` JSON (vLLM passes it
to ``setup()`` unchanged); each was tried against a real pair of masters (``docs/ha.md``). The HA form works only
with the masters' default ``--cluster_id`` (``mooncake_cluster``): a client finds another cluster id only through
its ``MC_STORE_CLUSTER_ID`` environment variable.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Prefix of the HA form (the etcd backend, the only HA backend this wheel serves).
ETCD_SCHEME = "etcd://"
#: Separator of several etcd endpoints, as Mooncake writes them (``--etcd_endpoints``, ``etcd://``).
ENDPOINT_SEPARATOR = ";"
#: Most etcd endpoints one address may list (an etcd cluster has a handful of members).
MAX_ENDPOINTS = 16


def parse_host_port(text: str, what: str = "address") -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``; IPv6 hosts in brackets (``[::1]:50051`` -> ``("::1", 50051)``).

    Raises:
        ValueError: not ``host:port`` with a port in 1..65535, or anything (a scheme, a path) around it.
    """
    if not isinstance(text, str) or not text or text != text.strip() or "/" in text or "@" in text:
        raise ValueError(f"{what} {text!r} must be 'host:port'")
    try:
        parts = urlsplit(f"//{text}")
        port = parts.port
    except ValueError:
        raise ValueError(f"{what} {text!r} must be 'host:port' with a port in 1..65535") from None
    if not parts.hostname or port is None or not 1 <= port <= 65535:
        raise ValueError(f"{what} {text!r} must be 'host:port' with a port in 1..65535")
    return parts.hostname, port


def format_host_port(host: str, port: int) -> str:
    """``(host, port)`` -> ``host:port``, brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class MasterAddress:
    """A parsed master address: ``ha`` False -> ``endpoints`` is the one master's ``(host, rpc_port)``; True -> the
    etcd endpoints the client finds the leader through. ``str()`` gives the canonical text back."""

    ha: bool
    endpoints: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        joined = ENDPOINT_SEPARATOR.join(format_host_port(host, port) for host, port in self.endpoints)
        return f"{ETCD_SCHEME}{joined}" if self.ha else joined


def parse_etcd_endpoints(text: str | Sequence[str], what: str = "etcd endpoints") -> tuple[str, ...]:
    """etcd endpoints as ``host:port`` strings, from ``"a:2379;b:2379"`` (commas accepted too) or a sequence; an
    ``http://`` prefix per endpoint is dropped (etcd's own URL form).

    Raises:
        ValueError: none given, more than ``MAX_ENDPOINTS``, one that is not ``host:port``, or one listed twice.
    """
    items = text.replace(",", ENDPOINT_SEPARATOR).split(ENDPOINT_SEPARATOR) if isinstance(text, str) else list(text)
    endpoints: list[str] = []
    for item in items:
        item = item.strip() if isinstance(item, str) else item
        if item == "":
            continue
        if isinstance(item, str) and item.lower().startswith("http://"):
            item = item[len("http://"):].rstrip("/")
        endpoint = format_host_port(*parse_host_port(item, f"{what}: endpoint"))
        if endpoint in endpoints:
            raise ValueError(f"{what}: endpoint {endpoint!r} is listed twice")
        endpoints.append(endpoint)
    if not endpoints:
        raise ValueError(f"{what}: at least one etcd endpoint 'host:port' is needed")
    if len(endpoints) > MAX_ENDPOINTS:
        raise ValueError(f"{what}: at most {MAX_ENDPOINTS} endpoints, got {len(endpoints)}")
    return tuple(endpoints)


def ha_master_address(etcd_endpoints: str | Sequence[str], what: str = "etcd endpoints") -> str:
    """The HA master address for ``etcd_endpoints`` (see :func:`parse_etcd_endpoints`): ``etcd://a:2379;b:2379``.

    Raises:
        ValueError: as :func:`parse_etcd_endpoints` (the message names ``what``).
    """
    return ETCD_SCHEME + ENDPOINT_SEPARATOR.join(parse_etcd_endpoints(etcd_endpoints, what))


def parse_master_address(text: str, what: str = "master_server_address") -> MasterAddress:
    """``host:port`` (one master) or ``etcd://host:port[;host:port...]`` (HA).

    Raises:
        ValueError: neither form (the message names ``what`` and both forms).
    """
    if not isinstance(text, str):
        raise ValueError(f"{what}: expected a string, got {type(text).__name__}")
    if text[:len(ETCD_SCHEME)].lower() == ETCD_SCHEME:
        endpoints = parse_etcd_endpoints(text[len(ETCD_SCHEME):], what)
        return MasterAddress(True, tuple(parse_host_port(e) for e in endpoints))
    try:
        return MasterAddress(False, (parse_host_port(text, what),))
    except ValueError:
        raise ValueError(f"{what}: expected 'host:port' (one master) or 'etcd://host:port[;host:port...]' "
                         f"(HA masters), got {text!r}") from None
