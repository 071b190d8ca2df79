"""Simulated engine traffic on a node: trace requests run through the agent's KV connector into a real Store.

On a GPU node the engines (vLLM 0.33.0 / SGLang 0.5.23) move KV blocks through their Mooncake connectors. Where
no engine runs (the demo, tests), :class:`EngineSimulator` plays every engine instance of the node's applied
config document, with the same key spaces, key grammar and zero-copy transfers, and real bytes:

* **prefill** (role ``prefill`` or ``both``): look up the request's prefix, load the hit blocks from the Store,
  "compute" the missing ones (fill their cache slots with a pattern derived from the block hash) and save them,
  then keep the request group's and the release's bytes on this node under their budgets (this node's shares)
  with the agent's node-maintenance policy (``agent.datapath.maintenance``: leaves chosen by the prefix-aware
  eviction policy, never a block with a cached descendant, so no orphans);
* **decode** (role ``decode``): look up the prefix and load what the prefill instance stored, checking that
  every loaded byte equals what prefill wrote (the prefill/decode sharing of the seed).

Work arrives as :class:`WorkloadBatch` messages (Celery task ``agent.run_workload`` on queue ``agent.<node>``),
one :class:`WorkItem` per request, each naming an instance of the applied document and a request group. A
prefill item may name a decode instance on another node; as soon as a request's prefill is done, the prefill
node hands it to that node's queue (a one-item batch), as a P/D router forwards a request once its prefill is
done, so a decode never runs before the blocks it loads were saved, and runs while they are still fresh.

Between writes, every ``reconcile_seconds``, the simulator runs the rest of that policy as the agent does for real
engines: orphan collection (blocks below one the master evicted), reconcile with the Store and probes.

Hits, misses, stored, loaded and evicted blocks go into the node's :class:`agent.datapath.ledger.Ledger` (reported by
the daemon); :meth:`EngineSimulator.snapshot` adds the requests in flight per cache scope. What each batch did
(requests, failed requests, corrupted blocks, …) is appended as one JSON line to :data:`RESULTS_FILE` in the
agent's state directory (:class:`ResultFile`), where the demo reads its totals (:func:`read_results`,
:class:`ResultTotals`) instead of parsing log lines.

**Launch overrides** model an engine started by hand with values that differ from its release (the seed's
misconfiguration): a JSON file maps an instance's port to ``{"namespace": ..., "cache_salt": ...}``; the
simulated engine on that port then reads and writes under the typed values, while the agent still acks the
pushed document unchanged. Nothing else reads them.

Store clients: one :class:`agent.datapath.store.StoreClient` per tenant. Every process that calls ``setup()`` mounts a
segment of ``global_segment_size`` bytes (Mooncake 0.3.13.post1), so only the first client of the process
mounts the document's segment size and further tenants' clients mount none: one node, one segment.

No Django here. Sizes are bytes.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.contract.messages import MessageError, NodeName, node_queue
from agent.contract.scope import NO_REQUEST_GROUP, CacheScope
from agent.datapath.keyspace import KeySpace

log = logging.getLogger("kvpool.agent.workload")

#: Celery task an agent runs for each workload batch (one positional argument: the batch dict).
WORKLOAD_TASK = "agent.run_workload"
#: ``schema`` of :class:`WorkloadBatch`.
WORKLOAD_SCHEMA = 1
#: Cache slots per simulated instance; longer requests move through the cache in chunks of this many blocks.
DEFAULT_CACHE_BLOCKS = 64
#: Seconds a handed-over decode batch may wait in its queue before the broker drops it.
HANDOFF_EXPIRES_SECONDS = 600
#: Seconds between checks of stored blocks against the Store (master evictions show up in the ledger).
DEFAULT_RECONCILE_SECONDS = 2.0


# --- messages ------------------------------------------------------------------------------------------------


class WorkItem(BaseModel):
    """One request for one engine instance.

    ``hash_ids`` are the request's prefix block ids (FAST'25 trace format: id ``i`` names the prefix up to block
    ``i``); ``request_group`` is the request group (its ``cache_salt`` comes from the applied document, "" = the
    tenant's default group). ``decode_node``/``decode_instance_id`` (prefill items only) name the decode
    instance the request goes to after its prefill.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: Annotated[int, Field(ge=0)]
    instance_id: str = Field(min_length=1)
    request_group: str = ""
    hash_ids: list[int] = Field(min_length=1)
    decode_node: str = ""
    decode_instance_id: str = ""


class WorkloadBatch(BaseModel):
    """A batch of requests for the engine instances of one node (queue ``agent.<node>``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: int = Field(WORKLOAD_SCHEMA, alias="schema")
    kind: Literal["workload"] = "workload"
    node: NodeName
    batch_id: Annotated[int, Field(ge=0)]
    items: list[WorkItem] = Field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict for the broker."""
        return self.model_dump(mode="json", by_alias=True)


def parse_batch(raw: Any) -> WorkloadBatch:
    """Validate a workload batch.

    Raises:
        MessageError: naming the offending field (also for an unknown ``schema``).
    """
    if isinstance(raw, Mapping) and raw.get("schema", WORKLOAD_SCHEMA) != WORKLOAD_SCHEMA:
        raise MessageError(f"schema: unsupported workload schema {raw.get('schema')!r} "
                           f"(this agent speaks {WORKLOAD_SCHEMA})")
    try:
        return WorkloadBatch.model_validate(raw)
    except ValidationError as exc:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ())) or '(batch)'}: {e.get('msg')}"
                 for e in exc.errors()[:5]]
        raise MessageError("; ".join(parts)) from None


