"""``python -m demo``: the whole system on one machine, replaying the FAST'25 trace through real services.

    python -m demo [--once] [--requests N] [--speed X] [--port P] [--screenshot PATH] [--trace PATH]
                   [--segment-mib M] [--var-dir D] [--redis-url URL | --private-redis] [--engine simulator|vllm]

Starts (each in its own process group, logs under ``<var-dir>/logs/``): Redis (the one answering on
127.0.0.1:6379, else ``redis-server`` on a free port), a multi-tenant ``mooncake_master`` with eviction on free
loopback ports, the Django dashboard (SQLite in ``<var-dir>``, migrated, a superuser with a printed password and
API token; ``127.0.0.1:8000`` when free), the dashboard's Celery worker with its beat schedule, and two agents
(``python -m agent run``): ``node-a`` prefill, ``node-b`` decode. Seeds the registry through the REST API
(``demo.scenario``), waits until both agents acked their config, then replays the trace at ``--speed`` times
its pace (``demo.replay``), showing progress from the dashboard's REST API.

Without ``--once`` it keeps everything running after the replay until Ctrl-C. With ``--once`` it prints the
per-namespace summary from the REST API, runs the checks below and exits 0 only if all passed:

* every service stayed up and both agents acked the pushed config;
* the replay completed (the dashboard counts every lookup the agents were sent);
* at least four namespaces hold bytes with a non-zero hit ratio;
* the decode node found and loaded what the prefill node stored, byte for byte (the agents' per-batch result
  files, ``<state dir>/workload-results.jsonl``, see ``agent.sim.workload.ResultFile``);
* the misconfigured instance got zero hits and the dashboard's checks flag its namespace;
* the Store filled to the point of eviction;
* namespaces never shared blocks across releases, request groups or tenants (``demo.probe``).

``--engine vllm`` runs real vLLM instances instead of the agents' engine simulator: see
``demo.engine_demo`` (its own walk and checks; same services, options and shutdown).

Ctrl-C (or SIGTERM) stops every process the demo started, also after an error, then deletes the demo's queue keys
from a Redis it did not start (on the shared one: every node queue and kombu binding in database 11 only).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.node.cli_args import broker_url, positive_float, positive_int
from demo.procs import ROOT, DemoError, Service, Supervisor

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
DEFAULT_VAR = ROOT / "var" / "demo"
#: Redis database the demo uses on a shared server (its queues are deleted there at start and at shutdown).
SHARED_REDIS_DB = 11
MARKER = ".kvpool-demo"
ADMIN = "admin"
ONCE_REQUESTS = 2000
#: Queues (Redis keys) of one demo run, deleted at start (no stale message is replayed) and at shutdown.
DEMO_KEYS = ("agent.node-a", "agent.node-b", "dashboard.ingest", "dashboard.control", "unacked", "unacked_index",
             "unacked_mutex")
#: Key patterns of the demo's own database on the shared Redis, deleted at start and at shutdown: the queues of
#: every node (also nodes added by hand during the session), the dashboard's queues and kombu's exchange bindings
#: (``_kombu.binding.*``, ``_kombu.binding_permanent.*``, ``_kombu.binding_deadlines``).
DEMO_KEY_PATTERNS = ("agent.*", "dashboard.*", "_kombu.binding*", "unacked*")
#: The demo runs every process as one user (``--single-user``: engines run as the agent's account, root included).
AGENT_COMMAND = [sys.executable, "-m", "agent", "run", "--single-user"]
#: The demo master's ``--default_kv_lease_ttl`` in ms (the agents get it as ``--store-lease-ttl``).
MASTER_LEASE_MS = 1000
#: ``--engine`` values: the engine simulator in the agents, or real vLLM instances (``demo.engine_demo``).
ENGINES = ("simulator", "vllm")
#: Trace conversations the ``--engine vllm`` run sends by default (``demo.engine_demo.DEFAULT_CONVERSATIONS``).
ENGINE_CONVERSATIONS = 12


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--once", action="store_true",
                   help=f"bounded replay (default {ONCE_REQUESTS} requests), summary and checks, then exit")
    p.add_argument("--requests", type=positive_int, help="replay only the first N requests (default: all; "
                   f"{ONCE_REQUESTS} with --once)")
    p.add_argument("--speed", type=positive_float, default=20.0,
                   help="time compression: trace seconds per wall-clock second (default 20)")
    p.add_argument("--port", type=_port, help="dashboard port (default 8000 when free, else a free one)")
    p.add_argument("--screenshot", metavar="PATH", help="save a screenshot of the occupancy page (headless Chromium)")
    p.add_argument("--trace", default=os.environ.get("KVPOOL_DEMO_TRACE", str(DEFAULT_TRACE)),
                   help="FAST'25 JSONL trace (default ../shared/traces/conversation_trace.jsonl)")
    p.add_argument("--segment-mib", type=positive_int, default=64,
                   help="Store segment each agent mounts, MiB (>= 16; default 64); quotas and budgets follow")
    p.add_argument("--var-dir", default=str(DEFAULT_VAR), help="state of this run: database, logs (wiped at start)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--redis-url", type=_redis_url,
                       help="broker URL, redis:// or rediss:// with a host (default: 127.0.0.1:6379 when it answers, "
                       f"database {SHARED_REDIS_DB}; else a private redis-server)")
    group.add_argument("--private-redis", action="store_true", help="always start a private redis-server")
    p.add_argument("--batch", type=positive_int, default=16, help="most requests per workload batch (default 16)")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds to wait for the agents to finish the replay (default 300)")
    p.add_argument("--engine", choices=ENGINES, default="simulator",
                   help="simulator (default): the agents play the engines (--simulate-engines); vllm: real vLLM "
                   "instances (CPU build, tiny model) started from the directories the agents write, "
                   "see docs/demo.md; --requests is then the number of trace conversations (default "
                   f"{ENGINE_CONVERSATIONS}) and --speed, --batch, --timeout, --segment-mib do not apply")
    args = p.parse_args(argv)
    if args.segment_mib < 16:
        p.error("--segment-mib: Mooncake 0.3.13.post1 needs at least 16 MiB per segment")
    if not Path(args.trace).is_file():
        p.error(f"--trace: {args.trace} is not a file (the FAST'25 trace; default {DEFAULT_TRACE})")
    if args.once and args.requests is None and args.engine == "simulator":
        args.requests = ONCE_REQUESTS
    return args


def _redis_url(text: str) -> str:
    """``--redis-url``: a ``redis://`` or ``rediss://`` URL with a host (the agents' ``--broker`` rule)."""
    return broker_url(text, schemes=("redis", "rediss"))


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port")
    return value


