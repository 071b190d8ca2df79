"""Nodes that run engine instances, and the assignment of release instances to them."""
from __future__ import annotations

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants import placement
from tenants.choices import Engine, InstanceRole, NodeDevice, ReleaseState, StoreMode
from tenants.fields import ByteSizeField
from tenants.models.base import RegistryModel
from tenants.models.release import Release
from tenants.validators import validate_dns_label, validate_gpu_ids, validate_hostname, validate_model_roots

#: Largest parallel size (tensor/pipeline/context parallel ranks of one instance). Explicit because SQLite does
#: not enforce the range of a small integer column, so PostgreSQL and SQLite must refuse the same values here.
MAX_PARALLEL_SIZE = 4096
_SIZE_VALIDATORS = [MinValueValidator(1), MaxValueValidator(MAX_PARALLEL_SIZE)]
_RANK_VALIDATORS = [MinValueValidator(0), MaxValueValidator(MAX_PARALLEL_SIZE - 1)]
_SIZE_HELP = f"Parallel size, 1 to {MAX_PARALLEL_SIZE}."
_RANK_HELP = f"Rank inside the parallel group, 0 to {MAX_PARALLEL_SIZE - 1} (below the size)."
_PORT_VALIDATORS = [MinValueValidator(1), MaxValueValidator(65535)]

#: Smallest segment a Mooncake 0.3.13.post1 client may mount (the master refuses smaller ones at setup()).
MIN_SEGMENT_BYTES = 16 << 20
#: Default port the node agent binds (``tcp://127.0.0.1:<port>``) for its engines' KV events.
DEFAULT_KV_EVENTS_PORT = 5557
#: Default service port of the node's ``mooncake_client`` (standalone-store mode; the client's own default).
DEFAULT_STORE_CLIENT_PORT = 50052


#: Largest ``cpu_kvcache_space_gib`` (GiB): 64 TiB of host memory, far above any node.
MAX_CPU_KVCACHE_SPACE_GIB = 65536


def generate_signing_secret() -> str:
    """A fresh node signing secret: 32 random bytes as 64 lower-case hex characters."""
    return secrets.token_hex(32)


