"""A stand-in for a vLLM engine's KV-event publisher: a ZMQ PUB bound at ``<instance dir>/kv-events.sock``, as vLLM
0.32.0's ``ZmqEventPublisher`` binds its rendered ``ipc://kv-events.sock`` in its working directory.

``bind_publisher`` binds through ``/proc/self/fd/<dir fd>`` (pytest's paths can exceed the 107 bytes of a Unix
socket path); ``ENGINE_SCRIPT`` is the same as a program another account runs (``tests.support.accounts.run_as``).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import zmq

from agent.contract.kv_events import KV_EVENTS_ENDPOINT, KV_EVENTS_SOCKET


def events_flag(instance_id: str, endpoint: str = KV_EVENTS_ENDPOINT) -> tuple[str, str]:
    """The ``--kv-events-config`` argument pair the registry renders for an instance."""
    import json

    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": instance_id}
    return ("--kv-events-config", json.dumps(config, separators=(",", ":")))


class Publisher:
    """A PUB socket bound in an instance directory (``close`` unbinds it and removes the socket file)."""

    def __init__(self, ctx: zmq.Context, directory: Path) -> None:
        self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"ipc:///proc/self/fd/{self.dir_fd}/{KV_EVENTS_SOCKET}")
        self.path = Path(directory) / KV_EVENTS_SOCKET

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(0)
        os.close(self.dir_fd)


class ReplayPublisher(Publisher):
    """A PUB at ``directory/kv-events.sock`` numbering its messages as vLLM 0.32.0's ``ZmqEventPublisher`` does
    (``publish(topic, payload)``: seq 0, 1, ... per publisher, 8 bytes big-endian), keeping them all, and a ROUTER at
    ``directory/kv-events-replay.sock`` answering a replay request ``[b"", start seq]`` with every kept message from
    ``start`` on, ``[b"", topic, seq, payload]`` each, then ``[b"", b"", END_SEQ, b""]`` (``_service_replay``).
    ``serve_replays()`` answers the waiting requests (the engine does so from its publisher thread)."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, ctx: zmq.Context, directory: Path) -> None:
        super().__init__(ctx, directory)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(f"ipc://{directory / 'kv-events-replay.sock'}")
        self.kept: list[tuple[int, bytes, bytes]] = []
        self.requests: list[int] = []

    def publish(self, topic: bytes, payload: bytes, *, deliver: bool = True) -> int:
        """Number and keep one message; send it on the PUB unless ``deliver`` is False (lost on the way)."""
        seq = len(self.kept)
        self.kept.append((seq, topic, payload))
        if deliver:
            self.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        return seq

    def serve_replays(self) -> int:
        """Answer every waiting replay request; returns how many."""
        served = 0
        while self.router.poll(0):
            client, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.requests.append(first)
            for seq, topic, payload in self.kept:
                if seq >= first:
                    self.router.send_multipart([client, b"", topic, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", b"", self.END_SEQ, b""])
            served += 1
        return served

    def close(self) -> None:
        self.router.close(0)
        super().close()


def bind_publisher(ctx: zmq.Context, directory: Path) -> Publisher:
    """Bind an engine's PUB at ``directory/kv-events.sock``."""
    return Publisher(ctx, directory)


def send_when_joined(send: Callable[[list[bytes]], None], received: Callable[[], int], messages: Iterable[list[bytes]],
                     *, probe_topic: bytes = b"probe", timeout: float = 10.0) -> int:
    """Send probes under ``probe_topic`` until ``received()`` grows (the SUB connected and its subscription reached
    the PUB: ZMQ's slow joiner), then ``messages``; returns how many probes arrived."""
    start = received()
    deadline = time.monotonic() + timeout
    while received() == start:
        if time.monotonic() > deadline:
            raise AssertionError("the observer's SUB socket never joined the engine's PUB")
        send([probe_topic, b"\0" * 8, b""])
        time.sleep(0.02)
    time.sleep(0.05)  # probes still in flight arrive before the messages
    probes = received() - start
    for raw in messages:
        send(raw)
    return probes


#: A program that binds ``ipc://kv-events.sock`` in its working directory (as a vLLM engine does) and prints
#: ``bound`` (or ``bind failed: ...``, exit 3), sends probes under topic ``probe`` until a line arrives on stdin,
#: then publishes the multipart messages of the JSON file argv[1] (lists of hex frames), prints ``sent`` and keeps
#: the socket until the next line.
ENGINE_SCRIPT = r"""
import json, sys, threading, time, zmq
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.LINGER, 0)
try:
    pub.bind("ipc://kv-events.sock")
except zmq.ZMQError as exc:
    print("bind failed:", exc, flush=True)
    sys.exit(3)
print("bound", flush=True)
messages = [[bytes.fromhex(f) for f in m] for m in json.load(open(sys.argv[1]))]
go = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
while not go.is_set():
    pub.send_multipart([b"probe", b"\0" * 8, b""])
    time.sleep(0.02)
time.sleep(0.05)
for m in messages:
    pub.send_multipart(m)
print("sent", flush=True)
sys.stdin.readline()
pub.close(0)
"""
