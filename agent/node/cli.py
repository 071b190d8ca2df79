"""Command line of the node agent (no Django): ``kvpool-agent`` once installed, ``python -m agent`` in a checkout.

    kvpool-agent run --node NAME [--broker URL] [--secret-file F] [--state-dir D] [--instance-root D]
                        [--engine-unit-dir D] [--report-interval S] [--heartbeat-interval S] [--reconcile-interval S]
                        [--metrics-interval S] [--pool solo|threads] [--outbox-max N] [--loglevel LEVEL]
                        [--single-user] [--min-engine-uid UID] [--max-engine-uid UID]
                        [--simulate-engines [--launch-overrides F]]

The broker URL comes from ``--broker``, else ``$KVPOOL_BROKER_URL`` (a URL with the agent's Redis password does not
belong on a command line, which every local user can read: ``deploy/systemd/kvpool-agent.service`` sets it from a
0600 environment file).
The signing secret comes from ``--secret-file`` (refused when group or others may read it, or another account owns
it) or, when that is not given, from ``$KVPOOL_NODE_SECRET``; the agent refuses to start without one (it could not
verify any document). The agent runs with umask 077 and keeps its state directory 0700 (0711 when the instance root
is inside it), every file there 0600 (README "Users and permissions on a node", ``agent.node.accounts``).
The state directory (default
``$KVPOOL_AGENT_STATE_DIR`` or ``~/.local/state/kvpool-agent/<node>``) keeps the last applied document and the
outbox of undelivered reports across restarts, and the blocks this node owns in the Store (``ledger.sqlite3``,
:mod:`agent.node.ledger_file`): a restarted agent reports them again until its reconcile finds them gone.

Real engines (``agent.node.engines.NodeEngines``): on every applied document the agent writes
``<instance-root>/<instance_id>/`` (``launch.sh``, ``env``, ``launch.json``, ``mooncake.json``; default
``<state-dir>/instances``) for each instance's launch spec — an engine launcher needs nothing but that directory
(systemd: ``EnvironmentFile=<dir>/env``, ``ExecStart=<dir>/launch.sh``, as ``deploy/systemd/kvpool-engine@.service``
whose account ``--engine-unit-dir`` names in one drop-in per instance, ``agent.node.unit_dropins``; a pod: an init
step running ``launch.sh``) —, runs the node's ``mooncake_client`` in ``standalone-store`` mode, binds
``tcp://127.0.0.1:<kv_events_port>`` for the vLLM instances' KV events and attributes their Store writes into
its ledger, scrapes their ``/metrics`` every ``--metrics-interval`` seconds, holds releases and request groups
under their budgets, and every ``--reconcile-interval`` seconds checks the ledger against the Store (between those,
a few blocks per tenant every 5 s: a restarted master's lost objects leave the ledger within seconds).

``--simulate-engines`` (demo and tests, where no engine runs) also plays the engine instances of the applied
document against the Store: it mounts this node's segment when a document is applied and runs workload batches
(task ``agent.run_workload``, see ``agent.sim.workload``), appending one JSON line per batch to
``workload-results.jsonl`` in the state directory; ``--launch-overrides`` gives engines hand-typed launch
values that differ from their release (a misconfiguration, on purpose). The simulator then is the node's engines:
the agent still writes the instance directories, but runs no store client, no observer and no engine maintenance;
the simulator reconciles its ledger with the Store every 2 s, also between batches.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from agent.contract.names import is_node_name
from agent.node.cli_args import broker_url, positive_float, positive_int

log = logging.getLogger("kvpool.agent")

#: ``--loglevel`` values (those of :mod:`logging` and of Celery's ``--loglevel``).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def prog_name() -> str:
    """How the agent was started, for usage and error lines: the console script's name (``kvpool-agent``), else
    ``python -m agent`` (``sys.argv[0]`` is then a ``.py`` file, or ``-c``)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not name or name == "-c" or name.endswith(".py"):
        return "python -m agent"
    return name