class Node(RegistryModel):
    """A machine running an agent (Celery queue ``agent.<name>``) and engine instances.

    ``signing_secret`` (HMAC key of the node's config documents) is generated on create, never shown in
    lists, details or the audit log; ``rotate_secret()`` replaces it. ``name`` cannot change (it is the
    agent's identity and queue name).

    What the rendered engine launches need from the node:

    * ``hostname`` — the address engines listen on (``--host``) and announce to the Store (vLLM
      ``VLLM_HOST_IP``, ``MOONCAKE_REQUESTER_LOCAL_HOSTNAME``; SGLang ``local_hostname``).
    * ``device`` — ``cuda`` or ``cpu`` (``NodeDevice``): CPU nodes get vLLM's CPU settings, among them
      ``VLLM_CPU_KVCACHE_SPACE`` = ``cpu_kvcache_space_gib`` (GiB per instance, default 1).
    * ``kv_events_port`` — the port the node agent binds on ``127.0.0.1`` for its engines' KV events; each
      vLLM instance connects there and publishes under its instance id as ZMQ topic.
    * ``store_mode`` (``StoreMode``) — ``embedded`` (each engine mounts its own segment) or
      ``standalone-store`` (the agent runs one ``mooncake_client`` on ``store_client_port`` that mounts
      ``store_segment_bytes``, required then, at least 16 MiB; ignored in embedded mode).
    * ``model_roots`` — the directories its engines may load an absolute ``model_path`` or adapter path from
      (``tenants.placement``); empty: hub ids only. Node writes are platform-admin only, so a tenant's operator
      cannot widen them.

    The node's ports (``kv_events_port``, ``store_client_port`` in standalone-store mode) may not collide with
    each other or with an instance's port or bootstrap port on the node.
    """

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[validate_dns_label],
        error_messages={"unique": "A node with this name already exists."},
        help_text="Agent identity; its Celery queue is 'agent.<name>'.",
    )
    hostname = models.CharField(max_length=255, validators=[validate_hostname])
    signing_secret = models.CharField(max_length=64, default=generate_signing_secret, editable=False)
    device = models.CharField(
        max_length=8,
        choices=NodeDevice.choices,
        default=NodeDevice.CUDA,
        help_text="What the node's engines compute on; 'cpu' renders vLLM's CPU settings.",
    )
    kv_events_port = models.PositiveIntegerField(
        default=DEFAULT_KV_EVENTS_PORT,
        validators=_PORT_VALIDATORS,
        help_text="Port the node agent binds on 127.0.0.1 for engine KV events (vLLM --kv-events-config), "
        "1 to 65535.",
    )
    store_mode = models.CharField(
        max_length=24,
        choices=StoreMode.choices,
        default=StoreMode.EMBEDDED,
        help_text="Who mounts the node's Store memory: each engine (embedded) or one mooncake_client per node "
        "(standalone-store).",
    )
    store_segment_bytes = ByteSizeField(
        null=True,
        blank=True,
        help_text="Segment the node's mooncake_client mounts in standalone-store mode, e.g. '64GB' "
        "(at least 16MB; ignored in embedded mode).",
    )
    store_client_port = models.PositiveIntegerField(
        default=DEFAULT_STORE_CLIENT_PORT,
        validators=_PORT_VALIDATORS,
        help_text="Service port of the node's mooncake_client (standalone-store mode), 1 to 65535.",
    )
    cpu_kvcache_space_gib = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CPU_KVCACHE_SPACE_GIB)],
        help_text="device=cpu nodes: GiB of KV cache each vLLM instance allocates in host memory "
        f"(VLLM_CPU_KVCACHE_SPACE), 1 to {MAX_CPU_KVCACHE_SPACE_GIB}; ignored on cuda nodes.",
    )
    model_roots = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_model_roots],
        help_text="Absolute directories (normal form) the node's engines may load models and adapters from; an "
        "absolute model_path or adapter path must lie under one. Empty: hub ids only. Platform admins set it.",
    )
    description = models.TextField(blank=True)

    audit_redact = ("signing_secret",)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue_name(self) -> str:
        """Celery queue the node's agent consumes: ``agent.<name>``."""
        return f"agent.{self.name}"

    def rotate_secret(self) -> str:
        """Replace the signing secret with a fresh one, save, and return it."""
        self.signing_secret = generate_signing_secret()
        self.save(update_fields=["signing_secret", "updated_at"])
        return self.signing_secret

    @property
    def standalone_store(self) -> bool:
        """Whether the node's agent runs a ``mooncake_client`` that owns the node's Store segment."""
        return self.store_mode == StoreMode.STANDALONE

    def reserved_ports(self) -> dict[int, str]:
        """Ports the node itself uses (port -> field name): ``kv_events_port``, and ``store_client_port`` in
        standalone-store mode."""
        ports = {}
        if isinstance(self.kv_events_port, int):
            ports[self.kv_events_port] = "kv_events_port"
        if self.standalone_store and isinstance(self.store_client_port, int):
            ports.setdefault(self.store_client_port, "store_client_port")
        return ports

    def clean(self) -> None:
        stored = self.stored()
        if stored is not None and stored.name != self.name:
            raise ValidationError(
                {
                    "name": f"A node's name cannot change (it is agent '{stored.name}''s identity and queue "
                    f"'{stored.queue_name}'). Create a new node instead."
                }
            )
        errors: dict[str, str] = {}
        if self.standalone_store:
            if self.store_segment_bytes is None:
                errors["store_segment_bytes"] = (
                    "A standalone-store node needs store_segment_bytes: the memory its mooncake_client mounts "
                    "into the pool, e.g. '64GB'."
                )
            elif isinstance(self.store_segment_bytes, int) and self.store_segment_bytes < MIN_SEGMENT_BYTES:
                errors["store_segment_bytes"] = (
                    "store_segment_bytes must be at least 16MB (the Mooncake master refuses smaller segments)."
                )
            if self.store_client_port == self.kv_events_port:
                errors["store_client_port"] = "store_client_port must differ from kv_events_port."
        if stored is not None and (stored.store_mode, stored.device) != (self.store_mode, self.device):
            sglang = self.assignments.filter(release__engine=Engine.SGLANG).first()
            refusal = sglang_node_refusal(self) if sglang is not None else None
            if refusal is not None:
                errors[refusal[0]] = f"{refusal[1]} Instance '{sglang}' runs SGLang on this node."
        if stored is not None and stored.model_roots != self.model_roots and "model_roots" not in errors:
            try:
                validate_model_roots(self.model_roots)
            except ValidationError:
                pass  # reported by clean_fields
            else:
                refusal = placement.check_node_roots(self)
                if refusal is not None:
                    errors["model_roots"] = refusal
        if self.pk is not None and not errors:
            ports = self.reserved_ports()
            for assignment in self.assignments.all():
                for port in (assignment.port, assignment.bootstrap_port):
                    if port in ports:
                        errors[ports[port]] = f"Port {port} is used by instance '{assignment}' on this node."
        if errors:
            raise ValidationError(errors)


