"""Schemas of every message that crosses the broker, shared by the dashboard and the agent.

Dashboard → agent (queue ``agent.<node>``):
  * ``ConfigDocument`` — what a node must serve, signed (see ``agent.contract.signing``), task ``agent.apply_config``;
  * ``PurgeRequest`` — remove every key of one retired release namespace, signed, task ``agent.purge_namespace``.

Agent → dashboard (queue ``dashboard.ingest``, task ``dashboard.ingest``, a JSON list of messages, each
tagged by ``kind``), all ``AgentMessage``s:
  * ``Ack`` — the outcome of one received document (``applied`` or ``rejected`` with a reason code);
  * ``Report`` — occupancy per cache scope (the ledger snapshot), idempotency key ``(node, sequence)``;
  * ``Heartbeat`` — liveness plus the applied version and digest (drift is visible even if an ack is lost).
  * ``PurgeResult`` — objects a purge removed, task ``dashboard.purge_result`` on queue ``dashboard.ingest``.

Every ``AgentMessage`` names its sender (``node``) and is signed by it when sent: ``signed_at`` (UTC, the
sending time) and ``signature`` (HMAC-SHA256 with the node's signing secret over the canonical encoding,
``agent.contract.signing.sign_message``). They are built unsigned (``signed_at`` None, ``signature`` ""), wait so in the
outbox, and are stamped and signed at each delivery attempt; the dashboard refuses unsigned ones.

Every message has ``schema``, its kind's version (``SCHEMA_VERSION``; ``REPORT_SCHEMA_VERSION`` for reports, which
became 2 when occupancy rows were renamed ``scopes`` with a ``request_group`` field, and gained per-instance engine
facts, ``instances``; ``DOCUMENT_SCHEMA_VERSION`` for config documents, which became 2 when they started to carry
each instance's launch spec and the node's own settings); a receiver refuses a schema it does not know with a
clear error instead of guessing (the dashboard still reads schema-1 reports, through
``dashboard.telemetry.compat``; the agent still applies schema-1 documents, ``DOCUMENT_SCHEMAS``). Models refuse
unknown fields (``extra="forbid"``), so a typo in a producer fails loudly on receipt. Sizes are bytes, times are
UTC ISO-8601 strings on the wire.

The config document carries only integers, strings, booleans and lists/objects of them (no floats), so its
canonical JSON encoding is the same from any encoder (see ``agent.contract.signing``).
"""
from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

import annotated_types
import msgspec
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from agent.contract import signing
from agent.contract.scope import CacheScope

#: ``schema`` of every message kind but the report and the config document.
SCHEMA_VERSION = 1
#: ``schema`` of ``Report``: 2 since its rows are ``scopes`` (``ScopeOccupancy``, with ``request_group``); schema 2
#: also carries ``instances`` (``InstanceStats``) and the node's unknown-topic counts.
REPORT_SCHEMA_VERSION = 2
#: ``schema`` the dashboard writes into a ``ConfigDocument``: 2 since instances carry their ``launch``
#: (``LaunchSpec``) and the document the node's ``node_settings`` (``NodeSettings``).
DOCUMENT_SCHEMA_VERSION = 2
#: Document schemas an agent applies. A schema-1 document (no launch specs, no node settings) still applies;
#: an agent that knows only schema 1 refuses a schema-2 document as ``unsupported_schema`` (upgrade agents first).
DOCUMENT_SCHEMAS = (1, 2)

#: Names a document's per-node budget share is read under: ``node_budget_bytes`` (written since it was renamed, so
#: that ``budget_bytes`` means only the registry's total) and ``budget_bytes`` (what dashboards before wrote; a
#: document of the previous dashboard may reach an upgraded agent during a rolling upgrade, or be its stored state).
NODE_BUDGET_ALIASES = AliasChoices("node_budget_bytes", "budget_bytes")

#: Celery task the agent runs for each pushed document (one positional argument: the document dict).
APPLY_CONFIG_TASK = "agent.apply_config"
#: Celery task the dashboard runs for agent telemetry (one positional argument: a list of messages).
INGEST_TASK = "dashboard.ingest"
#: Queue of ``INGEST_TASK``: acks, reports and heartbeats of every node.
INGEST_QUEUE = "dashboard.ingest"
#: Agent → dashboard fields added after the first release of each message, per message part (``report_row``: a
#: ``ScopeOccupancy``, ``heartbeat``): an agent sends one only when its applied document's ``dashboard_reads``
#: names it (``ConfigDocument``), so a dashboard of an earlier release never meets a field it would refuse.
NEWER_AGENT_FIELDS = {
    "report_row": ("store_evicted_blocks", "budget_evicted_blocks", "orphan_removed_blocks"),
    "heartbeat": ("single_user",),
}
#: What this release's dashboard reads of ``NEWER_AGENT_FIELDS`` (rendered into every document).
DASHBOARD_READS = tuple(name for names in NEWER_AGENT_FIELDS.values() for name in names)


def node_queue(node: str) -> str:
    """Name of the queue the agent of ``node`` consumes: ``agent.<node>``."""
    return f"agent.{node}"


NodeName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
NonNegative = Annotated[int, Field(ge=0)]