def setup_db_argv(username: str, password: str) -> list[str]:
    """The ``demo.setup_db`` command line. Values go as ``--opt=value``: a generated password may start with ``-``,
    which argparse would otherwise read as an option."""
    return [sys.executable, "-m", "demo.setup_db", f"--username={username}", f"--password={password}"]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the web server binds (TIME_WAIT is fine)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class Check:
    """One line of the final verdict."""

    name: str
    ok: bool
    detail: str


class Demo:
    """One demo run: services, registry, agents, replay, summary, shutdown (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.var = Path(args.var_dir).resolve()
        self.logs = self.var / "logs"
        self.sup = Supervisor()
        self.t0 = time.monotonic()
        self.checks: list[Check] = []
        self.password = secrets.token_urlsafe(12)
        self.token = ""
        self.base_url = ""
        self.broker_url = ""
        self.master: Any = None
        self.api: Any = None
        self.deployment: Any = None
        self.agents: dict[str, Service] = {}
        self._redis: Any = None
        self._owns_redis_db = False  # True when the demo picked database SHARED_REDIS_DB of the shared Redis
        self._clean_redis = False  # True on a Redis the demo did not start (its keys outlive the demo)
        self._secret_key = secrets.token_urlsafe(40)
        self.sizes: Any = None
        self.replayer: Any = None

    # --- output ---------------------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        """Print one progress line with the seconds since start."""
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record (and print) one verdict line."""
        self.checks.append(Check(name, ok, detail))
        self.say(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        return ok

    # --- set-up ---------------------------------------------------------------------------------------------

    def prepare_var(self) -> None:
        """Empty the run directory (only one this demo created, recognised by its marker file)."""
        if self.var.exists() and any(self.var.iterdir()):
            if not (self.var / MARKER).exists():
                raise DemoError(f"--var-dir {self.var} is not empty and was not created by the demo; "
                                "choose another directory")
            shutil.rmtree(self.var)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.var / MARKER).write_text("state of one `python -m demo` run; wiped by the next run\n")

    def start_redis(self) -> None:
        """Use the Redis on 127.0.0.1:6379 when it answers (clearing this demo's queues), else start one."""
        import redis

        from agent.sim.master import free_ports

        url = self.args.redis_url
        if url is None and not self.args.private_redis:
            try:
                if redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping():
                    url = f"redis://127.0.0.1:6379/{SHARED_REDIS_DB}"
                    self._owns_redis_db = True
            except redis.RedisError:
                url = None
        if url is None:
            binary = shutil.which("redis-server")
            if binary is None:
                raise DemoError("Redis does not answer on 127.0.0.1:6379 and redis-server is not installed "
                                "(apt-get install redis-server, or pass --redis-url)")
            port = free_ports(1)[0]
            (self.var / "redis").mkdir(exist_ok=True)
            service = self.sup.start(Service("redis-server", [binary, "--port", str(port), "--bind", "127.0.0.1",
                                                              "--save", "", "--appendonly", "no",
                                                              "--dir", str(self.var / "redis")],
                                             os.environ, self.logs / "redis.log"), shared=True)
            url = f"redis://127.0.0.1:{port}/0"
            client = redis.Redis.from_url(url, socket_connect_timeout=1)

            def ping() -> bool:
                try:
                    return bool(client.ping())
                except redis.RedisError:
                    return False

            service.wait_until(ping, 15, "redis-server to answer PING", interval=0.05)
            self.say(f"started redis-server on 127.0.0.1:{port}")
        else:
            client = redis.Redis.from_url(url, socket_connect_timeout=2)
            try:
                client.ping()
                cleared = self._delete_demo_keys(client)
            except redis.RedisError as exc:
                raise DemoError(f"Redis at {url} does not answer: {exc}") from None
            self._clean_redis = True
            self.say(f"using Redis {url} (cleared {cleared} stale demo queue key(s))")
        self.broker_url = url
        self._redis = client

    def _delete_demo_keys(self, client: Any) -> int:
        """Delete this demo's broker keys from its database; returns how many existed.

        Always the fixed :data:`DEMO_KEYS`; in the demo's own database (``SHARED_REDIS_DB``, picked by the demo,
        not a ``--redis-url``) also every key matching :data:`DEMO_KEY_PATTERNS`. Only the database of
        ``client`` is touched. Raises ``redis.RedisError`` when Redis does not answer.
        """
        keys = set(DEMO_KEYS)
        if self._owns_redis_db:
            for pattern in DEMO_KEY_PATTERNS:
                keys.update(client.scan_iter(match=pattern, count=500))
        return int(client.delete(*keys)) if keys else 0

    def start_master(self) -> None:
        """A multi-tenant ``mooncake_master`` with eviction on free loopback ports (tenants come from the
        dashboard's quota sync)."""
        from agent.sim.master import MasterError, MasterProcess

        # reads lease objects for 1 s (default 10 s): long enough for a transfer, short enough that the agents'
        # budget keeper can soon remove a block a decode read
        self.master = MasterProcess({}, eviction_high_watermark_ratio=0.9, eviction_ratio=0.1,
                                    default_kv_lease_ttl=MASTER_LEASE_MS, workdir=self.var / "master")
        try:
            self.master.start()
        except MasterError as exc:
            raise DemoError(str(exc)) from None
        self.sup.on_stop("mooncake_master", self.master.stop)
        self.say(f"mooncake_master (multi-tenant, eviction on) rpc {self.master.rpc_address}, "
                 f"metadata {self.master.metadata_server}, admin {self.master.admin_url}")

    def django_env(self) -> dict[str, str]:
        """Environment of every Django process (settings ``demo.settings``)."""
        segment = self.args.segment_mib << 20
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "DJANGO_"))}
        env.update({
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "demo.settings",
            "DJANGO_SECRET_KEY": self._secret_key,
            "DATABASE_URL": f"sqlite:///{self.var / 'db.sqlite3'}", "KVPOOL_VAR_DIR": str(self.var),
            "CELERY_BROKER_URL": self.broker_url,
            "KVPOOL_MASTER_ADDRESS": self.master.rpc_address, "KVPOOL_METADATA_SERVER": self.master.metadata_server,
            "KVPOOL_MASTER_ADMIN_URL": self.master.admin_url,
            "KVPOOL_TENANT_QUOTAS_PATH": str(self.var / "tenant_quotas.yaml"),
            "KVPOOL_GLOBAL_SEGMENT_SIZE": str(segment), "KVPOOL_LOCAL_BUFFER_SIZE": str(16 << 20),
            "KVPOOL_RECONCILE_SECONDS": "10", "KVPOOL_REPUSH_AFTER_SECONDS": "10", "KVPOOL_ROLLUP_SECONDS": "60",
            "KVPOOL_MASTER_SYNC_SECONDS": "30", "KVPOOL_MASTER_SAMPLE_SECONDS": "5",
            "KVPOOL_HEARTBEAT_SILENCE_SECONDS": "15",
        })
        # the flags start_master gives the master: the watermark the dashboard's budget checks assume
        master = self.master
        for setting, value in (("KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO", master.eviction_high_watermark_ratio),
                               ("KVPOOL_MASTER_EVICTION_RATIO", master.eviction_ratio)):
            if value is not None:
                env[setting] = str(value)
        return env

    def start_dashboard(self) -> None:
        """Migrate, create the superuser, start the web server and the Celery worker (with beat)."""
        env = self.django_env()
        self.say("migrating the database and creating the superuser")
        try:
            done = subprocess.run(setup_db_argv(ADMIN, self.password), cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise DemoError("demo.setup_db did not finish in 300 s") from None
        (self.logs / "setup_db.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise DemoError(f"migrating the database failed:\n{done.stderr[-2000:]}")
        self.token = json.loads(done.stdout.strip().splitlines()[-1])["token"]
        port = self.args.port or (8000 if port_is_free(8000) else _free_port())
        if not port_is_free(port):
            raise DemoError(f"--port {port} is in use")
        self.base_url = f"http://127.0.0.1:{port}"
        web = self.sup.start(Service("django", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                                                "--noreload", "--insecure"], env, self.logs / "django.log"))
        worker = self.sup.start(Service("celery", [
            sys.executable, "-m", "celery", "-A", "dashboard.celery", "worker", "-B",
            "--schedule", str(self.var / "celerybeat-schedule"), "-Q", "dashboard.ingest,dashboard.control",
            "--pool", "solo", "--without-mingle", "--without-gossip", "-n", "dashboard@demo", "-l", "INFO"],
            env, self.logs / "celery.log"))
        from demo.api import ApiError, RestClient

        self.api = RestClient(self.base_url, self.token)

        def web_up() -> bool:
            try:
                self.api.get("tenants/")
                return True
            except ApiError:
                return False

        web.wait_until(web_up, 90, f"the dashboard to answer on {self.base_url}")
        worker.wait_until(lambda: "ready." in worker.log_text(), 90, "the Celery worker to be ready")
        self.say(f"dashboard up on {self.base_url}; Celery worker (ingest, push, beat) ready")

    # --- registry and agents --------------------------------------------------------------------------------

    def seed(self) -> None:
        """Seed the registry through the REST API and fetch the nodes' signing secrets."""
        from demo.scenario import Sizes, seed

        sizes = Sizes(self.args.segment_mib << 20)
        self.sizes = sizes
        self.deployment = seed(self.api, sizes)
        dep = self.deployment
        self.say(f"seeded: tenants acme ({sizes.acme_quota >> 20} MiB) and globex ({sizes.globex_quota >> 20} MiB), "
                 f"{len(dep.model_ids)} models, {len(dep.release_ids)} releases (production-2026-07 serving, "
                 f"production-2026-08 warming), {len(dep.group_salts)} request groups, "
                 f"{len(dep.instances) + 1} instances on node-a/node-b")

    def start_agents(self) -> None:
        """Start ``python -m agent run`` for node-a (prefill) and node-b (decode, with the hand-typed launch
        value of its misconfigured instance)."""
        from demo.scenario import DECODE_NODE, NODES, launch_overrides

        argvs: dict[str, list[str]] = {}
        for node in NODES:
            secret_file = self.agent_secret_file(node, self.deployment.node_ids[node])
            argv = [*AGENT_COMMAND, "--node", node, "--broker", self.broker_url, "--secret-file", str(secret_file),
                    "--state-dir", str(self.agent_state_dir(node)), "--report-interval", "1",
                    "--heartbeat-interval", "2", "--pool", "solo", "--simulate-engines",
                    "--store-lease-ttl", f"{MASTER_LEASE_MS / 1000:g}"]
            if node == DECODE_NODE:
                overrides = self.var / f"{node}-launch.json"
                overrides.write_text(json.dumps(launch_overrides(), indent=2) + "\n")
                argv += ["--launch-overrides", str(overrides)]
            argvs[node] = argv
        self.launch_agents(argvs)
        self.say("agents node-a (prefill) and node-b (decode) running")

    def agent_secret_file(self, node: str, node_id: int) -> Path:
        """Write ``node``'s signing secret, read through the REST API, to ``<var-dir>/<node>.secret`` (mode 0600)."""
        secret_file = self.var / f"{node}.secret"
        secret = self.api.get(f"nodes/{node_id}/secret/")["signing_secret"]
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # the agent refuses a secret file others may read
        with os.fdopen(fd, "w") as handle:
            handle.write(secret)
        return secret_file

    def launch_agents(self, argvs: dict[str, list[str]]) -> None:
        """Start one agent per node (``{node: argv}``; a dead agent is restarted, see ``demo.procs``) and wait up to
        120 s for each to be ready."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "DJANGO_"))}
        env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
        for node, argv in argvs.items():
            self.agents[node] = self.sup.start(Service(f"agent {node}", argv, env, self.logs / f"agent-{node}.log",
                                                       restart=True))
        for node, service in self.agents.items():
            service.wait_until(lambda s=service: "ready." in s.log_text(), 120, f"agent {node} to be ready")

    def wait_synced(self, timeout: float = 90) -> None:
        """Wait until both agents acked the newest config, the master has both tenants' quotas and both
        segments are mounted."""
        from demo.api import ApiError

        deadline = time.monotonic() + timeout
        want_capacity = 2 * (self.args.segment_mib << 20)
        state: dict[str, Any] = {}
        while True:
            self.sup.check_all()
            try:
                nodes = {n["node_name"]: n for n in self.api.iterate("telemetry/nodes/")}
                quotas = {q["tenant_id"]: q for q in self.master.tenant_quotas()}
                capacity = self.master.metrics().get("master_total_capacity_bytes", 0)
            except (ApiError, OSError) as exc:
                nodes, quotas, capacity = {}, {}, 0
                state["error"] = str(exc)
            state = {"nodes": {name: (n["acked_version"], n["desired_version"]) for name, n in nodes.items()},
                     "tenants": sorted(quotas), "capacity": capacity}
            acked = all(name in nodes and nodes[name]["desired_version"] >= 1
                        and nodes[name]["acked_version"] == nodes[name]["desired_version"]
                        and nodes[name]["applied_digest"] == nodes[name]["desired_digest"]
                        for name in self.agents)
            if acked and {"acme", "globex"} <= set(quotas) and capacity >= want_capacity:
                break
            if time.monotonic() > deadline:
                self.check("config pushed and acked", False, f"not in sync after {timeout:.0f}s: {state}")
                raise DemoError(f"agents, master or quotas not in sync after {timeout:.0f}s: {state}")
            time.sleep(0.5)
        versions = ", ".join(f"{name} v{n['acked_version']}" for name, n in sorted(nodes.items()))
        self.check("config pushed and acked", True,
                   f"{versions} (signed documents, digests match); master has tenants acme, globex; "
                   f"pool {int(capacity) >> 20} MiB in 2 segments")

    # --- replay ---------------------------------------------------------------------------------------------

    def replay(self) -> Any:
        """Replay the trace; returns the :class:`demo.replay.Replayer` (its ``expected`` lookups)."""
        from celery import Celery

        from agent.contract.messages import node_queue
        from agent.sim.workload import WORKLOAD_TASK
        from demo.replay import Replayer, load_requests

        trace = Path(self.args.trace)
        requests = load_requests(trace, self.args.requests)
        app = Celery("kvpool-demo", broker=self.broker_url, set_as_current=False)
        app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_timeout=3,
                        broker_transport_options={"socket_connect_timeout": 3})

        def send(node: str, batch: dict) -> None:
            app.send_task(WORKLOAD_TASK, args=[batch], queue=node_queue(node), expires=900)

        replayer = Replayer(requests, self.deployment, send, speed=self.args.speed, batch_max=self.args.batch)
        span = replayer.state.trace_span_s
        self.say(f"replaying {len(requests)} requests of {trace.name} ({span:.0f}s of trace at {self.args.speed:g}x "
                 f"= {span / self.args.speed:.0f}s), {replayer.expected.total} lookup blocks expected")
        self.replayer = replayer
        state = replayer.run(tick=lambda s: self.progress(s))
        self.say(f"all {state.sent} requests sent in {state.batches} batches after {state.elapsed_s:.1f}s "
                 f"({state.sent / max(state.elapsed_s, 1e-9):.0f} requests/s)")
        return replayer

    def rows(self) -> dict:
        """Current per-scope rows (``demo.summary.ScopeRow`` by ``CacheScope``) from the dashboard's REST API."""
        from demo.summary import latest_samples, summarize

        return summarize(latest_samples(self.api))

    def progress(self, state: Any) -> dict:
        """Print one progress line; returns the rows it read."""
        from demo.api import ApiError
        from demo.summary import human_bytes

        self.sup.check_all()
        try:
            rows = self.rows()
        except ApiError as exc:
            self.say(f"progress unavailable: {exc}")
            return {}
        expected = self.replayer.expected
        counted = sum(min(rows[k].lookups, n) for k, n in expected.lookups.items() if k in rows)
        stored = sum(r.bytes for r in rows.values())
        blocks = sum(r.blocks for r in rows.values())
        hits = sum(r.hit_blocks for r in rows.values())
        lookups = sum(r.lookups for r in rows.values())
        evicted = sum(r.evicted_blocks for r in rows.values())
        queues = {node: self._queue_len(f"agent.{node}") for node in self.agents}
        sent = f"sent {state.sent}/{state.total}" if state is not None else "all sent"
        self.say(f"{sent} | processed {counted / max(expected.total, 1):.0%} of lookups | stored "
                 f"{human_bytes(stored)} in {blocks} blocks | hit ratio {hits / max(lookups, 1):.1%} | "
                 f"evicted {evicted} | queued a={queues.get('node-a', '?')} b={queues.get('node-b', '?')}")
        return rows

    def _queue_len(self, key: str) -> int | str:
        try:
            return int(self._redis.llen(key))
        except Exception:
            return "?"

    def wait_processed(self) -> dict:
        """Wait until the dashboard counts every lookup the replay caused; returns the final rows."""
        expected = self.replayer.expected.lookups
        deadline = time.monotonic() + self.args.timeout
        rows: dict = {}
        last_print = 0.0
        while True:
            self.sup.check_all()
            try:
                rows = self.rows()
            except Exception as exc:  # the API may be briefly busy; the deadline decides
                self.say(f"reading occupancy failed: {exc}")
                rows = {}
            missing = {k: n for k, n in expected.items() if (rows[k].lookups if k in rows else 0) < n}
            in_flight = sum(r.in_flight_requests for r in rows.values())
            if not missing and in_flight == 0:
                break
            if time.monotonic() > deadline:
                short = ", ".join(f"{'/'.join(k)}: {rows[k].lookups if k in rows else 0}/{n}"
                                  for k, n in list(missing.items())[:4])
                self.check("replay complete", False, f"not all lookups counted after {self.args.timeout:.0f}s "
                           f"({short}); {self.agent_errors()[1]}")
                return rows
            if time.monotonic() - last_print > 2:
                self.progress(None)
                last_print = time.monotonic()
            time.sleep(0.5)
        total = sum(expected.values())
        elapsed = self.replayer.state.elapsed_s
        self.check("replay complete", True,
                   f"{self.replayer.state.sent} requests, {total} lookup blocks counted by the dashboard after "
                   f"{elapsed:.1f}s ({self.replayer.state.sent / elapsed:.0f} requests/s end to end)")
        return rows

    def agent_state_dir(self, node: str) -> Path:
        """The ``--state-dir`` of ``node``'s agent."""
        return self.var / "agents" / node

    def agent_errors(self) -> tuple[dict[str, int], str]:
        """Totals of the agents' workload result files (``agent.sim.workload.RESULTS_FILE`` in each agent's
        state directory, one JSON line per batch): requests, failed requests, corrupted blocks."""
        from agent.sim.workload import RESULTS_FILE, ResultTotals, read_results

        totals = ResultTotals()
        for node in self.agents:
            totals.add(read_results(self.agent_state_dir(node) / RESULTS_FILE))
        return agent_totals_text(totals)

    # --- verdict --------------------------------------------------------------------------------------------

    def verdict(self, rows: dict) -> None:
        """Print the summary table and record the checks of ``--once``."""
        from demo.api import ApiError, BrowserSession
        from demo.scenario import MISTYPED_NAMESPACE
        from demo.summary import format_table

        registered = {(r["tenant_id"], r["served_model_name"], r["namespace"]) for r in self.api.iterate("releases/")}
        print()
        print("Cache scopes (from GET /api/v1/telemetry/occupancy/, summed over node-a and node-b; "
              "'hits P/D' = hit blocks on prefill/decode; '!' = release namespace not in the registry):")
        print(format_table(rows, registered))
        print()
        good = [k for k, r in rows.items() if k[:3] in registered and r.bytes > 0 and r.hit_ratio > 0]
        self.check("namespaces with bytes and hits", len(good) >= 4,
                   f"{len(good)} namespace(s) hold bytes with a non-zero hit ratio (need >= 4)")
        totals, text = self.agent_errors()
        shared = [k for k in good if rows[k].per_node.get("node-b", (0, 0))[0] > 0]
        self.check("prefill/decode sharing", len(shared) == len(good) and totals["failed"] == 0
                   and totals["corrupted"] == 0,
                   f"node-b loaded node-a's blocks in {len(shared)}/{len(good)} namespace(s); {text}")
        wrong = [r for k, r in rows.items() if k[2] == MISTYPED_NAMESPACE]
        lookups = sum(r.lookups for r in wrong)
        hits = sum(r.hit_blocks for r in wrong)
        self.check("misconfigured instance gets zero hits", bool(wrong) and lookups > 0 and hits == 0,
                   f"tag {MISTYPED_NAMESPACE!r} on node-b:8203: {hits} hit(s) in {lookups} looked-up block(s)")
        try:
            checks = BrowserSession(self.base_url, ADMIN, self.password).get_json("/checks/data.json")["checks"]
            flagged = [c for c in checks if c["status"] == "fail"
                       and any(MISTYPED_NAMESPACE in d for d in c.get("details", []))]
            if flagged:
                line = next(d for d in flagged[0]["details"] if MISTYPED_NAMESPACE in d)
                detail = f"check '{flagged[0]['title']}' fails: {line}"
            else:
                detail = "no failing check mentions " + MISTYPED_NAMESPACE
            statuses = ", ".join(f"{c['key']}={c['status']}" for c in checks)
            self.check("dashboard checks flag it", bool(flagged), f"{detail} [{statuses}]")
        except (ApiError, KeyError, StopIteration) as exc:
            self.check("dashboard checks flag it", False, f"reading /checks/data.json failed: {exc}")
        evicted = sum(r.evicted_blocks for r in rows.values())
        self.check("store filled to eviction", evicted > 0,
                   f"{evicted} block(s) evicted (agents keep each release under its budget, leaf first)")
        self.probe()

    def probe(self) -> None:
        """Run ``demo.probe`` on the Store (a subprocess: the Mooncake client logs to stderr)."""
        from demo.scenario import PREFILL_NODE

        node = self.api.get(f"telemetry/nodes/{PREFILL_NODE}/")
        document = node["document"]
        data = {"store": document["store"], "instances": document["instances"], "sample": 40,
                "requests": {json.dumps(list(k)): v for k, v in self.replayer.expected.requests.items()}}
        path = self.var / "probe-input.json"
        path.write_text(json.dumps(data))
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
        env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
        with open(self.logs / "probe.log", "wb") as log:
            done = subprocess.run([sys.executable, "-m", "demo.probe", str(path)], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=log, timeout=180)
        out = done.stdout.decode(errors="replace").strip().splitlines()
        try:
            findings = json.loads(out[-1])
        except (IndexError, ValueError):
            self.check("namespaces isolated", False, f"demo.probe exited {done.returncode} without findings; "
                       f"see {self.logs / 'probe.log'}")
            return
        detail = (f"{findings['pairs']} same-tenant namespace pairs: {findings['shared_keys']} shared keys among "
                  f"{findings['keys_compared']}; {findings['cross_found']} of {findings['probed_blocks']} probed "
                  f"objects found under another namespace's keys (own keys found: {findings['own_found']}); "
                  f"{findings['cross_tenant_found']} visible across tenants")
        if findings["problems"]:
            detail += "; " + "; ".join(findings["problems"][:3])
        self.check("namespaces isolated", bool(findings["ok"]) and done.returncode == 0, detail)

    def screenshot(self) -> None:
        """Save the occupancy page to ``--screenshot``."""
        from demo.screenshot import occupancy_screenshot

        path = Path(self.args.screenshot)
        try:
            occupancy_screenshot(self.base_url, ADMIN, self.password, path)
        except Exception as exc:
            self.check("screenshot", False, f"{type(exc).__name__}: {exc}")
            return
        self.check("screenshot", True, f"occupancy page saved to {path} ({path.stat().st_size} bytes)")

    # --- the run --------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the demo; returns the exit status."""
        self.prepare_var()
        self.start_redis()
        self.start_master()
        self.start_dashboard()
        print(f"\n  Dashboard: {self.base_url}/   login: {ADMIN} / {self.password}\n"
              f"  REST API:  {self.base_url}/api/v1/   header: Authorization: Token {self.token}\n"
              f"  Logs:      {self.logs}/\n", flush=True)
        self.seed()
        self.start_agents()
        self.wait_synced()
        self.replay()
        rows = self.wait_processed()
        self.verdict(rows)
        if self.args.screenshot:
            self.screenshot()
        failed = [c for c in self.checks if not c.ok]
        self.say(f"{len(self.checks) - len(failed)}/{len(self.checks)} checks passed"
                 + (f"; failed: {', '.join(c.name for c in failed)}" if failed else ""))
        if self.args.once:
            return 1 if failed else 0
        print(f"\n  Replay done. The dashboard keeps running: {self.base_url}/   login: {ADMIN} / {self.password}\n"
              "  Press Ctrl-C to stop every process the demo started.\n", flush=True)
        while True:
            time.sleep(30)
            self.sup.check_all()
            self.progress(None)

    def shutdown(self) -> None:
        """Stop every process this run started, newest first."""
        failed = self.sup.stop_all(lambda name: self.say(f"stopping {name}"))
        for line in failed:
            self.say(f"stopping {line}")
        if self._redis is not None:
            import redis

            try:  # after every process stopped, so no worker re-declares a queue
                if self._clean_redis:
                    deleted = self._delete_demo_keys(self._redis)
                    self.say(f"deleted {deleted} demo queue key(s) from Redis {self.broker_url}")
            except redis.RedisError as exc:
                self.say(f"could not delete the demo's queue keys from Redis {self.broker_url}: {exc}")
            finally:
                self._redis.close()


def agent_totals_text(totals: Any) -> tuple[dict[str, int], str]:
    """``({"requests", "failed", "corrupted"}, one-line text)`` of an ``agent.sim.workload.ResultTotals``
    (batches refused before they ran are named in the text; their requests never ran, so the replay check
    misses their lookups)."""
    counts = {"requests": totals.requests, "failed": totals.failed, "corrupted": totals.corrupted}
    text = (f"agents ran {counts['requests']} request(s): {counts['failed']} failed, "
            f"{counts['corrupted']} corrupted block(s)")
    if totals.refused:
        text += f", {totals.refused} batch(es) refused"
    return counts, text + (f"; first error: {totals.first_error[:300]}" if totals.first_error else "")


def _free_port() -> int:
    from agent.sim.master import free_ports

    return free_ports(1)[0]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m demo``."""
    args = parse_args(argv)
    if args.engine == "vllm":
        from demo.engine_demo import EngineDemo

        demo: Demo = EngineDemo(args)
    else:
        demo = Demo(args)
    # Ctrl-C also when started from a shell that ignores SIGINT for background jobs
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    status = 1
    try:
        status = demo.run()
    except KeyboardInterrupt:
        print(flush=True)
        demo.say("interrupted")
        status = 130 if not args.once else 1
    except DemoError as exc:
        demo.say(f"error: {exc}")
    except Exception as exc:  # an API or programming error: say what, then stop everything
        demo.say(f"error: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        # stopping must not be cut short by a second Ctrl-C; children also die with the demo (PDEATHSIG)
        held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        demo.shutdown()
        for sig, handler in held.items():
            signal.signal(sig, previous.get(sig, handler))
    demo.say(f"stopped; exit status {status}")
    return status