class _OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``<prog>: error: <message>`` on stderr, exit status 2 (as
    the agent's own checks after parsing, ``_usage_error``), without argparse's usage block; ``--help`` shows it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool-agent`` / ``python -m agent`` argument parser (its errors and its ``run`` subcommand's are
    one line: ``kvpool-agent run: error: …``, exit status 2)."""
    parser = _OneLineErrorParser(prog=prog_name(), description="KV-cache pool node agent")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent: a Celery worker on queue agent.<node> plus telemetry")
    run.add_argument("--node", required=True, help="node name as registered in the dashboard")
    run.add_argument("--broker", type=broker_url,
                     help="Celery broker URL: redis://host[:port][/db] or rediss://... (memory:// in tests); "
                          "default $KVPOOL_BROKER_URL")
    run.add_argument("--secret-file", help="file holding the node's signing secret (else $KVPOOL_NODE_SECRET)")
    run.add_argument("--state-dir", help="directory for the applied document, the outbox and the ledger file")
    run.add_argument("--instance-root", metavar="DIR",
                     help="directory of the instance directories (<instance_id>/launch.sh, env, ...) the agent "
                          "writes for each applied document (default <state-dir>/instances)")
    run.add_argument("--engine-unit-dir", metavar="DIR",
                     help="write each instance's account as a systemd drop-in DIR/kvpool-engine@<instance_id>"
                          ".service.d/kvpool-account.conf (User=, Group=) for deploy/systemd/kvpool-engine@.service, "
                          "e.g. /etc/systemd/system (default: none)")
    run.add_argument("--report-interval", type=positive_float, default=10.0, help="seconds between reports")
    run.add_argument("--heartbeat-interval", type=positive_float, default=5.0,
                     help="seconds between heartbeats")
    run.add_argument("--reconcile-interval", type=positive_float, default=30.0,
                     help="seconds between checks of engine-written blocks against the Store (default 30; each "
                          "check leases the checked objects for the master's --default_kv_lease_ttl, during "
                          "which budget removals skip them: keep it well above that TTL)")
    run.add_argument("--store-lease-ttl", type=positive_float, default=10.0, metavar="S",
                     help="the Store master's --default_kv_lease_ttl in seconds (default 10, Mooncake 0.3.13.post1's "
                          "default): a block this agent's check found present is not checked again within it, and "
                          "reconciles leave the budgets' next victims out (docs/eviction.md section 8). Set it to the "
                          "master's value when that is shorter")
    run.add_argument("--metrics-interval", type=positive_float, default=5.0,
                     help="seconds between scrapes of each vLLM instance's /metrics (default 5)")
    run.add_argument("--budget-policy", choices=["hit-density", "hit-density-inferred", "lru"],
                     default="hit-density",
                     help="which blocks budgets remove first (real engines): hit-density, the prefix-aware policy "
                          "(default); hit-density-inferred, the same counting a store under a cached prefix as a "
                          "read of it; or lru, the least recently stored leaf (agent.datapath.budget.BUDGET_POLICIES)")
    run.add_argument("--orphan-collection", choices=["pressure", "eager", "off"], default="pressure",
                     help="real engines: when this node's orphaned blocks (below a block that left the Store, which "
                          "no lookup can reach) are removed: pressure (default), only while the tenant is over a "
                          "budget or the master evicted inside it in the last minute, before any reachable block; "
                          "eager, every maintenance round; off, never (left to the master's eviction)")
    run.add_argument("--keep-orphans", dest="orphan_collection", action="store_const", const="off",
                     help="the same as --orphan-collection off")
    run.add_argument("--pool", choices=["solo", "threads"], default="solo", help="Celery pool (default solo)")
    run.add_argument("--outbox-max", type=positive_int, default=20_000,
                     help="most undelivered reports/acks kept on disk")
    run.add_argument("--loglevel", type=str.upper, choices=LOG_LEVELS, default="INFO",
                     help="logging level (default INFO)")
    run.add_argument("--single-user", action="store_true",
                     help="run every engine instance as the agent's own account, even as root (demos, development "
                          "machines): instance directories are not given to the tenants' engine accounts, and "
                          "instances on the node are not kept from each other's files and sockets")
    run.add_argument("--min-engine-uid", type=positive_int, default=None, metavar="UID",
                     help="lowest uid an engine instance's account may have (default: UID_MIN of /etc/login.defs, "
                          "else 1000): system accounts below it are refused, the instance is not observed")
    run.add_argument("--max-engine-uid", type=positive_int, default=None, metavar="UID",
                     help="highest uid an engine instance's account may have (default: UID_MAX of /etc/login.defs, "
                          "else 60000; nobody is 65534)")
    run.add_argument("--simulate-engines", action="store_true",
                     help="play the document's engine instances: run agent.run_workload batches through the "
                          "connector into the Store (where no engine runs)")
    run.add_argument("--launch-overrides", metavar="FILE",
                     help="with --simulate-engines: JSON {port: {namespace, cache_salt}} of engines started by "
                          "hand with values other than their release's")
    return parser


def _broker(args: argparse.Namespace) -> str:
    """The broker URL: ``--broker``, else ``$KVPOOL_BROKER_URL`` (checked like ``--broker``)."""
    if args.broker:
        return args.broker
    value = os.environ.get("KVPOOL_BROKER_URL", "").strip()
    if not value:
        _usage_error("no broker: pass --broker URL or set KVPOOL_BROKER_URL")
    try:
        return broker_url(value)
    except argparse.ArgumentTypeError as exc:
        _usage_error(f"KVPOOL_BROKER_URL: {exc}")


def _secret(args: argparse.Namespace) -> str:
    from agent.contract.signing import load_secret
    from agent.node.accounts import secret_file_problem

    if args.secret_file:
        try:
            problem = secret_file_problem(Path(args.secret_file))
            if problem:
                _usage_error(f"--secret-file: {problem}")
            return load_secret(args.secret_file)
        except (OSError, ValueError) as exc:
            _usage_error(f"cannot read --secret-file: {exc}")
    secret = os.environ.get("KVPOOL_NODE_SECRET", "").strip()
    if not secret:
        _usage_error("no signing secret: pass --secret-file FILE or set KVPOOL_NODE_SECRET")
    return secret


def _state_dir(args: argparse.Namespace) -> Path:
    """The state directory: ``--state-dir``, else ``$KVPOOL_AGENT_STATE_DIR``, else the XDG default."""
    if args.state_dir:
        return Path(args.state_dir)
    if os.environ.get("KVPOOL_AGENT_STATE_DIR"):
        return Path(os.environ["KVPOOL_AGENT_STATE_DIR"])
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "kvpool-agent" / args.node


def check_state_dir(path: Path) -> str | None:
    """Create ``path`` (with its parents) when missing; returns why it cannot be the state directory, else None.

    The agent writes ``applied.json``, ``outbox.sqlite3``, ``ledger.sqlite3`` and ``lock`` there, so it must be a
    writable directory.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"{path} exists and is not a directory"
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror or exc}"
    if not path.is_dir():
        return f"{path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    return None


