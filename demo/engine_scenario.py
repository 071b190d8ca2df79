"""The registry and the load of ``python -m demo --engine vllm``: real vLLM instances of the tiny model.

Registry (seeded through the REST API by :func:`seed_nodes`, then, once the nodes' segments are mounted,
:func:`seed`):

* tenant ``acme`` (:data:`QUOTA_BYTES`), served model ``tiny`` = ``var/tiny-llama`` (vLLM 0.32.0 CPU build,
  ``sha256`` block hashes, 32-token blocks of 16 KiB);
* release namespace :data:`OLD_NAMESPACE` serving; request groups ``support-bot`` and ``code-assistant``, each
  with its own generated ``cache_salt``;
* nodes ``node-a`` and ``node-b`` (``127.0.0.1``, CPU) in ``standalone-store`` mode: each node's agent runs one
  ``mooncake_client`` that owns the node's Store segment (:data:`SEGMENT_BYTES`), so blocks outlive the engine
  that wrote them, and binds the node's KV-events port;
* one instance of the serving release on each node (``role`` both).

During the run the demo starts the rolling upgrade to :data:`NEW_NAMESPACE` (a copy of the serving release)
and assigns it one instance on ``node-a`` (:func:`assign_new_release`).

Load: :func:`select_conversations` picks the first multi-turn conversations of the FAST'25 trace (requests
with the same conversation root, ``demo.scenario.conversation_root``), :func:`plan_requests` turns each turn
into a token-id prompt (``demo.engine.request_prompt``: every ``hash_id`` is one 32-token block drawn from a
generator seeded by the id, so turns of one conversation share their prefix) and gives each conversation a
request group by a stable hash of its root. First turns go to the serving release's instance on ``node-a``
(phase ``store``), later turns to its instance on ``node-b`` (phase ``share``): they start with their earlier
turns' prefix, which only ``node-a`` computed, so ``node-b`` loads it from the Store.

No Django here (the demo drives the dashboard over HTTP).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TENANT = "acme"
MODEL = "tiny"
OLD_NAMESPACE = "tiny-2026-12"
NEW_NAMESPACE = "tiny-2027-01"
GROUPS = ("support-bot", "code-assistant")
NODES = ("node-a", "node-b")
#: Store segment each node's ``mooncake_client`` mounts (the pool is two of them).
SEGMENT_BYTES = 128 << 20
#: ``acme``'s quota: most of the pool.
QUOTA_BYTES = 192 << 20
#: KV layout of the tiny model (``scripts/tiny_model.py``): one 32-token block = 16 KiB in bf16.
LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "block_size": 32}
BLOCK_TOKENS = LAYOUT["block_size"]
BLOCK_BYTES = 2 * LAYOUT["num_layers"] * LAYOUT["num_kv_heads"] * LAYOUT["head_dim"] * BLOCK_TOKENS * 2
ENGINE_VERSION = "0.32.0"
HASH_ALGO = "sha256"
#: Tokens generated per request (the prompts are cut to fit the model length with them).
MAX_TOKENS = 8
#: The full-pool phase: acme's quota is lowered to what its Store holds plus this room, and the next release's
#: instance is sent documents with continuations worth about FULL_POOL_FILL times that room.
FULL_POOL_ROOM_BYTES = 2 << 20
FULL_POOL_FILL = 3


@dataclass(frozen=True)
class EnginePorts:
    """Loopback ports of one run: each node's KV-events and ``mooncake_client`` ports, and the API port of
    each instance (``a``/``b``: the serving release on node-a/node-b, ``c``: the next release on node-a)."""

    events: Mapping[str, int]
    store_client: Mapping[str, int]
    api: Mapping[str, int]

    @classmethod
    def pick(cls, free_ports: Any) -> EnginePorts:
        """Seven distinct free ports from ``free_ports(n)`` (``agent.sim.master.free_ports``)."""
        ports = list(free_ports(7))
        if len(set(ports)) != 7:
            raise ValueError(f"free_ports gave repeated ports: {ports}")
        return cls(events={"node-a": ports[0], "node-b": ports[1]},
                   store_client={"node-a": ports[2], "node-b": ports[3]},
                   api={"a": ports[4], "b": ports[5], "c": ports[6]})


@dataclass
class EngineDeployment:
    """What :func:`seed` (and later :func:`assign_new_release`) created: ids by name."""

    tenant_id: int = 0
    model_id: int = 0
    release_ids: dict[str, int] = field(default_factory=dict)
    group_salts: dict[str, str] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    #: instance label (``a``, ``b``, ``c``) -> (node, release namespace, instance_id).
    instances: dict[str, tuple[str, str, str]] = field(default_factory=dict)


def seed_nodes(api: Any, ports: EnginePorts) -> EngineDeployment:
    """Register ``node-a`` and ``node-b`` (standalone-store, CPU, loopback) through the REST API.

    Nodes come first: once their agents run, each node's ``mooncake_client`` mounts its segment, so the pool's
    capacity is known when the tenant's quota is set (the registry refuses a quota above the mounted capacity
    unless confirmed). Raises ``demo.api.ApiError`` naming the refused field.
    """
    dep = EngineDeployment()
    for node in NODES:
        dep.node_ids[node] = api.post("nodes/", {
            "name": node, "hostname": "127.0.0.1", "device": "cpu", "kv_events_port": ports.events[node],
            "store_mode": "standalone-store", "store_segment_bytes": SEGMENT_BYTES,
            "store_client_port": ports.store_client[node]})["id"]
    return dep


def seed(api: Any, dep: EngineDeployment, ports: EnginePorts, model_path: str | Path) -> EngineDeployment:
    """Create the rest of the registry of the module docstring through the REST API (``api``:
    ``demo.api.RestClient``) on the nodes of :func:`seed_nodes`; returns ``dep`` filled in.

    Raises ``demo.api.ApiError`` naming the refused field.
    """
    dep.tenant_id = api.post("tenants/", {"tenant_id": TENANT, "quota_bytes": QUOTA_BYTES,
                                          "description": "Tenant of the real-engine demo."})["id"]
    model_dir = Path(model_path).resolve()
    for node_id in dep.node_ids.values():  # the nodes may load models from the model's directory
        api.patch(f"nodes/{node_id}/", {"model_roots": [str(model_dir.parent)]})
    dep.model_id = api.post("models/", {"tenant": dep.tenant_id, "served_model_name": MODEL,
                                        "model_path": str(model_dir)})["id"]
    release = api.post("releases/", {"model": dep.model_id, "namespace": OLD_NAMESPACE, "state": "serving",
                                     **LAYOUT, "engine": "vllm", "engine_version": ENGINE_VERSION,
                                     "hash_algo": HASH_ALGO, "description": "The tiny model, first release."})
    dep.release_ids[OLD_NAMESPACE] = release["id"]
    for name in GROUPS:
        dep.group_salts[name] = api.post("request-groups/", {"tenant": dep.tenant_id, "name": name})["cache_salt"]
    for label, node in (("a", "node-a"), ("b", "node-b")):
        assignment = api.post("assignments/", {"node": dep.node_ids[node], "release": release["id"], "role": "both",
                                               "port": ports.api[label]})
        dep.instances[label] = (node, OLD_NAMESPACE, str(assignment["id"]))
    return dep


def assign_new_release(api: Any, dep: EngineDeployment, ports: EnginePorts, release_id: int) -> str:
    """Assign the next release (:data:`NEW_NAMESPACE`, id ``release_id``) one instance on ``node-a`` (label
    ``c``); returns its instance id."""
    dep.release_ids[NEW_NAMESPACE] = release_id
    assignment = api.post("assignments/", {"node": dep.node_ids["node-a"], "release": release_id, "role": "both",
                                           "port": ports.api["c"]})
    dep.instances["c"] = ("node-a", NEW_NAMESPACE, str(assignment["id"]))
    return str(assignment["id"])


# --- load ----------------------------------------------------------------------------------------------------


def select_conversations(requests: Iterable[Any], conversations: int, turns: int = 3) -> list[list[Any]]:
    """The first ``conversations`` conversations with at least two turns, each with its first ``turns`` turns.

    ``requests`` are ``agent.sim.trace.TraceRequest`` in trace order; a conversation is the requests with the
    same ``demo.scenario.conversation_root`` (one-block requests have none). Conversations are ordered by their
    first turn. Raises ``ValueError`` when ``conversations`` < 1 or ``turns`` < 2.
    """
    from demo.scenario import conversation_root

    if conversations < 1 or turns < 2:
        raise ValueError("need at least one conversation of at least two turns")
    by_root: dict[int, list[Any]] = {}
    for request in requests:
        if len(request.hash_ids) < 2:
            continue
        by_root.setdefault(conversation_root(request.hash_ids), []).append(request)
    multi = [turns_of[:turns] for turns_of in by_root.values() if len(turns_of) >= 2]
    multi.sort(key=lambda turns_of: turns_of[0].line)
    return multi[:conversations]


def group_of(root: int, groups: Sequence[str] = GROUPS) -> str:
    """The request group of a conversation: a stable hash of its root (not a random draw)."""
    digest = hashlib.sha256(f"group:{root}".encode()).digest()
    return groups[int.from_bytes(digest[:8], "big") % len(groups)]


@dataclass(frozen=True)
class PlannedRequest:
    """One completion the demo sends: the turn of a conversation, its prompt and request group."""

    conversation: int
    turn: int
    line: int
    group: str
    prompt: tuple[int, ...]

    @property
    def phase(self) -> str:
        """``store`` (first turns, node-a) or ``share`` (later turns, node-b)."""
        return "store" if self.turn == 0 else "share"


def plan_requests(conversations: Sequence[Sequence[Any]], *, max_tokens: int = MAX_TOKENS) -> list[PlannedRequest]:
    """Prompts of every turn of ``conversations`` (:func:`select_conversations`), in order: every first turn,
    then every later turn (turn 1 of each conversation, then turn 2, ...)."""
    from demo.engine import request_prompt
    from demo.scenario import conversation_root

    planned = []
    for index, turns_of in enumerate(conversations):
        group = group_of(conversation_root(turns_of[0].hash_ids))
        for turn, request in enumerate(turns_of):
            prompt = request_prompt(request, BLOCK_TOKENS, max_tokens)
            planned.append(PlannedRequest(index, turn, request.line, group, tuple(prompt)))
    planned.sort(key=lambda r: (r.turn, r.conversation))
    return planned


def shared_prefix_blocks(planned: Sequence[PlannedRequest], *, first_turns_only: bool = False) -> int:
    """Full blocks the later turns share with the earlier turns of their conversation: per later turn, the
    longest block-aligned common prefix with any earlier turn (``first_turns_only``: with the first turn only,
    i.e. what only node-a computed and node-b can load from the Store)."""
    earlier: dict[int, list[tuple[int, ...]]] = {}
    total = 0
    for request in sorted(planned, key=lambda r: (r.conversation, r.turn)):
        before = earlier.setdefault(request.conversation, [])
        if first_turns_only:
            before = before[:1]
        best = 0
        for other in before:
            common = 0
            for x, y in zip(request.prompt, other, strict=False):
                if x != y:
                    break
                common += 1
            best = max(best, common // BLOCK_TOKENS)
        total += best
        earlier[request.conversation].append(request.prompt)
    return total


def expected_store_hits(planned: Sequence[PlannedRequest]) -> int:
    """Tokens node-b's engine should load from the Store over the later turns, sent in ``planned`` order after
    node-a stored every first turn: per request, the full blocks after its longest prefix node-b already holds
    (from its own earlier requests) that continue in node-a's blocks. A block is identified by its request group
    and every token up to its end (what its chained hash covers). vLLM 0.32 asks the connector only for the
    tokens after its own prefix-cache hit, and loads consecutive blocks from there."""
    def blocks(request: PlannedRequest) -> list[tuple[Any, ...]]:
        return [(request.group, *request.prompt[:BLOCK_TOKENS * (i + 1)])
                for i in range(len(request.prompt) // BLOCK_TOKENS)]

    stored = {block for request in planned if request.turn == 0 for block in blocks(request)}
    local: set[tuple[Any, ...]] = set()
    tokens = 0
    for request in planned:
        if request.turn == 0:
            continue
        chain = blocks(request)
        hit = 0
        while hit < len(chain) and chain[hit] in local:
            hit += 1
        loaded = hit
        while loaded < len(chain) and chain[loaded] in stored:
            loaded += 1
        tokens += (loaded - hit) * BLOCK_TOKENS
        local.update(chain)
    return tokens


# --- keys ----------------------------------------------------------------------------------------------------


def prompt_keys(keyspace: Any, prompt: Sequence[int]) -> list[str]:
    """Store keys of every full block of ``prompt`` in ``keyspace`` (``agent.datapath.keyspace.KeySpace``), root
    first (the trailing partial block is never stored)."""
    return keyspace.keys(keyspace.block_hashes(list(prompt)))


def full_pool_prompts(room_bytes: int, fill: int = FULL_POOL_FILL, *, prefix_blocks: int = 16,
                      continuation_blocks: int = 14, continuations: int = 3, seed: int = 9000,
                      groups: Sequence[str] = GROUPS) -> list[tuple[str, list[int]]]:
    """``(request group, prompt)`` pairs of the full-pool phase: documents of ``prefix_blocks`` blocks, each sent
    with ``continuations`` different continuations of ``continuation_blocks`` blocks (so a prefix-blind eviction
    of a document's blocks leaves its continuations' blocks orphaned), alternating over ``groups``, until the
    distinct blocks reach ``fill`` x ``room_bytes`` (``BLOCK_BYTES`` each). Prompts share nothing with the trace's
    (``demo.engine.random_prompt``) and fit the model length with :data:`MAX_TOKENS` (raises ``ValueError`` if
    not)."""
    from demo.engine import MAX_MODEL_LEN, random_prompt

    if (prefix_blocks + continuation_blocks) * BLOCK_TOKENS + MAX_TOKENS > MAX_MODEL_LEN:
        raise ValueError("full_pool_prompts: a prompt would not fit the model length")
    wanted = fill * room_bytes // BLOCK_BYTES
    per_document = prefix_blocks + continuations * continuation_blocks
    out: list[tuple[str, list[int]]] = []
    for document in range(max(1, -(-wanted // per_document))):
        prefix = random_prompt(prefix_blocks * BLOCK_TOKENS, seed=seed + 1000 * document)
        group = groups[document % len(groups)]
        for k in range(continuations):
            tail = random_prompt(continuation_blocks * BLOCK_TOKENS, seed=seed + 1000 * document + 1 + k)
            out.append((group, prefix + tail))
    return out


def chain_parents(chains: Iterable[Sequence[str]]) -> dict[str, str | None]:
    """Key -> its parent block's key (``None`` for a root) over prompt key chains (:func:`prompt_keys`)."""
    parents: dict[str, str | None] = {}
    for chain in chains:
        previous = None
        for key in chain:
            parents.setdefault(key, previous)
            previous = key
    return parents


def orphans(present: set[str], parents: Mapping[str, str | None]) -> list[str]:
    """Keys present in the Store whose parent block is not (a block nobody can reach by prefix lookup)."""
    return sorted(key for key in present if parents.get(key) is not None and parents[key] not in present)


__all__ = [
    "BLOCK_BYTES", "EngineDeployment", "EnginePorts", "GROUPS", "NEW_NAMESPACE", "OLD_NAMESPACE", "PlannedRequest",
    "FULL_POOL_FILL", "FULL_POOL_ROOM_BYTES", "assign_new_release", "chain_parents", "expected_store_hits",
    "full_pool_prompts", "group_of", "orphans", "plan_requests",
    "prompt_keys", "seed", "seed_nodes", "select_conversations", "shared_prefix_blocks",
]
