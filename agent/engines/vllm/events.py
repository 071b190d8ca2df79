"""Typed decoding of vLLM KV-cache event messages (vLLM 0.32.0 CPU / 0.33.0 ``vllm/distributed/kv_events.py``).

One ZMQ multipart message of the engine's ``ZmqEventPublisher`` is three frames:

* ``topic``: bytes, the ``--kv-events-config`` ``topic`` (``b""`` by default; the registry renders the
  instance id so one node socket can tell instances apart);
* ``seq``: 8 bytes, big-endian unsigned, 0, 1, 2 ... per publisher (restarts at 0 with the engine);
* ``payload``: msgpack ``EventBatch``, an *array* ``[ts: float unix seconds, events: [...], data_parallel_rank]``
  whose events are msgpack *maps* tagged by ``"type"`` (``BlockStored``, ``BlockRemoved``,
  ``AllBlocksCleared``).

The Structs below mirror vLLM's field for field (order, defaults, ``omit_defaults``), so encoding one of them
gives the engine's exact bytes (checked against the recorded captures). Unknown fields are ignored; an event
of an unknown ``type`` is skipped and counted (:attr:`DecodedMessage.unknown_events`), never fatal.

Block hashes (``ExternalBlockHash``) are ``int`` — the low 64 bits of the full digest, i.e. its last 8 bytes
read big-endian (vLLM's default, ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` unset or 1) — or ``bytes``, the full
digest (32 bytes for SHA-256, 16 for xxhash; ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).
:func:`external_hash`, :func:`hash_matches` and :func:`check_hash` convert and compare.

``medium``: ``"cpu"`` (lowercase) marks a Store write by ``MooncakeStoreConnector`` (one block per event, no
``extra_keys``, ``lora_name`` always null); ``"GPU"`` the engine's prefix cache (several blocks per event,
``token_ids`` of all of them concatenated, ``extra_keys`` one entry per block, untagged: the first block of a
salted request carries ``["<salt>"]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

#: ``medium`` of a Store write by vLLM 0.32.0's ``MooncakeStoreConnector`` (lowercase, unlike ``MEDIUM_CPU``).
MEDIUM_STORE = "cpu"
#: ``medium`` of the engine's GPU prefix cache (``MEDIUM_GPU``).
MEDIUM_GPU = "GPU"

_LOW64 = (1 << 64) - 1
_DIGEST_SIZES = (16, 32)

#: ``ExternalBlockHash``: low 64 bits as an int, or the full digest.
ExternalBlockHash = int | bytes


class EventDecodeError(ValueError):
    """A message (or one value in it) that is not a vLLM KV event message.

    Attributes:
        what: which part is wrong: ``frames``, ``seq``, ``payload``, ``event``, ``block_hash``.
        detail: a human-readable reason naming the offending value or path.
    """

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (``"type"`` = class name)."""


class BlockStored(KVCacheEvent):
    """Blocks entered a cache tier: ``block_hashes[i]`` covers ``token_ids[i*block_size:(i+1)*block_size]``.

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]`` in its request, ``None`` for a
    request's first block. ``extra_keys`` (GPU events): one entry per block, untagged values in the order LoRA
    name, ``(mm_identifier, offset)`` pairs, cache_salt, prompt-embedding digests; ``None`` for a block without.
    """

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left a cache tier (the Mooncake Store connector of 0.32.0 never publishes it)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The engine reset its prefix cache."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """``[ts, events, data_parallel_rank]``: one publish call (``ts`` unix seconds). Extra trailing items are
    ignored."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(EventBatch)
_raw_decoder = msgspec.msgpack.Decoder(_RawBatch)
_event_decoder = msgspec.msgpack.Decoder(Event)
_tag_decoder = msgspec.msgpack.Decoder(dict[str, Any])
_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class DecodedMessage:
    """One decoded multipart message: ``topic`` frame, ``seq`` number, the batch, and how many events of an
    unknown ``type`` were skipped."""

    topic: bytes
    seq: int
    batch: EventBatch
    unknown_events: int = 0


def decode_payload(payload: bytes) -> tuple[EventBatch, int]:
    """The ``EventBatch`` of a payload frame and the count of skipped events of unknown type.

    Raises:
        EventDecodeError: ``payload`` (not a batch: bad msgpack, wrong shape) or ``event`` (a known event type
            with missing or mistyped fields).
    """
    try:
        return _batch_decoder.decode(payload), 0
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        first_error = exc
    # slow path: find what is wrong, skipping events of types this version does not know
    try:
        raw = _raw_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EventDecodeError("payload", f"not a vLLM EventBatch [ts, events, dp_rank]: {exc}") from None
    events: list[Any] = []
    unknown = 0
    for i, item in enumerate(raw.events):
        try:
            events.append(_event_decoder.decode(item))
            continue
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            error = exc
        try:
            tag = _tag_decoder.decode(item).get("type")
        except (msgspec.DecodeError, msgspec.ValidationError):
            tag = None
        if isinstance(tag, str) and tag not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
            unknown += 1
            continue
        raise EventDecodeError("event", f"events[{i}] ({tag or 'untyped'}): {error}") from None
    if not events and not unknown:  # pragma: no cover - the typed decode would have succeeded
        raise EventDecodeError("payload", str(first_error))
    return EventBatch(raw.ts, events, raw.data_parallel_rank), unknown


