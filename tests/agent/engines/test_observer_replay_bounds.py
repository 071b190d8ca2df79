"""Hostile input on the replay path (``agent.engines.vllm.observer``, "Catching up"): the live messages held while a
replay runs are bounded in bytes (not only in count: 10,000 messages of up to ``max_message_bytes`` each would be
40 GiB, past the node's whole memory bound), and a replayed message can not move the sequence number beyond the
live stream (which would make every later live message look like an engine restart and replay the buffer again)."""
from __future__ import annotations

import os
from pathlib import Path

from agent.datapath.ledger import Ledger
from agent.engines.vllm import observer as observer_module
from agent.engines.vllm.observer import EngineObserver, _Link
from agent.engines.vllm.transport import EventSource

TOPIC = b"vllm-a"


def _observer_and_link(tmp_path: Path) -> tuple[EngineObserver, _Link, list]:
    obs = EngineObserver(Ledger(), source_for=lambda inst: EventSource(
        "ipc://kv-events.sock", tmp_path / "kv-events.sock", os.geteuid()), metrics_interval=0)
    link = _Link(source=EventSource("ipc://kv-events.sock", tmp_path / "kv-events.sock", os.geteuid()), topic=TOPIC)
    obs._links = {"vllm-a": link}
    handed: list = []
    obs.handle_instance_frames = lambda iid, frames: handed.append(frames) or True  # type: ignore[method-assign]
    return obs, link, handed


def _msg(seq: int, size: int = 10) -> list[bytes]:
    return [TOPIC, seq.to_bytes(8, "big"), b"x" * size]


def test_held_messages_are_bounded_in_bytes(tmp_path: Path) -> None:
    obs, link, handed = _observer_and_link(tmp_path)
    link.replay = object()  # a replay in progress: live messages are held
    big = 1 << 20
    for seq in range(200):  # 200 MiB offered while the replay runs
        obs._on_live("vllm-a", link, _msg(seq, big), None, {}, 0.0)  # type: ignore[arg-type]
    held = sum(len(frame) for frames in link.held for frame in frames)
    assert held <= observer_module.REPLAY_HOLD_BYTES
    assert observer_module.REPLAY_HOLD_BYTES <= 64 << 20
    assert link.held_dropped == 200 - len(link.held)
    link.replay = None
    obs._end_replay(link, _Poller(), {})
    assert link.held == [] and link.held_bytes == 0 and len(handed) == 200 - link.held_dropped


class _Poller:
    def unregister(self, sock) -> None:
        pass
