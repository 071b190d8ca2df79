"""The registry the demo seeds through the REST API, and where each request of the trace goes.

Two tenants share one Mooncake master:

* ``acme`` serves ``qwen3-8b`` (vLLM 0.33.0, ``sha256_cbor`` block hashes) mid rolling-upgrade: release namespace
  ``production-2026-07`` is serving and ``production-2026-08`` (a copy with new weights) is warming and gets a
  share of the traffic. Two request groups, ``support-bot`` and ``code-assistant``, each with its own
  ``cache_salt``.
* ``globex`` serves ``llama-3.1-8b`` (SGLang 0.5.23 page hashes, ``_k``/``_v`` objects) in
  ``production-2026-07``, in its default request group (no salt).

Every release has a prefill instance on ``node-a`` and a decode instance on ``node-b``. A third instance of
``acme``'s serving release, a decode instance on ``node-b`` port 8203, was started by hand with a mistyped tag
(:data:`MISTYPED_NAMESPACE` instead of ``production-2026-07``): it reads keys nobody writes.

Requests are routed by their conversation (:func:`conversation_root`), so every turn of a conversation lands in
the same namespace and reuses its earlier turns' blocks; the choice is a stable hash, not a random draw.

Sizes scale with the Store segment each agent mounts (``segment_bytes``): the pool holds two segments, the
tenants' quotas split it, and each release gets a budget inside its tenant's quota that the agents keep.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PREFILL_NODE = "node-a"
DECODE_NODE = "node-b"
NODES = (PREFILL_NODE, DECODE_NODE)
SERVING = "production-2026-07"
WARMING = "production-2026-08"
MISTYPED_NAMESPACE = "production-2026-7"
MISCONFIGURED_PORT = 8203

#: KV layout of every release: 2 layers x 2 KV heads x 64 dims x 16 tokens, bfloat16 = 16 KiB per block.
KV_LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}
BLOCK_BYTES = 2 * 2 * 2 * 64 * 16 * 2

#: Traffic shares (stable per conversation).
GLOBEX_SHARE = 0.3
WARMING_SHARE = 0.3
MISCONFIGURED_DECODE_SHARE = 0.15


@dataclass(frozen=True)
class Sizes:
    """Store sizing from the segment each agent mounts (bytes)."""

    segment_bytes: int

    @property
    def capacity_bytes(self) -> int:
        """The pool: one segment per agent, two agents."""
        return 2 * self.segment_bytes

    @property
    def acme_quota(self) -> int:
        """acme's quota: 60 % of the pool (MiB-aligned)."""
        return _mib(self.capacity_bytes * 0.6)

    @property
    def globex_quota(self) -> int:
        """globex's quota: 35 % of the pool."""
        return _mib(self.capacity_bytes * 0.35)

    @property
    def budgets(self) -> dict[tuple[str, str], int]:
        """Release budgets (bytes) by (tenant_id, release namespace): inside each quota, with headroom."""
        return {("acme", SERVING): _mib(self.acme_quota * 0.5), ("acme", WARMING): _mib(self.acme_quota * 0.35),
                ("globex", SERVING): _mib(self.globex_quota * 0.8)}


def _mib(value: float) -> int:
    return max(1, int(value) >> 20) << 20


@dataclass
class Deployment:
    """What :func:`seed` created: ids by name, and the instances of each release."""

    tenant_ids: dict[str, int] = field(default_factory=dict)
    model_ids: dict[str, int] = field(default_factory=dict)
    release_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    group_salts: dict[tuple[str, str], str] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    #: (tenant_id, release namespace, role) -> assignment id (the instance_id in config documents).
    instances: dict[tuple[str, str, str], str] = field(default_factory=dict)
    misconfigured_instance: str = ""

    def groups_of(self, tenant_id: str) -> list[str]:
        """Request group names of a tenant ("" = its default group when it has none)."""
        names = sorted(name for tenant, name in self.group_salts if tenant == tenant_id)
        return names or [""]


TENANTS = (("acme", "Tenant with a rolling upgrade and two request groups."),
           ("globex", "Tenant on SGLang, default request group."))
MODELS = {"acme": ("qwen3-8b", "/models/Qwen3-8B"), "globex": ("llama-3.1-8b", "/models/Llama-3.1-8B-Instruct")}
ENGINES = {"acme": ("vllm", "0.33.0", "sha256_cbor"), "globex": ("sglang", "0.5.23", "sha256")}
GROUPS = {"acme": ("support-bot", "code-assistant")}
#: Where the nodes load models from (``Node.model_roots``) and the GPUs each tenant's instances hold on a node (two
#: tenants' instances may not share a GPU; the releases of one model may, as in the rolling upgrade).
MODEL_ROOTS = ["/models"]
GPUS = {"acme": "0", "globex": "1"}