def decode_message(frames: Any) -> DecodedMessage:
    """Decode one multipart message ``[topic, seq, payload]`` (a sequence of 3 bytes-like frames).

    Raises:
        EventDecodeError: ``frames`` (not 3 bytes frames), ``seq`` (not 8 bytes), ``payload`` / ``event``
            (see :func:`decode_payload`).
    """
    try:
        n = len(frames)
    except TypeError:
        raise EventDecodeError("frames", f"expected a sequence of 3 frames, got {type(frames).__name__}") from None
    if n != 3:
        raise EventDecodeError("frames", f"{n} frames, expected 3 [topic, seq, payload]")
    topic, seq, payload = (bytes(f) if isinstance(f, (bytearray, memoryview)) else f for f in frames)
    if not all(isinstance(f, bytes) for f in (topic, seq, payload)):
        raise EventDecodeError("frames", "every frame must be bytes")
    if len(seq) != 8:
        raise EventDecodeError("seq", f"{len(seq)} bytes, expected 8 (big-endian sequence number)")
    batch, unknown = decode_payload(payload)
    return DecodedMessage(topic, int.from_bytes(seq, "big"), batch, unknown)


def encode_batch(batch: EventBatch) -> bytes:
    """The payload frame of ``batch``, byte for byte as vLLM's publisher encodes it (``msgspec.msgpack``)."""
    return _encoder.encode(batch)


def encode_message(topic: bytes, seq: int, batch: EventBatch) -> list[bytes]:
    """``[topic, seq as 8 bytes big-endian, payload]`` as vLLM's ``ZmqEventPublisher`` sends it."""
    return [topic, seq.to_bytes(8, "big"), _encoder.encode(batch)]


# --- block hashes ------------------------------------------------------------------------------------------------


def low64(digest: bytes) -> int:
    """vLLM's int form of a full digest: its last 8 bytes, big-endian (``int.from_bytes(d, "big") & 2**64-1``)."""
    return int.from_bytes(digest[-8:], "big")


def external_hash(digest: bytes, as_int: bool) -> ExternalBlockHash:
    """The hash an event carries for ``digest``: :func:`low64` when ``as_int``, else the digest itself."""
    return low64(digest) if as_int else digest


def hash_matches(digest: bytes, reported: ExternalBlockHash) -> bool:
    """Whether the full ``digest`` is the block the engine ``reported`` (an int: its low 64 bits; bytes: equal)."""
    if type(reported) is int:
        return int.from_bytes(digest[-8:], "big") == reported
    return digest == reported


def check_hash(value: Any) -> ExternalBlockHash:
    """``value`` if it is a valid ``ExternalBlockHash`` (an int in ``[0, 2**64)``, or 16 or 32 bytes).

    Raises:
        EventDecodeError: ``block_hash``, naming the value.
    """
    if type(value) is int:
        if 0 <= value <= _LOW64:
            return value
        raise EventDecodeError("block_hash", f"int {value} is outside [0, 2**64)")
    if isinstance(value, bytes):
        if len(value) in _DIGEST_SIZES:
            return value
        raise EventDecodeError("block_hash", f"{len(value)} bytes, expected a 16- or 32-byte digest")
    raise EventDecodeError("block_hash", f"expected int or bytes, got {type(value).__name__}")


def first_block_salt(extra_keys: list[Any] | None, lora_name: str | None) -> str:
    """The ``cache_salt`` in a request's first block's untagged extra keys (GPU event), "" for none.

    vLLM 0.32/0.33 publish, in order: the LoRA name (when the request has one), ``(mm_identifier, offset)``
    pairs, the salt, prompt-embedding digests (bytes). The salt is the one string after the LoRA name.
    """
    if not extra_keys:
        return ""
    strings = [x for x in extra_keys if isinstance(x, str)]
    if lora_name and strings and strings[0] == lora_name:
        strings = strings[1:]
    return strings[-1] if strings else ""


def has_unhashable_extras(extra_keys: list[Any] | None, lora_name: str | None) -> bool:
    """Whether a block's extra keys hold multimodal or prompt-embedding parts (hashes this agent cannot
    reproduce)."""
    if not extra_keys:
        return False
    return any(not isinstance(x, str) for x in extra_keys)


# --- sequence numbers ---------------------------------------------------------------------------------------------


class SequenceTracker:
    """Gaps in one publisher's ``seq`` numbers (ZMQ drops messages past its high-water mark).

    :meth:`observe` returns how many messages were skipped before ``seq``; a ``seq`` not above the last one
    means the publisher restarted (counted in :attr:`resets`, not a gap).
    """

    __slots__ = ("last", "gaps", "resets", "messages")

    def __init__(self) -> None:
        self.last: int | None = None
        self.gaps = 0
        self.resets = 0
        self.messages = 0

    def observe(self, seq: int) -> int:
        """Account ``seq``; returns the messages missed just before it (0 when in order)."""
        last = self.last
        self.last = seq
        self.messages += 1
        if last is None:
            return 0
        if seq > last:
            missed = seq - last - 1
            self.gaps += missed
            return missed
        self.resets += 1
        return 0


__all__ = [
    "AllBlocksCleared", "BlockRemoved", "BlockStored", "DecodedMessage", "Event", "EventBatch",
    "EventDecodeError", "ExternalBlockHash", "KVCacheEvent", "MEDIUM_GPU", "MEDIUM_STORE", "SequenceTracker",
    "check_hash", "decode_message", "decode_payload", "encode_batch", "encode_message", "external_hash",
    "first_block_salt", "has_unhashable_extras", "hash_matches", "low64",
]
