"""EngineObserver with a real ZMQ socket pair: recorded vLLM 0.32.0 frames replayed through a PUB that connects
to the observer's bound SUB, as an engine with ``--kv-events-config '{"endpoint": "tcp://127.0.0.1:P",
"topic": "<instance_id>"}'`` does; and /metrics scraped over real HTTP."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from agent.datapath.ledger import Ledger
from agent.engines.vllm.observer import EngineObserver
from tests.agent.engines.test_metrics import metrics_text
from tests.support.captures import frames, held_store, instance, meta, retopic
from tests.support.waiting import wait_for


@pytest.fixture
def observer() -> Iterator[tuple[EngineObserver, Ledger]]:
    ledger = Ledger()
    obs = EngineObserver(ledger, endpoint="tcp://127.0.0.1:*", metrics_interval=0, poll_ms=20)
    obs.start()
    try:
        yield obs, ledger
    finally:
        obs.stop()


@pytest.fixture
def publisher(observer) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(observer[0].endpoint)  # the engine connects; the node binds
    try:
        yield pub
    finally:
        pub.close(0)
        ctx.term()


def join(obs: EngineObserver, pub: zmq.Socket, topic: bytes) -> None:
    """Wait for the subscription to reach the publisher (ZMQ's slow joiner): send probes under a topic that
    extends ``topic`` — the SUB's prefix match lets them through, the observer's exact routing drops them."""
    start = obs.unknown_topic

    def probe() -> bool:
        pub.send_multipart([topic + b"-probe", b"\0" * 8, b""])
        time.sleep(0.02)
        return obs.unknown_topic > start
    wait_for(probe)


def test_replayed_capture_through_a_real_socket(observer, publisher) -> None:
    obs, ledger = observer
    obs.apply([instance("embedded-int", instance_id="vllm-a")])
    assert obs.topics == {b"vllm-a"}
    join(obs, publisher, b"vllm-a")
    for raw in retopic(frames("embedded-int"), "vllm-a"):
        publisher.send_multipart(raw)
    publisher.send_multipart([b"vllm-a", b"\0" * 3, b"junk"])  # malformed: counted, not fatal
    att = obs.attributor("vllm-a")
    wait_for(lambda: att.snapshot()["decode_errors"] == 1)
    snap = obs.snapshot()["instances"]["vllm-a"]
    assert snap["attributed"] == 19 and snap["by_group"] == {"default": 15, "group-a": 4}
    assert snap["seq_gaps"] == 0 and snap["topic"] == "vllm-a"
    assert not ledger.tables()  # events are hints: nothing is booked before the Store confirms it
    assert att.confirm(held_store("embedded-int")).confirmed == 19
    keys = {k for t in ledger.tables() for k in ledger.present_keys(t.scope)}
    assert sorted(keys) == sorted(meta("embedded-int")["store_keys"]["keys_present"])


def test_reapply_changes_subscriptions_without_dropping_the_socket(observer, publisher) -> None:
    obs, ledger = observer
    first = instance("embedded-int", instance_id="vllm-a")
    obs.apply([first])
    join(obs, publisher, b"vllm-a")
    endpoint = obs.endpoint
    obs.apply([first, instance("standalone-store", instance_id="vllm-b")])
    assert obs.attributor("vllm-a").instance == first
    assert obs.topics == {b"vllm-a", b"vllm-b"}
    join(obs, publisher, b"vllm-b")  # the new subscription reaches the engine on the same socket
    for a, b in zip(retopic(frames("embedded-int"), "vllm-a"), retopic(frames("standalone-store"), "vllm-b")):
        publisher.send_multipart(a)
        publisher.send_multipart(b)
    for raw in retopic(frames("embedded-int"), "vllm-a")[4:]:
        publisher.send_multipart(raw)
    wait_for(lambda: obs.attributor("vllm-a").snapshot()["attributed"] == 19
             and obs.attributor("vllm-b").snapshot()["attributed"] == 8)
    assert obs.endpoint == endpoint and obs.snapshot()["running"]
    obs.attributor("vllm-a").confirm(held_store("embedded-int"))
    obs.attributor("vllm-b").confirm(held_store("standalone-store"))
    tenants: dict[str, int] = {}
    for row in ledger.snapshot():
        tenants[row["tenant_id"]] = tenants.get(row["tenant_id"], 0) + row["bytes"]
    assert tenants == {"tenant-a": 19 * 16384, "tenant-b": 8 * 16384}
    obs.apply([])  # instances gone: nothing routed any more
    assert obs.topics == set() and obs.snapshot()["instances"] == {}


def test_bad_instances_and_other_engines_are_left_out(observer) -> None:
    obs, _ = observer
    good = instance("embedded-int", instance_id="vllm-a")
    sglang = good.model_copy(update={"instance_id": "sg-1", "engine": "sglang"})
    clash = instance("embedded-int", instance_id="vllm-b")
    obs2 = EngineObserver(None, topic_for=lambda i: "same", metrics_interval=0)
    obs2.apply([good, clash])
    assert "vllm-b" in obs2.apply_errors and obs2.topics == {b"same"}
    obs.apply([good, sglang])
    assert set(obs.snapshot()["instances"]) == {"vllm-a"}


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
        obs = EngineObserver(None, endpoint="tcp://127.0.0.1:*", metrics_interval=0.05, poll_ms=20)
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


def test_topics_that_prefix_each_other_are_routed_exactly(observer, publisher) -> None:
    """Instance ids are the registry's decimal assignment keys: subscribing "1" also receives "12"'s messages
    (ZMQ matches prefixes), so routing compares whole topic frames."""
    obs, ledger = observer
    obs.apply([instance("embedded-int", instance_id="1"), instance("standalone-store", instance_id="12")])
    join(obs, publisher, b"12")
    for raw in retopic(frames("embedded-int"), "1") + retopic(frames("standalone-store"), "12"):
        publisher.send_multipart(raw)
    wait_for(lambda: obs.attributor("12").snapshot()["messages"] == 4
             and obs.attributor("1").snapshot()["messages"] == 8)
    assert obs.attributor("1").snapshot()["attributed"] == 19
    assert obs.attributor("12").snapshot()["attributed"] == 8
    assert obs.attributor("1").snapshot()["decode_errors"] == obs.attributor("12").snapshot()["decode_errors"] == 0
