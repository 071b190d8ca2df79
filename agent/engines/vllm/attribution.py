"""Attribution of a real vLLM engine's Store writes to cache scopes and Store keys, as hints the Store confirms.

Matches vLLM 0.32.0 (CPU) / 0.33.0 KV events (see :mod:`agent.engines.vllm.events`). The engine's
``MooncakeStoreConnector`` publishes each block it wrote to the Mooncake Store as a ``BlockStored`` event with
``medium: "cpu"``: its hash (low 64 bits or full digest), its parent's hash, its 32-ish token ids — but not its
salt, LoRA adapter or key. An :class:`Attributor` (one per engine instance of the applied config document)
turns those events into block writes exactly like the connector's own puts:

1. **Request group.** A request's first block (``parent_block_hash`` null) is salted with its group's
   ``cache_salt``. The GPU prefix-cache event of the same block (``medium: "GPU"``) carries the salt in its
   first ``extra_keys`` entry; recent GPU events are remembered by block hash (bounded, oldest dropped). Without
   one, the block is hashed under every registered salt (and LoRA adapter) of the instance, at most
   ``MAX_ROOT_HASHES`` hashes per message (each a work unit of the inbox's round budget; first blocks left untried
   are ``unverifiable``, counted in ``roots_over_budget``), and a first block that no context reproduced is
   remembered as failed and not hashed again. Later blocks inherit the group of their parent.
2. **Full hash.** Rebuilt with :mod:`agent.datapath.hashing` under the release's fingerprint (algorithm, seed,
   salt, LoRA, block size) through the instance's key spaces (``adapter_keyspaces``), and compared with the
   engine's hash. A run of consecutive chained events is hashed in one call (the compiled chain).
3. **Store key** from the key space (``primary_key``). The block is **not** booked yet: anyone who reaches the
   event socket and knows the release's seed can publish a hash that recomputes. It waits in the instance's
   :class:`agent.datapath.pending.PendingWrites` (key space, full digest, parent, bytes, first seen) until
   :meth:`Attributor.confirm` finds its key in the Store under the instance's tenant; only then is it
   ``record_put`` into the ledger with outcome ``STORED`` under the key space's scope ``(tenant_id,
   served_model_name, namespace, request_group)`` with its parent, so occupancy, prefix trees, orphans, reports and
   budgets see engine-written blocks as they see the simulator's (``agent.node.engines`` confirms every tick). One
   write per TP rank key space of the instance. ``BlockRemoved`` events are hints too: the blocks are re-checked.

Outcomes per Store block (counters, :class:`AttributionCounters`; ``blocks_seen`` is their sum):
``attributed`` (the hash recomputes: a hint waiting for the Store; ``PendingWrites`` counts it ``confirmed`` or
``unconfirmed``); ``unknown_salt`` (no registered salt reproduces a first block, or the GPU event names an
unregistered salt — e.g. random per-request salts, which the registry warns against); ``unknown_adapter``
(the GPU event names a LoRA adapter the release does not list with a path); ``hash_mismatch`` (the GPU event
says the block has no salt or a registered one, yet no registered setting reproduces it, or a block's hash
differs below an attributed parent: the engine runs with settings the registry does not know, such as another
``--prefix-caching-hash-algo`` or ``PYTHONHASHSEED``); ``unresolved_parent`` (its parent was never seen, e.g.
the agent restarted mid-stream, and no GPU event leads to a known block: skipped, never guessed);
``unverifiable`` (wrong block size or token count — a Store event sent without token ids takes them from the
GPU event of the same block when one is remembered —, or multimodal / prompt-embedding extra keys). Blocks below a
failed block inherit its outcome.

Bounds (issue 16 item 4: input from another process). Per message: at most ``max_message_bytes`` (frame bytes,
``MAX_MESSAGE_BYTES``), ``MAX_MESSAGE_BLOCKS`` blocks and ``MAX_EVENT_TOKENS`` tokens per event, else it is dropped
and counted in ``decode_errors``. Per event: the GPU memo maps each block hash to its event, whose hash -> index map
is built once, so a walk up a GPU chain to a Store block's parent costs one lookup per block, never a list search
(``list.index`` made it quadratic before), and walks are memoised —
a resolved chain becomes known blocks, a failed one is remembered with its reason — so every remembered GPU block
is walked and hashed at most once (a walk stops after ``MAX_GPU_WALK`` blocks). Memory, in bytes: the known map,
the failed map, the GPU memo (token ids kept as 32-bit arrays) and the pending set each have a share of the
instance's ``memory_bytes`` (``MEMORY_SHARES``; entry sizes measured with ``tracemalloc``), oldest entries
dropped first (a parent hit refreshes its entry); the node's observer divides its own bound among its instances.

Thread-safety: one thread feeds an attributor (:meth:`Attributor.handle_frames`); :meth:`Attributor.snapshot`
never waits for it (it reads the counters published after each message) and :meth:`Attributor.confirm` (the
maintenance thread) touches only the pending set, whose lock is held for moments.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import msgspec

from agent.datapath.keyspace import adapter_keyspaces
from agent.datapath.pending import Alternate, ConfirmResult, PendingWrites
from agent.engines.vllm.events import (
    MEDIUM_GPU,
    MEDIUM_STORE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodedMessage,
    EventDecodeError,
    SequenceTracker,
    check_hash,
    decode_message,
    first_block_salt,
    has_unhashable_extras,
)

log = logging.getLogger("kvpool.agent.engines.vllm")

#: Default bound of the map of attributed block hashes (entries; the byte share of ``memory_bytes`` also bounds it).
DEFAULT_KNOWN_BLOCKS = 1 << 18
#: Default bound of the memo of GPU prefix-cache blocks (entries; the byte share also bounds it).
DEFAULT_GPU_MEMO_BLOCKS = 1 << 18
#: Longest GPU chain walked up to find a Store block's parent (blocks; 512k tokens of 32-token blocks). A walk
#: costs one memo lookup and one hashed block per step and is memoised, so each remembered block is walked once.
MAX_GPU_WALK = 1 << 14
#: Largest message accepted (bytes, all frames): a GPU event of ``MAX_EVENT_TOKENS`` tokens is about 0.8 MB.
MAX_MESSAGE_BYTES = 4 << 20
#: Most blocks of all events of one message.
MAX_MESSAGE_BLOCKS = 1 << 14
#: Most token ids of one event (vLLM: a GPU event carries every new block of one request).
MAX_EVENT_TOKENS = 1 << 18
#: Default memory bound of one instance's attribution state (bytes), shared as ``MEMORY_SHARES`` says.
DEFAULT_MEMORY_BYTES = 128 << 20
#: Shares of ``memory_bytes``: known blocks, failed blocks, the GPU memo, the pending set.
MEMORY_SHARES = {"known": 0.25, "failed": 0.05, "gpu": 0.5, "pending": 0.2}
#: Bytes per entry of the known map (int key, digest + tag, ordered-dict slot; measured with ``tracemalloc``).
KNOWN_ENTRY_BYTES = 208
#: Bytes per entry of the failed map.
FAILED_ENTRY_BYTES = 144
#: Bytes per remembered GPU block (memo slot, the (event, index) pair, its hash in the event's list).
GPU_BLOCK_BYTES = 208
#: Bytes per remembered GPU event besides its blocks and tokens (4 bytes each, 8 above 2**32).
GPU_EVENT_BYTES = 256
#: Bytes per block of an event's hash -> index map (built the first time a walk or a Store event needs it).
GPU_INDEX_BYTES = 72

#: Candidate (salt, adapter) contexts hashed per message for requests' first blocks that no remembered GPU event
#: names (issue 20 F3). Such a block is hashed under every context of the instance until one reproduces it, and an
#: instance may register 256 groups x 65 adapter slots = 16,640 contexts: without a cap one 3 KiB message of 20
#: such events cost a second of CPU. 4096 hashes (about 12 ms here, as much as ``inbox.DEFAULT_ROUND_WORK``
#: blocks) cover every context of 64 groups x 64 adapters; the common case (unsalted base model) is tried first.
#: Roots left untried once the budget is spent are ``unverifiable`` and counted in ``roots_over_budget``. Each hash
#: is a work unit, so the inbox ends the instance's round after that message.
MAX_ROOT_HASHES = 4096

#: Messages up to this size need no block and token count: each block hash and token id takes a byte at least.
_SMALL_MESSAGE_BYTES = min(MAX_MESSAGE_BLOCKS, MAX_EVENT_TOKENS)

#: The outcomes of a Store block; ``blocks_seen`` is their sum.
OUTCOMES = ("attributed", "unknown_salt", "unknown_adapter", "hash_mismatch", "unresolved_parent", "unverifiable")


@dataclass
class AttributionCounters:
    """Cumulative counters of one engine instance's event stream.

    Store blocks: ``blocks_seen`` = ``attributed`` + ``unknown_salt`` + ``unknown_adapter`` + ``hash_mismatch``
    + ``unresolved_parent`` + ``unverifiable`` (module docstring); ``by_group``: attributed blocks per request
    group name. Stream: ``messages`` decoded, ``decode_errors`` (messages dropped as malformed or over a limit),
    ``seq_gaps`` (messages missed per the sequence numbers), ``seq_resets`` (publisher restarts), ``events``,
    ``unknown_events`` (skipped event types), ``gpu_blocks`` (prefix-cache blocks seen), ``other_blocks``
    (``BlockStored`` of other media), ``removed_blocks`` (Store ``BlockRemoved`` blocks sent for a re-check),
    ``cleared`` (``AllBlocksCleared`` events), ``dropped_messages`` (received but not attributed: the instance's
    queue was full, see ``agent.engines.vllm.inbox``), ``walk_steps`` (GPU blocks walked up to find parents: an
    operation count), ``root_hashes`` (context hashes tried for first blocks no GPU event names: an operation count,
    at most ``MAX_ROOT_HASHES`` per message), ``roots_over_budget`` (first blocks left ``unverifiable`` because the
    message's ``MAX_ROOT_HASHES`` were spent), ``roots_remembered`` (first blocks that failed before, answered from
    the failed map without hashing).
    """

    messages: int = 0
    events: int = 0
    blocks_seen: int = 0
    attributed: int = 0
    unknown_salt: int = 0
    unknown_adapter: int = 0
    hash_mismatch: int = 0
    unresolved_parent: int = 0
    unverifiable: int = 0
    decode_errors: int = 0
    seq_gaps: int = 0
    seq_resets: int = 0
    unknown_events: int = 0
    gpu_blocks: int = 0
    other_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    dropped_messages: int = 0
    walk_steps: int = 0
    root_hashes: int = 0
    roots_over_budget: int = 0
    roots_remembered: int = 0
    by_group: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready copy (``by_group`` copied)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["by_group"] = dict(self.by_group)
        return out


class _Ctx:
    """One (request group, LoRA adapter) of an instance: its hasher and its key spaces (one per TP rank)."""

    __slots__ = ("group", "salt", "adapter", "hasher", "keyspaces", "fingerprint", "tag", "_by_kv_group")

    def __init__(self, group: str, adapter: str, keyspaces: list[Any], index: int) -> None:
        ks0 = keyspaces[0]
        self.tag = index.to_bytes(2, "big")  # appended to full digests in the known map (no tuple per block)
        self.group = group
        self.adapter = adapter
        self.salt = ks0.cache_salt
        self.hasher = ks0.hasher
        self.keyspaces = tuple(keyspaces)
        h = self.hasher
        self.fingerprint = (h.algo, h.seed, h.block_size, h.cache_salt, h.lora)
        self._by_kv_group: dict[int, tuple[Any, ...]] = {0: self.keyspaces}

    def spaces(self, kv_group: int | None) -> tuple[Any, ...]:
        """Key spaces of KV-cache group ``kv_group`` (key field ``group:<g>``)."""
        g = kv_group or 0
        out = self._by_kv_group.get(g)
        if out is None:
            out = tuple(ks.replace(kv_group=g) for ks in self.keyspaces)
            self._by_kv_group[g] = out
        return out


class _GpuEvent(msgspec.Struct, gc=False):
    """What the memo keeps of one GPU prefix-cache event: its block hashes, parent, token ids (a compact array),
    per-block extra keys, LoRA name, block size, its byte cost and how many memo entries still point at it. Not
    tracked by the garbage collector (one per event; the memo holds it once per block)."""

    hashes: list[Any]
    parent: Any
    tokens: Any  # array.array of token ids
    extra_keys: Any
    lora_name: str | None
    block_size: int
    cost: int = 0
    live: int = 0
    index: dict[Any, int] | None = None

    @classmethod
    def of(cls, ev: BlockStored, tokens: array) -> _GpuEvent:
        return cls(ev.block_hashes, ev.parent_block_hash, tokens, ev.extra_keys, ev.lora_name, ev.block_size,
                   GPU_EVENT_BYTES + tokens.itemsize * len(tokens))

    def block_tokens(self, i: int) -> list[int] | None:
        """Token ids of block ``i`` (None when the event carries fewer)."""
        bs = self.block_size
        if bs <= 0 or len(self.tokens) < (i + 1) * bs:
            return None
        return self.tokens[i * bs:(i + 1) * bs].tolist()

    def extra(self, i: int) -> Any:
        keys = self.extra_keys
        return keys[i] if keys and i < len(keys) else None


def _compact(tokens: list[int]) -> array | None:
    """Token ids as a 32-bit array (64-bit when one does not fit; None when not even that)."""
    try:
        return array("I", tokens)
    except (OverflowError, TypeError):
        try:
            return array("q", tokens)
        except (OverflowError, TypeError):
            return None


def instance_block_bytes(instance: Any) -> int:
    """Bytes of one Store object of the instance: ``num_layers * 2 * num_kv_heads * head_dim * block_size *
    dtype bytes`` (``agent.datapath.kv_cache.KVCacheSpec.from_layout``; ``kv_dtype`` "auto" = bf16)."""
    from agent.datapath.kv_cache import KVCacheSpec

    return KVCacheSpec.from_layout(instance.kv_layout, 1).block_bytes


class Attributor:
    """Attributes one vLLM engine instance's Store writes (module docstring); the Store confirms them into ``ledger``.

    Args:
        instance: the instance of the applied config document, duck-typed on
            ``agent.contract.messages.InstanceSpec`` (instance_id, engine ``"vllm"``, tenant_id,
            served_model_name, vllm_model_name, namespace, hash_algo, hash_seed, kv_layout (block_size,
            adapters, num_layers, num_kv_heads, head_dim, kv_dtype), ranks, request_groups[].name/.cache_salt).
        ledger: the node's ``agent.datapath.ledger.Ledger`` that :meth:`confirm` books confirmed blocks into
            (None: count only).
        block_bytes: bytes per Store object (default :func:`instance_block_bytes`).
        store_media: ``medium`` values that mean a Store write (vLLM 0.32.0 Mooncake: ``"cpu"``).
        known_blocks, gpu_memo_blocks: entry bounds of the hash maps (the byte bounds apply too).
        memory_bytes: bound of this instance's state in bytes (``MEMORY_SHARES``).
        max_message_bytes: largest message accepted (bytes).
        grace: seconds a reported block may stay absent from the Store before it is dropped
            (``agent.datapath.pending``).
        previous: the attributor this one replaces after a re-apply: its counters, sequence state, GPU memo and
            pending set continue, and its known blocks stay known where their group's hashing settings are unchanged.

    Raises:
        ValueError: the instance is not a vLLM instance, or its values make no valid key space (naming the field).
    """

    def __init__(self, instance: Any, ledger: Any = None, *, block_bytes: int | None = None,
                 store_media: Iterable[str] = (MEDIUM_STORE,), known_blocks: int = DEFAULT_KNOWN_BLOCKS,
                 gpu_memo_blocks: int = DEFAULT_GPU_MEMO_BLOCKS, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, grace: float | None = None,
                 previous: Attributor | None = None) -> None:
        if getattr(instance, "engine", None) != "vllm":
            raise ValueError(f"engine: an Attributor reads vLLM events, got {getattr(instance, 'engine', None)!r}")
        self.instance = instance
        self.instance_id: str = getattr(instance, "instance_id", "")
        self.ledger = ledger
        self.block_bytes = int(block_bytes) if block_bytes is not None else instance_block_bytes(instance)
        self.store_media = frozenset(store_media)
        self.known_entries = max(1, known_blocks)
        self.gpu_entries = max(1, gpu_memo_blocks)
        self.max_message_bytes = max_message_bytes
        grouped: dict[tuple[str, str], list[tuple[int, Any]]] = {}
        for (tp, group, adapter), ks in adapter_keyspaces(instance).items():
            grouped.setdefault((group, adapter), []).append((tp, ks))
        self._ctx_list = [_Ctx(key[0], key[1], [ks for _, ks in sorted(items, key=lambda item: item[0])], i)
                          for i, (key, items) in enumerate(grouped.items())]
        if not self._ctx_list:
            raise ValueError("request_groups: the instance has no key space")
        self._ctxs: dict[tuple[str, str], _Ctx] = {(c.group, c.adapter): c for c in self._ctx_list}
        self.block_size: int = next(iter(self._ctxs.values())).hasher.block_size
        self._by_salt: dict[tuple[str, str], _Ctx] = {}
        for ctx in self._ctxs.values():
            self._by_salt.setdefault((ctx.salt, ctx.adapter), ctx)
        self._adapters = {ctx.adapter for ctx in self._ctxs.values()}
        # roots are tried unsalted and base-model first (the common case), then the others
        self._root_order = sorted(self._ctxs.values(), key=lambda c: (bool(c.adapter), bool(c.salt), c.group))
        self._lock = threading.Lock()
        # engine hash -> full digest + 2-byte context index (bytes values: nothing for the GC to track)
        self._known: OrderedDict[Any, bytes] = OrderedDict()
        self._failed: OrderedDict[Any, str] = OrderedDict()
        # engine hash -> (its GPU event, its index there); _gpu_bytes: what the remembered events cost
        self._gpu: OrderedDict[Any, _GpuEvent] = OrderedDict()
        self._gpu_bytes = 0
        self.counters = AttributionCounters()
        self._seq = SequenceTracker()
        self.last_error = ""
        #: Unix seconds of the newest decoded message (None before the first).
        self.last_message_at: float | None = None
        self.pending = PendingWrites() if grace is None else PendingWrites(grace=grace)
        #: Work units done so far (blocks handled, GPU blocks walked, root contexts hashed): the inbox's round
        #: budget reads it.
        self.work = 0
        #: Root context hashes left to this message (``MAX_ROOT_HASHES``, refilled per message).
        self._root_budget = MAX_ROOT_HASHES
        self.set_memory_bytes(memory_bytes)
        self._published: dict[str, Any] = {}
        if previous is not None:
            self._inherit(previous)
        self._publish()

    def set_memory_bytes(self, memory_bytes: int) -> None:
        """Bound this instance's state to ``memory_bytes`` (``MEMORY_SHARES``); a lower bound trims the maps at once
        (the pending set keeps what it has until checked, taking nothing new over its bound)."""
        with self._lock:
            self.memory_bytes = max(0, int(memory_bytes))
            self.known_cap = max(1, min(self.known_entries,
                                        int(self.memory_bytes * MEMORY_SHARES["known"]) // KNOWN_ENTRY_BYTES))
            self.failed_cap = max(1, min(self.known_entries,
                                         int(self.memory_bytes * MEMORY_SHARES["failed"]) // FAILED_ENTRY_BYTES))
            self.gpu_cap_bytes = int(self.memory_bytes * MEMORY_SHARES["gpu"])
            self.pending.set_max_bytes(int(self.memory_bytes * MEMORY_SHARES["pending"]))
            self._trim()

    def _trim(self) -> None:
        known, failed = self._known, self._failed
        while len(known) > self.known_cap:
            known.popitem(last=False)
        while len(failed) > self.failed_cap:
            failed.popitem(last=False)
        self._trim_gpu()

    def _trim_gpu(self) -> None:
        gpu = self._gpu
        cap_entries, cap_bytes = self.gpu_entries, self.gpu_cap_bytes
        while gpu and (len(gpu) > cap_entries or self._gpu_bytes + GPU_BLOCK_BYTES * len(gpu) > cap_bytes):
            _h, rec = gpu.popitem(last=False)
            rec.live -= 1
            if rec.live == 0:
                self._gpu_bytes -= rec.cost

    def _inherit(self, old: Attributor) -> None:
        with old._lock:
            self.counters = old.counters
            self._seq = old._seq
            self.last_error = old.last_error
            self.last_message_at = old.last_message_at
            self.pending = old.pending
            self._gpu = OrderedDict(old._gpu)
            self._gpu_bytes = old._gpu_bytes
            self.work = old.work
            for ref, value in old._known.items():
                ctx = old._ctx_list[int.from_bytes(value[-2:], "big")]
                new = self._ctxs.get((ctx.group, ctx.adapter))
                if new is not None and new.fingerprint == ctx.fingerprint:
                    self._known[ref] = value[:-2] + new.tag
        self.set_memory_bytes(self.memory_bytes)

    # --- input --------------------------------------------------------------------------------------------

    def handle_frames(self, frames: Sequence[bytes]) -> DecodedMessage | None:
        """Decode and apply one multipart message; a malformed one, or one over ``max_message_bytes``,
        ``MAX_MESSAGE_BLOCKS`` blocks or ``MAX_EVENT_TOKENS`` tokens in an event, is counted (``decode_errors``)
        and dropped.

        Never raises for bad input; returns the decoded message (None when dropped).
        """
        try:
            size = sum(map(len, frames))
        except TypeError:
            size = 0
        try:
            if size > self.max_message_bytes:
                raise EventDecodeError("frames", f"{size} bytes, over the limit of {self.max_message_bytes}")
            msg = decode_message(frames)
            if size > _SMALL_MESSAGE_BYTES:  # a smaller one cannot hold that many blocks or tokens
                _check_limits(msg)
        except EventDecodeError as exc:
            with self._lock:
                self.counters.decode_errors += 1
                self._error(str(exc))
                self._publish()
            return None
        self.handle_message(msg)
        return msg

    def handle_message(self, msg: DecodedMessage) -> None:
        """Apply one decoded message: sequence accounting, then its events in order."""
        with self._lock:
            self.last_message_at = time.time()
            c = self.counters
            c.messages += 1
            c.unknown_events += msg.unknown_events
            missed = self._seq.observe(msg.seq)
            if missed:
                c.seq_gaps += missed
            c.seq_resets = self._seq.resets
            self._root_budget = MAX_ROOT_HASHES
            self._apply_events(msg.batch.events)
            self._publish()

    def handle_events(self, events: Sequence[Any]) -> None:
        """Apply decoded events (no sequence accounting)."""
        with self._lock:
            self._root_budget = MAX_ROOT_HASHES
            self._apply_events(events)
            self._publish()

    def note_dropped(self, messages: int = 1) -> None:
        """Count messages received for this instance but never attributed (its queue was full)."""
        with self._lock:
            self.counters.dropped_messages += messages
            self._publish()

    def _error(self, message: str) -> None:
        if message != self.last_error:
            log.warning("instance %s: KV-event message dropped: %s", self.instance_id, message[:500])
        self.last_error = message

    def _publish(self) -> None:
        """Copy the counters for :meth:`snapshot` (called under the lock after each message)."""
        out = dict(vars(self.counters))
        out["by_group"] = dict(self.counters.by_group)
        out["last_error"] = self.last_error
        out["last_message_at"] = self.last_message_at
        self._published = out

    # --- events -------------------------------------------------------------------------------------------

    def _apply_events(self, events: Sequence[Any]) -> None:
        c = self.counters
        c.events += len(events)
        self.work += len(events)  # plus one unit per block of a multi-block event, counted where it is handled
        store_media = self.store_media
        bs = self.block_size
        run: list[BlockStored] = []
        for ev in events:
            if type(ev) is BlockStored:
                medium = ev.medium
                if medium in store_media:
                    n = len(ev.block_hashes)
                    if n == 0:
                        continue
                    if (ev.block_size != bs or len(ev.token_ids) != n * bs) and not (
                            ev.block_size == bs and not ev.token_ids and self._tokens_from_gpu(ev)):
                        if run:
                            self._attribute_run(run)
                            run = []
                        self._fail_refs(ev.block_hashes, "unverifiable", count=True)
                        continue
                    if run:
                        prev = run[-1]
                        if (ev.parent_block_hash is None or ev.parent_block_hash != prev.block_hashes[-1]
                                or ev.group_idx != prev.group_idx or ev.lora_name != prev.lora_name):
                            self._attribute_run(run)
                            run = []
                    run.append(ev)
                    continue
                if run:
                    self._attribute_run(run)
                    run = []
                if medium == MEDIUM_GPU:
                    self._remember_gpu(ev)
                else:
                    c.other_blocks += len(ev.block_hashes)
                continue
            if run:
                self._attribute_run(run)
                run = []
            if type(ev) is BlockRemoved:
                if ev.medium in store_media:
                    self._removed(ev)
            elif type(ev) is AllBlocksCleared:
                c.cleared += 1
        if run:
            self._attribute_run(run)

    def _remember_gpu(self, ev: BlockStored) -> None:
        hashes = ev.block_hashes
        self.counters.gpu_blocks += len(hashes)
        self.work += len(hashes)
        tokens = _compact(ev.token_ids)
        if tokens is None or not hashes:
            return
        rec = _GpuEvent.of(ev, tokens)
        gpu = self._gpu
        self._gpu_bytes += rec.cost
        pop = gpu.pop
        for h in hashes:
            prev = pop(h, None)  # re-inserted below: the newest report of a block is the freshest entry
            if prev is not None:
                prev.live -= 1
                if prev.live == 0 and prev is not rec:
                    self._gpu_bytes -= prev.cost
            gpu[h] = rec
        rec.live += len(hashes)
        self._trim_gpu()

    def _position(self, rec: _GpuEvent, h: Any) -> int:
        """Index of block ``h`` in its GPU event: a map built once per event (its bytes counted in the memo's),
        never a list search per call."""
        index = rec.index
        if index is None:
            index = rec.index = {ref: i for i, ref in enumerate(rec.hashes)}
            extra = GPU_INDEX_BYTES * len(rec.hashes)
            rec.cost += extra
            if rec.live > 0:
                self._gpu_bytes += extra
        return index[h]

    def _tokens_from_gpu(self, ev: BlockStored) -> bool:
        """Fill the token ids of a Store event sent without them (vLLM sends ``[]`` when the request's tokens
        are no longer at hand) from remembered GPU events of the same blocks; False when some block is unknown."""
        bs = self.block_size
        toks: list[int] = []
        for h in ev.block_hashes:
            rec = self._gpu.get(h)
            if rec is None or rec.block_size != bs:
                return False
            block = rec.block_tokens(self._position(rec, h))
            if block is None:
                return False
            toks += block
        ev.token_ids = toks
        return True

    def _removed(self, ev: BlockRemoved) -> None:
        self.work += len(ev.block_hashes)
        for ref in ev.block_hashes:
            hit = self._lookup(ref)
            if hit is None:
                continue
            full, ctx = hit
            for ks in ctx.spaces(ev.group_idx):
                self.pending.recheck(ks, [full])
            self.counters.removed_blocks += 1

    # --- attribution --------------------------------------------------------------------------------------

    def _lookup(self, ref: Any) -> tuple[bytes, _Ctx] | None:
        """Full digest and context of an attributed (or GPU-resolved) block, by the engine's hash."""
        value = self._known.get(ref)
        if value is None:
            return None
        return value[:-2], self._ctx_list[int.from_bytes(value[-2:], "big")]

    def _fail_refs(self, refs: Sequence[Any], reason: str, *, count: bool, remember: bool = True) -> None:
        if remember:
            failed = self._failed
            for ref in refs:
                failed[ref] = reason
            extra = len(failed) - self.failed_cap
            while extra > 0:
                failed.popitem(last=False)
                extra -= 1
        if count:
            c = self.counters
            c.blocks_seen += len(refs)
            setattr(c, reason, getattr(c, reason) + len(refs))

    def _know(self, refs: Sequence[Any], digests: Sequence[bytes], tag: bytes) -> None:
        known = self._known
        for r, d in zip(refs, digests):
            known[r] = d + tag
        extra = len(known) - self.known_cap
        while extra > 0:
            known.popitem(last=False)
            extra -= 1

    def _attribute_run(self, run: list[BlockStored]) -> None:
        """Attribute a chain of Store events (each continues the previous one)."""
        if len(run) == 1:
            head = run[0]
            refs = head.block_hashes
            toks = head.token_ids
        else:
            head = run[0]
            refs = []
            toks = []
            for ev in run:
                refs += ev.block_hashes
                toks += ev.token_ids
        self.work += len(refs) - len(run)  # blocks beyond one per event
        bs = self.block_size
        parent_ref = head.parent_block_hash
        parent_full: bytes | None
        if parent_ref is None:
            known_failure = self._failed.get(refs[0])
            if known_failure in _HASHED_FAILURES:  # this root was hashed and failed before: not hashed again
                self.counters.roots_remembered += 1
                self._fail_refs(refs, str(known_failure), count=True)
                return
            root = self._resolve_root(refs[0], toks[:bs], head.lora_name)
            if root is _OVER_BUDGET:  # not tried: a later message may try it, so it is not remembered
                self._fail_refs(refs, "unverifiable", count=True, remember=False)
                return
            if isinstance(root, str):
                self._fail_refs(refs, root, count=True)
                return
            ctx, first = root
            digests = [first]
            if len(refs) > 1:
                digests += ctx.hasher.block_hashes(toks[bs:], first)
            parent_full = None
        else:
            hit: tuple[bytes, _Ctx] | str | None = self._lookup(parent_ref)
            if hit is not None:
                self._known.move_to_end(parent_ref)
            else:
                reason = self._failed.get(parent_ref)
                hit = self._resolve_via_gpu(parent_ref) if reason is None else reason
            if isinstance(hit, str):
                self._fail_refs(refs, hit, count=True)
                return
            parent_full, ctx = hit
            digests = ctx.hasher.block_hashes(toks, parent_full)
        # compare with the engine's hashes (int = low 64 bits, big-endian; bytes = the full digest)
        n = len(refs)
        k = 0
        if type(refs[0]) is int:
            from_bytes = int.from_bytes
            for d, r in zip(digests, refs):
                if from_bytes(d[-8:], "big") != r:
                    break
                k += 1
        else:
            for d, r in zip(digests, refs):
                if d != r:
                    break
                k += 1
        c = self.counters
        if k:
            good = digests if k == n else digests[:k]
            add = self.pending.add
            for ks in ctx.spaces(head.group_idx):
                add(ks, good, parent_full, self.block_bytes)
            self._know(refs, good, ctx.tag)
            c.blocks_seen += k
            c.attributed += k
            by_group = c.by_group
            by_group[ctx.group] = by_group.get(ctx.group, 0) + k
        if k < n:
            rest = refs[k:]
            try:
                check_hash(rest[0])
                reason = "hash_mismatch"
            except EventDecodeError as exc:
                reason = "unverifiable"
                self._error(str(exc))
            self._fail_refs(rest, reason, count=True)

    def _resolve_root(self, ref: Any, first_toks: list[int], lora_name: str | None) -> tuple[_Ctx, bytes] | str:
        """The (group, adapter) context and full digest of a request's first block, or the failure reason
        (:data:`_OVER_BUDGET` when the message's ``MAX_ROOT_HASHES`` ran out before every context was tried).
        Every hash is a work unit and counted in ``root_hashes``."""
        rec = self._gpu.get(ref)
        if rec is not None and rec.parent is None and rec.hashes[0] == ref:
            extra = rec.extra(0)
            if has_unhashable_extras(extra, rec.lora_name):
                return "unverifiable"
            adapter = rec.lora_name or ""
            ctx = self._by_salt.get((first_block_salt(extra, rec.lora_name), adapter))
            if ctx is None:
                return "unknown_adapter" if adapter not in self._adapters else "unknown_salt"
            self.work += 1
            self.counters.root_hashes += 1
            digest = ctx.hasher.block_hashes(first_toks)[0]
            return (ctx, digest) if _matches(digest, ref) else "hash_mismatch"
        candidates = self._root_order
        if lora_name:
            candidates = [ctx for ctx in candidates if ctx.adapter == lora_name]
            if not candidates:
                return "unknown_adapter"
        budget = self._root_budget
        tried = 0
        try:
            for ctx in candidates:
                if tried >= budget:
                    self.counters.roots_over_budget += 1
                    return _OVER_BUDGET
                tried += 1
                digest = ctx.hasher.block_hashes(first_toks)[0]
                if _matches(digest, ref):
                    return ctx, digest
        finally:
            self._root_budget = budget - tried
            self.work += tried
            self.counters.root_hashes += tried
        return "unknown_salt"

    def _resolve_via_gpu(self, ref: Any) -> tuple[bytes, _Ctx] | str:
        """Full digest and context of a block the Store events never named, from remembered GPU events: walks up
        (one memo lookup per block) to a known block or a request's first block, hashes down (one hasher call per
        run of one event) and checks every hash. Memoised: the blocks walked become known, or failed with the
        reason, so no block is walked twice."""
        gpu, known, failed = self._gpu, self._known, self._failed
        chain: list[tuple[Any, _GpuEvent, int]] = []
        base: tuple[bytes, _Ctx] | None = None
        cur = ref
        while True:
            value = known.get(cur)
            if value is not None:
                base = value[:-2], self._ctx_list[int.from_bytes(value[-2:], "big")]
                break
            reason = failed.get(cur)
            if reason is not None:
                return self._fail_walk(chain, reason)
            rec = gpu.get(cur)
            if rec is None or len(chain) >= MAX_GPU_WALK:
                return self._fail_walk(chain, "unresolved_parent")
            i = self._position(rec, cur)
            chain.append((cur, rec, i))
            up = rec.hashes[i - 1] if i > 0 else rec.parent
            if up is None:
                break
            cur = up
        self.counters.walk_steps += len(chain)
        self.work += len(chain)
        self._trim_gpu()  # the walk may have built index maps: the memo stays in its bytes
        chain.reverse()
        bs = self.block_size
        if base is None:
            cur, rec, i = chain[0]
            first = rec.block_tokens(i) if rec.block_size == bs else None
            if first is None:
                return self._fail_walk(chain, "unverifiable")
            resolved = self._resolve_root(cur, first, rec.lora_name)
            if resolved is _OVER_BUDGET:  # cannot happen (a GPU event names this root), kept safe: not remembered
                return "unverifiable"
            if isinstance(resolved, str):
                return self._fail_walk(chain, resolved)
            ctx, full = resolved
            self._know([cur], [full], ctx.tag)
            pos = 1
        else:
            full, ctx = base
            pos = 0
        # hash down, one hasher call per run of consecutive blocks of one event
        while pos < len(chain):
            _h, rec, i = chain[pos]
            end = pos + 1
            while end < len(chain) and chain[end][1] is rec and chain[end][2] == chain[end - 1][2] + 1:
                end += 1
            j = chain[end - 1][2]
            if rec.block_size != bs or len(rec.tokens) < (j + 1) * bs:
                return self._fail_walk(chain[pos:], "unverifiable")
            for k in range(i, j + 1):
                if has_unhashable_extras(rec.extra(k), rec.lora_name):
                    return self._fail_walk(chain[pos + (k - i):], "unverifiable")
            digests = ctx.hasher.block_hashes(rec.tokens[i * bs:(j + 1) * bs].tolist(), full)
            for k, d in enumerate(digests):
                h = chain[pos + k][0]
                if not _matches(d, h):
                    self._know([c[0] for c in chain[pos:pos + k]], digests[:k], ctx.tag)
                    return self._fail_walk(chain[pos + k:], "hash_mismatch")
            self._know([c[0] for c in chain[pos:end]], digests, ctx.tag)
            full = digests[-1]
            pos = end
        return full, ctx

    def _fail_walk(self, chain: Sequence[tuple[Any, _GpuEvent, int]], reason: str) -> str:
        """Remember why a walked chain failed (no walk passes through it again) and return the reason."""
        if chain:
            self.counters.walk_steps += len(chain)
            self.work += len(chain)
            self._fail_refs([c[0] for c in chain], reason, count=False)
        return reason

    # --- confirmation -------------------------------------------------------------------------------------

    def confirm(self, store: Any, *, limit: int | None = None,
                alternates: Callable[[], Sequence[Alternate]] | None = None) -> ConfirmResult:
        """Check the waiting blocks in ``store`` (a Store client of the instance's tenant) and book the confirmed
        ones into the ledger (:meth:`agent.datapath.pending.PendingWrites.confirm`; ``alternates``: other namespaces
        the engine may write under). Called by the node's maintenance, never by the attribution thread.

        Raises:
            StoreError: ``batch_is_exist`` answered -1 for some key.
        """
        kwargs: dict[str, Any] = {"alternates": alternates}
        if limit is not None:
            kwargs["limit"] = limit
        return self.pending.confirm(store, self.ledger, **kwargs)

    # --- output -------------------------------------------------------------------------------------------

    def memory_used(self) -> int:
        """Bytes this instance's state costs by the measured entry sizes (maps, GPU memo, pending set)."""
        return (len(self._known) * KNOWN_ENTRY_BYTES + len(self._failed) * FAILED_ENTRY_BYTES
                + self._gpu_bytes + len(self._gpu) * GPU_BLOCK_BYTES + self.pending.size_bytes)

    def snapshot(self) -> dict[str, Any]:
        """Counters of this instance (:class:`AttributionCounters` fields, as of the last message handled) plus
        ``instance_id``, ``last_error``, ``last_message_at`` (unix seconds or None), ``known_blocks`` and
        ``gpu_memo_blocks`` (map sizes), ``memory_bytes`` (:meth:`memory_used`) and the pending set's counters
        (``PendingWrites.snapshot``). Never waits for the attribution thread."""
        out = dict(self._published)
        out["by_group"] = dict(out.get("by_group", {}))
        out.update(instance_id=self.instance_id, known_blocks=len(self._known), gpu_memo_blocks=len(self._gpu),
                   memory_bytes=self.memory_used())
        out.update(self.pending.snapshot())
        return out

    def full_hash(self, ref: Any) -> bytes | None:
        """The full digest of an attributed block named by the engine's hash ``ref`` (None if unknown)."""
        with self._lock:
            hit = self._lookup(ref)
            return hit[0] if hit is not None else None

    def key_of(self, ref: Any, tp_rank: int | None = None) -> str | None:
        """The Store key of an attributed block (first TP rank's key space unless ``tp_rank``), or None."""
        with self._lock:
            hit = self._lookup(ref)
        if hit is None:
            return None
        full, ctx = hit
        for ks in ctx.keyspaces:
            if tp_rank is None or ks.tp_rank == tp_rank:
                return ks.primary_key(full)
        return None

    def group_of(self, ref: Any) -> str | None:
        """The request group name of an attributed block, or None."""
        with self._lock:
            hit = self._lookup(ref)
        return hit[1].group if hit is not None else None


#: :meth:`Attributor._resolve_root`'s answer for a first block left untried (the message's root budget is spent).
_OVER_BUDGET = "unverifiable (root budget spent)"
#: Failures of a first block that hashing decided (the same block fails the same way again: remembered, not retried);
#: ``unverifiable`` is not one of them (a later event of the block may carry its token ids).
_HASHED_FAILURES = frozenset({"unknown_salt", "unknown_adapter", "hash_mismatch"})


def _check_limits(msg: DecodedMessage) -> None:
    """Raise ``EventDecodeError`` for a message over ``MAX_MESSAGE_BLOCKS`` blocks or an event over
    ``MAX_EVENT_TOKENS`` token ids."""
    blocks = 0
    for ev in msg.batch.events:
        if type(ev) is BlockStored:
            if len(ev.token_ids) > MAX_EVENT_TOKENS:
                raise EventDecodeError("event", f"{len(ev.token_ids)} token ids in one event, over the limit of "
                                                f"{MAX_EVENT_TOKENS}")
            blocks += len(ev.block_hashes)
        elif type(ev) is BlockRemoved:
            blocks += len(ev.block_hashes)
    if blocks > MAX_MESSAGE_BLOCKS:
        raise EventDecodeError("payload", f"{blocks} blocks in one message, over the limit of {MAX_MESSAGE_BLOCKS}")


def _matches(digest: bytes, ref: Any) -> bool:
    if type(ref) is int:
        return int.from_bytes(digest[-8:], "big") == ref
    return digest == ref


__all__ = ["AttributionCounters", "Attributor", "OUTCOMES", "DEFAULT_GPU_MEMO_BLOCKS", "DEFAULT_KNOWN_BLOCKS",
           "DEFAULT_MEMORY_BYTES", "MAX_EVENT_TOKENS", "MAX_GPU_WALK", "MAX_MESSAGE_BLOCKS", "MAX_MESSAGE_BYTES",
           "MAX_ROOT_HASHES", "MEMORY_SHARES", "instance_block_bytes"]
