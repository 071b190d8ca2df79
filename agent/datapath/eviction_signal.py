"""The Store master's eviction counters as a cheap signal: which tenants lost blocks since the last poll.

Mooncake 0.3.13.post1's master serves Prometheus text on its metrics port (``--metrics_port``, the admin API's
port: ``GET /metrics``) with eviction counters: global ``master_evicted_key_count``, ``master_evicted_size_bytes``,
``master_successful_evictions_total`` and, per tenant (``--enable_multi_tenants``),
``mooncake_tenant_evict_bytes_total{tenant_id="…"}``. Reading them is one small HTTP GET and leases nothing, while
checking blocks with ``batch_is_exist`` leases every object it finds (``--default_kv_lease_ttl``, 10 s). So the
node-maintenance policy (``agent.datapath.maintenance.Maintenance``) polls these counters about every second and
runs a full reconcile of a tenant only when its eviction counter grew.

:class:`EvictionWatch` keeps the previous reading of each master URL (``NodeSettings.master_metrics_urls`` of the
applied document: every master of an HA set, the standbys' counters never move) and answers, per poll, an
:class:`EvictionSignal`:

* a tenant's ``mooncake_tenant_evict_bytes_total`` grew (a tenant first seen with a value above 0 grew from 0):
  that tenant;
* a global counter grew and no tenant's did (a master without per-tenant counters): every tenant;
* any counter went down (the master restarted: it lost every object): every tenant;
* the first reading of a URL is the baseline: no signal (the agent's first reconcile covers what came before).

A URL that fails (unreachable, slow, oversized, not Prometheus text) is skipped for ``FAILED_URL_BACKOFF`` seconds
(so a blackholed standby costs one deadline per backoff, not per poll) and keeps its baseline. Each read is bounded:
``METRICS_DEADLINE`` seconds in all (connect, headers and body together, enforced by shutting the socket down, not
per read: a local process answering on the master's port cannot hold the maintenance round by dripping bytes) and
``METRICS_MAX_BYTES`` of body.

No Django here; times are ``time.monotonic`` seconds.
"""
from __future__ import annotations

import http.client
import logging
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("kvpool.agent.eviction_signal")

#: Global eviction counters of the master (Mooncake 0.3.13.post1).
GLOBAL_EVICTION_COUNTERS = ("master_evicted_key_count", "master_evicted_size_bytes",
                            "master_successful_evictions_total")
#: Per-tenant eviction counter (label ``tenant_id``).
TENANT_EVICTION_COUNTER = "mooncake_tenant_evict_bytes_total"
#: Default seconds between polls.
DEFAULT_POLL_INTERVAL = 1.0
#: Seconds one read of ``/metrics`` may take in all.
METRICS_DEADLINE = 1.0
#: Most bytes of a ``/metrics`` body read (the master's is a few KiB, plus about 1 KiB per tenant).
METRICS_MAX_BYTES = 4 << 20
#: Seconds a URL that failed is not read again.
FAILED_URL_BACKOFF = 10.0

_CHUNK = 64 << 10
_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsError(Exception):
    """A master's ``/metrics`` could not be read within the bounds, or is not Prometheus text."""


@dataclass(frozen=True)
class EvictionCounters:
    """One reading: ``totals`` (global counter name -> value, those present) and ``tenants`` (tenant_id -> evicted
    bytes, from ``mooncake_tenant_evict_bytes_total``)."""

    totals: dict[str, float] = field(default_factory=dict)
    tenants: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EvictionSignal:
    """What a poll found: ``tenants`` whose counter grew, or ``every_tenant`` (a global counter grew without any
    tenant's, or the master restarted: then ``restarted`` too, and every object is gone, leased or not). Empty and
    False: nothing new."""

    tenants: frozenset[str] = frozenset()
    every_tenant: bool = False
    restarted: bool = False

    def __bool__(self) -> bool:
        return self.every_tenant or bool(self.tenants)

    def affected(self, tenants: Iterable[str]) -> list[str]:
        """The tenants of ``tenants`` this signal is about, sorted."""
        return sorted(t for t in set(tenants) if self.every_tenant or t in self.tenants)


def parse_eviction_counters(text: str) -> EvictionCounters:
    """The eviction counters in Prometheus text ``text`` (other families are skipped; a family the master does not
    export is absent). A line that does not parse is skipped.

    Raises:
        MetricsError: none of the eviction counters is in ``text`` (not a Mooncake master's metrics).
    """
    totals: dict[str, float] = {}
    tenants: dict[str, float] = {}
    wanted = set(GLOBAL_EVICTION_COUNTERS) | {TENANT_EVICTION_COUNTER}
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(("master_", "mooncake_")):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1)
        if name == TENANT_EVICTION_COUNTER:
            labels = dict(_LABEL_RE.findall(m.group(2) or ""))
            tenant = labels.get("tenant_id")
            if tenant:
                tenants[tenant] = tenants.get(tenant, 0.0) + value
        elif m.group(2) is None or not m.group(2).strip():
            totals[name] = value
    if not totals and not tenants:
        raise MetricsError("no Mooncake eviction counters in the metrics")
    return EvictionCounters(totals, tenants)


