"""Catching up through vLLM's replay socket (``agent.engines.vllm.observer``, "Catching up"): an engine that published
before the agent connected, messages lost on the way, an engine restart, and a replay that never ends. The engine is
``tests.support.engines.ReplayPublisher``: real ZMQ sockets in the instance directory with vLLM 0.32.0's numbering
and replay protocol, publishing the recorded frames of a real vLLM run."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from agent.datapath.ledger import Ledger
from agent.engines.vllm import observer as observer_module
from agent.engines.vllm.observer import EngineObserver
from agent.engines.vllm.transport import EventSource
from tests.support.captures import frames, instance
from tests.support.engines import ReplayPublisher, send_when_joined
from tests.support.waiting import wait_for

IID = "vllm-a"
PAYLOADS = [payload for _topic, _seq, payload in frames("embedded-int")]
TOPIC = IID.encode()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator:
    directory = tmp_path / IID
    directory.mkdir(mode=0o700)
    ctx = zmq.Context()
    engine = ReplayPublisher(ctx, directory)
    serving = threading.Event()
    serving.set()
    stop = threading.Event()

    def serve() -> None:  # the engine's publisher thread answers replay requests
        while not stop.wait(0.01):
            if serving.is_set():
                engine.serve_replays()

    thread = threading.Thread(target=serve, daemon=True)
    obs = EngineObserver(Ledger(), source_for=lambda inst: EventSource(
        "ipc://kv-events.sock", directory / "kv-events.sock", os.geteuid()), metrics_interval=0, poll_ms=20,
        retry_max=0.05)
    try:
        yield obs, engine, serving, thread
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(5)
        obs.stop()
        engine.close()
        ctx.term()


def _snap(obs: EngineObserver) -> dict:
    return obs.snapshot()["instances"][IID]


def test_events_published_before_the_agent_connected_are_replayed(setup) -> None:
    obs, engine, _serving, thread = setup
    for payload in PAYLOADS:  # nobody subscribed yet: a plain SUB would never see these
        engine.publish(TOPIC, payload)
    thread.start()
    obs.apply([instance("embedded-int", instance_id=IID)])
    obs.start()
    wait_for(lambda: _snap(obs)["attributed"] == 19, what="the replayed events attributed")
    snap = _snap(obs)
    assert engine.requests[0] == 0 and snap["replays"] >= 1 and snap["replayed"] == len(PAYLOADS)
    assert snap["seq_gaps"] == 0 and snap["seq_resets"] == 0 and snap["by_group"] == {"default": 15, "group-a": 4}


def test_a_gap_is_filled_from_the_replay_and_nothing_is_applied_twice(setup) -> None:
    obs, engine, _serving, thread = setup
    thread.start()
    obs.apply([instance("embedded-int", instance_id=IID)])
    obs.start()
    wait_for(lambda: obs.status(IID)[0] == "connected" and not obs._links[IID].replay, what="connected, caught up")
    send_when_joined(engine.send_multipart, lambda: obs.received, [])  # unnumbered probes: the SUB has joined
    half = len(PAYLOADS) // 2
    for payload in PAYLOADS[:half]:
        engine.publish(TOPIC, payload, deliver=False)  # lost on the way (a full queue)
    for payload in PAYLOADS[half:]:
        engine.publish(TOPIC, payload)
    wait_for(lambda: _snap(obs)["attributed"] == 19, what="every event attributed")
    snap = _snap(obs)
    assert engine.requests == [0, 0]  # at connect (nothing kept yet), then at the gap: from the first one missing
    assert snap["seq_gaps"] == 0 and snap["messages"] == len(PAYLOADS)  # each message applied once


def test_a_replay_that_never_ends_is_abandoned_and_the_held_messages_go_on(setup, monkeypatch) -> None:
    obs, engine, serving, thread = setup
    monkeypatch.setattr(observer_module, "REPLAY_TIMEOUT", 0.3)
    serving.clear()  # the engine never answers
    thread.start()
    obs.apply([instance("embedded-int", instance_id=IID)])
    obs.start()
    wait_for(lambda: _snap(obs)["replay_timeouts"] >= 1, what="the replay abandoned")
    send_when_joined(engine.send_multipart, lambda: obs.received, [])
    for payload in PAYLOADS:
        engine.publish(TOPIC, payload)
    wait_for(lambda: _snap(obs)["attributed"] == 19, what="the live events attributed")
    assert _snap(obs)["replayed"] == 0


def test_after_an_engine_restart_its_first_messages_are_replayed_from_zero(setup) -> None:
    obs, engine, _serving, thread = setup
    thread.start()
    obs.apply([instance("embedded-int", instance_id=IID)])
    obs.start()
    wait_for(lambda: obs.status(IID)[0] == "connected" and not obs._links[IID].replay, what="connected")
    send_when_joined(engine.send_multipart, lambda: obs.received, [])
    link = obs._links[IID]
    link.last_seq = 500  # as if the engine before the restart had published 501 messages
    for payload in PAYLOADS[:3]:
        engine.publish(TOPIC, payload, deliver=False)  # the restarted engine's first messages, before the agent saw
    engine.publish(TOPIC, PAYLOADS[3])
    wait_for(lambda: _snap(obs)["messages"] >= 4, what="the restarted engine's messages")
    for payload in PAYLOADS[4:]:
        engine.publish(TOPIC, payload)
    wait_for(lambda: _snap(obs)["attributed"] == 19, what="every event attributed")
    assert 0 in engine.requests and _snap(obs)["messages"] == len(PAYLOADS)
