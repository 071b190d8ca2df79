"""Which master leads, and what counts as a failover (``dashboard.master.leader``, ``health.failover_reason``), from
``/health`` answers as mooncake_master 0.3.13.post1 gives them."""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from dashboard.master.health import failover_reason
from dashboard.master.leader import MAX_HEALTH_BYTES, MasterState, MastersView, read_health

LEADER = MasterState("http://a:1", "a:5", role="leader", ha_state="serving", service_ready=True, view_version=4)
WARMING = MasterState("http://b:1", "b:5", role="leader", ha_state="leader_warmup", view_version=6)
STANDBY = MasterState("http://b:1", "b:5", role="standby", ha_state="standby", view_version=4)
DOWN = MasterState("http://c:1", "c:5", error="unreachable: refused")


def test_the_serving_leader_the_elected_one_and_the_standbys():
    view = MastersView((LEADER, STANDBY, DOWN))
    assert (view.leader, view.elected, view.standbys, view.down) == (LEADER, LEADER, 1, (DOWN,))
    # a new election won, warm-up not over: elected but nobody serves yet
    warming = MastersView((DOWN, WARMING))
    assert (warming.leader, warming.elected, warming.standbys) == (None, WARMING, 0)
    # an old leader that has not noticed yet loses to the newer election
    newer = replace(WARMING, service_ready=True)
    assert MastersView((LEADER, newer)).leader == newer


def test_failover_reasons():
    before = SimpleNamespace(leader_address="a:5", view_version=4, key_count=10)
    assert failover_reason(before, LEADER) == ""
    assert failover_reason(before, None) == ""
    assert failover_reason(SimpleNamespace(leader_address="", view_version=None, key_count=None), WARMING) == ""
    assert failover_reason(before, WARMING) == ("failover: master b:5 took over from a:5 (election 4 → 6); "
                                                "10 key(s) before")
    again = MasterState("http://a:1", "a:5", role="leader", service_ready=True, view_version=9)
    assert failover_reason(before, again) == "failover: master a:5 was elected again (election 4 → 9); 10 key(s) before"


class _Health(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_health_answers_are_bounded_and_typed(health_server):
    url = f"http://127.0.0.1:{health_server.server_address[1]}"
    _Health.body = json.dumps({"status": "ok", "role": "leader", "ha_state": "serving", "service_ready": True,
                               "leader_address": "a:5", "view_version": 2}).encode()
    state = read_health(url, "a:5")
    assert state.serving_leader and state.view_version == 2 and state.leader_address == "a:5"
    _Health.body = json.dumps({"role": "leader", "service_ready": "yes", "view_version": True}).encode()
    state = read_health(url)
    assert not state.serving_leader and state.view_version is None  # only a JSON true serves
    _Health.body = b"[1, 2]"
    assert "not a master's answer" in read_health(url).error
    _Health.body = b" " * (MAX_HEALTH_BYTES + 1)
    assert "longer than" in read_health(url).error