def seed(api: Any, sizes: Sizes) -> Deployment:
    """Create the registry through the REST API (``api``: :class:`demo.api.RestClient`) and return its ids.

    Order: tenants (quotas), served models, the serving releases, the warming copy (``releases/{id}/copy/``),
    request groups, nodes, assignments. Each registry change makes the dashboard push config to the nodes on
    commit. Raises :class:`demo.api.ApiError` naming the refused field.
    """
    dep = Deployment()
    quotas = {"acme": sizes.acme_quota, "globex": sizes.globex_quota}
    for tenant_id, description in TENANTS:
        # The pool mounts its memory only when the agents start, after this seed: the master reports capacity 0
        # now, so the dashboard asks to confirm the quotas (95 % of the pool the agents will mount; audited).
        dep.tenant_ids[tenant_id] = api.post("tenants/", {"tenant_id": tenant_id, "quota_bytes": quotas[tenant_id],
                                                          "description": description,
                                                          "confirm_overcommit": True})["id"]
    for tenant_id, (name, path) in MODELS.items():
        dep.model_ids[tenant_id] = api.post("models/", {"tenant": dep.tenant_ids[tenant_id],
                                                        "served_model_name": name, "model_path": path})["id"]
    for tenant_id in MODELS:
        engine, version, algo = ENGINES[tenant_id]
        release = api.post("releases/", {
            "model": dep.model_ids[tenant_id], "namespace": SERVING, "state": "serving", "weights_revision": "r1",
            **KV_LAYOUT, "engine": engine, "engine_version": version, "hash_algo": algo,
            "budget_bytes": sizes.budgets[(tenant_id, SERVING)]})
        dep.release_ids[(tenant_id, SERVING)] = release["id"]
    copy = api.post(f"releases/{dep.release_ids[('acme', SERVING)]}/copy/", {
        "namespace": WARMING, "weights_revision": "r2", "budget_bytes": sizes.budgets[("acme", WARMING)],
        "description": "New weights, warming during the rolling upgrade."})
    dep.release_ids[("acme", WARMING)] = copy["id"]
    for tenant_id, names in GROUPS.items():
        for name in names:
            group = api.post("request-groups/", {"tenant": dep.tenant_ids[tenant_id], "name": name})
            dep.group_salts[(tenant_id, name)] = group["cache_salt"]
    for node in NODES:
        dep.node_ids[node] = api.post("nodes/", {"name": node, "hostname": "127.0.0.1",
                                                 "model_roots": MODEL_ROOTS})["id"]
    port = {PREFILL_NODE: 8100, DECODE_NODE: 8200}
    for (tenant_id, namespace), release_id in sorted(dep.release_ids.items()):
        for node, role in ((PREFILL_NODE, "prefill"), (DECODE_NODE, "decode")):
            assignment = api.post("assignments/", {"node": dep.node_ids[node], "release": release_id, "role": role,
                                                   "port": port[node], "gpu_ids": GPUS[tenant_id]})
            port[node] += 1
            dep.instances[(tenant_id, namespace, role)] = str(assignment["id"])
    extra = api.post("assignments/", {"node": dep.node_ids[DECODE_NODE], "release": dep.release_ids[("acme", SERVING)],
                                      "role": "decode", "port": MISCONFIGURED_PORT, "gpu_ids": GPUS["acme"]})
    dep.misconfigured_instance = str(extra["id"])
    return dep


def launch_overrides() -> dict[str, dict[str, str]]:
    """The hand-typed launch values of node-b's engines (``agent run --launch-overrides``): port -> fields."""
    return {str(MISCONFIGURED_PORT): {"namespace": MISTYPED_NAMESPACE}}


# --- routing -------------------------------------------------------------------------------------------------


def conversation_root(hash_ids: Sequence[int]) -> int:
    """The block that identifies a request's conversation: the first block after the shared system prompt
    (block 0 of every FAST'25 request), or the only block."""
    return hash_ids[1] if len(hash_ids) > 1 else hash_ids[0]


def _share(root: int, salt: str) -> float:
    digest = hashlib.sha256(f"{salt}:{root}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Route:
    """Where one request goes: its namespace (tenant, release, request group) and the two instances."""

    tenant_id: str
    served_model_name: str
    namespace: str
    request_group: str
    prefill_instance: str
    decode_instance: str
    misconfigured: bool

    @property
    def decode_namespace(self) -> str:
        """The namespace the decode instance reads (the mistyped one on the misconfigured instance)."""
        return MISTYPED_NAMESPACE if self.misconfigured else self.namespace


def route(hash_ids: Sequence[int], dep: Deployment) -> Route:
    """The route of a request, a pure function of its conversation root and the deployment."""
    root = conversation_root(hash_ids)
    tenant_id = "globex" if _share(root, "tenant") < GLOBEX_SHARE else "acme"
    namespace = SERVING
    if tenant_id == "acme" and _share(root, "release") < WARMING_SHARE:
        namespace = WARMING
    groups = dep.groups_of(tenant_id)
    group = groups[min(int(_share(root, "group") * len(groups)), len(groups) - 1)]
    misconfigured = (tenant_id, namespace) == ("acme", SERVING) and _share(root, "decode") < MISCONFIGURED_DECODE_SHARE
    decode = dep.misconfigured_instance if misconfigured else dep.instances[(tenant_id, namespace, "decode")]
    return Route(tenant_id, MODELS[tenant_id][0], namespace, group, dep.instances[(tenant_id, namespace, "prefill")],
                 decode, misconfigured)