# --- launch overrides ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchOverride:
    """Values an engine was started with by hand, replacing its release's (``None`` = as pushed).

    ``namespace``: the typed ``cache_prefix`` / ``extra_backend_tag``; ``cache_salt``: the typed salt, used for
    every request group of the instance.
    """

    namespace: str | None = None
    cache_salt: str | None = None


def load_overrides(path: str | os.PathLike[str]) -> dict[int, LaunchOverride]:
    """Read ``{"<port>": {"namespace": "...", "cache_salt": "..."}}`` from a JSON file.

    Raises:
        ValueError: naming the file and the offending entry (bad JSON, port, field or value type).
        OSError: the file cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object mapping ports to overrides")
    out: dict[int, LaunchOverride] = {}
    for port, values in raw.items():
        if not str(port).isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{path}: {port!r} is not a port number")
        if not isinstance(values, dict):
            raise ValueError(f"{path}: port {port}: expected an object")
        unknown = sorted(set(values) - {"namespace", "cache_salt"})
        if unknown:
            raise ValueError(f"{path}: port {port}: unknown field(s) {', '.join(unknown)} "
                             "(allowed: namespace, cache_salt)")
        for name, value in values.items():
            if not isinstance(value, str):
                raise ValueError(f"{path}: port {port}: {name} must be a string, got {value!r}")
        out[int(port)] = LaunchOverride(values.get("namespace"), values.get("cache_salt"))
    return out


# --- results ---------------------------------------------------------------------------------------------------


@dataclass
class BatchResult:
    """What one batch did (block counts; bytes are payload bytes moved)."""

    node: str
    batch_id: int
    requests: int = 0
    prefill: int = 0
    decode: int = 0
    lookup_blocks: int = 0
    hit_blocks: int = 0
    loaded_blocks: int = 0
    stored_blocks: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    mismatched_blocks: int = 0
    evicted_blocks: int = 0
    failed_requests: int = 0
    handed_off: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        """Count a failed request and keep its message (the first 5)."""
        self.failed_requests += 1
        if len(self.errors) < 5:
            self.errors.append(message)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counters."""
        return dict(self.__dict__)


#: File in the agent's state directory (``--simulate-engines``) with one JSON line per workload batch run or
#: refused (:class:`ResultFile`); the demo reads its verdict's request totals from it (:func:`read_results`).
RESULTS_FILE = "workload-results.jsonl"
#: ``schema`` of a line of :data:`RESULTS_FILE`.
RESULT_SCHEMA = 1


class ResultFile:
    """Append-only JSON-lines record of what the simulated engines did, one line per batch.

    A line is ``{"schema": 1, "kind": "workload_result", "finished_at": <unix seconds>, **BatchResult}`` for a
    batch that ran, or ``{"schema": 1, "kind": "workload_refused", "node", "finished_at", "error"}`` for one
    refused as malformed. Each line goes to the file in one ``write`` on a descriptor opened with
    ``O_APPEND`` (batches of one simulator run one at a time), so a reader sees whole lines plus at most one
    unfinished last line, which :func:`read_results` skips. Writing is best effort: a failure is logged, the
    batch's outcome is unchanged.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` (with ``schema`` and ``finished_at`` added) as one line."""
        line = json.dumps({"schema": RESULT_SCHEMA, "finished_at": round(time.time(), 3), **record},
                          separators=(",", ":"), sort_keys=True) + "\n"
        data = memoryview(line.encode())
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                while data:  # one write for any sane line; the loop only covers a short write
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("could not append to the workload result file %s: %s", self.path, exc)

    def batch(self, result: BatchResult) -> None:
        """Record a batch that ran."""
        self.append({"kind": "workload_result", **result.as_dict()})

    def refused(self, node: str, error: str) -> None:
        """Record a batch refused before it ran (malformed, or addressed to another node)."""
        self.append({"kind": "workload_refused", "node": node, "error": error[:1000]})