#: Upper bounds of the integers agents send (``Ack``, ``Report`` with its rows, ``Heartbeat``, ``PurgeResult``),
#: checked by both validation paths (pydantic, and msgspec for report rows: ``ScopeRow`` is built from the same
#: annotations). The dashboard sums these columns over many rows in 64-bit SQL integers (SQLite ``sum`` raises
#: "integer overflow", PostgreSQL ``CAST(sum(..) AS BIGINT)`` likewise): one signed node reporting ``2**63 - 1``
#: would break the overview, the series and every rollup for the whole fleet. Chosen so that a sum of fewer than
#: 2**15 rows at the bound still fits in 2**63 - 1 (a node reports only its document's scopes, a few hundred at most,
#: and an honest fleet's rows are orders of magnitude below the bounds; SQLite's weighted rollup sums of one key
#: would still overflow if one node sent 2**15 reports at the bound within one hour, PostgreSQL's ``sum(bigint)`` is
#: ``numeric`` and does not): ``MAX_BYTES`` = 2**48 B = 256 TiB per cache scope per node (far
#: above the DRAM + SSD any one node lends Mooncake), ``MAX_COUNT`` = 2**48 for block, event, key, token and
#: message counters and the other gauges (8.9 years at a million per second since the agent started; the agent
#: clamps at its report builder, :func:`clamped`, so it never sends more), ``MAX_SEQUENCE`` = 2**53 for message
#: sequence numbers and document versions (grow by one per message / change; exact in a JSON double).
MAX_BYTES = 2 ** 48
MAX_COUNT = 2 ** 48
MAX_SEQUENCE = 2 ** 53
#: A byte gauge of an agent message: 0..``MAX_BYTES``.
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
#: A counter or non-byte gauge of an agent message: 0..``MAX_COUNT``.
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
#: A message sequence number: 1..``MAX_SEQUENCE``.
SequenceNumber = Annotated[int, Field(ge=1, le=MAX_SEQUENCE)]
#: A document version an agent names: 0..``MAX_SEQUENCE`` (0: none applied yet).
VersionNumber = Annotated[int, Field(ge=0, le=MAX_SEQUENCE)]
#: Characters refused in agent-sent text shown in pages and stored: C0 controls but tab, newline and carriage
#: return, and DEL (NUL is refused by PostgreSQL ``text`` outright); regex character-class ranges, escaped, so a
#: refusal's text (naming the pattern) carries none of them.
CONTROL_CHARACTERS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f"
#: Agent-sent text: no ``CONTROL_CHARACTERS``.
Text = Annotated[str, Field(pattern=f"^[^{CONTROL_CHARACTERS}]*$")]
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")
#: A document digest an agent names (hex SHA-256: 64 characters; the dashboard's columns hold no more).
DigestText = Annotated[str, Field(max_length=64, pattern=f"^[^{CONTROL_CHARACTERS}]*$")]


def printable(text: str, limit: int = 2000) -> str:
    """``text`` with each of ``CONTROL_CHARACTERS`` replaced by U+FFFD, cut to ``limit`` characters: what the agent
    puts into a ``Text`` field."""
    return _CONTROL.sub("\ufffd", text[:limit])


