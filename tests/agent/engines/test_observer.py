"""EngineObserver with real ZMQ sockets: recorded vLLM 0.32.0 frames replayed through a PUB bound at
``<instance dir>/kv-events.sock`` as an engine with ``--kv-events-config '{"endpoint": "ipc://kv-events.sock",
"topic": "<instance_id>"}'`` binds it, one SUB per instance connected by the observer; and /metrics scraped over
real HTTP."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from agent.datapath.ledger import Ledger
from agent.engines.vllm.observer import EngineObserver
from agent.engines.vllm.transport import EventSource
from tests.agent.engines.test_metrics import metrics_text
from tests.support.captures import frames, held_store, instance, meta, retopic
from tests.support.engines import Publisher, bind_publisher, send_when_joined
from tests.support.waiting import wait_for


@pytest.fixture
def observer(tmp_path: Path) -> Iterator[tuple[EngineObserver, Ledger]]:
    ledger = Ledger()

    def source_for(inst) -> EventSource:
        directory = tmp_path / inst.instance_id
        directory.mkdir(mode=0o700, exist_ok=True)
        return EventSource("ipc://kv-events.sock", directory / "kv-events.sock", os.geteuid())

    obs = EngineObserver(ledger, source_for=source_for, metrics_interval=0, poll_ms=20, retry_max=0.05)
    obs.start()
    try:
        yield obs, ledger
    finally:
        obs.stop()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator:
    """``bind(instance_id)``: a PUB bound in the instance's directory, as its engine binds it."""
    ctx = zmq.Context()
    pubs: list[Publisher] = []

    def bind(instance_id: str) -> Publisher:
        (tmp_path / instance_id).mkdir(mode=0o700, exist_ok=True)
        pubs.append(bind_publisher(ctx, tmp_path / instance_id))
        return pubs[-1]

    try:
        yield bind
    finally:
        for pub in pubs:
            pub.close()
        ctx.term()


def test_replayed_capture_through_a_real_socket(observer, engine) -> None:
    obs, ledger = observer
    obs.apply([instance("embedded-int", instance_id="vllm-a")])
    assert obs.topics == {b"vllm-a"}
    pub = engine("vllm-a")
    send_when_joined(pub.send_multipart, lambda: obs.received, retopic(frames("embedded-int"), "vllm-a"))
    pub.send_multipart([b"vllm-a", b"\0" * 3, b"junk"])  # malformed: counted, not fatal
    att = obs.attributor("vllm-a")
    wait_for(lambda: att.snapshot()["decode_errors"] == 1)
    snap = obs.snapshot()["instances"]["vllm-a"]
    assert snap["attributed"] == 19 and snap["by_group"] == {"default": 15, "group-a": 4}
    link = obs._links["vllm-a"]  # the connected SUB has the observer's size limit (libzmq drops larger messages)
    assert link.sock is not None and link.sock.getsockopt(zmq.MAXMSGSIZE) == obs.max_message_bytes
    assert snap["seq_gaps"] == 0 and snap["topic"] == "vllm-a" and snap["events_status"] == "connected"
    assert snap["topic_mismatch"] >= 1  # the probes, under topic "probe"
    assert not ledger.tables()  # events are hints: nothing is booked before the Store confirms it
    assert att.confirm(held_store("embedded-int")).confirmed == 19
    keys = {k for t in ledger.tables() for k in ledger.present_keys(t.scope)}
    assert sorted(keys) == sorted(meta("embedded-int")["store_keys"]["keys_present"])