def read_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete lines of a :data:`RESULTS_FILE` (``[]`` when it does not exist yet), oldest first.

    An unfinished last line (being written, or cut off by a crash), a line that is not a JSON object and a line
    of another ``schema`` are skipped.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    records = []
    for line in text.split("\n")[:-1]:  # the part after the last newline is not a finished line
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("schema") == RESULT_SCHEMA:
            records.append(record)
    return records


@dataclass
class ResultTotals:
    """Sums over result lines: requests run, failed requests, corrupted (mismatched) blocks, batches refused;
    ``first_error`` is the first error recorded (``node N batch B: message``), "" when none."""

    batches: int = 0
    requests: int = 0
    failed: int = 0
    corrupted: int = 0
    refused: int = 0
    first_error: str = ""

    def add(self, records: Sequence[Mapping[str, Any]]) -> ResultTotals:
        """Fold ``records`` (from :func:`read_results`) in; returns ``self``."""
        for record in records:
            if record.get("kind") == "workload_refused":
                self.refused += 1
                if not self.first_error:
                    self.first_error = f"node {record.get('node')}: refused workload batch: {record.get('error')}"
            elif record.get("kind") == "workload_result":
                self.batches += 1
                self.requests += int(record.get("requests", 0))
                self.failed += int(record.get("failed_requests", 0))
                self.corrupted += int(record.get("mismatched_blocks", 0))
                errors = record.get("errors") or []
                if errors and not self.first_error:
                    self.first_error = f"node {record.get('node')} batch {record.get('batch_id')}: {errors[0]}"
        return self


# --- the simulator ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Instance:
    """One engine instance of the applied document, bound to its key spaces (after launch overrides)."""

    instance_id: str
    role: str
    port: int
    tenant_id: str
    layout_key: tuple[Any, ...]
    keyspaces: Mapping[str, KeySpace]  # request group name -> key space (tp rank of the instance)
    overridden: bool
    node_budget_bytes: int | None = None  # this node's share of the release's budget (InstanceSpec), bytes
    group_budgets: Mapping[str, int] = field(default_factory=dict)  # request group name -> node's share, bytes

    @property
    def release_scope(self) -> CacheScope:
        """The release the instance writes under (its scopes without the request group)."""
        return next(iter(self.keyspaces.values())).scope.release_scope()


@dataclass(frozen=True)
class _Applied:
    version: int
    store: Mapping[str, Any]
    instances: Mapping[str, _Instance]
    specs: tuple[Any, ...] = ()  # the document's InstanceSpec objects (their budgets)


