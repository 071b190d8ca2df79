"""Where a vLLM instance publishes its KV events: the one rule the registry renders and the node agent reads back.

vLLM 0.32.0 (CPU) / 0.33.0 ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``) **binds** its PUB socket for
``ipc://`` endpoints (and ``tcp://*``) and connects for other ``tcp://`` ones. Every instance is rendered with
``--kv-events-config '{"endpoint": "ipc://kv-events.sock", "topic": "<instance_id>", ...}'``: a path relative to
the engine's working directory, which ``launch.sh`` makes the instance directory (``agent.node.instance_dirs``).
So each engine binds its own socket in a directory only its account can write, and the node agent connects to it
(``agent.engines.vllm.transport``): no other local process can publish as the instance, and none can take the
endpoint first (a bound tcp port could be squatted; a ``tcp://host:port`` endpoint delivers every prompt's tokens
to whoever binds that port). vLLM 0.32.0 refuses ``ipc://`` endpoints with a data-parallel rank above 0
(``offset_endpoint_port``); the registry renders no data parallelism.

The same config renders ``"replay_endpoint": "ipc://kv-events-replay.sock"``: vLLM's publisher keeps its last
``buffer_steps`` (10,000) messages and a ROUTER bound there sends them from a requested sequence number on, ending
with a message whose sequence number is -1 (``ZmqEventPublisher.END_SEQ``, vLLM 0.32.0 ``_service_replay``). The agent
asks for them when it connects (events published before it joined) and when it sees a gap.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

#: File name of an instance's KV-event socket in its instance directory.
KV_EVENTS_SOCKET = "kv-events.sock"
#: The ``endpoint`` rendered into every vLLM instance's ``--kv-events-config`` (relative to its working directory).
KV_EVENTS_ENDPOINT = f"ipc://{KV_EVENTS_SOCKET}"
#: File name of an instance's replay socket (vLLM's ``replay_endpoint``: a ROUTER that sends the publisher's buffered
#: messages from a sequence number on), in the same directory.
KV_EVENTS_REPLAY_SOCKET = "kv-events-replay.sock"
#: The ``replay_endpoint`` rendered into every vLLM instance's ``--kv-events-config``.
KV_EVENTS_REPLAY_ENDPOINT = f"ipc://{KV_EVENTS_REPLAY_SOCKET}"
#: vLLM's flag that carries the publisher config (a JSON object).
KV_EVENTS_FLAG = "--kv-events-config"


def launch_events_endpoint(argv: Sequence[str]) -> str | None:
    """The ``endpoint`` of the ``--kv-events-config`` JSON in an engine's ``argv`` (``--flag VALUE`` or
    ``--flag=VALUE``); None when the flag is absent, its value is not a JSON object with a string ``endpoint``, or
    events are disabled (``enable_kv_cache_events`` false)."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == KV_EVENTS_FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(KV_EVENTS_FLAG + "="):
            value = arg[len(KV_EVENTS_FLAG) + 1:]
    if value is None:
        return None
    try:
        config = json.loads(value)
    except ValueError:
        return None
    if not isinstance(config, dict) or config.get("enable_kv_cache_events") is False:
        return None
    endpoint = config.get("endpoint")
    return endpoint if isinstance(endpoint, str) and endpoint else None
