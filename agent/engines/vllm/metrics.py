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

Untrusted answers (issue 20 F4/F5): whoever listens on the port answers. :func:`fetch_text` bounds one scrape in
total time (``SCRAPE_DEADLINE_S``, connect to last byte, not per socket operation) and size (``MAX_METRICS_BYTES``),
and, given the instance's uid, reads nothing from a listener of another account: the kernel's socket table
(``/proc/net/tcp``, ``tcp6``) names the uid of the server side of the very connection made (the listener's account;
a port held by another account while the engine is down is refused). :meth:`MetricsTracker.update` refuses a scrape
whose token counters grew by more than ``MAX_TOKENS_PER_S`` per second since the previous one (counted in
``implausible``): what one scrape can credit is bounded.
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


#: Total seconds one scrape may take, from connect to the answer's last byte. vLLM answers ``/metrics`` in
#: milliseconds; one thread scrapes every instance in turn, so this is the most one instance (a trickling engine or
#: a process squatting its port) can delay the scrapes of the others.
SCRAPE_DEADLINE_S = 2.0
#: Largest ``/metrics`` answer read (bytes, headers included). vLLM 0.32's is about 100-300 KiB (histograms per
#: engine and model); 4 MiB leaves room for many label sets while bounding the memory and parse CPU of one scrape.
MAX_METRICS_BYTES = 4 << 20
#: Most tokens an instance may look up per second (each token counter: ``prefix_cache_*``,
#: ``external_prefix_cache_*``). A large GPU prefills on the order of 10^5 tokens/s and a lookup counts a prompt's
#: tokens once per scheduling; 10^6/s per instance is far above it. A larger jump is refused (``implausible``).
MAX_TOKENS_PER_S = 1_000_000
#: Seconds of slack added to the time since the previous scrape for :data:`MAX_TOKENS_PER_S`.
PLAUSIBLE_SLACK_S = 5.0

_TOKEN_COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_queries",
                   "external_prefix_cache_hits")
_RECV_BYTES = 64 << 10


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


def fetch_text(url: str, timeout: float = SCRAPE_DEADLINE_S, *, owner_uid: int | None = None,
               max_bytes: int = MAX_METRICS_BYTES, proc_net: Path = Path("/proc/net")) -> str:
    """GET ``url`` (``http://host:port/path``) and return its body as text, within ``timeout`` seconds in all and
    ``max_bytes`` bytes (module docstring). With ``owner_uid``, the server side of the connection must belong to
    that uid (:func:`server_uid`), else nothing is sent or read.

    Raises:
        MetricsError: connection failure, deadline passed, answer too large, a listener of another account,
            a non-200 status or a malformed answer.
    """
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MetricsError(f"{url}: no complete answer within {timeout:g} s (the scrape's deadline): refused")
        return remaining

    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise MetricsError(f"{url}: not an http:// URL")
    host, port = parts.hostname, parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        sock = socket.create_connection((host, port), timeout=left())
    except MetricsError:
        raise
    except OSError as exc:
        raise MetricsError(f"{url}: {exc}") from None
    try:
        if owner_uid is not None:
            uid = server_uid(sock, proc_net)
            if uid != owner_uid:
                who = "no listener found in the socket table" if uid is None else f"the listener's uid is {uid}"
                raise MetricsError(f"{url}: {who}, not the instance's account (uid {owner_uid}): another process "
                                   "holds the port; scrape refused")
        raw = _exchange(sock, url, host, port, path, max_bytes, left)
    except MetricsError:
        raise
    except OSError as exc:  # reset, timeout (the deadline), ...
        if isinstance(exc, TimeoutError | socket.timeout):
            raise MetricsError(f"{url}: no complete answer within {timeout:g} s (the scrape's deadline): "
                               "refused") from None
        raise MetricsError(f"{url}: {exc}") from None
    finally:
        sock.close()
    resp = http.client.HTTPResponse(_Replay(raw))  # type: ignore[arg-type]
    try:
        resp.begin()
        if resp.status != 200:
            raise MetricsError(f"{url}: HTTP {resp.status}")
        return resp.read().decode("utf-8", "replace")
    except MetricsError:
        raise
    except Exception as exc:  # malformed status line, headers, chunks; truncated body
        raise MetricsError(f"{url}: malformed HTTP answer: {exc!r}"[:500]) from None


class _Replay:
    """A received answer, as the socket ``http.client.HTTPResponse`` parses."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def makefile(self, *_args: Any, **_kwargs: Any) -> io.BytesIO:
        return io.BytesIO(self._raw)


def _exchange(sock: socket.socket, url: str, host: str, port: int, path: str, max_bytes: int,
              left: Callable[[], float]) -> bytes:
    """Send the request and receive the answer: until the peer closes, the ``Content-Length`` is in or a chunked
    body's last chunk; every operation within the deadline (``left``), at most ``max_bytes``."""
    sock.settimeout(left())
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/plain\r\nConnection: close"
                 "\r\n\r\n".encode("latin-1"))
    buf = bytearray()
    body_at = -1
    length: int | None = None
    chunked = False
    while True:
        sock.settimeout(left())
        data = sock.recv(min(_RECV_BYTES, max_bytes + 1 - len(buf)))
        if not data:
            break
        buf += data
        if len(buf) > max_bytes:
            raise MetricsError(f"{url}: answer over {max_bytes} bytes (MAX_METRICS_BYTES): refused")
        if body_at < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            body_at = end + 4
            for line in bytes(buf[:end]).split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length" and value.strip().isdigit():
                    length = int(value.strip())
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
        if length is not None and not chunked and len(buf) - body_at >= length:
            break
        if chunked and buf.endswith(b"\r\n0\r\n\r\n"):
            break
    return bytes(buf)