_RANKS = ("tp", "pp", "pcp", "dcp")


def port_not_available(port: int, node: Node) -> str:
    """Why ``port`` is refused for an instance on ``node`` when another instance uses it: the node is seen by
    every user, the other instance (perhaps another tenant's) is not named."""
    return f"Port {port} is not available on node '{node}': another instance uses it. Choose another port."


def sglang_node_refusal(node: Node) -> tuple[str, str] | None:
    """Why ``node`` cannot run SGLang 0.5.23 instances: ``(node field, message)``, or ``None`` when it can.

    SGLang has no CPU build (its CPU engine imports the CUDA-only ``sgl_kernel``), and its rendered Mooncake
    settings mount the engine's own segment (``global_segment_size``), which would sit beside a standalone-store
    node's ``mooncake_client``.
    """
    if node.device == NodeDevice.CPU:
        return "device", "SGLang 0.5.23 has no CPU build; SGLang instances need a device=cuda node."
    if node.store_mode == StoreMode.STANDALONE:
        return "store_mode", ("SGLang instances mount their own Store segment (global_segment_size), so they "
                              "cannot run on a standalone-store node; use an embedded-store node.")
    return None


class InstanceAssignment(RegistryModel):
    """One engine instance of a release on a node.

    ``engine`` must equal the release's engine (filled from it when blank); ``role`` is ``prefill``,
    ``decode`` or ``both``. Parallel layout: ``tp_rank``/``tp_size``, ``pp_rank``/``pp_size``,
    ``pcp_rank``/``pcp_size``, ``dcp_rank``/``dcp_size`` (each rank below its size); these ranks are the ones
    vLLM 0.33.0 puts in its keys. ``port`` is the engine's HTTP port (unique per node), ``bootstrap_port`` the
    optional P/D bootstrap port (vLLM ``VLLM_MOONCAKE_BOOTSTRAP_PORT``, SGLang
    ``--disaggregation-bootstrap-port``), ``gpu_ids`` the ``CUDA_VISIBLE_DEVICES`` list. Namespace values are
    never stored here: rendering takes them from the release, so prefill and decode always agree.

    Between the tenants of a node (``tenants.placement``): no two instances hold a common GPU (a blank ``gpu_ids``
    on a ``cuda`` node holds them all), except instances of one served model; the node, and each tenant on it, run
    at most the configured number of instances; the model and adapter paths lie under the node's ``model_roots``.
    A port, bootstrap port or GPU another instance uses is refused as "not available", naming nothing of it.
    """

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="assignments")
    release = models.ForeignKey(Release, on_delete=models.PROTECT, related_name="assignments")
    engine = models.CharField(max_length=16, choices=Engine.choices, blank=True)
    role = models.CharField(max_length=16, choices=InstanceRole.choices, default=InstanceRole.BOTH)
    tp_rank = models.PositiveSmallIntegerField(default=0, validators=_RANK_VALIDATORS, help_text=_RANK_HELP)
    tp_size = models.PositiveSmallIntegerField(default=1, validators=_SIZE_VALIDATORS, help_text=_SIZE_HELP)
    pp_rank = models.PositiveSmallIntegerField(default=0, validators=_RANK_VALIDATORS, help_text=_RANK_HELP)
    pp_size = models.PositiveSmallIntegerField(default=1, validators=_SIZE_VALIDATORS, help_text=_SIZE_HELP)
    pcp_rank = models.PositiveSmallIntegerField(default=0, validators=_RANK_VALIDATORS, help_text=_RANK_HELP)
    pcp_size = models.PositiveSmallIntegerField(default=1, validators=_SIZE_VALIDATORS, help_text=_SIZE_HELP)
    dcp_rank = models.PositiveSmallIntegerField(default=0, validators=_RANK_VALIDATORS, help_text=_RANK_HELP)
    dcp_size = models.PositiveSmallIntegerField(default=1, validators=_SIZE_VALIDATORS, help_text=_SIZE_HELP)
    port = models.PositiveIntegerField(validators=_PORT_VALIDATORS, help_text="Engine HTTP port on the node.")
    bootstrap_port = models.PositiveIntegerField(null=True, blank=True, validators=_PORT_VALIDATORS)
    gpu_ids = models.CharField(max_length=255, blank=True, validators=[validate_gpu_ids])

    class Meta:
        ordering = ["node__name", "port"]
        constraints = [models.UniqueConstraint(fields=["node", "port"], name="uniq_assignment_port_per_node")]

    def __str__(self) -> str:
        release = self.release.namespace if self.release_id is not None else "?"
        node = self.node.name if self.node_id is not None else "?"
        return f"{release} {self.role} on {node}:{self.port}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        for rank in _RANKS:
            rank_value, size_value = getattr(self, f"{rank}_rank"), getattr(self, f"{rank}_size")
            if isinstance(rank_value, int) and isinstance(size_value, int) and rank_value >= size_value >= 1:
                errors[f"{rank}_rank"] = f"{rank}_rank must be below {rank}_size ({size_value})."
        if self.bootstrap_port is not None and self.bootstrap_port == self.port:
            errors["bootstrap_port"] = "bootstrap_port must differ from port."
        if self.node_id is not None:
            reserved = self.node.reserved_ports()
            for name in ("port", "bootstrap_port"):
                value = getattr(self, name)
                if value in reserved and name not in errors:
                    errors[name] = f"Port {value} is node '{self.node}''s {reserved[value]}."
            if self.node.device == NodeDevice.CPU and self.gpu_ids:
                errors["gpu_ids"] = f"Node '{self.node}' is a CPU node; gpu_ids must be blank."
        if self.release_id is not None:
            release = self.release
            if not self.engine:
                self.engine = release.engine
            elif self.engine != release.engine:
                errors["engine"] = (
                    f"engine '{self.engine}' differs from release '{release.namespace}''s engine "
                    f"'{release.engine}': instances of one release must run the same engine to share its cache."
                )
            stored = self.stored()
            if release.state == ReleaseState.RETIRED and (stored is None or stored.release_id != self.release_id):
                errors["release"] = f"Release '{release.namespace}' is retired; it cannot get new instances."
            moved = stored is None or (stored.node_id, stored.release_id) != (self.node_id, self.release_id)
            refusal = (sglang_node_refusal(self.node)
                       if moved and release.engine == Engine.SGLANG and self.node_id is not None else None)
            if refusal is not None:
                errors.setdefault("node", f"Node '{self.node}': {refusal[1]}")
        if errors:
            raise ValidationError(errors)
        if self.node_id is not None and isinstance(self.port, int):
            others = InstanceAssignment._base_manager.filter(node_id=self.node_id).exclude(pk=self.pk)
            for name in ("port", "bootstrap_port"):
                value = getattr(self, name)
                if value is not None and others.filter(models.Q(port=value) | models.Q(bootstrap_port=value)).exists():
                    raise ValidationError({name: port_not_available(value, self.node)}, code="unique")
        if self.node_id is not None and self.release_id is not None:
            stored = self.stored()
            moved = stored is None or (stored.node_id, stored.release_id) != (self.node_id, self.release_id)
            placement_errors = placement.check_assignment(self, moved)
            if placement_errors:
                raise ValidationError(placement_errors)
