"""Per-scope numbers from the dashboard's REST API (``/api/v1/telemetry/occupancy/``), and the table.

A scope is what the agents' ledgers report, an ``agent.contract.scope.CacheScope``: (tenant, served model,
release namespace, request group). Each node's newest raw sample of a scope is its current state; the scope's
numbers are the sums over nodes: blocks and bytes (only the node that stored them counts them), lookups (hit and
miss blocks of the prefill and the decode instance), gets, evicted blocks and orphaned bytes.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.contract.scope import CacheScope

_COUNTERS = ("blocks", "bytes", "puts", "gets", "hit_blocks", "miss_blocks", "evicted_blocks", "orphaned_bytes",
             "in_flight_requests")


@dataclass
class ScopeRow:
    """One cache scope summed over nodes; ``per_node`` keeps each node's (hit_blocks, miss_blocks)."""

    key: CacheScope
    blocks: int = 0
    bytes: int = 0
    puts: int = 0
    gets: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    evicted_blocks: int = 0
    orphaned_bytes: int = 0
    in_flight_requests: int = 0
    per_node: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def lookups(self) -> int:
        """Blocks looked up (hit + miss)."""
        return self.hit_blocks + self.miss_blocks

    @property
    def hit_ratio(self) -> float:
        """Hit blocks / looked-up blocks (0.0 before any lookup)."""
        return self.hit_blocks / self.lookups if self.lookups else 0.0


def latest_samples(api: Any, *, window_s: float = 30.0) -> list[dict[str, Any]]:
    """Each node's newest raw sample per scope among those of the last ``window_s`` seconds."""
    since = (datetime.now(UTC) - timedelta(seconds=window_s)).isoformat().replace("+00:00", "Z")
    newest: dict[tuple[str, ...], dict[str, Any]] = {}
    for sample in api.iterate("telemetry/occupancy/", level="raw", since=since, page=1000):
        key = (sample["node_name"], sample["tenant_id"], sample["served_model_name"], sample["namespace"],
               sample["request_group"])
        if key not in newest or sample["ts"] > newest[key]["ts"]:
            newest[key] = sample
    return list(newest.values())


def summarize(samples: Iterable[Mapping[str, Any]]) -> dict[CacheScope, ScopeRow]:
    """Sum each node's newest sample per scope (see the module docstring)."""
    rows: dict[CacheScope, ScopeRow] = {}
    for s in samples:
        key = CacheScope(s["tenant_id"], s["served_model_name"], s["namespace"], s["request_group"])
        row = rows.setdefault(key, ScopeRow(key))
        for name in _COUNTERS:
            setattr(row, name, getattr(row, name) + int(s.get(name) or 0))
        row.per_node[s["node_name"]] = (int(s.get("hit_blocks") or 0), int(s.get("miss_blocks") or 0))
    return rows


def human_bytes(n: float) -> str:
    """``1.5 MiB`` style (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_table(rows: Mapping[CacheScope, ScopeRow], registered: set[tuple[str, str, str]]) -> str:
    """The summary table: one line per scope, unregistered release namespaces marked with ``!``."""
    header = ("tenant", "model", "release", "request group", "blocks", "bytes", "hit ratio", "hits P/D",
              "evictions seen", "orphaned")
    lines = [header]
    for key in sorted(rows):
        row = rows[key]
        tenant, model, namespace, group = key
        mark = "" if (tenant, model, namespace) in registered else " !"
        p = row.per_node.get("node-a", (0, 0))[0]
        d = row.per_node.get("node-b", (0, 0))[0]
        lines.append((tenant, model, namespace + mark, group or "(default)", f"{row.blocks}",
                      human_bytes(row.bytes), f"{row.hit_ratio:.1%}", f"{p}/{d}", f"{row.evicted_blocks}",
                      human_bytes(row.orphaned_bytes)))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    right = {4, 5, 6, 7, 8, 9}
    out = []
    for n, line in enumerate(lines):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
