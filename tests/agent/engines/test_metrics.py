"""The recorded engines' /metrics counters (vLLM 0.32.0 CPU + MooncakeStoreConnector)."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest

from agent.engines.vllm.metrics import (
    MAX_METRICS_BYTES,
    EngineMetrics,
    MetricsError,
    MetricsTracker,
    fetch_text,
    parse_metrics,
)
from tests.support.captures import RUNS, instance, meta


def metrics_text(run: str, scale: float = 1.0) -> str:
    lines = meta(run)["engine_metrics"]
    if scale == 1.0:
        return "\n".join(lines) + "\n"
    out = []
    for line in lines:
        name, value = line.rsplit(" ", 1)
        out.append(f"{name} {float(value) * scale}")
    return "\n".join(out) + "\n"


def test_captured_counters_parse() -> None:
    m = parse_metrics(metrics_text("embedded-int"), scraped_at=5.0)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (760.0, 96.0)
    assert (m.external_prefix_cache_queries, m.external_prefix_cache_hits) == (664.0, 0.0)
    assert m.store_keys == {"lookup_exists": 22.0, "save_exists": 22.0, "save_put": 19.0}
    assert m.store_bytes["save_put"] == 311296.0 == 19 * 16384
    assert m.store_failed_keys == {"lookup_exists": 0.0, "save_exists": 0.0, "save_put": 0.0}
    assert m.external_hit_rate == 0.0 and m.prefix_hit_rate == pytest.approx(96 / 760)
    assert "vllm:external_prefix_cache_hits_total" in m.found and m.scraped_at == 5.0


@pytest.mark.parametrize("run", RUNS)
def test_store_put_keys_equal_the_store_events(run: str) -> None:
    m = parse_metrics(metrics_text(run))
    assert m.store_keys["save_put"] == len(meta(run)["store_keys"]["keys_present"])


def test_type_lines_and_several_series_are_summed() -> None:
    text = ("# HELP vllm:prefix_cache_queries Prefix cache queries.\n# TYPE vllm:prefix_cache_queries counter\n"
            + metrics_text("embedded-int")
            + 'vllm:prefix_cache_queries_total{engine="1",model_name="var/tiny-llama"} 40.0\n')
    m = parse_metrics(text)
    assert m.prefix_cache_queries == 800.0


def test_deltas_between_scrapes_and_restarts() -> None:
    before = parse_metrics(metrics_text("embedded-int"))
    after = parse_metrics(metrics_text("embedded-int", 2.0))
    d = after.delta(before)
    assert not d.reset and d.prefix_cache_queries == 760.0 and d.store_keys["save_put"] == 19.0
    restarted = parse_metrics(metrics_text("standalone-store"))  # lower counters: a new engine process
    d2 = restarted.delta(after)
    assert d2.reset and d2.prefix_cache_queries == 300.0 and d2.store_keys["save_put"] == 8.0


def test_tracker_sums_deltas_and_counts_failures() -> None:
    texts = iter([metrics_text("embedded-int"), OSError("connection refused"), metrics_text("embedded-int", 2.0),
                  "this is { not prometheus", metrics_text("standalone-store")])

    def fetch(url: str, timeout: float) -> str:
        item = next(texts)
        if isinstance(item, Exception):
            raise item
        return item

    t = MetricsTracker("http://127.0.0.1:1/metrics", fetch=fetch)
    assert t.scrape() is None  # baseline
    assert t.scrape() is None and t.failures == 1 and "refused" in t.last_error
    assert t.scrape().store_keys["save_put"] == 19.0
    assert t.scrape() is None and t.failures == 2
    assert t.scrape().reset and t.resets == 1
    snap = t.snapshot()
    assert snap["totals"]["store_keys"]["save_put"] == 27.0 and snap["scrapes"] == 3
    assert snap["last"]["prefix_cache_queries"] == 300.0


def test_bad_text_raises_a_metrics_error() -> None:
    with pytest.raises(MetricsError):
        parse_metrics("vllm:prefix_cache_queries_total{engine= 1\n")


def test_empty_scrape_is_zero() -> None:
    assert parse_metrics("", scraped_at=1.0) == EngineMetrics(scraped_at=1.0)


# --- issue 20 F4/F5: a /metrics answer is untrusted input ------------------------------------------------------

class RawServer:
    """A listener on 127.0.0.1 (this process's uid) whose one connection ``serve(conn)`` answers in a thread."""

    def __init__(self, serve: Any) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.sent = 0
        self.hung_up = threading.Event()
        self._serve = serve
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if not conn.recv(4096):
                    continue  # the client closed without asking
                try:
                    self._serve(self, conn)
                except OSError:
                    self.hung_up.set()  # the client closed before the answer's end

    def close(self) -> None:
        self.sock.close()


def trickle(server: RawServer, conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    for _ in range(400):  # 20 s at most: the hang guard of the unbounded read this replaces
        conn.sendall(b"#")
        server.sent += 1
        time.sleep(0.05)
    server.hung_up.wait(0)


def test_a_trickling_answer_ends_at_the_scrapes_deadline() -> None:
    """The review's F4: a server sending 1 byte/s held a scrape with timeout=2.0 for as long as it sent (12 s),
    since the timeout applied per socket operation. Now ``timeout`` bounds the whole scrape."""
    server = RawServer(trickle)
    try:
        with pytest.raises(MetricsError, match="deadline"):
            fetch_text(server.url, 0.5)
        assert server.hung_up.wait(30)  # the client hung up mid-answer ...
        assert server.sent < 400  # ... long before the trickle's end (before: every byte was awaited)
    finally:
        server.close()


def test_an_answer_over_the_size_limit_is_refused_without_reading_it_all() -> None:
    """The review's F4: a 512 MiB body was read whole (peak RSS 1,074 MiB). Now at most ``MAX_METRICS_BYTES``."""
    chunk = b"# " + b"x" * (1 << 20) + b"\n"

    def stream(server: RawServer, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        for _ in range(64):
            conn.sendall(chunk)
            server.sent += 1

    server = RawServer(stream)
    try:
        with pytest.raises(MetricsError, match="MAX_METRICS_BYTES"):
            fetch_text(server.url, 30.0)
        assert server.hung_up.wait(30) and server.sent < 64
        assert MAX_METRICS_BYTES <= 8 << 20
    finally:
        server.close()


def test_answers_with_a_length_or_chunks_are_read_without_waiting_for_the_close() -> None:
    body = metrics_text("embedded-int").encode()

    def keep_alive(server: RawServer, conn: socket.socket) -> None:  # answers and keeps the connection open
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        server.hung_up.wait(30)

    def chunked(server: RawServer, conn: socket.socket) -> None:
        half = len(body) // 2
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n" % half + body[:half] + b"\r\n"
                     + b"%x\r\n" % (len(body) - half) + body[half:] + b"\r\n0\r\n\r\n")
        server.hung_up.wait(30)

    for serve in (keep_alive, chunked):
        server = RawServer(serve)
        try:
            assert parse_metrics(fetch_text(server.url, 30.0, owner_uid=os.geteuid())).store_keys["save_put"] == 19
        finally:
            server.hung_up.set()
            server.close()


def test_a_listener_of_another_account_is_not_scraped() -> None:
    """The review's F5: whoever listened on the instance's port while its engine was down fed the hit counters
    (10,000,000 hit blocks booked). The listener here runs as this process's uid and the instance's account is
    another: every scrape is refused and counted, nothing is counted as the instance's."""
    from agent.engines.vllm.observer import EngineObserver
    from agent.engines.vllm.transport import EventSource

    answers = iter([0.0, 320_000.0, 640_000.0])

    def squat(server: RawServer, conn: socket.socket) -> None:
        value = next(answers, 0.0)
        text = (f"vllm:external_prefix_cache_queries_total {value}\n"
                f"vllm:external_prefix_cache_hits_total {value}\n").encode()
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + text)
        server.sent += 1

    server = RawServer(squat)
    other = os.geteuid() + 1
    try:
        obs = EngineObserver(None, metrics_interval=0,
                             source_for=lambda i: EventSource("", owner_uid=other, status="unobserved", problem="-"))
        obs.apply([instance("embedded-int", port=server.port)])
        for _ in range(3):
            obs.scrape_metrics_now()
        m = obs.snapshot()["instances"]["vllm-0"]["metrics"]
        assert m["totals"]["external_prefix_cache_hits"] == 0.0  # before: 640,000
        assert m["failures"] == 3 and m["scrapes"] == 0
        assert f"uid is {os.geteuid()}" in m["last_error"] and f"(uid {other})" in m["last_error"]
        assert server.sent == 0  # not even a request was answered
        # the instance's own account is scraped
        own = EngineObserver(None, metrics_interval=0,
                             source_for=lambda i: EventSource("", owner_uid=os.geteuid(), status="unobserved",
                                                              problem="-"))
        own.apply([instance("embedded-int", port=server.port)])
        own.scrape_metrics_now()
        own.scrape_metrics_now()
        m = own.snapshot()["instances"]["vllm-0"]["metrics"]
        assert m["failures"] == 0 and m["totals"]["external_prefix_cache_hits"] == 320_000.0
    finally:
        server.close()


def test_a_counter_jump_no_engine_could_make_is_refused_and_counted() -> None:
    def text(hits: int, queries: int) -> str:
        return f"vllm:external_prefix_cache_hits_total {hits}\nvllm:external_prefix_cache_queries_total {queries}\n"

    texts = iter([text(0, 0), text(320_000_000, 320_000_000), text(320_000_640, 320_001_280)])
    t = MetricsTracker("http://127.0.0.1:1/metrics", fetch=lambda url, timeout: next(texts))
    t.scrape()  # baseline
    t.scrape()  # 10,000,000 blocks of 32 tokens within seconds
    assert t.totals.external_prefix_cache_hits == 0.0  # before: 320,000,000
    snap = t.snapshot()
    assert snap["implausible"] == 1 and snap["failures"] == 1 and "MAX_TOKENS_PER_S" in snap["last_error"]
    t.scrape()  # counted from the refused scrape on
    assert (t.totals.external_prefix_cache_hits, t.totals.external_prefix_cache_queries) == (640.0, 1280.0)


def test_a_trickling_instance_delays_the_others_scrapes_by_its_deadline_only() -> None:
    """One thread scrapes every instance in turn: a trickling one ends at ``metrics_timeout`` and the next instance
    is scraped in the same pass."""
    from agent.engines.vllm.observer import EngineObserver

    slow = RawServer(trickle)

    def answer(server: RawServer, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + metrics_text("embedded-int").encode())

    fast = RawServer(answer)
    try:
        obs = EngineObserver(None, metrics_interval=0, metrics_timeout=0.5)
        obs.apply([instance("embedded-int", instance_id="a", port=slow.port),
                   instance("embedded-int", instance_id="b", port=fast.port)])
        obs.scrape_metrics_now()
        snap = obs.snapshot()["instances"]
        assert snap["a"]["metrics"]["failures"] == 1 and "deadline" in snap["a"]["metrics"]["last_error"]
        assert snap["b"]["metrics"]["scrapes"] == 1 and snap["b"]["metrics"]["failures"] == 0
        assert slow.hung_up.wait(30) and slow.sent < 400
    finally:
        slow.close()
        fast.close()
