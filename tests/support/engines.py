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