def _proc_addr(field_: str) -> tuple[str, int]:
    """``ADDR:PORT`` of a ``/proc/net/tcp[6]`` row: the address in host byte order, 4 or 16 bytes, as text
    (an IPv4-mapped IPv6 address as its IPv4 form)."""
    addr_hex, _, port_hex = field_.partition(":")
    raw = bytes.fromhex(addr_hex)
    packed = b"".join(struct.pack("=I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port_hex, 16)


def _norm(addr: Any) -> tuple[str, int]:
    ip = ipaddress.ip_address(str(addr[0]).split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(addr[1])


def server_uid(sock: socket.socket, proc_net: Path = Path("/proc/net")) -> int | None:
    """The uid owning the server side of ``sock``'s connection (Linux: the kernel's ``/proc/net/tcp`` and ``tcp6``
    rows; an accepted socket carries its listener's uid): the row whose local address is ``sock``'s peer and whose
    remote address is ``sock``'s own; when that row is not listed (yet), the listening socket(s) on the peer's port
    (all must be one uid). None when none is found or the table cannot be read."""
    server, client = _norm(sock.getpeername()), _norm(sock.getsockname())
    listeners: set[int] = set()
    wildcard = {"0.0.0.0", "::"}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 8:
                continue
            try:
                local, remote = _proc_addr(cols[1]), _proc_addr(cols[2])
                uid = int(cols[7])
            except ValueError:
                continue
            if local == server and remote == client:
                return uid
            if cols[3] == "0A" and local[1] == server[1] and (local[0] == server[0] or local[0] in wildcard):
                listeners.add(uid)
    return listeners.pop() if len(listeners) == 1 else None


class MetricsTracker:
    """Scrapes of one engine: the last one, deltas summed since the tracker started, and failures.

    Args:
        url: the engine's metrics URL (``http://127.0.0.1:<port>/metrics``).
        fetch: ``(url, timeout) -> text`` (default :func:`fetch_text`, checking ``owner_uid``).
        timeout: seconds per scrape, in all (``SCRAPE_DEADLINE_S``).
        owner_uid: the instance's account: :func:`fetch_text` refuses a listener of another uid (None: no check;
            the observer always passes one).
        clock: monotonic seconds (tests), for :data:`MAX_TOKENS_PER_S`.

    Not thread-safe by itself (the observer calls it from one thread and reads :meth:`snapshot` under its lock).
    """

    def __init__(self, url: str, *, fetch: Callable[[str, float], str] | None = None,
                 timeout: float = SCRAPE_DEADLINE_S, owner_uid: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.owner_uid = owner_uid
        self.fetch: Callable[[str, float], str] = fetch if fetch is not None else self._fetch_owned
        self.timeout = timeout
        self.clock = clock
        self.last: EngineMetrics | None = None
        self.totals = EngineMetrics()
        self.scrapes = 0
        self.failures = 0
        self.resets = 0
        self.implausible = 0
        self.last_error = ""
        self._since = clock()  # when the counters were last known (the tracker's start, then each scrape taken)

    def _fetch_owned(self, url: str, timeout: float) -> str:
        return fetch_text(url, timeout, owner_uid=self.owner_uid)

    def update(self, metrics: EngineMetrics) -> EngineMetrics | None:
        """Take one scrape; returns its delta since the previous one. The first successful scrape is the baseline
        (None, nothing counted) unless earlier scrapes failed: then the engine came up after the tracker started
        and its whole counts are the delta."""
        now = self.clock()
        elapsed, self._since = max(0.0, now - self._since), now
        previous, self.last = self.last, metrics
        self.scrapes += 1
        grown = metrics if previous is None else metrics.delta(previous)
        allowed = MAX_TOKENS_PER_S * (elapsed + PLAUSIBLE_SLACK_S)
        if (previous is not None or self.failures) and any(getattr(grown, n) > allowed for n in _TOKEN_COUNTERS):
            # more tokens than the instance could have looked up since: refused, counted; the next scrape counts
            # from this one
            self.implausible += 1
            self.failures += 1
            worst = max(_TOKEN_COUNTERS, key=lambda n: getattr(grown, n))
            self.last_error = (f"{self.url}: {worst} grew by {getattr(grown, worst):,.0f} tokens in {elapsed:.1f} s, "
                               f"over {MAX_TOKENS_PER_S:,} tokens/s (MAX_TOKENS_PER_S): not counted")
            return None
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
        """``url``, ``scrapes``, ``failures``, ``resets``, ``implausible`` (scrapes refused for
        :data:`MAX_TOKENS_PER_S`, also in ``failures``), ``last_error``, ``last`` (the latest scrape) and ``totals``
        (increases since the tracker started), JSON-ready."""
        return {"url": self.url, "scrapes": self.scrapes, "failures": self.failures, "resets": self.resets,
                "implausible": self.implausible,
                "last_error": self.last_error, "last": self.last.as_dict() if self.last else None,
                "totals": self.totals.as_dict()}


__all__ = ["MAX_METRICS_BYTES", "MAX_TOKENS_PER_S", "SCRAPE_DEADLINE_S", "EngineMetrics", "MetricsError",
           "MetricsTracker", "fetch_text", "parse_metrics", "server_uid"]