def clamped(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (fields of ``model``) with every integer over its field's upper bound (``le``) lowered to it,
    also in ``dict[str, int]`` fields: what the agent's report builder sends for a counter that grew past
    ``MAX_COUNT``. Other values unchanged."""
    out = dict(values)
    for name, info in model.model_fields.items():
        bound = next((item.le for item in _bounds_of(info) if isinstance(item, annotated_types.Le)), None)
        if not isinstance(bound, int) or name not in out:
            continue
        value = out[name]
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = min(value, bound)
        elif isinstance(value, dict):
            out[name] = {key: min(item, bound) if isinstance(item, int) and not isinstance(item, bool) else item
                         for key, item in value.items()}
    return out


def _bounds_of(info: Any) -> list[Any]:
    """The ``annotated_types`` constraints of a field, or of its ``dict`` values."""
    if info.metadata:
        return list(info.metadata)
    args = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is dict and len(args) == 2:
        return [item for arg in typing.get_args(args[1])[1:] for item in getattr(arg, "metadata", [arg])]
    return []

#: Reason codes an ``Ack`` carries when ``status`` is ``rejected``.
REJECT_REASONS = (
    "undecryptable",  # a sealed envelope that does not open with this node's secret (agent.contract.sealing)
    "unsigned",  # no signature member
    "bad_signature",  # HMAC mismatch: tampered, or signed with another node's secret
    "invalid",  # not a config document of this schema (field named in ``error``)
    "unsupported_schema",  # a ``schema`` this agent does not speak
    "wrong_node",  # addressed to another node
    "stale",  # version older than the applied one, or issued too long ago for an agent without state (freshness)
    "version_conflict",  # same version as the applied one, different content
    "apply_failed",  # valid, but building or persisting the new bindings failed
)


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(UTC)


class Message(BaseModel):
    """Base of all broker messages: immutable, unknown fields refused, ``schema`` checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The ``schema`` this side writes for the message kind (a subclass with its own version overrides both).
    schema_version: ClassVar[int] = SCHEMA_VERSION
    #: The schemas this side reads (empty: ``schema_version`` only).
    accepted_schemas: ClassVar[tuple[int, ...]] = ()
    schema_: int = Field(SCHEMA_VERSION, alias="schema")

    @field_validator("schema_")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        accepted = cls.accepted_schemas or (cls.schema_version,)
        if value not in accepted:
            speaks = " and ".join(str(v) for v in accepted)
            raise ValueError(f"unsupported schema {value} (this side speaks schema {speaks})")
        return value

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict (aliases applied, datetimes as ISO strings) for the broker."""
        return self.model_dump(mode="json", by_alias=True)


# --- dashboard → agent ------------------------------------------------------------------------------------


_SIZE_RE = re.compile(r"\s*([0-9]+)\s*([KMGT]?i?B?)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value: int | str) -> int:
    """Bytes from an int or a size string with binary units (``"4GB"`` = 4 * 2**30, ``"512MiB"``, ``"1024"``),
    as Mooncake 0.3.13.post1 reads ``global_segment_size`` / ``local_buffer_size``.

    Raises:
        ValueError: anything else, or a negative number.
    """
    if isinstance(value, bool):
        raise ValueError(f"size must be bytes or a string like '4GB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    m = _SIZE_RE.fullmatch(str(value))
    if m is None:
        raise ValueError(f"size must be bytes or a string like '4GB', got {value!r}")
    unit = (m.group(2) or "").upper().replace("I", "").rstrip("B") or ""
    return int(m.group(1)) * _UNITS[unit]


class StoreEndpoints(BaseModel):
    """How a Mooncake Store client reaches the pool: the one definition the config document, the agent's store
    client and the registry's rendering (``tenants.rendering``) share.

    The fields are Mooncake's own names, the keys of vLLM 0.33.0's ``MOONCAKE_CONFIG_PATH`` JSON and SGLang
    0.5.23's Mooncake config (Mooncake 0.3.13.post1): ``master_server_address`` (``host:rpc_port``),
    ``metadata_server`` (``http://host:port/metadata`` or ``P2PHANDSHAKE``), ``protocol`` (``tcp``/``rdma``),
    ``device_name`` (RDMA NIC list, "" for TCP), ``global_segment_size`` (bytes each process that calls
    ``setup()`` mounts) and ``local_buffer_size`` (bytes of its registered transfer buffer).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    master_server_address: str = Field(min_length=1)  # "host:rpc_port"
    metadata_server: str = Field(min_length=1)  # "http://host:port/metadata"
    protocol: str = Field("tcp", min_length=1)
    device_name: str = ""
    global_segment_size: NonNegative
    local_buffer_size: NonNegative

    def mooncake_config(self, tenant_id: str | None = None) -> dict[str, Any]:
        """The ``MOONCAKE_CONFIG_PATH`` keys (sizes in bytes), plus ``tenant_id`` when given. A subclass's own
        fields (``tenants.rendering.RenderTarget``) are not part of it."""
        config = self.model_dump(include=set(StoreEndpoints.model_fields))
        if tenant_id is not None:
            config["tenant_id"] = tenant_id
        return config

    @classmethod
    def from_mooncake_config(cls, config: Mapping[str, Any], **overrides: Any) -> StoreEndpoints:
        """From a vLLM ``MOONCAKE_CONFIG_PATH`` / SGLang Mooncake config mapping: this model's keys (sizes as ints
        or strings like ``"4GB"``; ``master_server_addr``, the ``setup()`` spelling, is read too); other keys are
        ignored and ``overrides`` win.

        Raises:
            ValueError: a missing or malformed field, named.
        """
        data = {name: config[name] for name in cls.model_fields if name in config}
        if "master_server_address" not in data and "master_server_addr" in config:
            data["master_server_address"] = config["master_server_addr"]
        data.update(overrides)
        for required in ("master_server_address", "metadata_server"):
            if not data.get(required):
                raise ValueError(f"{required}: missing from the Mooncake config")
        for name in ("global_segment_size", "local_buffer_size"):
            if name in data:
                try:
                    data[name] = parse_size(data[name])
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
        return cls(**data)


class RequestGroupSpec(BaseModel):
    """A request group: requests sharing one ``cache_salt`` (vLLM 0.33.0 salts the first block hash).

    An empty ``cache_salt`` is the tenant's default shared group. ``node_budget_bytes`` is this node's share of the
    group's budget (the registry's ``RequestGroup.budget_bytes``, a share of the tenant quota), in bytes; ``None``
    = the group has no budget (see :class:`InstanceSpec` for how a share is computed). Documents of dashboards
    before the rename call it ``budget_bytes``: still read, never written (``NODE_BUDGET_ALIASES``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    cache_salt: str = ""
    node_budget_bytes: NonNegative | None = Field(default=None, validation_alias=NODE_BUDGET_ALIASES)


class LoraAdapterSpec(BaseModel):
    """A LoRA adapter the instance loads: ``name`` (what requests ask for) and ``path`` (absolute directory or
    hub id, exactly as the engine got it; "" = unknown, for adapters recorded before the registry held paths).

    vLLM 0.33.0 hashes ``("lora", name, path)`` into every block of an adapter request; SGLang 0.5.23 seeds the
    adapter's page chains with an id made from both (see ``agent.datapath.keyspace.sglang_lora_id``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    path: str = ""


class KVLayout(BaseModel):
    """The release's cache-affecting settings that shape one stored block; equal layouts can share blocks.

    ``block_size`` is tokens per block (vLLM ``--block-size``, SGLang ``--page-size``); ``kv_dtype`` the KV
    cache dtype name; ``adapters`` the LoRA adapters (sorted by name; a bare string, as documents before adapter
    paths carried, reads as a name without a path); ``weights_revision`` the model weights revision.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: Annotated[int, Field(ge=1)]
    num_kv_heads: Annotated[int, Field(ge=1)]
    head_dim: Annotated[int, Field(ge=1)]
    block_size: Annotated[int, Field(ge=1)]
    kv_dtype: str = "auto"
    quantization: str = ""
    adapters: list[LoraAdapterSpec] = Field(default_factory=list)
    weights_revision: str = ""

    @field_validator("adapters", mode="before")
    @classmethod
    def _names_are_adapters(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @property
    def block_size_tokens(self) -> int:
        """Alias of ``block_size`` (tokens per block) for duck-typed consumers."""
        return self.block_size


class Ranks(BaseModel):
    """The instance's parallel layout; vLLM 0.33.0 puts ``tp_rank``, ``pcp``, ``dcp`` and ``pp_rank`` in keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp_rank: NonNegative = 0
    tp_size: Annotated[int, Field(ge=1)] = 1
    pp_rank: NonNegative = 0
    pp_size: Annotated[int, Field(ge=1)] = 1
    pcp_rank: NonNegative = 0
    pcp_size: Annotated[int, Field(ge=1)] = 1
    dcp_rank: NonNegative = 0
    dcp_size: Annotated[int, Field(ge=1)] = 1

    @property
    def tp_ranks(self) -> list[int]:
        """The TP ranks this instance holds on the node: one assignment is one rank, ``[tp_rank]``."""
        return [self.tp_rank]


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: An engine account name (``LaunchSpec.user``): a portable POSIX user name of at most 32 characters, or "".
ENGINE_USER_PATTERN = r"^(?:[a-z_][a-z0-9_-]{0,31})?$"
ENGINE_USER_RE = re.compile(ENGINE_USER_PATTERN)
#: Files the node agent writes itself into every instance directory (``agent.node.instance_dirs``); a launch's
#: own ``files`` may not use these names.
INSTANCE_DIR_FILES = ("launch.json", "env", "launch.sh")


class LaunchSpec(BaseModel):
    """What a node needs to start one engine instance, independent of where its directory lives: the one
    definition the registry renders (``tenants.rendering.RenderedConfig.launch_spec()``), the config document
    carries (``InstanceSpec.launch``) and the agent writes (``agent.node.instance_dirs``).

    * ``instance_id`` — the instance's id (``InstanceSpec.instance_id``, the assignment's pk): also the instance
      directory's name and the vLLM KV-events topic. No ``/``, no NUL, not starting with ``.``.
    * ``argv`` — the command; ``argv[0] == "python"`` stands for the engine environment's interpreter.
    * ``env`` — variables to set (plain strings, never shell syntax).
    * ``file_env`` — variables whose value is the absolute path of one of ``files`` in the instance directory
      (``{"MOONCAKE_CONFIG_PATH": "mooncake.json"}``); the node fills them in when it writes the directory.
    * ``files`` — file name (no ``/``, not hidden, not one of ``INSTANCE_DIR_FILES``) -> text content.
    * ``user`` — the unprivileged account the instance runs as on the node (the tenant's engine account in the
      registry; ``ENGINE_USER_RE``): the agent gives the instance directory to it and accepts KV events only from a
      socket it owns (``agent.node.accounts``); "" in documents of dashboards before it (a privileged agent then
      gives the directory to nobody and observes no events of the instance).

    ``to_dict()`` / ``from_dict()`` give the JSON form. Raises ``ValueError`` (pydantic's ``ValidationError``)
    naming what is wrong.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str
    argv: tuple[str, ...] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    file_env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    user: str = Field("", pattern=ENGINE_USER_PATTERN)

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, value: str) -> str:
        if not value or "/" in value or "\0" in value or value.startswith("."):
            raise ValueError(f"invalid instance id {value!r} (a non-empty name without '/', not starting with '.')")
        return value

    @field_validator("argv")
    @classmethod
    def _argv(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            if "\0" in arg:
                raise ValueError(f"argument {arg!r} contains a NUL byte")
        return value

    @field_validator("env", "file_env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid environment variable name {name!r}")
            if "\0" in text:
                raise ValueError(f"{name} contains a NUL byte")
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name or "/" in name or "\0" in name or name.startswith(".") or name in INSTANCE_DIR_FILES:
                raise ValueError(f"invalid instance file name {name!r} (no '/', not hidden, not one of "
                                 f"{', '.join(INSTANCE_DIR_FILES)})")
        return value

    @model_validator(mode="after")
    def _file_env_names_files(self) -> LaunchSpec:
        for var, name in self.file_env.items():
            if name not in self.files:
                raise ValueError(f"{var} names {name!r}, which is not one of the instance's files")
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"instance_id", "argv" (list), "env", "file_env", "files", "user"}``."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """From the JSON form (``env``, ``file_env``, ``files`` optional)."""
        return cls.model_validate(dict(data))


#: ``NodeSettings.store_mode`` values (``tenants.choices.StoreMode``).
STORE_MODES = ("embedded", "standalone-store")


class NodeSettings(BaseModel):
    """What the node agent itself runs for the node's engines (the registry's ``Node`` launch settings).

    * ``kv_events_port`` — the registry's node port of the shared ``tcp://127.0.0.1:<port>`` endpoint that vLLM
      instances once published to. Not used any more: each instance binds its own ``ipc://`` socket in its
      instance directory (``agent.contract.kv_events``); kept so documents keep their schema.
    * ``store_mode`` — ``embedded`` (each engine mounts its own segment) or ``standalone-store`` (the agent runs
      the node's one ``mooncake_client``, which mounts the node's memory; engines mount none).
    * ``store_client_argv`` — that client's command line as ``tenants.rendering.render_store_client`` renders it
      (``mooncake_client --host=… --port=… --global_segment_size=…``; Mooncake 0.3.13.post1 flags); required in
      ``standalone-store`` mode, absent in ``embedded`` mode.
    * ``master_metrics_urls`` — the Store masters' Prometheus endpoints (``http://host:metrics_port/metrics``,
      Mooncake 0.3.13.post1's ``--metrics_port``; every master of an HA set), from the setting the dashboard's own
      master probe reads (``KVPOOL_MASTER_ADMIN_URL``, or ``KVPOOL_MASTER_HA_ADMIN_URLS``). The agent polls their
      eviction counters (``agent.datapath.eviction_signal``) to reconcile a tenant as soon as the master evicted;
      empty (documents of dashboards before it): no polling, the periodic reconcile only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kv_events_port: Annotated[int, Field(ge=1, le=65535)]
    store_mode: Literal["embedded", "standalone-store"] = "embedded"
    store_client_argv: tuple[str, ...] | None = None
    master_metrics_urls: tuple[Annotated[str, Field(pattern=r"^https?://\S+$", max_length=2048)], ...] = ()

    @model_validator(mode="after")
    def _client_iff_standalone(self) -> NodeSettings:
        if self.store_mode == "standalone-store" and not self.store_client_argv:
            raise ValueError("store_client_argv: required in standalone-store mode")
        if self.store_mode == "embedded" and self.store_client_argv is not None:
            raise ValueError("store_client_argv: only a standalone-store node runs a store client")
        return self


class InstanceSpec(BaseModel):
    """One engine instance on the node and the cache namespace it reads and writes.

    ``namespace`` is the release namespace: SGLang 0.5.23 ``extra_backend_tag`` / vLLM 0.33.0
    ``cache_prefix``. ``vllm_model_name`` is the last path component of ``model_path`` (vLLM's key model
    name). ``hash_algo`` is vLLM's ``--prefix-caching-hash-algo`` (``sha256``, ``sha256_cbor``, ``xxhash``,
    ``xxhash_cbor``; SGLang releases use ``sha256``), ``hash_seed`` the release's ``PYTHONHASHSEED``.
    ``request_groups`` are the tenant's groups (salts), ``node_budget_bytes`` this node's share of the release's
    effective budget (the registry's ``Release.budget_bytes`` or its implicit budget; ``None`` = none), in bytes:
    ``budget * w_node // w_all``, ``w_node`` the node's writer instances (role ``prefill`` or ``both``) of the
    release and ``w_all`` those of every node, so the shares sum to at most the budget and a node that writes
    nothing of the release gets 0 (keeps nothing); each group's ``node_budget_bytes`` is the same share of the
    group's budget (``dashboard.rollout.push.budget_share``). The agent holds the blocks *it* wrote under these
    shares. Documents of dashboards before the rename call both ``budget_bytes``: still read, never written
    (``NODE_BUDGET_ALIASES``). ``tenant_quota_bytes`` the tenant's Mooncake quota. ``port`` is the engine's HTTP
    port on the node.
    ``launch`` (document schema 2) is how the node starts the instance (its ``instance_id`` is the instance's);
    ``None`` in schema-1 documents.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(min_length=1)
    engine: Literal["vllm", "sglang"]
    engine_version: str = ""
    role: Literal["prefill", "decode", "both"]
    port: Annotated[int, Field(ge=1, le=65535)]
    tenant_id: str = Field(min_length=1)
    tenant_quota_bytes: NonNegative | None = None
    served_model_name: str = Field(min_length=1)
    model_path: str = ""
    vllm_model_name: str = ""
    namespace: str = Field(min_length=1)
    release_state: str = Field(min_length=1)
    release_fingerprint: str = ""
    kv_layout: KVLayout
    hash_algo: str = Field(min_length=1)
    hash_seed: str = ""
    ranks: Ranks = Field(default_factory=Ranks)
    request_groups: list[RequestGroupSpec] = Field(default_factory=list)
    node_budget_bytes: NonNegative | None = Field(default=None, validation_alias=NODE_BUDGET_ALIASES)
    launch: LaunchSpec | None = None

    @model_validator(mode="after")
    def _launch_is_this_instance(self) -> InstanceSpec:
        if self.launch is not None and self.launch.instance_id != self.instance_id:
            raise ValueError(f"launch.instance_id {self.launch.instance_id!r} is not the instance's id "
                             f"{self.instance_id!r}")
        return self


class ConfigDocument(Message):
    """Versioned, signed description of everything a node serves.

    ``version`` grows by one for each change of content for this node (the dashboard keeps the counter in its
    database); the agent refuses a version below the one it applied (``stale``). ``issued_at`` is when the
    version was created. ``sent_at`` is when the dashboard sent this delivery of it (stamped and signed at each
    send, re-pushes included; not part of the version's digest, ``agent.contract.signing.document_digest``): the
    agent refuses a delivery sent longer ago than its freshness window (``stale``), so a captured document
    replayed later applies nowhere, a fresh agent's empty state included, while a re-push of the current
    version after an outage does. "" from dashboards before it. ``signature`` = HMAC-SHA256 over the canonical
    encoding (``agent.contract.signing``).

    ``schema`` is ``DOCUMENT_SCHEMA_VERSION`` (2) as the dashboard writes it; schema 1 (no ``node_settings``, no
    instance ``launch``) is still read. ``node_settings`` (schema 2) says what the agent runs for the node's
    engines; ``None`` in a schema-1 document (then the agent starts no engine observer and no store client).

    ``dashboard_reads``: the agent → dashboard fields of :data:`NEWER_AGENT_FIELDS` that the dashboard which
    rendered the document reads (it renders ``DASHBOARD_READS``). The agent sends none of the others, so an agent
    upgraded before its dashboard (the upgrade order: agents first, as they read documents of either release)
    keeps being heard by a dashboard that refuses unknown fields. Empty from dashboards before it.
    """

    schema_version: ClassVar[int] = DOCUMENT_SCHEMA_VERSION
    accepted_schemas: ClassVar[tuple[int, ...]] = DOCUMENT_SCHEMAS
    schema_: int = Field(DOCUMENT_SCHEMA_VERSION, alias="schema")
    kind: Literal["config"] = "config"
    node: NodeName
    version: Annotated[int, Field(ge=1, le=MAX_SEQUENCE)]  # an ack names it: ``Ack`` bounds
    issued_at: str = Field(min_length=1)  # ISO-8601 UTC, a string so the canonical encoding is exact
    sent_at: str = ""  # ISO-8601 UTC of this delivery ("" from older dashboards)
    store: StoreEndpoints
    instances: list[InstanceSpec] = Field(default_factory=list)
    node_settings: NodeSettings | None = None
    dashboard_reads: tuple[Annotated[str, Field(max_length=64)], ...] = Field(default=(), max_length=64)
    signature: str = ""

    @model_validator(mode="after")
    def _schema_1_has_no_launches(self) -> ConfigDocument:
        if self.schema_ == 1:
            if self.node_settings is not None:
                raise ValueError("node_settings: needs document schema 2")
            for instance in self.instances:
                if instance.launch is not None:
                    raise ValueError(f"instances: launch of instance {instance.instance_id} needs document schema 2")
        return self

    @field_validator("instances")
    @classmethod
    def _unique_instances(cls, value: list[InstanceSpec]) -> list[InstanceSpec]:
        seen: set[str] = set()
        for instance in value:
            if instance.instance_id in seen:
                raise ValueError(f"instance_id {instance.instance_id!r} appears twice")
            seen.add(instance.instance_id)
        return value


# --- agent → dashboard ------------------------------------------------------------------------------------


class AgentMessage(Message):
    """Base of every agent → dashboard message: the sender and the signature it adds when sending.

    ``node`` is the sending node (its signing secret is the HMAC key); ``signed_at``/``signature`` are set by
    ``agent.contract.signing.sign_message`` at each delivery attempt (None / "" while the message waits to be sent).
    """

    node: NodeName
    signed_at: datetime | None = None
    signature: str = ""


class Ack(AgentMessage):
    """The agent's answer to one received document.

    ``version``/``digest`` describe the received document (``None`` when it could not be read that far);
    ``applied_version``/``applied_digest`` what the agent runs after handling it (0/"" before the first
    document). ``reason`` is one of ``REJECT_REASONS`` when ``status`` is ``rejected``.
    """

    kind: Literal["ack"] = "ack"
    sequence: SequenceNumber
    sent_at: datetime
    status: Literal["applied", "rejected"]
    version: Annotated[int, Field(ge=-MAX_SEQUENCE, le=MAX_SEQUENCE)] | None = None
    digest: DigestText | None = None
    reason: Annotated[str, Field(max_length=32, pattern=f"^[^{CONTROL_CHARACTERS}]*$")] = ""
    error: Text = ""
    applied_version: VersionNumber = 0
    applied_digest: DigestText = ""


class ScopeOccupancy(BaseModel):
    """Occupancy of one :class:`agent.contract.scope.CacheScope` (tenant, served model, release namespace,
    request group) on the node.

    ``blocks``/``bytes``/``orphaned_bytes``/``in_flight_requests`` are gauges at ``Report.sent_at``;
    ``puts``/``gets``/``hit_blocks``/``miss_blocks``/``evicted_blocks`` are counters since the agent started
    (monotonic within one ``Report.started_at``; a new ``started_at`` restarts them). ``evicted_blocks`` by cause,
    counters too: ``store_evicted_blocks`` (the Store's master evicted them), ``budget_evicted_blocks`` (the agent
    removed them over a release's or request group's budget), ``orphan_removed_blocks`` (the agent removed them as
    orphans: below a block that left the Store); ``evicted_blocks`` is their sum (agents before the split send only
    it: the three read 0). Blocks a purge of the release removed count in none of them. ``request_group`` is a
    request group's name or ``""``, the release's row without a request group (``agent.contract.scope``); a row is
    never a whole release.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str = Field(min_length=1)
    served_model_name: str = ""
    namespace: str = ""
    request_group: str = ""
    blocks: Count = 0
    bytes: Bytes = 0
    puts: Count = 0
    gets: Count = 0
    hit_blocks: Count = 0
    miss_blocks: Count = 0
    evicted_blocks: Count = 0
    orphaned_bytes: Bytes = 0
    in_flight_requests: Count = 0
    store_evicted_blocks: Count = 0
    budget_evicted_blocks: Count = 0
    orphan_removed_blocks: Count = 0

    @property
    def scope(self) -> CacheScope:
        """The row's identity."""
        return CacheScope(self.tenant_id, self.served_model_name, self.namespace, self.request_group)


class InstanceStats(BaseModel):
    """What the agent observed of one real engine instance of its applied document (report schema 2).

    Identity: ``instance_id`` (the document's), ``engine`` and the instance's release scope (``tenant_id``,
    ``served_model_name``, ``namespace``). ``observed_since`` is when the agent began observing it (its first
    apply, or the agent's start); ``last_event_at`` when its newest KV-event message arrived (None: none yet).

    KV events (vLLM 0.32.0/0.33.0 ``ZmqEventPublisher``; ``agent.engines.vllm.attribution.AttributionCounters``),
    counters since the agent started: ``messages``, ``events``; Store blocks ``blocks_seen`` = ``attributed`` +
    ``unknown_salt`` + ``unknown_adapter`` + ``hash_mismatch`` + ``unresolved_parent`` + ``unverifiable``;
    ``attributed_by_group`` (request group name -> attributed blocks); stream troubles ``decode_errors``
    (malformed messages dropped), ``seq_gaps`` (messages lost per the sequence numbers), ``seq_resets``
    (publisher restarts); ``last_error``.

    Confirmation (events are hints; ``agent.datapath.pending``): ``confirmed`` (attributed blocks whose keys the
    Store held under the instance's tenant: booked), ``unconfirmed`` (attributed blocks whose keys were still absent
    after the grace: forged events, writes the master dropped despite a success code — upstream Mooncake #3741 —,
    or blocks evicted before the check), ``pending`` (waiting now), ``pending_overflow`` (reported while the
    pending set was full, never checked), ``dropped_messages`` (received, never attributed: the instance's queue
    was full). ``unknown_namespace_keys`` / ``unknown_namespace_bytes``: blocks of this instance's engine found in
    the Store under another key prefix (a namespace the registry does not have: a mistyped ``cache_prefix``,
    another ``--model``), per key prefix ``<cache_prefix>@<model>``; all default to empty so older agents validate.

    ``/metrics`` (``agent.engines.vllm.metrics``), increases since the agent started, in **tokens**:
    ``prefix_cache_queries``/``prefix_cache_hits`` (the engine's own prefix cache),
    ``external_prefix_cache_queries``/``external_prefix_cache_hits`` (the KV connector: the Store);
    ``store_keys``/``store_failed_keys`` — keys per Mooncake Store operation (``lookup_exists``, ``load_get``,
    ``save_exists``, ``save_put``, …); ``metrics_scrapes``/``metrics_errors`` (failed scrapes) and
    ``metrics_error`` (the newest failure).

    Where its events come from (``agent.engines.vllm.transport``): ``events_endpoint`` as its launch renders it
    (``ipc://kv-events.sock``), ``events_status`` — ``connected`` (a socket only its account could have made),
    ``waiting`` (no socket yet: the engine is not running), ``refused`` (a socket or directory another account
    could have made: not connected, retried), ``insecure`` (a ``tcp://`` endpoint: any local process could bind it
    first or publish as the instance; not observed), ``unobserved`` (no launch, or an account this node lacks) —
    with ``events_problem`` saying why; ``events_refusals`` (ownership checks failed) and ``topic_mismatch``
    (messages on its socket under another topic, dropped).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(min_length=1)
    engine: Literal["vllm", "sglang"] = "vllm"
    tenant_id: str = ""
    served_model_name: str = ""
    namespace: str = ""
    observed_since: datetime
    last_event_at: datetime | None = None
    messages: Count = 0
    events: Count = 0
    blocks_seen: Count = 0
    attributed: Count = 0
    unknown_salt: Count = 0
    unknown_adapter: Count = 0
    hash_mismatch: Count = 0
    unresolved_parent: Count = 0
    unverifiable: Count = 0
    decode_errors: Count = 0
    seq_gaps: Count = 0
    seq_resets: Count = 0
    attributed_by_group: dict[str, Count] = Field(default_factory=dict)
    last_error: Text = ""
    confirmed: Count = 0
    unconfirmed: Count = 0
    pending: Count = 0
    pending_overflow: Count = 0
    dropped_messages: Count = 0
    unknown_namespace_keys: dict[Annotated[str, Field(max_length=512)], Count] = Field(default_factory=dict)
    unknown_namespace_bytes: dict[Annotated[str, Field(max_length=512)], Bytes] = Field(default_factory=dict)
    prefix_cache_queries: Count = 0
    prefix_cache_hits: Count = 0
    external_prefix_cache_queries: Count = 0
    external_prefix_cache_hits: Count = 0
    store_keys: dict[str, Count] = Field(default_factory=dict)
    store_failed_keys: dict[str, Count] = Field(default_factory=dict)
    metrics_scrapes: Count = 0
    metrics_errors: Count = 0
    metrics_error: Text = ""
    events_endpoint: Text = ""
    events_status: Literal["", "connected", "waiting", "refused", "insecure", "unobserved"] = ""
    events_problem: Text = ""
    events_refusals: Count = 0
    topic_mismatch: Count = 0

    #: ``events_status`` values that the Checks page shows as failing (nobody can vouch for the events' sender).
    UNTRUSTED_EVENTS: ClassVar[tuple[str, ...]] = ("refused", "insecure", "unobserved")
    #: The Store-block outcomes whose sum is ``blocks_seen``.
    OUTCOMES: ClassVar[tuple[str, ...]] = ("attributed", "unknown_salt", "unknown_adapter", "hash_mismatch",
                                           "unresolved_parent", "unverifiable")


class Report(AgentMessage):
    """Occupancy report: one ledger snapshot, a row per cache scope. Stored once per ``(node, sequence)``.

    Schema 2 also carries ``instances`` (``InstanceStats``, one per real engine instance the agent observes) and
    the node's KV-event messages/Store blocks under topics of no instance of the applied document
    (``unknown_topic_messages``/``unknown_topic_blocks``: an engine the registry does not know writes into the
    pool), counters since the agent started.
    """

    schema_version: ClassVar[int] = REPORT_SCHEMA_VERSION
    schema_: int = Field(REPORT_SCHEMA_VERSION, alias="schema")
    kind: Literal["report"] = "report"
    sequence: SequenceNumber
    sent_at: datetime
    started_at: datetime
    applied_version: VersionNumber = 0
    scopes: list[ScopeOccupancy] = Field(default_factory=list)
    instances: list[InstanceStats] = Field(default_factory=list)
    unknown_topic_messages: Count = 0
    unknown_topic_blocks: Count = 0


class Heartbeat(AgentMessage):
    """Liveness: sent every heartbeat interval, never buffered (only the latest one matters).

    ``single_user``: the agent runs every engine instance as its own account (it is not privileged, or runs with
    ``--single-user``), so instances on the node are not kept from each other's files and sockets
    (``agent.node.accounts``); a JSON boolean, false when absent (agents before it; an agent leaves it out for a
    dashboard whose documents do not list it in ``dashboard_reads``).
    """

    kind: Literal["heartbeat"] = "heartbeat"
    sent_at: datetime
    started_at: datetime
    applied_version: VersionNumber = 0
    applied_digest: DigestText = ""
    hostname: Annotated[str, Field(max_length=255, pattern=f"^[^{CONTROL_CHARACTERS}]*$")] = ""
    pid: Count = 0
    outbox_pending: Count = 0
    outbox_dropped: Count = 0
    single_user: StrictBool = False


IngestMessage = Annotated[Ack | Report | Heartbeat, Field(discriminator="kind")]
_INGEST = TypeAdapter(IngestMessage)


def parse_ingest(raw: Any) -> Ack | Report | Heartbeat:
    """Validate one agent → dashboard message. Raises ``MessageError`` naming the offending field."""
    try:
        return _INGEST.validate_python(raw)
    except ValidationError as exc:
        raise MessageError(_describe(exc)) from None


def _struct_of(model: type[BaseModel], name: str, base: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """A frozen msgspec Struct with the fields of ``model`` (same names, order, defaults, ``min_length`` / ``ge`` /
    ``le`` bounds; unknown fields refused) and the methods of ``base``, for models of ``str`` and ``int`` fields only
    (raises ``TypeError`` for another field type or constraint, so a new field cannot slip past it)."""
    fields: list[tuple[str, Any, Any] | tuple[str, Any]] = []
    for field_name, info in model.model_fields.items():
        if info.annotation not in (str, int) or info.alias or info.default_factory is not None:
            raise TypeError(f"{model.__name__}.{field_name}: only plain str/int fields map to a Struct")
        bounds: dict[str, Any] = {}
        for item in info.metadata:
            if isinstance(item, annotated_types.MinLen):
                bounds["min_length"] = item.min_length
            elif isinstance(item, annotated_types.Ge) and isinstance(item.ge, int):
                bounds["ge"] = item.ge
            elif isinstance(item, annotated_types.Le) and isinstance(item.le, int):
                bounds["le"] = item.le
            else:
                raise TypeError(f"{model.__name__}.{field_name}: constraint {item!r} has no Struct equivalent")
        kind = Annotated[info.annotation, msgspec.Meta(**bounds)] if bounds else info.annotation
        fields.append((field_name, kind) if info.is_required() else (field_name, kind, info.default))
    return msgspec.defstruct(name, fields, bases=(base,), frozen=True, forbid_unknown_fields=True)


class _ScopeRowMethods(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What ``ScopeRow`` shares with ``ScopeOccupancy`` besides its fields."""

    @property
    def scope(self) -> CacheScope:
        """The row's identity."""
        return CacheScope(self.tenant_id, self.served_model_name, self.namespace,  # type: ignore[attr-defined]
                          self.request_group)  # type: ignore[attr-defined]


#: ``ScopeOccupancy``'s schema as a msgspec Struct (built from its fields): a report's rows validated about ten
#: times faster than as pydantic models, for the dashboard's ingest (``parse_report_rows``). Same attribute names.
ScopeRow = _struct_of(ScopeOccupancy, "ScopeRow", _ScopeRowMethods)
_SCOPE_ROWS = list[ScopeRow]  # type: ignore[valid-type]


def parse_report_rows(raw: Any) -> tuple[Ack | Report | Heartbeat, list[Any] | None]:
    """``parse_ingest(raw)``, with a report's rows apart: ``(report without its rows, rows as ScopeRow)``; other
    messages: ``(message, None)``. Accepts and refuses exactly what ``parse_ingest`` does (``MessageError``
    naming the field): the rows are first checked strictly by msgspec (exact types: a JSON integer, a JSON
    string), and when that refuses them the whole message is validated by pydantic, which names the field at
    fault or accepts what its lax mode converts (an integral float, a numeric string)."""
    if not (isinstance(raw, dict) and raw.get("kind") == "report" and isinstance(raw.get("scopes"), list)):
        message = parse_ingest(raw)
        return message, None
    try:
        rows = msgspec.convert(raw["scopes"], _SCOPE_ROWS, strict=True)
    except msgspec.ValidationError:
        report = parse_ingest(raw)  # raises MessageError naming the row and field, unless lax mode accepts it
        assert isinstance(report, Report)
        return report.model_copy(update={"scopes": []}), [ScopeRow(**row.model_dump()) for row in report.scopes]
    return parse_ingest({**raw, "scopes": []}), rows


def parse_document(raw: Any) -> ConfigDocument:
    """Validate a config document. Raises ``MessageError`` naming the offending field."""
    try:
        return ConfigDocument.model_validate(raw)
    except ValidationError as exc:
        raise MessageError(_describe(exc)) from None


#: Celery task the agent runs for a purge request (one positional argument: the signed request dict).
PURGE_TASK = "agent.purge_namespace"
#: Celery task the dashboard runs for the agent's answer (one positional argument: the result dict).
PURGE_RESULT_TASK = "dashboard.purge_result"
#: Every task an agent sends: the dashboard's worker runs no other task from the queue agents push to.
AGENT_TASKS = frozenset({INGEST_TASK, PURGE_RESULT_TASK})
#: Queue of ``PURGE_RESULT_TASK``: the one queue an agent may push to (``agent.contract.broker.agent_acl_rules``),
#: where the dashboard's worker runs nothing but ``AGENT_TASKS`` (``dashboard.task_queues``).
PURGE_RESULT_QUEUE = INGEST_QUEUE

class PurgeRequest(Message):
    """Dashboard → agent: remove every key of one release namespace of one tenant.

    ``engine`` decides the key grammar (``vllm``: ``model`` is the vLLM model name, the last path component;
    ``sglang``: ``model`` is the served model name). ``served_model_name`` names the ledger tables to clear.
    ``namespace`` is the release namespace (vLLM ``cache_prefix`` / SGLang ``extra_backend_tag``) and may not
    be empty: an empty one would select the model's unprefixed keys of every release. ``signature`` =
    HMAC-SHA256 of the canonical encoding with the node's signing secret.
    """

    kind: Literal["purge"] = "purge"
    purge_id: str = Field(min_length=1, max_length=64)
    node: NodeName
    tenant_id: str = Field(min_length=1)
    engine: Literal["vllm", "sglang"]
    namespace: str = Field(min_length=1)
    model: str = Field(min_length=1)
    served_model_name: str = Field(min_length=1)
    issued_at: str = Field(min_length=1)
    signature: str = ""


def signed_request(request: PurgeRequest, secret: str) -> dict[str, Any]:
    """Wire dict of ``request`` signed with the node's ``secret`` (what the dashboard publishes)."""
    wire = request.to_wire()
    wire.pop("signature", None)
    return signing.signed(wire, secret)


class PurgeResult(AgentMessage):
    """Agent → dashboard: how many objects ``remove_by_regex`` removed (``error`` set when it failed); signed with
    the node's secret when sent (``agent.contract.signing.sign_message``), like every ``AgentMessage``."""

    kind: Literal["purge_result"] = "purge_result"
    purge_id: str = Field(min_length=1, max_length=64)
    node: NodeName
    removed: Count = 0
    error: Text = ""
    sent_at: datetime


class MessageError(ValueError):
    """A message does not match its schema; the text names the field(s) and what is wrong."""


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        location = ".".join(str(item) for item in error.get("loc", ())) or "(message)"
        parts.append(f"{location}: {error.get('msg')}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
