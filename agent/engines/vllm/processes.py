"""The vLLM engines running on this node, from their command lines: the namespace each one really writes under.

An engine that publishes on an instance's KV events may write its blocks under a namespace the registry does not
have — a mistyped ``cache_prefix``, another ``--model`` — while its block hashes still recompute (the key prefix is
not hashed): the blocks are attributed, but their expected keys never appear in the Store and they end
``unconfirmed`` (``agent.datapath.pending``). Finding the real keys takes the engine's real prefix, and the Store
cannot list it: on Mooncake 0.3.13.post1 the master's ``/get_all_keys`` lists the ``default`` tenant only,
``/query_key`` and ``/batch_query_keys`` ignore ``tenant_id`` (checked), and the client has no listing call. The
engine's own command line has it: vLLM 0.32.0/0.33.0 keeps its argv in ``/proc/<pid>/cmdline`` — ``--model`` (the
key's model component is its last path component), ``--kv-transfer-config`` (``kv_connector_extra_config.
cache_prefix``) and ``--kv-events-config`` (``endpoint`` and ``topic``: which instance's events it publishes) — and
Linux lets any user read it unless ``/proc`` is mounted with ``hidepid``.

:func:`scan_engines` reads at most ``MAX_PROCESSES`` command lines of at most ``MAX_CMDLINE_BYTES`` each (the node's
maintenance calls it at most every ``agent.node.engines.NAMESPACE_SCAN_INTERVAL`` seconds, and only when some block
went unconfirmed); :func:`alternate_keys` turns the engines bound to an instance's events that write under another
key prefix into ``agent.datapath.pending.Alternate`` entries, named by that key prefix (``<cache_prefix>@<model>``,
or ``<model>`` without a prefix). What a command line says is a hint like the events: a block counts under that
namespace only when the Store holds its key there, under the instance's tenant. Engines in another PID namespace (a
pod) are not seen; their blocks stay ``unconfirmed``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.contract import keys as keygrammar
from agent.datapath.keyspace import KeySpace
from agent.datapath.pending import Alternate

#: Most ``/proc`` entries read per scan.
MAX_PROCESSES = 65536
#: Most bytes read of one command line.
MAX_CMDLINE_BYTES = 1 << 17
#: Most other namespaces checked for one instance.
MAX_ALTERNATES = 4

_VLLM_ENTRYPOINTS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")


@dataclass(frozen=True)
class EngineLaunch:
    """What one vLLM engine process was started with: ``pid``, ``model`` (``--model``), ``cache_prefix``
    (``kv_connector_extra_config.cache_prefix``, "" when none), its ``--kv-events-config`` (``kv_events``) and its
    working directory (``cwd``, "" when unreadable: a relative ``ipc://`` endpoint is bound there)."""

    pid: int
    model: str
    cache_prefix: str
    kv_events: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    cwd: str = ""

    @property
    def key_model(self) -> str:
        """The model component of its Store keys (last path component of ``--model``)."""
        return keygrammar.vllm_model_name(self.model)

    @property
    def namespace_name(self) -> str:
        """Its key prefix as the Store shows it: ``<cache_prefix>@<model>`` (``<model>`` without a prefix)."""
        return f"{self.cache_prefix}@{self.key_model}" if self.cache_prefix else self.key_model


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` / ``--name=VALUE`` (the last one wins, as argparse does)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def _json_option(argv: Sequence[str], name: str) -> dict[str, Any]:
    raw = _option(argv, name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_vllm_argv(argv: Sequence[str], pid: int = 0) -> EngineLaunch | None:
    """The launch of a vLLM 0.32.0/0.33.0 OpenAI server command line (``python -m
    vllm.entrypoints.openai.api_server --model M …`` or ``vllm serve M …``) that writes to the Store (has a
    ``--kv-transfer-config``); None for any other process."""
    args = list(argv)
    model = None
    if any(arg in _VLLM_ENTRYPOINTS for arg in args):
        model = _option(args, "--model")
    else:
        for i, arg in enumerate(args[:-1]):
            if os.path.basename(arg) == "vllm" and args[i + 1] == "serve":
                rest = args[i + 2:]
                model = _option(rest, "--model") or (rest[0] if rest and not rest[0].startswith("-") else None)
                break
    if not model:
        return None
    transfer = _json_option(args, "--kv-transfer-config")
    if not transfer:
        return None
    extra = transfer.get("kv_connector_extra_config")
    prefix = extra.get("cache_prefix") if isinstance(extra, dict) else None
    return EngineLaunch(pid, model, prefix if isinstance(prefix, str) else "", _json_option(args, "--kv-events-config"))


def scan_engines(proc_root: str | os.PathLike[str] = "/proc") -> list[EngineLaunch]:
    """Every vLLM engine process this user can see (:func:`parse_vllm_argv` of each ``/proc/<pid>/cmdline``),
    bounded by ``MAX_PROCESSES`` and ``MAX_CMDLINE_BYTES``; unreadable entries are skipped."""
    root = Path(proc_root)
    out: list[EngineLaunch] = []
    try:
        entries = os.scandir(root)
    except OSError:
        return out
    with entries:
        for n, entry in enumerate(entries):
            if n >= MAX_PROCESSES:
                break
            if not entry.name.isdigit():
                continue
            try:
                with open(root / entry.name / "cmdline", "rb") as f:
                    raw = f.read(MAX_CMDLINE_BYTES)
            except OSError:
                continue
            argv = [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]
            launch = parse_vllm_argv(argv, int(entry.name))
            if launch is not None:
                try:
                    cwd = os.readlink(root / entry.name / "cwd")
                except OSError:
                    cwd = ""
                out.append(replace(launch, cwd=cwd))
    return out


def expected_events(instance: Any) -> dict[str, Any]:
    """The ``endpoint`` / ``topic`` an instance's engine publishes with: from the ``--kv-events-config`` of its
    rendered launch (``instance.launch.argv``), else its ``instance_id`` as topic."""
    launch = getattr(instance, "launch", None)
    config = _json_option(list(launch.argv), "--kv-events-config") if launch is not None else {}
    wanted: dict[str, Any] = {name: config[name] for name in ("endpoint", "topic") if name in config}
    return wanted or {"topic": getattr(instance, "instance_id", "")}


def bound_to(launch: EngineLaunch, instance: Any, directory: str | os.PathLike[str] | None = None) -> bool:
    """Whether the engine publishes KV events as ``instance``: same ``endpoint`` and ``topic`` as its launch, and,
    for a relative ``ipc://`` endpoint (the rendered ``ipc://kv-events.sock``), started in the instance's
    ``directory`` (when given), where that endpoint is the socket the agent reads."""
    wanted = expected_events(instance)
    if not all(launch.kv_events.get(name) == value for name, value in wanted.items()):
        return False
    endpoint = str(wanted.get("endpoint", ""))
    if directory is not None and endpoint.startswith("ipc://") and not endpoint.startswith("ipc:///"):
        return launch.cwd == os.fspath(directory)
    return True


def alternate_keys(launches: Sequence[EngineLaunch], instance: Any,
                   directory: str | os.PathLike[str] | None = None) -> list[Alternate]:
    """For the engines bound to ``instance`` (:func:`bound_to`, in ``directory``) that write under a key prefix other
    than its release's: ``(name, key_of)`` with ``key_of(keyspace, block_hash)`` = that block's primary key under
    the engine's prefix (same ranks and KV-cache group), at most ``MAX_ALTERNATES``."""
    own_prefix = getattr(instance, "namespace", "")
    try:
        own_model = keygrammar.key_model("vllm", instance.served_model_name, getattr(instance, "vllm_model_name", ""))
    except ValueError:
        own_model = ""
    out: list[Alternate] = []
    seen: set[tuple[str, str]] = set()
    for launch in launches:
        try:
            config = (launch.cache_prefix, launch.key_model)
        except ValueError:  # a --model with no last path component names no keys
            continue
        if config == (own_prefix, own_model) or config in seen or not bound_to(launch, instance, directory):
            continue
        seen.add(config)
        out.append((launch.namespace_name, _key_of(*config)))
        if len(out) >= MAX_ALTERNATES:
            break
    return out


def _key_of(cache_prefix: str, model: str) -> Any:
    def key_of(ks: KeySpace, block_hash: bytes) -> str:
        return keygrammar.vllm_key(model, block_hash, cache_prefix=cache_prefix or None, tp_rank=ks.tp_rank,
                                   pcp_rank=ks.pcp_rank, dcp_rank=ks.dcp_rank, pp_rank=ks.pp_rank, group=ks.kv_group)
    return key_of


__all__ = ["EngineLaunch", "MAX_ALTERNATES", "MAX_CMDLINE_BYTES", "MAX_PROCESSES", "alternate_keys", "bound_to",
           "expected_events", "parse_vllm_argv", "scan_engines"]
