"""A vLLM engine's ``/metrics`` counters that matter to a shared KV pool (vLLM 0.32.0 CPU / 0.33.0 names).

Read (Prometheus text format, parsed with ``prometheus_client.parser``; every label set summed, so several
``engine``/``model_name``/``status`` series add up):

* ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` — tokens looked up in / found in the
  engine's own (GPU) prefix cache;
* ``vllm:external_prefix_cache_queries_total`` / ``..._hits_total`` — tokens looked up in / found in the KV
  connector (the Mooncake Store);
* ``vllm:mooncake_store_operation_keys_total{operation=…}`` (keys), ``…_bytes_total`` (bytes) and
  ``…_failed_keys_total`` (keys) per ``operation`` (``lookup_exists``, ``load_get``, ``save_exists``,
  ``save_put``, …).

:class:`EngineMetrics` is one scrape; :meth:`EngineMetrics.delta` the increase since an earlier one, where a
counter that went down (the engine restarted) counts its whole current value. :class:`MetricsTracker` keeps
the last scrape, the summed deltas since the tracker started, and scrape failures. Its first successful scrape is
the baseline (not counted: an engine that already ran before the agent started) unless scrapes failed before it
(the engine was not up yet when the tracker started: everything it counted happened since).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_SCALARS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:external_prefix_cache_queries_total": "external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits_total": "external_prefix_cache_hits",
}
_PER_OPERATION = {
    "vllm:mooncake_store_operation_keys_total": "store_keys",
    "vllm:mooncake_store_operation_bytes_total": "store_bytes",
    "vllm:mooncake_store_operation_failed_keys_total": "store_failed_keys",
}


class MetricsError(RuntimeError):
    """A scrape failed (connection, HTTP status, or text that is not Prometheus format)."""


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of an engine's counters (tokens for the prefix caches; keys/bytes per Store operation).

    ``found``: names of the counters present in the scrape (an engine without a KV connector has no
    ``external_*``/``mooncake_*`` series). ``scraped_at``: unix seconds. ``reset``: set on a :meth:`delta`
    result when some counter went down (engine restart).
    """

    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    external_prefix_cache_queries: float = 0.0
    external_prefix_cache_hits: float = 0.0
    store_keys: Mapping[str, float] = field(default_factory=dict)
    store_bytes: Mapping[str, float] = field(default_factory=dict)
    store_failed_keys: Mapping[str, float] = field(default_factory=dict)
    found: frozenset[str] = frozenset()
    scraped_at: float = 0.0
    reset: bool = False

    @property
    def prefix_hit_rate(self) -> float | None:
        """Hit tokens / queried tokens of the engine's own prefix cache (None with no queries)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None

    @property
    def external_hit_rate(self) -> float | None:
        """Hit tokens / queried tokens of the connector's (Store) lookups (None with no queries)."""
        q = self.external_prefix_cache_queries
        return self.external_prefix_cache_hits / q if q else None

    def delta(self, previous: EngineMetrics | None) -> EngineMetrics:
        """Increase of every counter since ``previous`` (``self`` when None); a counter below its previous value
        restarted, so its current value is the increase (and ``reset`` is set)."""
        if previous is None:
            return self
        reset = False

        def diff(cur: float, prev: float) -> float:
            nonlocal reset
            if cur < prev:
                reset = True
                return cur
            return cur - prev

        def diff_map(cur: Mapping[str, float], prev: Mapping[str, float]) -> dict[str, float]:
            return {op: diff(value, prev.get(op, 0.0)) for op, value in cur.items()}

        out = EngineMetrics(
            prefix_cache_queries=diff(self.prefix_cache_queries, previous.prefix_cache_queries),
            prefix_cache_hits=diff(self.prefix_cache_hits, previous.prefix_cache_hits),
            external_prefix_cache_queries=diff(self.external_prefix_cache_queries,
                                               previous.external_prefix_cache_queries),
            external_prefix_cache_hits=diff(self.external_prefix_cache_hits, previous.external_prefix_cache_hits),
            store_keys=diff_map(self.store_keys, previous.store_keys),
            store_bytes=diff_map(self.store_bytes, previous.store_bytes),
            store_failed_keys=diff_map(self.store_failed_keys, previous.store_failed_keys),
            found=self.found, scraped_at=self.scraped_at)
        return replace(out, reset=reset) if reset else out

    def plus(self, other: EngineMetrics) -> EngineMetrics:
        """Sum of two deltas (for running totals); ``scraped_at`` and ``found`` from ``other``."""
        def add_map(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
            return {op: a.get(op, 0.0) + b.get(op, 0.0) for op in {*a, *b}}

        return EngineMetrics(
            prefix_cache_queries=self.prefix_cache_queries + other.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits + other.prefix_cache_hits,
            external_prefix_cache_queries=self.external_prefix_cache_queries + other.external_prefix_cache_queries,
            external_prefix_cache_hits=self.external_prefix_cache_hits + other.external_prefix_cache_hits,
            store_keys=add_map(self.store_keys, other.store_keys),
            store_bytes=add_map(self.store_bytes, other.store_bytes),
            store_failed_keys=add_map(self.store_failed_keys, other.store_failed_keys),
            found=other.found | self.found, scraped_at=other.scraped_at)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (maps copied, ``found`` sorted, hit rates added)."""
        return {
            "prefix_cache_queries": self.prefix_cache_queries, "prefix_cache_hits": self.prefix_cache_hits,
            "external_prefix_cache_queries": self.external_prefix_cache_queries,
            "external_prefix_cache_hits": self.external_prefix_cache_hits,
            "store_keys": dict(self.store_keys), "store_bytes": dict(self.store_bytes),
            "store_failed_keys": dict(self.store_failed_keys), "found": sorted(self.found),
            "scraped_at": self.scraped_at, "reset": self.reset,
            "prefix_hit_rate": self.prefix_hit_rate, "external_hit_rate": self.external_hit_rate,
        }


def parse_metrics(text: str, *, scraped_at: float | None = None) -> EngineMetrics:
    """The counters of one ``/metrics`` text (with or without ``# TYPE`` lines).

    Raises:
        MetricsError: the text is not Prometheus exposition format.
    """
    scalars: dict[str, float] = {}
    maps: dict[str, dict[str, float]] = {name: {} for name in _PER_OPERATION.values()}
    found: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                attr = _SCALARS.get(name)
                if attr is not None:
                    scalars[attr] = scalars.get(attr, 0.0) + float(sample.value)
                    found.add(name)
                    continue
                attr = _PER_OPERATION.get(name)
                if attr is not None:
                    op = sample.labels.get("operation", "")
                    per_op = maps[attr]
                    per_op[op] = per_op.get(op, 0.0) + float(sample.value)
                    found.add(name)
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text: {exc}") from None
    return EngineMetrics(
        prefix_cache_queries=scalars.get("prefix_cache_queries", 0.0),
        prefix_cache_hits=scalars.get("prefix_cache_hits", 0.0),
        external_prefix_cache_queries=scalars.get("external_prefix_cache_queries", 0.0),
        external_prefix_cache_hits=scalars.get("external_prefix_cache_hits", 0.0),
        store_keys=maps["store_keys"], store_bytes=maps["store_bytes"], store_failed_keys=maps["store_failed_keys"],
        found=frozenset(found), scraped_at=time.time() if scraped_at is None else scraped_at)


def fetch_text(url: str, timeout: float = 2.0) -> str:
    """GET ``url`` and return its body as text.

    Raises:
        MetricsError: connection failure, timeout, or a non-200 status.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - a node-local http URL
            if resp.status != 200:
                raise MetricsError(f"{url}: HTTP {resp.status}")
            return resp.read().decode("utf-8", "replace")
    except MetricsError:
        raise
    except Exception as exc:  # URLError, socket timeout, connection reset, ...
        raise MetricsError(f"{url}: {exc}") from None


class MetricsTracker:
    """Scrapes of one engine: the last one, deltas summed since the tracker started, and failures.

    Args:
        url: the engine's metrics URL (``http://127.0.0.1:<port>/metrics``).
        fetch: ``(url, timeout) -> text`` (default :func:`fetch_text`).
        timeout: seconds per scrape.

    Not thread-safe by itself (the observer calls it from one thread and reads :meth:`snapshot` under its lock).
    """

    def __init__(self, url: str, *, fetch: Callable[[str, float], str] = fetch_text, timeout: float = 2.0) -> None:
        self.url = url
        self.fetch = fetch
        self.timeout = timeout
        self.last: EngineMetrics | None = None
        self.totals = EngineMetrics()
        self.scrapes = 0
        self.failures = 0
        self.resets = 0
        self.last_error = ""

    def update(self, metrics: EngineMetrics) -> EngineMetrics | None:
        """Take one scrape; returns its delta since the previous one. The first successful scrape is the baseline
        (None, nothing counted) unless earlier scrapes failed: then the engine came up after the tracker started
        and its whole counts are the delta."""
        previous, self.last = self.last, metrics
        self.scrapes += 1
        if previous is None:
            if not self.failures:
                return None
            self.totals = self.totals.plus(metrics)
            return metrics
        delta = metrics.delta(previous)
        if delta.reset:
            self.resets += 1
        self.totals = self.totals.plus(delta)
        return delta

    def scrape(self) -> EngineMetrics | None:
        """Fetch, parse and :meth:`update`; returns the delta, None on the first scrape or on failure
        (counted in ``failures``, message in ``last_error``). Never raises for a failed scrape."""
        try:
            metrics = parse_metrics(self.fetch(self.url, self.timeout))
        except Exception as exc:  # a scrape must never take the observer down
            self.failures += 1
            self.last_error = str(exc)
            return None
        return self.update(metrics)

    def snapshot(self) -> dict[str, Any]:
        """``url``, ``scrapes``, ``failures``, ``resets``, ``last_error``, ``last`` (the latest scrape) and
        ``totals`` (increases since the tracker started), JSON-ready."""
        return {"url": self.url, "scrapes": self.scrapes, "failures": self.failures, "resets": self.resets,
                "last_error": self.last_error, "last": self.last.as_dict() if self.last else None,
                "totals": self.totals.as_dict()}


__all__ = ["EngineMetrics", "MetricsError", "MetricsTracker", "fetch_text", "parse_metrics"]
