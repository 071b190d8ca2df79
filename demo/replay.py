"""Time-compressed replay of a FAST'25 trace into the agents' queues.

Each request is routed (:func:`demo.scenario.route`) and becomes a prefill :class:`agent.sim.workload.WorkItem` for
the prefill node, naming the decode instance the prefill node hands it to. Arrival times are the trace's
``timestamp`` divided by ``speed``; requests due together go out as batches of at most ``batch_max`` items.

:class:`Expected` counts, per namespace, the blocks the agents' lookups will count as hit or miss: one lookup
per request on the prefill node and one on the decode node. The replay is complete when the dashboard's
numbers reach it.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.contract.scope import CacheScope
from agent.sim.trace import TraceRequest, read_trace
from agent.sim.workload import WorkItem, WorkloadBatch
from demo.scenario import DECODE_NODE, PREFILL_NODE, Deployment, Route, route


def load_requests(path: str | Path, limit: int | None) -> list[TraceRequest]:
    """The first ``limit`` requests of a trace (all when None), in timestamp order.

    Raises:
        agent.sim.trace.TraceError: a malformed line (file and line named); OSError when unreadable.
    """
    requests = read_trace(path)
    requests.sort(key=lambda r: r.timestamp_ms)
    return requests[:limit] if limit else requests


@dataclass
class Expected:
    """Lookup blocks the agents will count, per cache scope and per node; the requests of each scope."""

    lookups: dict[CacheScope, int] = field(default_factory=lambda: defaultdict(int))
    by_node: dict[tuple[str, CacheScope], int] = field(default_factory=lambda: defaultdict(int))
    requests: dict[CacheScope, list[list[int]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, r: Route, hash_ids: Sequence[int]) -> None:
        """Count one routed request: its prefill lookup and its decode lookup."""
        n = len(hash_ids)
        prefill = CacheScope(r.tenant_id, r.served_model_name, r.namespace, r.request_group)
        decode = CacheScope(r.tenant_id, r.served_model_name, r.decode_namespace, r.request_group)
        self.lookups[prefill] += n
        self.lookups[decode] += n
        self.by_node[(PREFILL_NODE, prefill)] += n
        self.by_node[(DECODE_NODE, decode)] += n
        self.requests[prefill].append(list(hash_ids))

    @property
    def total(self) -> int:
        """All lookup blocks of the replay."""
        return sum(self.lookups.values())


@dataclass
class ReplayState:
    """Progress of a replay (seconds are wall-clock since its start)."""

    total: int
    sent: int = 0
    batches: int = 0
    started_at: float = 0.0
    trace_span_s: float = 0.0

    @property
    def elapsed_s(self) -> float:
        """Wall-clock seconds since the start."""
        return time.monotonic() - self.started_at if self.started_at else 0.0


class Replayer:
    """Sends routed requests to the prefill node at ``speed`` times the trace's pace.

    Args:
        requests: trace requests in timestamp order.
        deployment: the seeded registry (instances to route to).
        send: ``(node, batch dict) -> None`` publishes one workload batch (raises when the broker refuses).
        speed: time compression (finite, > 0): trace seconds per wall-clock second.
        batch_max: most requests per batch.
    """

    def __init__(self, requests: Sequence[TraceRequest], deployment: Deployment,
                 send: Callable[[str, dict], None], *, speed: float, batch_max: int = 16) -> None:
        if not math.isfinite(speed) or speed <= 0:
            raise ValueError(f"speed must be a finite number > 0, got {speed}")
        if batch_max < 1:
            raise ValueError(f"batch_max must be at least 1, got {batch_max}")
        self.requests = list(requests)
        self.deployment = deployment
        self.send = send
        self.speed = speed
        self.batch_max = batch_max
        self.expected = Expected()
        self.routes: list[Route] = []
        for req in self.requests:
            r = route(req.hash_ids, deployment)
            self.routes.append(r)
            self.expected.add(r, req.hash_ids)
        t0 = self.requests[0].timestamp_ms if self.requests else 0
        self._due = [(req.timestamp_ms - t0) / 1000.0 / speed for req in self.requests]
        span = (self.requests[-1].timestamp_ms - t0) / 1000.0 if self.requests else 0.0
        self.state = ReplayState(total=len(self.requests), trace_span_s=span)

    def _item(self, index: int) -> WorkItem:
        req, r = self.requests[index], self.routes[index]
        return WorkItem(request_id=index, instance_id=r.prefill_instance, request_group=r.request_group,
                        hash_ids=list(req.hash_ids), decode_node=DECODE_NODE, decode_instance_id=r.decode_instance)

    def run(self, *, tick: Callable[[ReplayState], None] | None = None, tick_every: float = 2.0,
            should_stop: Callable[[], bool] = lambda: False) -> ReplayState:
        """Send every request at its time; calls ``tick(state)`` about every ``tick_every`` seconds."""
        state = self.state
        state.started_at = time.monotonic()
        next_tick = state.started_at + tick_every
        i = 0
        while i < len(self.requests) and not should_stop():
            now = state.elapsed_s
            j = i
            while j < len(self.requests) and self._due[j] <= now:
                j += 1
            for start in range(i, j, self.batch_max):
                items = [self._item(k) for k in range(start, min(j, start + self.batch_max))]
                self.send(PREFILL_NODE, WorkloadBatch(node=PREFILL_NODE, batch_id=state.batches,
                                                      items=items).to_wire())
                state.batches += 1
                state.sent += len(items)
            i = j
            if tick is not None and time.monotonic() >= next_tick:
                tick(state)
                next_tick = time.monotonic() + tick_every
            if i < len(self.requests):
                wait = self._due[i] - state.elapsed_s
                time.sleep(min(max(wait, 0.01), 0.25))
        return state
