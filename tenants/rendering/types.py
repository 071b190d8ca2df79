"""Value types of engine-config rendering: where the Store is, and what a rendered instance consists of."""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class StoreEndpoints:
    """How engines reach the Mooncake Store, plus where rendered config files go on the node.

    * ``master_address`` — master RPC ``host:port`` (client ``master_server_address``).
    * ``metadata_server`` — transfer-engine metadata, ``http://host:port/metadata`` (the master's embedded
      HTTP metadata server) or ``P2PHANDSHAKE``.
    * ``protocol`` (``tcp``/``rdma``), ``device_name`` (RDMA NIC list, ``""`` for auto/TCP).
    * ``global_segment_size`` — bytes each client process mounts into the pool; ``local_buffer_size`` —
      bytes of its registered transfer buffer.
    * ``admin_url`` — master metrics/admin HTTP base (``--metrics_port``), e.g. ``http://127.0.0.1:9003``.
    * ``config_dir`` — directory on the node where rendered files are written (paths in env point there).
    """

    master_address: str
    metadata_server: str
    protocol: str = "tcp"
    device_name: str = ""
    global_segment_size: int = 4 << 30
    local_buffer_size: int = 512 << 20
    admin_url: str = "http://127.0.0.1:9003"
    config_dir: str = "/etc/kvpool"

    @classmethod
    def from_settings(cls, **overrides: Any) -> StoreEndpoints:
        """Build from Django settings ``KVPOOL_MASTER_ADDRESS``, ``KVPOOL_METADATA_SERVER``,
        ``KVPOOL_STORE_PROTOCOL``, ``KVPOOL_MASTER_ADMIN_URL`` and, when defined, ``KVPOOL_STORE_DEVICE``,
        ``KVPOOL_GLOBAL_SEGMENT_SIZE``, ``KVPOOL_LOCAL_BUFFER_SIZE`` (bytes), ``KVPOOL_ENGINE_CONFIG_DIR``;
        ``overrides`` replace any field."""
        from django.conf import settings

        defaults = cls(master_address="", metadata_server="")
        endpoints = cls(
            master_address=settings.KVPOOL_MASTER_ADDRESS,
            metadata_server=settings.KVPOOL_METADATA_SERVER,
            protocol=settings.KVPOOL_STORE_PROTOCOL,
            device_name=getattr(settings, "KVPOOL_STORE_DEVICE", defaults.device_name),
            global_segment_size=int(getattr(settings, "KVPOOL_GLOBAL_SEGMENT_SIZE", defaults.global_segment_size)),
            local_buffer_size=int(getattr(settings, "KVPOOL_LOCAL_BUFFER_SIZE", defaults.local_buffer_size)),
            admin_url=settings.KVPOOL_MASTER_ADMIN_URL,
            config_dir=getattr(settings, "KVPOOL_ENGINE_CONFIG_DIR", defaults.config_dir),
        )
        return replace(endpoints, **overrides)


@dataclass(frozen=True)
class RenderedConfig:
    """One process to start: ``argv`` (exact arguments), ``env`` (variables to set), ``files`` (absolute path
    on the node -> text content to write before starting), and ``meta`` (what it was rendered from).

    ``command_line`` is ``shlex.join(argv)``, so ``shlex.split(command_line) == argv`` for any argument;
    ``shell_line`` prefixes the ``NAME=value`` assignments, also quoted with ``shlex``.
    """

    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        for name in self.env:
            if not _ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid environment variable name {name!r}")
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    @property
    def command_line(self) -> str:
        """The command, shell-quoted: ``shlex.split(command_line) == list(argv)``."""
        return shlex.join(self.argv)

    @property
    def shell_line(self) -> str:
        """``NAME=value ... command`` for a POSIX shell (variables sorted by name)."""
        assignments = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        return " ".join([*assignments, self.command_line])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form used by the REST API and ``render_config``."""
        return {
            **dict(self.meta),
            "kind": self.kind,
            "argv": list(self.argv),
            "env": dict(self.env),
            "files": dict(self.files),
            "command_line": self.command_line,
            "shell_line": self.shell_line,
        }