def _pattern(block_hash: bytes, size: int) -> bytes:
    """The bytes a simulated prefill writes for a block: its hash repeated to ``size`` bytes."""
    reps = -(-size // len(block_hash))
    return (block_hash * reps)[:size]


class EngineSimulator:
    """Plays the engine instances of one node against a real Mooncake Store (see the module docstring).

    Args:
        node: this node's name.
        ledger: the node's :class:`agent.datapath.ledger.Ledger` (the daemon reports it).
        overrides: launch overrides by instance port (:func:`load_overrides`).
        cache_blocks: KV cache slots per instance (>= 1).
        local_hostname: address this node's transfer engine listens on.
        store_opener: ``(StoreEndpoints, tenant_id) -> StoreClient`` (default: ``agent.datapath.store.open_store``
            with ``local_hostname``).
        handoff: ``(node, batch dict) -> None`` sends a decode batch to another node (set by
            :func:`register_workload_task`); without one, hand-offs are counted as failed requests.
        reconcile_seconds: seconds between ledger checks against the Store (0 = never).
        open_on_apply: open every tenant's store client when a document is applied (mounts the segment early).
        results: where each batch's :class:`BatchResult` is appended (:class:`ResultFile`; the agent passes
            :data:`RESULTS_FILE` in its state directory), ``None`` = nowhere.
        lease_ttl: the Store master's ``--default_kv_lease_ttl`` in seconds for the maintenance's lease-aware
            reconciles (None: ``agent.datapath.maintenance.DEFAULT_LEASE_TTL``).

    Thread-safe: batches run one at a time (a lock); :meth:`snapshot` may be called from any thread.
    """

    def __init__(self, node: str, ledger: Any, *, overrides: Mapping[int, LaunchOverride] | None = None,
                 cache_blocks: int = DEFAULT_CACHE_BLOCKS, local_hostname: str = "127.0.0.1",
                 store_opener: Callable[..., Any] | None = None,
                 handoff: Callable[[str, dict[str, Any]], None] | None = None,
                 reconcile_seconds: float = DEFAULT_RECONCILE_SECONDS, open_on_apply: bool = True,
                 results: ResultFile | None = None, lease_ttl: float | None = None) -> None:
        if cache_blocks < 1:
            raise ValueError(f"cache_blocks must be at least 1, got {cache_blocks}")
        self.node = node
        self.ledger = ledger
        self.overrides = dict(overrides or {})
        self.cache_blocks = cache_blocks
        self.local_hostname = local_hostname
        self.handoff = handoff
        self.reconcile_seconds = reconcile_seconds
        self.open_on_apply = open_on_apply
        self.results = results
        self._store_opener = store_opener
        self._applied: _Applied | None = None
        self._batch_lock = threading.Lock()
        self._closing = threading.Event()
        self._maintenance: threading.Thread | None = None
        self._state_lock = threading.Lock()
        self._in_flight: Counter[CacheScope] = Counter()
        # (store endpoints, instance id, tenant, layout) -> (cache, connector)
        self._engines: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._stores: dict[tuple[Any, ...], Any] = {}
        self._mounted = False
        self.batches = 0
        from agent.datapath.budget import BudgetEnforcer
        from agent.datapath.maintenance import DEFAULT_LEASE_TTL, Maintenance

        self.budget = BudgetEnforcer(ledger)
        #: The node-maintenance policy the agent runs for real engines (``agent.datapath.maintenance``): budgets
        #: after each write, orphans, reconcile and probes every ``reconcile_seconds`` (under the batch lock).
        self.maintenance = Maintenance(node, ledger, self.budget, self._tenant_store,
                                       reconcile_interval=reconcile_seconds,
                                       lease_ttl=DEFAULT_LEASE_TTL if lease_ttl is None else lease_ttl)
        self.maintenance.last_reconcile = time.monotonic()  # the first reconcile one interval after start

    # --- config ---------------------------------------------------------------------------------------------

    def on_apply(self, applied: Any) -> None:
        """Daemon hook: take the instances of a newly applied document (duck-typed ``AppliedConfig``).

        One reference assignment: a batch running now finishes with the instances it started with.

        Raises:
            ValueError: an override makes an invalid key space (the old instances stay in use).
        """
        document = applied.document
        instances: dict[str, _Instance] = {}
        for spec in document.instances:
            instances[spec.instance_id] = self._bind(spec)
        self._applied = _Applied(document.version, document.store.model_dump(), instances, tuple(document.instances))
        settings = getattr(document, "node_settings", None)
        with self._batch_lock:  # the maintenance round runs under it
            self.maintenance.set_master_metrics(settings.master_metrics_urls if settings is not None else ())
        self._prune(self._applied)
        overridden = [i for i in instances.values() if i.overridden]
        for inst in overridden:
            log.warning("node %s: instance %s (port %d) runs with hand-typed launch values %s, not its release's",
                        self.node, inst.instance_id, inst.port, self.overrides[inst.port])
        if self.open_on_apply:
            self._open_stores(self._applied)

    def _prune(self, applied: _Applied) -> None:
        """Close the caches and connectors of instances the applied document no longer has (or has changed)."""
        live = {self._engine_key(applied, inst) for inst in applied.instances.values()}
        with self._batch_lock:
            for key in [k for k in self._engines if k not in live]:
                _cache, connector = self._engines.pop(key)
                try:
                    connector.close()
                except Exception:
                    log.warning("node %s: closing a connector failed", self.node, exc_info=True)

    def _open_stores(self, applied: _Applied) -> None:
        """Open the store client of every tenant of ``applied`` and build every instance's cache and connector
        now, so this node's segment is mounted before traffic arrives (a tenant's effective quota scales with the
        mounted capacity) and the first batch runs at full speed. A failure is logged and retried at the first
        batch that needs it."""
        with self._batch_lock:
            for inst in sorted(applied.instances.values(), key=lambda i: (i.tenant_id, i.port)):
                try:
                    self._engine(applied, inst)
                except Exception as exc:
                    log.error("node %s: cannot prepare instance %s (tenant %s) yet: %s", self.node,
                              inst.instance_id, inst.tenant_id, exc)

    def _bind(self, spec: Any) -> _Instance:
        from agent.datapath.keyspace import keyspaces_for_instance

        bound = keyspaces_for_instance(spec)
        tp = spec.ranks.tp_rank
        override = self.overrides.get(spec.port)
        keyspaces: dict[str, KeySpace] = {}
        for (rank, group), ks in bound.items():
            if rank != tp:
                continue
            if override is not None:
                changes: dict[str, Any] = {}
                if override.namespace is not None:
                    changes["namespace"] = override.namespace
                if override.cache_salt is not None:
                    changes["cache_salt"] = override.cache_salt
                ks = ks.replace(**changes)
            keyspaces[group] = ks
        layout = spec.kv_layout
        layout_key = (spec.engine, layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_size,
                      layout.kv_dtype)
        group_budgets = {g.name: g.node_budget_bytes for g in spec.request_groups
                         if g.node_budget_bytes is not None and g.name in keyspaces}
        return _Instance(spec.instance_id, spec.role, spec.port, spec.tenant_id, layout_key, keyspaces,
                         override is not None, spec.node_budget_bytes, group_budgets)

    # --- store and engines ----------------------------------------------------------------------------------

    def _store(self, store_cfg: Mapping[str, Any], tenant_id: str) -> Any:
        from agent.contract.messages import StoreEndpoints
        from agent.datapath.store import open_store

        key = (tuple(sorted(store_cfg.items())), tenant_id)
        client = self._stores.get(key)
        if client is not None:
            return client
        endpoints = StoreEndpoints.model_validate(
            {**store_cfg, "global_segment_size": 0 if self._mounted else store_cfg["global_segment_size"]})
        if self._store_opener is not None:
            client = self._store_opener(endpoints, tenant_id)
        else:
            client = open_store(endpoints, tenant_id, local_hostname=self.local_hostname)
        if endpoints.global_segment_size:
            self._mounted = True
        log.info("node %s: store client for tenant %s at %s (segment %d bytes)", self.node, tenant_id,
                 endpoints.master_server_address, endpoints.global_segment_size)
        self._stores[key] = client
        return client

    @staticmethod
    def _engine_key(applied: _Applied, inst: _Instance) -> tuple[str, ...]:
        return (str(sorted(applied.store.items())), inst.instance_id, inst.tenant_id, repr(inst.layout_key))

    def _engine(self, applied: _Applied, inst: _Instance) -> tuple[Any, Any]:
        """The (cache, connector) of an instance, built on first use and kept while its layout is unchanged."""
        key = self._engine_key(applied, inst)
        found = self._engines.get(key)
        if found is not None:
            return found
        from agent.datapath.connector import KVConnector
        from agent.datapath.kv_cache import KVCacheSpec, PagedKVCache

        engine, num_layers, num_kv_heads, head_dim, block_size, kv_dtype = inst.layout_key
        spec = KVCacheSpec(num_layers=num_layers, num_kv_heads=num_kv_heads, head_size=head_dim,
                           block_size=block_size, num_blocks=self.cache_blocks,
                           dtype="bfloat16" if kv_dtype in ("", "auto") else kv_dtype, layout="cross_layer")
        cache = PagedKVCache.allocate(spec)
        store = self._store(applied.store, inst.tenant_id)
        first = next(iter(inst.keyspaces.values()))
        connector = KVConnector(store, cache, first, ledger=self.ledger, max_batch_blocks=self.cache_blocks)
        self._engines[key] = (cache, connector)
        return cache, connector

    # --- telemetry ------------------------------------------------------------------------------------------

    def launched_scopes(self) -> set[CacheScope]:
        """The cache scopes the simulated engines really run under where launch overrides changed an instance's
        namespace (each request group's and the release's row without a request group): the daemon reports these
        rows beside the document's, so the dashboard shows the hand-typed namespace (it accepts a row of a tenant
        and served model the node's document carries under a namespace the registry does not have). Empty without
        overrides."""
        applied = self._applied
        if applied is None:
            return set()
        scopes: set[CacheScope] = set()
        for inst in applied.instances.values():
            if inst.overridden:
                for ks in inst.keyspaces.values():
                    scopes |= {ks.scope, ks.scope._replace(request_group=NO_REQUEST_GROUP)}
        return scopes

    def snapshot(self) -> list[dict[str, Any]]:
        """The ledger snapshot plus ``in_flight_requests`` per scope (``ScopeOccupancy`` fields)."""
        rows = {CacheScope(r["tenant_id"], r["served_model_name"], r["namespace"], r["request_group"]): dict(r)
                for r in self.ledger.snapshot()}
        with self._state_lock:
            in_flight = dict(self._in_flight)
        for scope, count in in_flight.items():
            row = rows.setdefault(scope, scope._asdict())
            row["in_flight_requests"] = count
        return list(rows.values())

    # --- batches --------------------------------------------------------------------------------------------

    def run_batch(self, raw: Any) -> dict[str, Any]:
        """Run one workload batch; returns :class:`BatchResult` as a dict (also appended to :attr:`results`).
        Never raises for a bad request.

        Raises:
            MessageError: the batch itself is malformed or addressed to another node (nothing runs; recorded
                as refused in :attr:`results`).
        """
        try:
            batch = parse_batch(raw)
            if batch.node != self.node:
                raise MessageError(f"node: batch is for node {batch.node!r}, this is {self.node!r}")
        except MessageError as exc:
            if self.results is not None:
                self.results.refused(self.node, str(exc))
            raise
        with self._batch_lock:
            result = self._run(batch)
            if self.results is not None:
                self.results.batch(result)
            return result.as_dict()

    def _resolve(self, applied: _Applied | None, item: WorkItem) -> tuple[_Instance, KeySpace]:
        if applied is None:
            raise LookupError("no config document applied yet")
        inst = applied.instances.get(item.instance_id)
        if inst is None:
            raise LookupError(f"instance {item.instance_id} is not in applied config version {applied.version}")
        ks = inst.keyspaces.get(item.request_group)
        if ks is None:
            groups = ", ".join(repr(g) for g in inst.keyspaces) or "none"
            raise LookupError(f"request group {item.request_group!r} is not served by instance {item.instance_id} "
                              f"(groups: {groups})")
        return inst, ks

    def _run(self, batch: WorkloadBatch) -> BatchResult:
        started = time.monotonic()
        applied = self._applied  # read once: a new document applies from the next batch on
        result = BatchResult(self.node, batch.batch_id, requests=len(batch.items))
        resolved: list[tuple[WorkItem, _Instance, KeySpace] | None] = []
        for item in batch.items:
            try:
                inst, ks = self._resolve(applied, item)
            except LookupError as exc:
                result.error(f"request {item.request_id}: {exc}")
                resolved.append(None)
                continue
            resolved.append((item, inst, ks))
        with self._state_lock:
            for entry in resolved:
                if entry is not None:
                    self._in_flight[entry[2].scope] += 1
        for entry in resolved:
            if entry is None:
                continue
            assert applied is not None  # _resolve refused every item without an applied document
            item, inst, ks = entry
            try:
                if inst.role == "decode":
                    result.decode += 1
                    self._decode(applied, inst, ks, item, result)
                else:
                    result.prefill += 1
                    self._prefill(applied, inst, ks, item, result)
                    if item.decode_node:
                        self._hand_off(item.decode_node, batch.batch_id, [WorkItem(
                            request_id=item.request_id, instance_id=item.decode_instance_id,
                            request_group=item.request_group, hash_ids=item.hash_ids)], result)
            except Exception as exc:  # one request's failure (quota, layout, store) must not stop the batch
                log.debug("request %d failed", item.request_id, exc_info=True)
                result.error(f"request {item.request_id} on instance {inst.instance_id}: "
                             f"{type(exc).__name__}: {exc}")
            finally:
                with self._state_lock:
                    self._in_flight[ks.scope] -= 1
                    if self._in_flight[ks.scope] <= 0:
                        del self._in_flight[ks.scope]
        if applied is not None:
            self._maybe_reconcile()
        self.batches += 1
        result.seconds = round(time.monotonic() - started, 4)
        log.info("node %s batch %d: %d requests (%d prefill, %d decode): hit %d/%d blocks, loaded %d, stored %d "
                 "(%d bytes), removed %d over budget, %d handed off, %d failed, %d corrupted, %.2fs", self.node,
                 batch.batch_id, result.requests, result.prefill, result.decode, result.hit_blocks,
                 result.lookup_blocks, result.loaded_blocks, result.stored_blocks, result.bytes_written,
                 result.evicted_blocks, result.handed_off, result.failed_requests, result.mismatched_blocks,
                 result.seconds)
        for message in result.errors:
            log.warning("node %s batch %d: %s", self.node, batch.batch_id, message)
        return result

    def _hand_off(self, node: str, batch_id: int, items: list[WorkItem], result: BatchResult) -> None:
        if self.handoff is None:
            for item in items:
                result.error(f"request {item.request_id}: no hand-off route to decode node {node}")
            return
        try:
            self.handoff(node, WorkloadBatch(node=node, batch_id=batch_id, items=items).to_wire())
        except Exception as exc:  # broker down: the decode half of these requests is lost, say so
            for item in items:
                result.error(f"request {item.request_id}: hand-off to {node} failed: {type(exc).__name__}: {exc}")
            return
        result.handed_off += len(items)

    # --- the engine operations ------------------------------------------------------------------------------

    def _load(self, cache: Any, connector: Any, ks: KeySpace, hashes: Sequence[bytes],
              result: BatchResult) -> int:
        """Read leading blocks ``hashes`` into the cache in chunks and check their bytes; returns blocks loaded."""
        import torch

        rows = cache.tensors[0].view(torch.uint8).view(cache.spec.num_blocks, -1)
        size = cache.spec.block_bytes
        loaded = 0
        for start in range(0, len(hashes), self.cache_blocks):
            chunk = list(hashes[start:start + self.cache_blocks])
            got = connector.get(list(range(len(chunk))), chunk, keyspace=ks)
            for slot in range(got):
                expected = torch.frombuffer(bytearray(_pattern(chunk[slot], size)), dtype=torch.uint8)
                if not torch.equal(rows[slot], expected):
                    result.mismatched_blocks += 1
            loaded += got
            result.bytes_read += got * size
            if got < len(chunk):
                break
        result.loaded_blocks += loaded
        return loaded

    def _lookup(self, applied: _Applied, inst: _Instance, ks: KeySpace, item: WorkItem,
                result: BatchResult) -> tuple[Any, Any, list[bytes], int]:
        """The instance's (cache, connector), the request's block hashes, and how many lead blocks are in the
        Store (prefix lookup); counts the looked-up and hit blocks into ``result``."""
        cache, connector = self._engine(applied, inst)
        hashes = ks.trace_hashes(item.hash_ids)
        hit = connector.lookup(block_hashes=hashes, keyspace=ks)
        result.lookup_blocks += len(hashes)
        result.hit_blocks += hit
        return cache, connector, hashes, hit

    def _prefill(self, applied: _Applied, inst: _Instance, ks: KeySpace, item: WorkItem,
                 result: BatchResult) -> None:
        """Lookup, load the hit prefix, compute (fill) and save the rest."""
        import torch

        from agent.datapath.errors import StoreError

        cache, connector, hashes, hit = self._lookup(applied, inst, ks, item, result)
        done = self._load(cache, connector, ks, hashes[:hit], result) if hit else 0
        rows = cache.tensors[0].view(torch.uint8).view(cache.spec.num_blocks, -1)
        size = cache.spec.block_bytes
        for start in range(done, len(hashes), self.cache_blocks):
            chunk = hashes[start:start + self.cache_blocks]
            for slot, block_hash in enumerate(chunk):
                rows[slot].copy_(torch.frombuffer(bytearray(_pattern(block_hash, size)), dtype=torch.uint8))
            parent = hashes[start - 1] if start else None
            try:
                put = connector.put(list(range(len(chunk))), chunk, parent=parent, keyspace=ks)
            except StoreError as exc:
                put = exc.result
                if put is not None:
                    result.stored_blocks += put.stored
                    result.bytes_written += put.bytes_written
                raise
            result.stored_blocks += put.stored
            result.bytes_written += put.bytes_written
        if inst.group_budgets or inst.node_budget_bytes is not None:  # a share of 0 keeps nothing
            result.evicted_blocks += self._keep_budget(applied, inst)

    def _keep_budget(self, applied: _Applied, inst: _Instance) -> int:
        """Hold the request groups with a budget and then the release that ``inst`` writes under their budgets
        right after its write; returns blocks removed. The budgets and their enforcement are the agent's
        (``agent.datapath.maintenance``: leaves only, never forced, down to ``BUDGET_LOW_WATER``), so no block is
        orphaned and a leased block (another client reads it) stays for a later round."""
        release = inst.release_scope
        budgets = [b for b in self._budgets(applied) if b.scopes[0].release_scope() == release]
        return self.maintenance.enforce_budgets(budgets)

    def _budgets(self, applied: _Applied) -> list[Any]:
        from agent.datapath.maintenance import document_budgets

        return document_budgets(applied.specs, [t.scope for t in self.ledger.tables()])

    def _tenant_store(self, tenant_id: str) -> Any | None:
        """The store client of ``tenant_id`` for the applied document (opened on first use)."""
        applied = self._applied
        if applied is None:
            return None
        return self._store(applied.store, tenant_id)

    def _decode(self, applied: _Applied, inst: _Instance, ks: KeySpace, item: WorkItem,
                result: BatchResult) -> None:
        """Lookup and load what the prefill instance stored."""
        cache, connector, hashes, hit = self._lookup(applied, inst, ks, item, result)
        if hit:
            self._load(cache, connector, ks, hashes[:hit], result)

    def _maybe_reconcile(self) -> None:
        """A round of the agent's node-maintenance policy (``agent.datapath.maintenance.Maintenance.tick``) every
        ``reconcile_seconds``: budgets, orphans (blocks below one the master evicted), then a reconcile with the
        Store, so master evictions are counted; a probe between reconciles. Never with ``reconcile_seconds`` 0."""
        applied = self._applied
        if not self.reconcile_seconds or applied is None:
            return
        now = time.monotonic()
        last = self.maintenance.last_probe or self.maintenance.last_reconcile
        if (last is not None and now - last < min(self.reconcile_seconds, self.maintenance.probe_interval)
                and not self.maintenance.signal_due(now)):
            return
        tenants = {inst.tenant_id for inst in applied.instances.values()}
        tenants.update(t.scope.tenant_id for t in self.ledger.tables() if t.blocks > 0)
        try:
            self.maintenance.tick(self._budgets(applied), tenants)
        except Exception:  # the next round retries
            log.warning("node %s: maintenance round failed", self.node, exc_info=True)

    def maintain(self) -> None:
        """Reconcile between batches, so an idle node's ledger follows the Store too (a master restart loses every
        object: the sampled blocks are gone and the reconcile checks every block). Skipped while a batch runs
        (it reconciles at its end)."""
        if not self._batch_lock.acquire(blocking=False):
            return
        try:
            if self._applied is not None:
                self._maybe_reconcile()
        finally:
            self._batch_lock.release()

    def _maintenance_wait(self) -> float:
        """Seconds until the next :meth:`maintain`: ``reconcile_seconds``, or the eviction counters' poll interval
        while the applied document names the masters' metrics (``NodeSettings.master_metrics_urls``)."""
        watch = self.maintenance.eviction_watch
        return min(self.reconcile_seconds, watch.poll_interval) if watch.active else self.reconcile_seconds

    def start_maintenance(self) -> None:
        """Call :meth:`maintain` every ``reconcile_seconds`` from a daemon thread until :meth:`close`."""
        if not self.reconcile_seconds or self._maintenance is not None:
            return

        def loop() -> None:
            while not self._closing.wait(self._maintenance_wait()):
                try:
                    self.maintain()
                except Exception:  # telemetry only: the next round retries
                    log.warning("node %s: simulator maintenance failed", self.node, exc_info=True)

        self._maintenance = threading.Thread(target=loop, name=f"sim-maintenance-{self.node}", daemon=True)
        self._maintenance.start()

    # --- lifecycle ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the maintenance thread, unregister the caches and close every store client (their segment leaves
        the pool)."""
        self._closing.set()
        if self._maintenance is not None:
            self._maintenance.join(timeout=30)
            self._maintenance = None
        with self._batch_lock:
            for _cache, connector in self._engines.values():
                try:
                    connector.close()
                except Exception:
                    log.warning("node %s: closing a connector failed", self.node, exc_info=True)
            self._engines.clear()
            for client in self._stores.values():
                try:
                    client.close()
                except Exception:
                    log.warning("node %s: closing the store client of %s failed", self.node, client.tenant_id,
                                exc_info=True)
            self._stores.clear()
            self._mounted = False


# --- Celery wiring ---------------------------------------------------------------------------------------------


def make_handoff(app: Any, *, expires: float = HANDOFF_EXPIRES_SECONDS) -> Callable[[str, dict[str, Any]], None]:
    """``handoff(node, batch)`` that publishes ``agent.run_workload`` to ``agent.<node>`` through ``app``."""

    def handoff(node: str, batch: dict[str, Any]) -> None:
        app.send_task(WORKLOAD_TASK, args=[batch], queue=node_queue(node), expires=expires, retry=True,
                      retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.5,
                                    "interval_max": 1.0})

    return handoff


def register_workload_task(app: Any, simulator: EngineSimulator) -> None:
    """Register ``agent.run_workload`` on the agent's Celery ``app`` and route hand-offs through it."""
    if simulator.handoff is None:
        simulator.handoff = make_handoff(app)

    @app.task(name=WORKLOAD_TASK, ignore_result=True)
    def run_workload(batch: dict[str, Any]) -> None:
        """Run one workload batch on this node's simulated engines (the simulator logs one line per batch)."""
        try:
            simulator.run_batch(batch)
        except MessageError as exc:
            log.warning("node %s: refused workload batch: %s", simulator.node, exc)
