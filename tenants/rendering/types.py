"""Value types of engine-config rendering: where the Store is, and what a rendered instance consists of.

``LaunchSpec`` (what a node needs to start one instance) is ``agent.contract.messages.LaunchSpec``, the one
definition the config document carries; it is re-exported here.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agent.contract.messages import LaunchSpec, NonNegative, StoreEndpoints

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RenderTarget(StoreEndpoints):
    """Where rendered configs point and land: the Store endpoints every rendered client gets (the fields of
    ``agent.contract.messages.StoreEndpoints``, the one definition, with Mooncake's names) plus

    * ``admin_url`` — master metrics/admin HTTP base (``--metrics_port``), e.g. ``http://127.0.0.1:9003``;
    * ``config_dir`` — directory on the node where rendered files are written (paths in env point there).

    ``mooncake_config(tenant_id)`` gives the client config keys only (no ``admin_url``/``config_dir``).
    """

    global_segment_size: NonNegative = 4 << 30
    local_buffer_size: NonNegative = 512 << 20
    admin_url: str = "http://127.0.0.1:9003"
    config_dir: str = "/etc/kvpool"

    @classmethod
    def from_settings(cls, **overrides: Any) -> RenderTarget:
        """Build from Django settings ``KVPOOL_MASTER_ADDRESS`` (the ``master_server_address``; in HA mode
        ``etcd://<KVPOOL_MASTER_HA_ETCD_ENDPOINTS>``, ``tenants.masters``), ``KVPOOL_METADATA_SERVER``,
        ``KVPOOL_STORE_PROTOCOL``, ``KVPOOL_MASTER_ADMIN_URL`` and, when defined,
        ``KVPOOL_STORE_DEVICE``, ``KVPOOL_GLOBAL_SEGMENT_SIZE``, ``KVPOOL_LOCAL_BUFFER_SIZE`` (bytes),
        ``KVPOOL_ENGINE_CONFIG_DIR``; ``overrides`` replace any field."""
        from django.conf import settings

        from tenants.masters import client_master_address_from_settings

        optional = {"device_name": "KVPOOL_STORE_DEVICE", "global_segment_size": "KVPOOL_GLOBAL_SEGMENT_SIZE",
                    "local_buffer_size": "KVPOOL_LOCAL_BUFFER_SIZE", "config_dir": "KVPOOL_ENGINE_CONFIG_DIR"}
        fields: dict[str, Any] = {
            "master_server_address": client_master_address_from_settings(),
            "metadata_server": settings.KVPOOL_METADATA_SERVER,
            "protocol": settings.KVPOOL_STORE_PROTOCOL,
            "admin_url": settings.KVPOOL_MASTER_ADMIN_URL,
        }
        fields.update({name: getattr(settings, setting) for name, setting in optional.items()
                       if hasattr(settings, setting)})
        fields.update(overrides)
        return cls(**fields)

    def store_endpoints(self) -> StoreEndpoints:
        """The Store endpoints alone (what a config document carries)."""
        return StoreEndpoints(**self.mooncake_config())


__all__ = ["ENGINE_PYTHON", "LaunchSpec", "RenderTarget", "RenderedConfig"]

#: ``argv[0]`` of a rendered engine launch that stands for the engine's Python interpreter: whoever starts the
#: instance substitutes the interpreter of the engine's environment (the node's instance directories run
#: ``"${KVPOOL_ENGINE_PYTHON:-python3}"`` in its place, see ``agent.node.instance_dirs``).
ENGINE_PYTHON = "python"


@dataclass(frozen=True)
class RenderedConfig:
    """One process to start: ``argv`` (exact arguments), ``env`` (variables to set), ``files`` (absolute path
    on the node -> text content to write before starting), and ``meta`` (what it was rendered from).

    Engine instances also carry ``instance_id``, ``instance_dir`` (``<config_dir>/<instance_id>``, where
    their files are rendered) and ``user`` (the tenant's engine account, ``Tenant.engine_account``);
    ``launch_spec()`` gives the same launch relative to that directory.
    ``argv[0] == "python"`` (``ENGINE_PYTHON``) stands for the engine's interpreter.

    ``command_line`` is ``shlex.join(argv)``, so ``shlex.split(command_line) == argv`` for any argument;
    ``shell_line`` prefixes the ``NAME=value`` assignments, also quoted with ``shlex``.
    """

    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    instance_id: str = ""
    instance_dir: str = ""
    user: str = ""

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

    def launch_spec(self) -> LaunchSpec:
        """The launch relative to the instance directory: files by name, and every env variable whose value is
        the rendered path of one of them moved to ``file_env``.

        Raises:
            ValueError: not an engine instance (no ``instance_id``), a file outside ``instance_dir``, or what
                ``LaunchSpec`` refuses.
        """
        return LaunchSpec.model_validate(self.launch_form())

    def launch_form(self) -> dict[str, Any]:
        """:meth:`launch_spec` in its JSON form (``LaunchSpec.to_dict()``) without validating it as a ``LaunchSpec``:
        for a caller that validates the whole message carrying it (the config push validates each document once,
        ``dashboard.rollout.push``). Raises ``ValueError`` as :meth:`launch_spec` does for its own checks."""
        if not self.instance_id or not self.instance_dir:
            raise ValueError(f"a {self.kind} config is not an engine instance; it has no launch spec")
        prefix = self.instance_dir.rstrip("/") + "/"
        files: dict[str, str] = {}
        for path, content in self.files.items():
            name = path[len(prefix):] if path.startswith(prefix) else ""
            if not name or "/" in name:
                raise ValueError(f"file {path!r} is not directly inside the instance directory {self.instance_dir!r}")
            files[name] = content
        env: dict[str, str] = {}
        file_env: dict[str, str] = {}
        for name, value in self.env.items():
            if value in self.files:
                file_env[name] = value[len(prefix):]
            else:
                env[name] = value
        return {"instance_id": self.instance_id, "argv": list(self.argv), "env": env, "file_env": file_env,
                "files": files, "user": self.user}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form used by the REST API and ``render_config`` (``instance_id`` for engine instances)."""
        data = {
            **dict(self.meta),
            "kind": self.kind,
            "argv": list(self.argv),
            "env": dict(self.env),
            "files": dict(self.files),
            "command_line": self.command_line,
            "shell_line": self.shell_line,
        }
        if self.instance_id:
            data["instance_id"] = self.instance_id
        return data