def test_reapply_keeps_a_connection_and_adds_one_per_new_instance(observer, engine) -> None:
    obs, ledger = observer
    first = instance("embedded-int", instance_id="vllm-a")
    obs.apply([first])
    a = engine("vllm-a")
    send_when_joined(a.send_multipart, lambda: obs.received, [])
    obs.apply([first, instance("standalone-store", instance_id="vllm-b")])
    assert obs.attributor("vllm-a").instance == first and obs.status("vllm-a")[0] == "connected"
    assert obs.topics == {b"vllm-a", b"vllm-b"} and obs.status("vllm-b")[0] == "waiting"
    b = engine("vllm-b")
    wait_for(lambda: obs.status("vllm-b")[0] == "connected")
    mismatches = obs.snapshot()["instances"]["vllm-b"]["topic_mismatch"]
    send_when_joined(b.send_multipart, lambda: obs.snapshot()["instances"]["vllm-b"]["topic_mismatch"], [])
    assert obs.snapshot()["instances"]["vllm-b"]["topic_mismatch"] > mismatches
    for x, y in zip(retopic(frames("embedded-int"), "vllm-a"), retopic(frames("standalone-store"), "vllm-b")):
        a.send_multipart(x)
        b.send_multipart(y)
    for raw in retopic(frames("embedded-int"), "vllm-a")[4:]:
        a.send_multipart(raw)
    wait_for(lambda: obs.attributor("vllm-a").snapshot()["attributed"] == 19
             and obs.attributor("vllm-b").snapshot()["attributed"] == 8)
    assert obs.snapshot()["running"]
    obs.attributor("vllm-a").confirm(held_store("embedded-int"))
    obs.attributor("vllm-b").confirm(held_store("standalone-store"))
    tenants: dict[str, int] = {}
    for row in ledger.snapshot():
        tenants[row["tenant_id"]] = tenants.get(row["tenant_id"], 0) + row["bytes"]
    assert tenants == {"tenant-a": 19 * 16384, "tenant-b": 8 * 16384}
    obs.apply([])  # instances gone: nothing routed any more, their sockets closed
    assert obs.topics == set() and obs.snapshot()["instances"] == {}
    wait_for(lambda: not obs.connected())


def test_other_engines_are_left_out_and_an_instance_without_a_socket_path_is_unobserved(observer) -> None:
    obs, _ = observer
    good = instance("embedded-int", instance_id="vllm-a")
    sglang = good.model_copy(update={"instance_id": "sg-1", "engine": "sglang"})
    obs.apply([good, sglang])
    assert set(obs.snapshot()["instances"]) == {"vllm-a"}
    bare = EngineObserver(None, metrics_interval=0)  # default source: the instance's launch (none here)
    bare.apply([good])
    assert bare.status("vllm-a")[0] == "unobserved" and "no KV-event endpoint" in bare.status("vllm-a")[1]


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


def test_metrics_are_scraped_from_each_instance_port() -> None:
    _Metrics.body = metrics_text("embedded-int").encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        obs = EngineObserver(None, metrics_interval=0.05, poll_ms=20)
        obs.apply([instance("embedded-int", instance_id="vllm-a", port=port),
                   instance("standalone-store", instance_id="vllm-dead", port=1)])
        with obs:
            wait_for(lambda: (obs.snapshot()["instances"]["vllm-a"]["metrics"]["scrapes"] >= 2
                              and obs.snapshot()["instances"]["vllm-dead"]["metrics"]["failures"] >= 2))
        snap = obs.snapshot()
        assert not snap["running"]
        m = snap["instances"]["vllm-a"]["metrics"]
        assert m["last"]["store_keys"]["save_put"] == 19.0 and m["failures"] == 0
        assert m["url"] == f"http://127.0.0.1:{port}/metrics"
        assert snap["instances"]["vllm-dead"]["metrics"]["last"] is None
    finally:
        server.shutdown()
        server.server_close()


def test_topics_that_prefix_each_other_are_routed_exactly(observer, engine) -> None:
    """Instance ids are the registry's decimal assignment keys: "1" is a prefix of "12" (ZMQ subscriptions match
    prefixes), so the topic check compares whole frames: 1's socket carrying 12's topic is a mismatch."""
    obs, _ = observer
    obs.apply([instance("embedded-int", instance_id="1"), instance("standalone-store", instance_id="12")])
    one = engine("1")
    probes = send_when_joined(one.send_multipart, lambda: obs.received, retopic(frames("standalone-store"), "12"))
    wait_for(lambda: obs.snapshot()["instances"]["1"]["topic_mismatch"] >= probes + 4)
    assert obs.attributor("1").snapshot()["messages"] == obs.attributor("12").snapshot()["messages"] == 0