def _usage_error(message: str) -> NoReturn:
    """Exit with status 2 and ``message``, as argparse does for a bad argument."""
    print(f"{prog_name()} run: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run(args: argparse.Namespace) -> int:
    """Start the daemon's telemetry thread and the Celery worker; returns the exit status."""
    if not is_node_name(args.node):
        _usage_error(f"--node {args.node!r} is not a valid node name: 1-63 lower-case letters, digits or inner '-' "
                     "(the registry's rule, e.g. 'node-a')")
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    from agent.node.accounts import restrict_umask

    restrict_umask()  # nothing the agent creates is readable by group or others (README "Users and permissions")
    from agent.datapath.ledger import Ledger
    from agent.node.celery_app import make_app, make_publisher, register_tasks, run_worker
    from agent.node.daemon import Daemon
    from agent.node.purge import daemon_store_opener, register_purge_task

    if args.launch_overrides and not args.simulate_engines:
        _usage_error("--launch-overrides needs --simulate-engines")
    broker = _broker(args)
    try:
        app = make_app(args.node, broker)
    except ValueError as exc:
        _usage_error(str(exc))
    secret = _secret(args)
    state_dir = _state_dir(args)
    problem = check_state_dir(state_dir)
    if problem:
        _usage_error(f"{'--state-dir' if args.state_dir else 'state directory'}: {problem}")
    ledger = Ledger()
    simulator = _simulator(args, ledger, state_dir)
    engines = _engines(args, ledger, state_dir, observe=simulator is None)
    _secure_state_dir(state_dir, engines.instance_root)
    hooks: dict[str, Any] = ({"snapshot": simulator.snapshot, "launched_scopes": simulator.launched_scopes}
                             if simulator else {})
    on_apply = ([simulator.on_apply] if simulator else []) + [engines.on_apply]
    try:
        daemon = Daemon(args.node, secret, state_dir, publish=make_publisher(app),
                        report_interval=args.report_interval, heartbeat_interval=args.heartbeat_interval,
                        outbox_max=args.outbox_max, ledger=ledger, on_apply=on_apply,
                        report_fields=engines.report_fields, single_user=engines.single_user, **hooks)
    except RuntimeError as exc:
        raise SystemExit(f"error: {exc}") from None
    except OSError as exc:  # e.g. a read-only file already in the state directory
        _usage_error(f"state directory {state_dir}: {exc}")
    ledger_file = _restore_ledger(ledger, state_dir)
    register_tasks(app, daemon)
    from agent.node.freshness import SEEN_PURGES_FILE, SeenPurges

    register_purge_task(app, node=args.node, secret=secret, open_store=daemon_store_opener(daemon),
                        ledger=daemon.ledger, seen=SeenPurges(state_dir / SEEN_PURGES_FILE))
    if simulator is not None:
        from agent.sim.workload import register_workload_task

        register_workload_task(app, simulator)
    if daemon.current is not None:  # resumed from the state directory: bind its instances, observe its engines
        daemon.run_hooks(daemon.current)
    engines.start()
    if simulator is not None:
        simulator.start_maintenance()
    daemon.start()
    try:
        status = run_worker(app, args.node, pool=args.pool, loglevel=args.loglevel)
    finally:
        daemon.stop()
        engines.close()
        if simulator is not None:
            simulator.close()
        if ledger_file is not None:
            ledger_file.close()
    if status:
        log.error("node %s: the Celery worker stopped with status %s (see the errors above)", args.node, status)
    return status


def _secure_state_dir(state_dir: Path, instance_root: Path) -> None:
    """Make the state directory the agent's alone (``agent.node.accounts.secure_state_dir``): 0700, or 0711 when the
    instance root is inside it (engines must reach their directories); its files 0600."""
    from agent.node.accounts import inside, secure_state_dir

    traversable = inside(instance_root, state_dir)
    try:
        secure_state_dir(state_dir, traversable=traversable)
    except OSError as exc:
        _usage_error(f"state directory {state_dir}: cannot make it the agent's alone: {exc}")
    log.info("state directory %s: mode %s, files 0600", state_dir, "0711 (it holds the instance root)"
             if traversable else "0700")


def _restore_ledger(ledger, state_dir: Path):
    """Take back the blocks an earlier agent on this state directory owned (``ledger.sqlite3``, see
    :mod:`agent.node.ledger_file`) and keep the file following ``ledger``; returns the
    :class:`agent.node.ledger_file.LedgerFile` (None, logged, when no file can be made there). Runs once the daemon
    holds the state directory's lock and before anything reports or records: the simulator's and the engines'
    reconciles drop what left the Store meanwhile."""
    import sqlite3

    from agent.node.ledger_file import open_ledger_file

    try:
        return open_ledger_file(ledger, state_dir)
    except (OSError, sqlite3.Error) as exc:  # no file can be made there: run, but a restart starts empty
        log.error("node ledger file in %s cannot be written (%s: %s): running without one; a restart will "
                  "report no blocks until the engines write again", state_dir, type(exc).__name__, exc)
        return None


def _engines(args: argparse.Namespace, ledger, state_dir: Path, *, observe: bool):
    """The node's :class:`agent.node.engines.NodeEngines` (instance directories under ``--instance-root``; with
    ``observe``, also the store client, the engine observer and the maintenance)."""
    from agent.node.accounts import EngineAccountRules
    from agent.node.engines import NodeEngines, tune_gc

    root = Path(args.instance_root) if args.instance_root else state_dir / "instances"
    problem = check_state_dir(root)
    if problem:
        _usage_error(f"--instance-root: {problem}" if args.instance_root else f"instance directory root: {problem}")
    if observe:
        tune_gc()  # attribution of engine writes allocates per block (agent.node.engines.ENGINE_GC_THRESHOLD)
    return NodeEngines(args.node, ledger, root, state_dir=state_dir, observe=observe,
                       reconcile_interval=args.reconcile_interval, metrics_interval=args.metrics_interval,
                       is_privileged=False if args.single_user else None, unit_dir=args.engine_unit_dir,
                       account_rules=EngineAccountRules(min_uid=args.min_engine_uid, max_uid=args.max_engine_uid),
                       budget_policy=args.budget_policy, orphan_collection=args.orphan_collection,
                       lease_ttl=args.store_lease_ttl)


def _simulator(args: argparse.Namespace, ledger, state_dir: Path):
    """The ``--simulate-engines`` engine simulator (``None`` without the flag); it appends each batch's result
    to ``workload-results.jsonl`` in the state directory."""
    if not args.simulate_engines:
        return None
    from agent.sim.workload import RESULTS_FILE, EngineSimulator, ResultFile, load_overrides

    overrides = None
    if args.launch_overrides:
        try:
            overrides = load_overrides(args.launch_overrides)
        except (OSError, ValueError) as exc:
            _usage_error(f"--launch-overrides: {exc}")
    return EngineSimulator(args.node, ledger, overrides=overrides, results=ResultFile(state_dir / RESULTS_FILE),
                           lease_ttl=args.store_lease_ttl)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``kvpool-agent`` and ``python -m agent``."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # argparse would name the top-level program; every option belongs to ``run``
        _usage_error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "run":
        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
