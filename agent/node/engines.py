"""The node agent's side of real engine instances: what it prepares, runs and watches for them.

:class:`NodeEngines` is an ``on_apply`` hook of :class:`agent.node.daemon.Daemon` (chained after the engine
simulator's with ``--simulate-engines``) and the source of every report's per-instance engine facts. For each
applied config document (schema 2, ``agent.contract.messages``):

1. **Instance directories.** ``<instance_root>/<instance_id>/`` for every instance with a ``launch`` spec
   (``agent.node.instance_dirs.write_instance_dirs``: ``launch.sh``, ``env``, ``launch.json`` and the rendered
   files such as ``mooncake.json``); directories of instances that left the document go. An engine launcher needs
   nothing but that directory: a systemd unit with ``EnvironmentFile=<dir>/env`` and ``ExecStart=<dir>/launch.sh``
   (``KVPOOL_ENGINE_PYTHON`` names the engine environment's interpreter; ``deploy/systemd/kvpool-engine@.service``,
   whose ``User=`` the agent writes as a drop-in under ``unit_dir``: ``agent.node.unit_dropins``), or a pod's init
   step that runs ``launch.sh``. The agent never starts engines itself.
2. **The node's store client** (``node_settings.store_mode == "standalone-store"``): one supervised
   ``mooncake_client`` (``agent.node.segment.SegmentSupervisor``) with the rendered argv, restarted when the argv
   changes, stopped when the node goes back to ``embedded`` mode.
3. **KV events and metrics** (vLLM 0.32.0/0.33.0): one :class:`agent.engines.vllm.observer.EngineObserver` connects
   to each vLLM instance's own socket (``ipc://kv-events.sock`` in its instance directory, bound by its engine;
   ``agent.contract.kv_events``) once it proved that only the instance's account could have made it
   (``agent.engines.vllm.transport``; retried with backoff, refusals reported per instance), attributes the
   engines' Store writes (booked into the node's ledger, exactly as the connector records its own puts, once the
   Store confirms them: **confirm** below), and scrapes each instance's ``/metrics``. A document without vLLM
   instances (or without ``node_settings``) runs no observer.

Accounts (``agent.node.accounts``, README "Users and permissions on a node"): each instance's directory belongs to
the account its launch names (``LaunchSpec.user``), which must own its socket. An agent that is not privileged
uses its own account for every instance and logs it once.

A maintenance thread (every ``interval`` seconds, :meth:`NodeEngines.tick`) books engine-written blocks and then
runs the node-maintenance policy the simulator runs too (``agent.datapath.maintenance``); between those ticks it wakes
every ``CONFIRM_INTERVAL`` (0.5 s) for a light round (:meth:`NodeEngines.signal_tick`: confirm the engines' writes,
then only the eviction signal, whose counters are polled every second while the applied document names the masters'
metrics), so the ledger books a write and follows a master eviction within about a second, not a whole tick:

* **confirm** (first) — engine events are hints: an attributed block waits in its instance's pending set until the
  Store client of the instance's tenant finds its key (:meth:`NodeEngines.confirm_writes`,
  ``agent.datapath.pending``); only then is it booked into the ledger, so the ledger matches the Store within a
  tick of the write and nothing below (budgets, orphans) ever acts on a block the Store does not hold. Blocks still
  absent after the grace are ``unconfirmed``; before that verdict the engines bound to the instance's events are
  looked up in ``/proc`` (``agent.engines.vllm.processes``, at most every ``namespace_scan_interval`` seconds) and
  the blocks checked under the key prefix they really write under (``unknown_namespace_keys``);
* **hits** — the engines' external prefix-cache counters (tokens the KV connector looked up in / loaded from the
  Store) become the ledger's ``hit_blocks`` / ``miss_blocks`` of the instance's release row of engine lookups
  (``agent.contract.scope.ENGINE_LOOKUPS``: an engine's lookups are not told apart by request group): ``hit_blocks`` =
  ``external_prefix_cache_hits // block_size``, ``miss_blocks`` = ``(external_prefix_cache_queries -
  external_prefix_cache_hits) // block_size``, both over the tokens counted since the agent started (the
  remainders carry over, so the counters only grow);
* **budgets, orphans, reconcile and probes** — ``agent.datapath.maintenance.Maintenance.tick`` with the budgets of
  the observed instances (:meth:`NodeEngines.budgets`, this node's shares) and one Store client per tenant, opened
  lazily, mounting **no** segment (``ENGINE_STORE_SEGMENT_BYTES``: memory it mounted would receive engine objects
  that vanish with the agent). Blocks of an embedded-mode engine that stopped (its segment left the pool) leave the
  ledger at the next reconcile like evicted ones.

``observe=False`` (``--simulate-engines``: the simulator plays the engines and mounts the node's memory) keeps
step 1 only. No Django here.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.contract.messages import ConfigDocument, InstanceStats, Report, StoreEndpoints, clamped, printable
from agent.contract.scope import ENGINE_LOOKUPS, CacheScope
from agent.datapath.maintenance import (
    DEFAULT_FOREIGN_CHECK_INTERVAL,
    DEFAULT_LEASE_TTL,
    DEFAULT_ORPHAN_RULE,
    DEFAULT_PROBE_INTERVAL,
    DEFAULT_RECONCILE_INTERVAL,
    DEFAULT_RECONCILE_SAMPLE,
    Budget,
    Maintenance,
    document_budgets,
)
from agent.node.accounts import Account, AccountError, EngineAccountRules, privileged, resolve_account

log = logging.getLogger("kvpool.agent.engines")

#: Default seconds between maintenance ticks (hits, budgets).
DEFAULT_INTERVAL = 2.0
#: Seconds between light rounds (confirm the engines' writes, the eviction signal) between ticks: at the engine
#: pressure bench's pace (600 KiB/s per node) a second of unbooked writes is already 5 % of a 12 MiB tenant.
CONFIRM_INTERVAL = 0.5
#: Default seconds between ``/metrics`` scrapes of each engine instance.
DEFAULT_METRICS_INTERVAL = 5.0
#: Segment the maintenance Store clients mount: none (they only check and remove keys).
ENGINE_STORE_SEGMENT_BYTES = 0
#: Transfer buffer of the maintenance Store clients (bytes; they move no data).
ENGINE_STORE_BUFFER_BYTES = 16 << 20
#: Seconds between scans of the node's engine command lines for the namespace an engine really writes under (only
#: when some attributed block was not found in the Store).
NAMESPACE_SCAN_INTERVAL = 30.0
#: Log file of the node's ``mooncake_client``, in the agent's state directory.
STORE_CLIENT_LOG = "mooncake_client.log"
#: ``gc.set_threshold`` of an agent that observes engines (:func:`tune_gc`). The ledger and the eviction policy
#: allocate a few tracked objects per attributed block; with Python's default first-generation threshold (700) the
#: collector then runs every few hundred blocks and walks the young, still-growing tables. Measured with
#: ``python -m bench.engine_ingest`` on this project's 2-core machine: attribution with a budget enforcer 36k-39k
#: Store blocks/s/core with the defaults, 54k-69k with this threshold (without a budget 75k-83k -> 115k-120k).
ENGINE_GC_THRESHOLD = (50_000, 20, 100)

#: ``(StoreEndpoints, tenant_id) -> StoreClient`` (tests pass fakes; default ``agent.datapath.store.open_store``).
StoreOpener = Callable[[StoreEndpoints, str], Any]


def tune_gc() -> None:
    """Raise the collector's thresholds to ``ENGINE_GC_THRESHOLD`` for this process (the agent's ``run`` does it when
    it observes engines; process-wide, so library code and tests leave it alone)."""
    import gc

    gc.set_threshold(*ENGINE_GC_THRESHOLD)


def _instance_stats(**fields: Any) -> InstanceStats:
    """``InstanceStats`` of ``fields`` with each counter clamped to its contract bound (``MAX_COUNT``: a counter of
    a long-running agent is reported at the bound rather than refused by the dashboard)."""
    return InstanceStats.model_validate(clamped(InstanceStats, fields))


def _utc(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None


@dataclass
class _Credit:
    """Tokens an instance's engine counted (external prefix cache) and the blocks already credited for them."""

    scope: CacheScope
    block_size: int
    hit_tokens: float = 0.0
    query_tokens: float = 0.0
    seen_hits: float = 0.0       # the tracker totals last read (a lower value: a new tracker started from 0)
    seen_queries: float = 0.0
    hit_blocks: int = 0
    miss_blocks: int = 0