def read_metrics(url: str, *, deadline: float = METRICS_DEADLINE, max_bytes: int = METRICS_MAX_BYTES) -> str:
    """GET ``url`` (``http://HOST:METRICS_PORT/metrics``) within ``deadline`` seconds in all (connect, status line,
    headers and body: a timer shuts the socket down at the deadline, so a peer dripping bytes within each read's
    timeout cannot hold the caller) and at most ``max_bytes`` of body. Redirects are not followed.

    Raises:
        MetricsError: unreachable, not HTTP 200, slower than ``deadline``, a body over ``max_bytes``.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MetricsError(f"{url}: not an http(s) URL")
    end = time.monotonic() + deadline
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    expired = threading.Event()
    timer: threading.Timer | None = None
    conn = None
    try:
        conn = kind(parts.hostname, parts.port, timeout=deadline)
        conn.connect()
        sock = conn.sock

        def expire() -> None:
            expired.set()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        timer = threading.Timer(max(0.0, end - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        if response.status != 200:
            raise MetricsError(f"{url}: HTTP {response.status}")
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise MetricsError(f"{url}: body of {length} bytes, over {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        while not expired.is_set():
            chunk = response.read(min(_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise MetricsError(f"{url}: body over {max_bytes} bytes")
    except MetricsError:
        raise
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if expired.is_set() or time.monotonic() > end:
            raise MetricsError(f"{url}: slower than {deadline:g} s") from None
        raise MetricsError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    finally:
        if timer is not None:
            timer.cancel()
        if conn is not None:
            conn.close()
    if expired.is_set() or time.monotonic() > end:
        raise MetricsError(f"{url}: slower than {deadline:g} s")
    return b"".join(chunks).decode("utf-8", "replace")


class EvictionWatch:
    """Polls the masters' eviction counters (module docstring).

    Args:
        urls: the masters' ``/metrics`` URLs (none: :meth:`poll` never reads anything).
        fetch: ``url -> Prometheus text``, raising on failure (default :func:`read_metrics`; tests pass fakes).
        poll_interval: seconds between polls.

    Not thread-safe: one caller polls (the maintenance round). :attr:`last_error` is the newest failure ("" once
    every URL read again); :attr:`polls`, :attr:`signals` and :attr:`errors` count since creation.
    """

    def __init__(self, urls: Iterable[str] = (), *, fetch: Callable[[str], str] | None = None,
                 poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self._fetch = fetch or read_metrics
        self.poll_interval = poll_interval
        self.urls: tuple[str, ...] = ()
        self._previous: dict[str, EvictionCounters] = {}
        self._failed_until: dict[str, float] = {}
        self.last_poll: float | None = None
        self.last_error = ""
        self.polls = self.signals = self.errors = 0
        self.set_urls(urls)

    @property
    def active(self) -> bool:
        """Whether there is a URL to poll."""
        return bool(self.urls)

    def set_urls(self, urls: Iterable[str]) -> None:
        """Poll ``urls`` from now on; a URL kept keeps its baseline, a new one starts with one."""
        self.urls = tuple(dict.fromkeys(u for u in urls if u))
        self._previous = {u: c for u, c in self._previous.items() if u in self.urls}
        self._failed_until = {u: t for u, t in self._failed_until.items() if u in self.urls}

    def due(self, now: float) -> bool:
        """Whether a poll is due at ``now``."""
        return self.active and (self.last_poll is None or now - self.last_poll >= self.poll_interval)

    def poll(self, now: float | None = None) -> EvictionSignal:
        """Read every URL (those not backing off after a failure) and compare with the previous reading."""
        now = time.monotonic() if now is None else now
        self.last_poll = now
        if not self.urls:
            return EvictionSignal()
        self.polls += 1
        tenants: set[str] = set()
        every = restart = False
        errors: list[str] = []
        for url in self.urls:
            if self._failed_until.get(url, now) > now:
                continue
            try:
                reading = parse_eviction_counters(self._fetch(url))
            except Exception as exc:  # MetricsError, or whatever a fake raises
                self._failed_until[url] = now + FAILED_URL_BACKOFF
                self.errors += 1
                errors.append(f"{url}: {exc}" if url not in str(exc) else str(exc))
                continue
            self._failed_until.pop(url, None)
            previous = self._previous.get(url)
            self._previous[url] = reading
            if previous is None:
                continue
            grown, restarted = _compare(previous, reading)
            if restarted:
                every = restart = True
            tenants |= grown
            if not grown and any(reading.totals.get(n, 0.0) > previous.totals.get(n, 0.0)
                                 for n in GLOBAL_EVICTION_COUNTERS):
                every = True
        if errors:
            if errors[0] != self.last_error:
                log.warning("master eviction counters: %s", "; ".join(errors))
            self.last_error = errors[0]
        elif not self._failed_until:
            self.last_error = ""
        signal = EvictionSignal(frozenset(tenants), every, restart)
        if signal:
            self.signals += 1
        return signal


def _compare(previous: EvictionCounters, reading: EvictionCounters) -> tuple[set[str], bool]:
    """Tenants whose counter grew, and whether any counter went down (a master restart)."""
    restarted = any(reading.totals.get(n, 0.0) < v for n, v in previous.totals.items() if n in reading.totals)
    restarted |= any(reading.tenants[t] < v for t, v in previous.tenants.items() if t in reading.tenants)
    grown = {t for t, v in reading.tenants.items() if v > previous.tenants.get(t, 0.0)}
    return grown, restarted


__all__ = ["DEFAULT_POLL_INTERVAL", "GLOBAL_EVICTION_COUNTERS", "METRICS_DEADLINE", "METRICS_MAX_BYTES",
           "TENANT_EVICTION_COUNTER", "EvictionCounters", "EvictionSignal", "EvictionWatch", "MetricsError",
           "parse_eviction_counters", "read_metrics"]
