"""``agent.engines.vllm.inbox.Inbox`` and the observer's routing: one instance's traffic cannot stall another's
(rounds and messages counted, never timed), queues bounded in bytes, a size limit on the sockets."""

from __future__ import annotations

import random

import zmq

from agent.engines.vllm.observer import EngineObserver
from tests.agent.engines.test_attribution_bounds import BS, gpu_message, store_message
from tests.support.captures import frames, instance, retopic


def hostile_stream(topic: str, count: int) -> list[list[bytes]]:
    """A long GPU event, then ``count`` Store events below its last block (the measured attack), as ``topic``."""
    rng = random.Random(1)
    tokens = [rng.randrange(1024) for _ in range(2000 * BS)]
    gpu, refs = gpu_message(tokens, 0)
    out = [gpu] + [store_message(refs[-1], tokens[:BS], seq, rng.getrandbits(64)) for seq in range(1, count + 1)]
    return [[topic.encode(), seq, payload] for _t, seq, payload in out]


def observer_of(*instance_ids: str, **inbox_options: int) -> EngineObserver:
    obs = EngineObserver(None, metrics_interval=0, inbox_options=inbox_options)
    obs.apply([instance("embedded-int", instance_id=iid) for iid in instance_ids])
    obs.inbox.open()  # queue without the thread: this test runs the rounds
    return obs


def test_a_flooding_instance_does_not_delay_another_by_more_than_a_round() -> None:
    obs = observer_of("a", "b", round_work=512)
    for raw in hostile_stream("a", 3000):
        assert obs.handle_instance_frames(raw[0].decode(), raw)
    for raw in retopic(frames("embedded-int"), "b"):
        assert obs.handle_instance_frames(raw[0].decode(), raw)
    assert obs.inbox.queued("a") == 3001 and obs.inbox.queued("b") == 8
    rounds = 0
    while obs.inbox.queued("b"):
        obs.inbox.run_round()
        rounds += 1
    assert rounds == 1  # b's whole stream fits in its budget of the first round
    assert obs.attributor("b").snapshot()["attributed"] == 19
    assert obs.inbox.queued("a") == 3000  # a's first message (2,000 GPU blocks) used its whole round
    obs.inbox.run_round()
    assert obs.inbox.queued("a") == 2999  # its first Store event walked the 2,000 GPU blocks up: once
    obs.inbox.run_round()
    assert 2999 - obs.inbox.queued("a") == 512  # then a round's budget: 512 one-block events
    while obs.inbox.queued():
        obs.inbox.run_round()
    assert obs.attributor("a").snapshot()["messages"] == 3001


def test_a_full_queue_drops_that_instances_messages_only() -> None:
    msgs = retopic(frames("embedded-int"), "a")
    size = max(sum(len(f) for f in raw) for raw in msgs)
    obs = observer_of("a", "b", max_bytes=2 * size)
    results = [obs.handle_instance_frames(raw[0].decode(), raw) for raw in msgs]
    assert results.count(False) == len(msgs) - obs.inbox.queued("a") > 0
    first_of_b = retopic(frames("embedded-int"), "b")[0]
    assert obs.handle_instance_frames("b", first_of_b)  # b's queue has room of its own
    while obs.inbox.queued():
        obs.inbox.run_round()
    assert obs.attributor("a").snapshot()["dropped_messages"] == results.count(False)
    assert obs.attributor("b").snapshot()["dropped_messages"] == 0
    assert obs.attributor("b").snapshot()["messages"] == 1


def test_sockets_get_a_maximum_message_size_and_the_node_bound_is_shared() -> None:
    obs = EngineObserver(None, metrics_interval=0, max_message_bytes=1 << 20, memory_bytes=64 << 20)
    assert obs.socket_options()[zmq.MAXMSGSIZE] == 1 << 20
    obs.apply([instance("embedded-int", instance_id=f"i{n}") for n in range(4)])
    assert {att.memory_bytes for att in obs.attributors()} == {16 << 20}
    assert {att.max_message_bytes for att in obs.attributors()} == {1 << 20}