class NodeEngines:
    """Everything the agent does for its node's real engine instances (module docstring).

    Args:
        node: this node's name (log lines).
        ledger: the node's ``agent.datapath.ledger.Ledger`` (attributed blocks, reconcile, budgets, hits).
        instance_root: directory of the instance directories (created when missing).
        state_dir: where the ``mooncake_client`` log goes (default: ``instance_root``'s parent).
        observe: run the store client, the observer and the maintenance (False: instance directories only).
        interval: seconds between maintenance ticks (<= 0: no thread; call :meth:`tick`).
        reconcile_interval: seconds between reconciles with the Store (checked at each tick).
        metrics_interval: seconds between ``/metrics`` scrapes of each instance (0: none).
        reconcile_sample: blocks sampled per tenant and tick (None: every block).
        probe_interval: seconds between Store probes of ``PROBE_SAMPLE`` blocks per tenant (<= 0: none).
        foreign_check_interval: seconds between checks of foreign parents (:meth:`_collect_orphans`).
        store_opener: opens a maintenance Store client (default ``agent.datapath.store.open_store``).
        observer_options: extra keyword arguments of each ``EngineObserver`` (tests: ``fetch``, ``metrics_host``).
        segment_options: extra keyword arguments of the ``SegmentSupervisor`` (tests: ``binary``).
        is_privileged: whether instance directories are given to the instances' accounts (None: whether this
            process can, ``agent.node.accounts.privileged``; False: every instance uses the agent's account).
        proc_root: where the engines' command lines are read (``/proc``; tests pass a directory of their own).
        namespace_scan_interval: seconds between those scans.
        unit_dir: where each instance's systemd drop-in naming its account goes (``agent.node.unit_dropins``;
            None: none written).
        account_rules: which accounts may be an instance's (``agent.node.accounts.EngineAccountRules``; None:
            the defaults, login.defs' uid range; tests with throwaway system accounts pass their own minimum).
        budget_policy: the eviction policy budgets remove by (``agent.datapath.budget.BUDGET_POLICIES``:
            ``hit-density``, the default, or ``lru``).
        orphan_collection: the maintenance's orphan rule (``agent.datapath.maintenance.ORPHAN_RULES``: ``pressure``,
            the default, ``eager`` or ``off``).
        lease_ttl: the Store master's ``--default_kv_lease_ttl`` in seconds (the maintenance's lease-aware
            reconciles, ``agent.datapath.maintenance``).

    Thread-safety: :meth:`on_apply` (the worker thread), :meth:`tick` (the maintenance thread) and
    :meth:`report_fields` (the telemetry thread) may run at once; state changes happen under one lock, Store
    calls outside it.
    """

    def __init__(self, node: str, ledger: Any, instance_root: str | Path, *, state_dir: str | Path | None = None,
                 observe: bool = True, interval: float = DEFAULT_INTERVAL,
                 reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL,
                 metrics_interval: float = DEFAULT_METRICS_INTERVAL,
                 reconcile_sample: int | None = DEFAULT_RECONCILE_SAMPLE, store_opener: StoreOpener | None = None,
                 probe_interval: float = DEFAULT_PROBE_INTERVAL,
                 foreign_check_interval: float = DEFAULT_FOREIGN_CHECK_INTERVAL,
                 observer_options: Mapping[str, Any] | None = None,
                 segment_options: Mapping[str, Any] | None = None, is_privileged: bool | None = None,
                 proc_root: str | Path = "/proc", namespace_scan_interval: float = NAMESPACE_SCAN_INTERVAL,
                 unit_dir: str | Path | None = None, account_rules: EngineAccountRules | None = None,
                 budget_policy: str = "hit-density", orphan_collection: str | bool = DEFAULT_ORPHAN_RULE,
                 lease_ttl: float = DEFAULT_LEASE_TTL) -> None:
        self.node = node
        self.account_rules = account_rules or EngineAccountRules()
        self.unit_dir = Path(unit_dir) if unit_dir is not None else None
        self.ledger = ledger
        self.instance_root = Path(instance_root)
        self.state_dir = Path(state_dir) if state_dir is not None else self.instance_root.parent
        self.observe = observe
        self.interval = interval
        self.metrics_interval = metrics_interval
        self._store_opener = store_opener
        self.observer_options = dict(observer_options or {})
        self.segment_options = dict(segment_options or {})
        self.budget: Any = None
        #: The node-maintenance policy (``agent.datapath.maintenance``): budgets, orphans, reconcile, probes.
        self.maintenance: Maintenance | None = None
        if observe:
            from agent.datapath.budget import BudgetEnforcer, budget_policy_factory

            self.budget = BudgetEnforcer(ledger, budget_policy_factory(budget_policy))
            self.maintenance = Maintenance(node, ledger, self.budget, self._store,
                                           reconcile_interval=reconcile_interval, reconcile_sample=reconcile_sample,
                                           probe_interval=probe_interval,
                                           foreign_check_interval=foreign_check_interval,
                                           orphan_collection=orphan_collection, lease_ttl=lease_ttl,
                                           on_problem=self._problem, on_store_failure=self._close_store)
        self.document: ConfigDocument | None = None
        self.observer: Any = None       # agent.engines.vllm.observer.EngineObserver
        self.segment: Any = None        # agent.node.segment.SegmentSupervisor
        self.instance_dirs: list[Path] = []
        #: What went wrong last, per part (``instance_dirs``, ``unit_dropins``, ``store_client``, ``observer``,
        #: ``store:<tenant>``, ``budget``, ``orphans``); a part that works again is removed.
        self.errors: dict[str, str] = {}
        self.proc_root = Path(proc_root)
        self.namespace_scan_interval = namespace_scan_interval
        self._launches: list[Any] = []              # agent.engines.vllm.processes.EngineLaunch of the last scan
        self._launches_at: float | None = None      # time.monotonic() of that scan
        #: Sums of every confirmation step: ``confirmed``, ``unconfirmed`` blocks.
        self.confirm_totals = {"confirmed": 0, "unconfirmed": 0}
        self.privileged = privileged() if is_privileged is None else is_privileged
        #: instance id -> the account it runs as here, or why it has none (``AccountError``)
        self.accounts: dict[str, Account | AccountError] = {}
        self._fallback_logged = False
        self._credits: dict[str, _Credit] = {}
        self._stores: dict[str, tuple[StoreEndpoints, Any]] = {}  # tenant -> (endpoints it was opened with, client)
        self._lock = threading.RLock()
        self._tick_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- config -------------------------------------------------------------------------------------------

    def on_apply(self, applied: Any) -> None:
        """Daemon hook: take a newly applied document (a duck-typed ``AppliedConfig``, or a ``ConfigDocument``).

        Each part (directories, store client, observer) is done on its own: a failure is logged, kept in
        :attr:`errors` and does not stop the others (the document stays applied).
        """
        document: ConfigDocument = getattr(applied, "document", applied)
        with self._lock:
            self.document = document
            self._write_dirs(document)
            if not self.observe:
                return
            self._apply_store_client(document)
            self._apply_observer(document)
        if self.maintenance is not None:  # under the round's lock (after the other: tick takes them in that order)
            settings = document.node_settings
            with self._tick_lock:
                self.maintenance.set_master_metrics(settings.master_metrics_urls if settings is not None else ())

    def _write_dirs(self, document: ConfigDocument) -> None:
        from agent.node.instance_dirs import write_instance_dirs

        launches = [instance.launch for instance in document.instances if instance.launch is not None]
        self.accounts = self._resolve_accounts(launches)
        try:
            self.instance_dirs = write_instance_dirs(self.instance_root, launches, accounts=self.accounts)
        except Exception as exc:  # a bad launch or the disk: keep the old directories
            self._fail("instance_dirs", f"writing instance directories under {self.instance_root} failed: {exc}")
            return
        self.errors.pop("instance_dirs", None)
        if launches:
            log.info("node %s: %d instance director%s under %s", self.node, len(launches),
                     "y" if len(launches) == 1 else "ies", self.instance_root)
        if self.unit_dir is not None:
            from agent.node.unit_dropins import write_account_dropins

            try:
                write_account_dropins(self.unit_dir, self.accounts)
            except OSError as exc:
                self._fail("unit_dropins", f"writing engine unit drop-ins under {self.unit_dir} failed: {exc}")
            else:
                self.errors.pop("unit_dropins", None)

    @property
    def single_user(self) -> bool:
        """Whether every instance runs as the agent's own account (not privileged, or ``--single-user``): instances
        on this node are then not kept from each other's files and sockets (the heartbeats say so)."""
        return not self.privileged

    def _resolve_accounts(self, launches: list[Any]) -> dict[str, Account | AccountError]:
        """The account of each launch (``agent.node.accounts.resolve_account``); problems logged and kept in
        :attr:`errors` (``account:<instance id>``)."""
        accounts: dict[str, Account | AccountError] = {}
        for launch in launches:
            try:
                account: Account | AccountError = resolve_account(
                    launch.user, is_privileged=self.privileged, rules=self.account_rules)
            except AccountError as exc:
                account = exc
                self._fail(f"account:{launch.instance_id}", f"instance {launch.instance_id}: {exc}")
            else:
                self.errors.pop(f"account:{launch.instance_id}", None)
            accounts[launch.instance_id] = account
        for part in [p for p in self.errors if p.startswith("account:") and p[len("account:"):] not in accounts]:
            self.errors.pop(part)
        if launches and not self.privileged and not self._fallback_logged:
            self._fallback_logged = True
            own = next(iter(accounts.values()))
            log.warning("node %s: single-user mode (the agent is not privileged: not root, no CAP_CHOWN/"
                        "CAP_DAC_OVERRIDE/CAP_FOWNER; or --single-user): every instance directory stays the agent's "
                        "(uid %s) and the engines must run as it; instances on this node are not kept from each "
                        "other's files and sockets", self.node, getattr(own, "uid", "?"))
        return accounts

    def event_source(self, instance: Any) -> Any:
        """Where ``instance`` publishes its KV events and who must own the socket
        (``agent.engines.vllm.transport.launch_source`` on its directory and its account)."""
        from agent.engines.vllm.transport import launch_source

        account = self.accounts.get(instance.instance_id)
        if isinstance(account, Account):
            return launch_source(instance, self.instance_root / instance.instance_id, account.uid)
        why = str(account) if account is not None else "no launch: it has no instance directory here"
        return launch_source(instance, self.instance_root / instance.instance_id, None, why)

    def _apply_store_client(self, document: ConfigDocument) -> None:
        from agent.node.segment import SegmentConfig, supervisor_for

        settings = document.node_settings
        try:
            config = None
            if settings is not None and settings.store_mode == "standalone-store" and settings.store_client_argv:
                config = SegmentConfig.from_argv(settings.store_client_argv)
            kwargs = {"log_path": self.state_dir / STORE_CLIENT_LOG, **self.segment_options}
            self.segment = supervisor_for(config, self.segment, **kwargs)
        except Exception as exc:  # no binary, bad flags: engines of this node have no store memory
            self._fail("store_client", f"the node's mooncake_client: {exc}")
            return
        self.errors.pop("store_client", None)

    def _vllm_instances(self, document: ConfigDocument | None) -> list[Any]:
        return [i for i in document.instances if i.engine == "vllm"] if document is not None else []

    def _apply_observer(self, document: ConfigDocument) -> None:
        settings = document.node_settings
        if settings is None or not self._vllm_instances(document):
            self._stop_observer()
            return
        from agent.engines.vllm.observer import EngineObserver

        try:
            if self.observer is None:
                self.observer = EngineObserver(self.ledger, source_for=self.event_source,
                                               metrics_interval=self.metrics_interval, **self.observer_options)
            self.observer.apply(document)
            for iid, why in self.observer.apply_errors.items():
                log.error("node %s: instance %s is not observed: %s", self.node, iid, why)
            self._ensure_observer_running()
        except Exception as exc:
            self._fail("observer", f"observing engines: {exc}")

    def _ensure_observer_running(self) -> None:
        observer = self.observer
        if observer is None or observer.running:
            return
        observer.start()
        self.errors.pop("observer", None)
        log.info("node %s: observing the KV events of %d vLLM instance(s), one socket each", self.node,
                 len(self._vllm_instances(self.document)))

    def _stop_observer(self, why: str = "no vLLM instance left") -> None:
        observer, self.observer = self.observer, None
        if observer is not None:
            observer.stop()
            log.info("node %s: engine observer stopped (%s)", self.node, why)
        self.errors.pop("observer", None)

    def _fail(self, part: str, message: str) -> None:
        if self.errors.get(part) != message:
            log.error("node %s: %s", self.node, message)
        self.errors[part] = message

    def _problem(self, part: str, message: str | None) -> None:
        """``Maintenance``'s report: a step of ``part`` failed (``message``) or works again (None)."""
        if message is None:
            self.errors.pop(part, None)
        else:
            self._fail(part, message)

    @property
    def removed_over_budget(self) -> int:
        """Blocks removed over budget since the agent started."""
        return self.maintenance.removed_over_budget if self.maintenance is not None else 0

    @property
    def removed_orphans(self) -> int:
        """Orphaned blocks removed since the agent started."""
        return self.maintenance.removed_orphans if self.maintenance is not None else 0

    # --- maintenance --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the maintenance thread (no-op without ``observe`` or with ``interval`` <= 0)."""
        if not self.observe or self.interval <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"kvpool-engines-{self.node}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_tick = time.monotonic()
        while not self._stop.wait(self._wait(last_tick)):
            now = time.monotonic()
            try:
                if now - last_tick >= self.interval:
                    last_tick = now
                    self.tick()
                else:
                    self.signal_tick()
            except Exception:  # never let maintenance die; the next tick retries
                log.exception("node %s: engine maintenance tick failed", self.node)

    def _wait(self, last_tick: float) -> float:
        """Seconds until the next round: the next full tick (``interval`` after the last), or sooner, the next light
        round (``CONFIRM_INTERVAL``; the eviction counters' poll interval when that is shorter and the applied
        document names the masters' metrics)."""
        until_tick = max(0.0, last_tick + self.interval - time.monotonic())
        maintenance = self.maintenance
        if maintenance is None:
            return until_tick
        light = CONFIRM_INTERVAL
        if maintenance.eviction_watch.active:
            light = min(light, maintenance.eviction_watch.poll_interval)
        return min(until_tick, light)

    def signal_tick(self) -> dict[str, int]:
        """A light round between full ticks: confirm the engines' reported writes, then the eviction-signal step
        (``Maintenance.signal_round``: poll the master's eviction counters when due; a full reconcile of each tenant
        whose counter grew). So the ledger follows the Store within about ``poll_interval`` (1 s) of a write or a
        master eviction, not ``interval`` (2 s). Returns ``checked`` and ``missing`` blocks."""
        maintenance = self.maintenance
        if not self.observe or maintenance is None:
            return {"checked": 0, "missing": 0}
        with self._tick_lock:
            self.confirm_writes()
            checked, missing = maintenance.signal_round(self.budgets(), self._tenants())
            return {"checked": checked, "missing": missing}

    def tick(self, *, reconcile: bool | None = None, full: bool = False, enforce: bool = True) -> dict[str, int]:
        """One maintenance round: credit engine hits, confirm the engines' reported writes, then the node-maintenance
        policy (``agent.datapath.maintenance.Maintenance.tick``: budgets and orphans unless ``enforce`` is False,
        then a reconcile when ``reconcile`` — None: when the reconcile interval passed; ``full``: every block — or a
        probe). Returns counts (``checked`` and ``missing`` blocks, ``removed`` over budget, ``orphans_removed``)."""
        maintenance = self.maintenance
        if not self.observe or maintenance is None:
            return {"checked": 0, "missing": 0, "removed": 0, "orphans_removed": 0}
        with self._tick_lock:
            with self._lock:
                if self.observer is not None:
                    try:
                        self._ensure_observer_running()
                    except Exception as exc:
                        self._fail("observer", f"observing engines: {exc}")
            self.credit_hits()
            self.confirm_writes()
            tenants = self._tenants()
            for tenant_id in sorted(set(self._stores) - tenants):
                self._close_store(tenant_id)
            return maintenance.tick(self.budgets(), tenants, reconcile=reconcile, full=full, enforce=enforce)

    def confirm_writes(self) -> dict[str, int]:
        """Confirm every observed instance's reported Store writes with the Store client of its tenant
        (``Attributor.confirm``: at most ``agent.datapath.pending.DEFAULT_CONFIRM_LIMIT`` blocks per instance); the
        confirmed ones are booked into the ledger. Returns ``confirmed``, ``unconfirmed`` and ``waiting`` blocks of
        this step. A Store failure is kept in :attr:`errors` (``store:<tenant>``) and retried next tick."""
        out = {"confirmed": 0, "unconfirmed": 0, "waiting": 0}
        observer = self.observer
        if observer is None:
            return out
        for att in observer.attributors():
            if not att.pending.has_work():
                continue
            tenant_id = att.instance.tenant_id
            store = self._store(tenant_id)
            if store is None:
                continue
            try:
                result = att.confirm(store, alternates=lambda att=att: self._alternates(att.instance))
            except Exception as exc:  # the next tick retries (a fresh client if this one broke)
                self._fail(f"store:{tenant_id}", f"confirming engine writes of tenant {tenant_id} failed: {exc}")
                self._close_store(tenant_id)
                continue
            out["confirmed"] += result.confirmed
            out["unconfirmed"] += result.unconfirmed
            out["waiting"] += result.waiting
            if result.unconfirmed:
                log.warning("node %s: instance %s reported %d Store write(s) the Store does not hold (forged events, "
                            "writes the master dropped, or blocks evicted before the check)", self.node,
                            att.instance_id, result.unconfirmed)
            for name, count in result.unknown_namespace.items():
                log.warning("node %s: instance %s's engine writes under %s, a namespace that is not its release's "
                            "(%d block(s))", self.node, att.instance_id, name, count)
        for name in ("confirmed", "unconfirmed"):
            self.confirm_totals[name] += out[name]
        return out

    def _alternates(self, instance: Any) -> list[Any]:
        """The other namespaces the engines bound to ``instance`` write under (``/proc`` scanned at most every
        ``namespace_scan_interval`` seconds)."""
        from agent.engines.vllm.processes import alternate_keys, scan_engines

        now = time.monotonic()
        if self._launches_at is None or now - self._launches_at >= self.namespace_scan_interval:
            self._launches_at = now
            self._launches = scan_engines(self.proc_root)
        return alternate_keys(self._launches, instance, self.instance_root / instance.instance_id)

    def reconcile_now(self) -> dict[str, int]:
        """A tick that enforces the budgets and then checks every block of the ledger against the Store."""
        return self.tick(reconcile=True, full=True)

    def _store(self, tenant_id: str) -> Any | None:
        """The maintenance Store client of ``tenant_id`` for the applied document's endpoints (opened on first use,
        reopened when the endpoints change; None while it cannot be opened)."""
        document = self.document
        if document is None:
            return None
        endpoints = document.store.model_copy(update={
            "global_segment_size": ENGINE_STORE_SEGMENT_BYTES,
            "local_buffer_size": min(document.store.local_buffer_size, ENGINE_STORE_BUFFER_BYTES)
            or ENGINE_STORE_BUFFER_BYTES})
        held = self._stores.get(tenant_id)
        if held is not None:
            if held[0] == endpoints:
                return held[1]
            self._close_store(tenant_id)
        opener = self._store_opener or _open_store
        try:
            client = opener(endpoints, tenant_id)
        except Exception as exc:
            self._fail(f"store:{tenant_id}", f"cannot open a Store client of tenant {tenant_id}: {exc}")
            return None
        self.errors.pop(f"store:{tenant_id}", None)
        self._stores[tenant_id] = (endpoints, client)
        return client

    def _close_store(self, tenant_id: str) -> None:
        held = self._stores.pop(tenant_id, None)
        if held is not None:
            try:
                held[1].close()
            except Exception:
                log.warning("node %s: closing the Store client of %s failed", self.node, tenant_id, exc_info=True)

    def _tenants(self) -> set[str]:
        """Tenants whose blocks the ledger holds, and those of the document's observed instances."""
        tenants = {t.scope.tenant_id for t in self.ledger.tables() if t.blocks > 0}
        tenants.update(i.tenant_id for i in self._vllm_instances(self.document))
        return tenants

    def budgets(self) -> list[Budget]:
        """The budgets of the observed instances' releases and request groups
        (``agent.datapath.maintenance.document_budgets``: a release's scopes are every request group the ledger
        holds of it)."""
        return document_budgets(self._vllm_instances(self.document), [t.scope for t in self.ledger.tables()])

    # --- hits ---------------------------------------------------------------------------------------------

    def credit_hits(self) -> None:
        """Move the engines' external prefix-cache tokens counted since the last call into the ledger's hit/miss
        blocks of each instance's release row without a request group (module docstring)."""
        observer = self.observer
        if observer is None:
            return
        instances = {i.instance_id: i for i in self._vllm_instances(self.document)}
        snapshot = observer.snapshot()["instances"]
        with self._lock:
            for iid, row in snapshot.items():
                metrics = row.get("metrics") or {}
                totals = metrics.get("totals") or {}
                instance = instances.get(iid)
                if instance is None:
                    continue
                scope = CacheScope(instance.tenant_id, instance.served_model_name, instance.namespace, ENGINE_LOOKUPS)
                credit = self._credits.get(iid)
                if credit is None or credit.scope != scope or credit.block_size != instance.kv_layout.block_size:
                    credit = self._credits[iid] = _Credit(scope, instance.kv_layout.block_size)
                hits = float(totals.get("external_prefix_cache_hits", 0.0))
                queries = float(totals.get("external_prefix_cache_queries", 0.0))
                credit.hit_tokens += hits - credit.seen_hits if hits >= credit.seen_hits else hits
                credit.query_tokens += queries - credit.seen_queries if queries >= credit.seen_queries else queries
                credit.seen_hits, credit.seen_queries = hits, queries
                hit_blocks = int(credit.hit_tokens // credit.block_size)
                miss_blocks = int(max(0.0, credit.query_tokens - credit.hit_tokens) // credit.block_size)
                new_hits = max(0, hit_blocks - credit.hit_blocks)
                new_misses = max(0, miss_blocks - credit.miss_blocks)
                if new_hits or new_misses:
                    self.ledger.record_hits(scope, new_hits, new_misses)
                    credit.hit_blocks += new_hits
                    credit.miss_blocks += new_misses

    # --- reports ------------------------------------------------------------------------------------------

    def instance_stats(self) -> list[InstanceStats]:
        """One :class:`agent.contract.messages.InstanceStats` per observed instance (counters since the agent
        started), ordered by instance id."""
        observer = self.observer
        if observer is None:
            return []
        instances = {i.instance_id: i for i in self._vllm_instances(self.document)}
        out = []
        for iid, row in sorted(observer.snapshot()["instances"].items()):
            instance = instances.get(iid)
            metrics = row.get("metrics") or {}
            totals = metrics.get("totals") or {}
            out.append(_instance_stats(
                instance_id=iid, engine="vllm",
                tenant_id=instance.tenant_id if instance is not None else "",
                served_model_name=instance.served_model_name if instance is not None else "",
                namespace=instance.namespace if instance is not None else "",
                observed_since=_utc(row.get("observed_since")) or datetime.now(UTC),
                last_event_at=_utc(row.get("last_message_at")),
                messages=row["messages"], events=row["events"], blocks_seen=row["blocks_seen"],
                attributed=row["attributed"], unknown_salt=row["unknown_salt"],
                unknown_adapter=row["unknown_adapter"], hash_mismatch=row["hash_mismatch"],
                unresolved_parent=row["unresolved_parent"], unverifiable=row["unverifiable"],
                decode_errors=row["decode_errors"], seq_gaps=row["seq_gaps"], seq_resets=row["seq_resets"],
                attributed_by_group=row.get("by_group", {}), last_error=printable(row.get("last_error", "")),
                confirmed=row.get("confirmed", 0), unconfirmed=row.get("unconfirmed", 0),
                pending=row.get("pending", 0), pending_overflow=row.get("pending_overflow", 0),
                dropped_messages=row.get("dropped_messages", 0),
                unknown_namespace_keys=row.get("unknown_namespace_keys", {}),
                unknown_namespace_bytes=row.get("unknown_namespace_bytes", {}),
                prefix_cache_queries=int(totals.get("prefix_cache_queries", 0)),
                prefix_cache_hits=int(totals.get("prefix_cache_hits", 0)),
                external_prefix_cache_queries=int(totals.get("external_prefix_cache_queries", 0)),
                external_prefix_cache_hits=int(totals.get("external_prefix_cache_hits", 0)),
                store_keys=_ints(totals.get("store_keys", {})),
                store_failed_keys=_ints(totals.get("store_failed_keys", {})),
                metrics_scrapes=metrics.get("scrapes", 0), metrics_errors=metrics.get("failures", 0),
                metrics_error=printable(metrics.get("last_error") or ""),
                events_endpoint=printable(row.get("events_endpoint", "")), events_status=row.get("events_status", ""),
                events_problem=printable(row.get("events_problem", "")), events_refusals=row.get("events_refusals", 0),
                topic_mismatch=row.get("topic_mismatch", 0)))
        return out

    def report_fields(self) -> dict[str, Any]:
        """Extra ``Report`` fields (the daemon's ``report_fields`` source): ``instances`` (:meth:`instance_stats`)
        and the observer's ``unknown_topic_messages`` / ``unknown_topic_blocks``. Credits the engines' hits into
        the ledger first, so the same report's scope rows include them."""
        self.credit_hits()
        observer = self.observer
        if observer is None:
            return {"instances": []}
        snap = observer.snapshot()
        return {"instances": self.instance_stats(), **clamped(Report, {
            "unknown_topic_messages": snap["unknown_topic"], "unknown_topic_blocks": snap["unknown_topic_blocks"]})}

    def status(self) -> dict[str, Any]:
        """What runs now, JSON-ready: ``instance_dirs`` (paths), ``store_client`` (pid or None), ``observer``
        (ids of the instances whose KV-event socket is connected, or None without an observer), ``stores``
        (tenants with an open maintenance client), ``errors``."""
        with self._lock:
            return {"instance_dirs": [str(p) for p in self.instance_dirs],
                    "store_client": self.segment.pid if self.segment is not None else None,
                    "observer": sorted(self.observer.connected()) if self.observer is not None else None,
                    "stores": sorted(self._stores), "errors": dict(self.errors),
                    "removed_over_budget": self.removed_over_budget, "removed_orphans": self.removed_orphans,
                    **self.confirm_totals}

    # --- lifecycle ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the maintenance thread, the observer and the store client; close the Store clients."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(5.0, self.interval * 2))
            self._thread = None
        with self._lock:
            self._stop_observer("the agent stops")
            segment, self.segment = self.segment, None
            if segment is not None:
                segment.stop()
            for tenant_id in list(self._stores):
                self._close_store(tenant_id)


def _open_store(endpoints: StoreEndpoints, tenant_id: str) -> Any:
    from agent.datapath.store import open_store

    return open_store(endpoints, tenant_id)


def _ints(values: Mapping[str, Any] | Iterable[Any]) -> dict[str, int]:
    return {str(name): int(value) for name, value in dict(values).items()}


__all__ = ["DEFAULT_INTERVAL", "DEFAULT_METRICS_INTERVAL", "DEFAULT_RECONCILE_INTERVAL",
           "ENGINE_GC_THRESHOLD", "NAMESPACE_SCAN_INTERVAL",
           "ENGINE_STORE_SEGMENT_BYTES", "NodeEngines", "tune_gc"]
