"""Attribution of a real vLLM engine's Store writes to cache scopes, Store keys and the node's ledger.

Matches vLLM 0.32.0 (CPU) / 0.33.0 KV events (see :mod:`agent.engines.vllm.events`). The engine's
``MooncakeStoreConnector`` publishes each block it wrote to the Mooncake Store as a ``BlockStored`` event with
``medium: "cpu"``: its hash (low 64 bits or full digest), its parent's hash, its 32-ish token ids — but not its
salt, LoRA adapter or key. An :class:`Attributor` (one per engine instance of the applied config document)
turns those events into ledger records exactly like the connector's own puts:

1. **Request group.** A request's first block (``parent_block_hash`` null) is salted with its group's
   ``cache_salt``. The GPU prefix-cache event of the same block (``medium: "GPU"``) carries the salt in its
   first ``extra_keys`` entry; recent GPU events are remembered by block hash (bounded, oldest dropped). Without
   one, the block is hashed under every registered salt (and LoRA adapter) of the instance. Later blocks
   inherit the group of their parent.
2. **Full hash.** Rebuilt with :mod:`agent.datapath.hashing` under the release's fingerprint (algorithm, seed,
   salt, LoRA, block size) through the instance's key spaces (``adapter_keyspaces``), and compared with the
   engine's hash. A run of consecutive chained events is hashed in one call (the compiled chain).
3. **Store key** from the key space (``primary_key``), and a ``record_put`` of the chain into the ledger with
   outcome ``STORED`` and the block's bytes, under the key space's scope ``(tenant_id, served_model_name,
   namespace, request_group)`` and with its parent, so occupancy, prefix trees, orphans, reports and budgets
   see engine-written blocks as they see the simulator's. One record per TP rank key space of the instance.

Outcomes per Store block (counters, :class:`AttributionCounters`; ``blocks_seen`` is their sum):
``attributed``; ``unknown_salt`` (no registered salt reproduces a first block, or the GPU event names an
unregistered salt — e.g. random per-request salts, which the registry warns against); ``unknown_adapter``
(the GPU event names a LoRA adapter the release does not list with a path); ``hash_mismatch`` (the GPU event
says the block has no salt or a registered one, yet no registered setting reproduces it, or a block's hash
differs below an attributed parent: the engine runs with settings the registry does not know, such as another
``--prefix-caching-hash-algo`` or ``PYTHONHASHSEED``); ``unresolved_parent`` (its parent was never seen, e.g.
the agent restarted mid-stream, and no GPU event leads to a known block: skipped, never guessed);
``unverifiable`` (wrong block size or token count — a Store event sent without token ids takes them from the
GPU event of the same block when one is remembered —, or multimodal / prompt-embedding extra keys). Blocks below a
failed block inherit its outcome. Memory: the maps of known and failed block hashes and the GPU memo are bounded
(oldest dropped; a parent hit refreshes its entry).

Thread-safety: one thread feeds an attributor (:meth:`Attributor.handle_frames`); :meth:`Attributor.snapshot`
may be called from any thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from agent.datapath.keyspace import adapter_keyspaces
from agent.datapath.ledger import Outcome
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

#: Default bound of the map of attributed block hashes (entries; ~200 bytes each).
DEFAULT_KNOWN_BLOCKS = 1 << 18
#: Default bound of the memo of GPU prefix-cache blocks (entries).
DEFAULT_GPU_MEMO_BLOCKS = 1 << 16
#: Longest GPU chain walked up to find a Store block's parent.
MAX_GPU_WALK = 4096

#: The outcomes of a Store block; ``blocks_seen`` is their sum.
OUTCOMES = ("attributed", "unknown_salt", "unknown_adapter", "hash_mismatch", "unresolved_parent", "unverifiable")


@dataclass
class AttributionCounters:
    """Cumulative counters of one engine instance's event stream.

    Store blocks: ``blocks_seen`` = ``attributed`` + ``unknown_salt`` + ``unknown_adapter`` + ``hash_mismatch``
    + ``unresolved_parent`` + ``unverifiable`` (module docstring); ``by_group``: attributed blocks per request
    group name. Stream: ``messages`` decoded, ``decode_errors`` (messages dropped as malformed), ``seq_gaps``
    (messages missed per the sequence numbers), ``seq_resets`` (publisher restarts), ``events``,
    ``unknown_events`` (skipped event types), ``gpu_blocks`` (prefix-cache blocks seen), ``other_blocks``
    (``BlockStored`` of other media), ``removed_blocks`` (Store ``BlockRemoved`` applied to the ledger),
    ``cleared`` (``AllBlocksCleared`` events).
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


def instance_block_bytes(instance: Any) -> int:
    """Bytes of one Store object of the instance: ``num_layers * 2 * num_kv_heads * head_dim * block_size *
    dtype bytes`` (``agent.datapath.kv_cache.KVCacheSpec.from_layout``; ``kv_dtype`` "auto" = bf16)."""
    from agent.datapath.kv_cache import KVCacheSpec

    return KVCacheSpec.from_layout(instance.kv_layout, 1).block_bytes


class Attributor:
    """Attributes one vLLM engine instance's Store writes (module docstring) and records them in ``ledger``.

    Args:
        instance: the instance of the applied config document, duck-typed on
            ``agent.contract.messages.InstanceSpec`` (instance_id, engine ``"vllm"``, tenant_id,
            served_model_name, vllm_model_name, namespace, hash_algo, hash_seed, kv_layout (block_size,
            adapters, num_layers, num_kv_heads, head_dim, kv_dtype), ranks, request_groups[].name/.cache_salt).
        ledger: the node's ``agent.datapath.ledger.Ledger`` (None: count only).
        block_bytes: bytes per Store object (default :func:`instance_block_bytes`).
        store_media: ``medium`` values that mean a Store write (vLLM 0.32.0 Mooncake: ``"cpu"``).
        known_blocks, gpu_memo_blocks: bounds of the hash maps (entries).
        previous: the attributor this one replaces after a re-apply: its counters, sequence state and GPU memo
            continue, and its known blocks stay known where their group's hashing settings are unchanged.

    Raises:
        ValueError: the instance is not a vLLM instance, or its values make no valid key space (naming the field).
    """

    def __init__(self, instance: Any, ledger: Any = None, *, block_bytes: int | None = None,
                 store_media: Iterable[str] = (MEDIUM_STORE,), known_blocks: int = DEFAULT_KNOWN_BLOCKS,
                 gpu_memo_blocks: int = DEFAULT_GPU_MEMO_BLOCKS, previous: Attributor | None = None) -> None:
        if getattr(instance, "engine", None) != "vllm":
            raise ValueError(f"engine: an Attributor reads vLLM events, got {getattr(instance, 'engine', None)!r}")
        self.instance = instance
        self.instance_id: str = getattr(instance, "instance_id", "")
        self.ledger = ledger
        self.block_bytes = int(block_bytes) if block_bytes is not None else instance_block_bytes(instance)
        self.store_media = frozenset(store_media)
        self.known_cap = max(1, known_blocks)
        self.gpu_cap = max(1, gpu_memo_blocks)
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
        self._gpu: OrderedDict[Any, BlockStored] = OrderedDict()  # engine hash -> its GPU event
        self.counters = AttributionCounters()
        self._seq = SequenceTracker()
        self.last_error = ""
        #: Unix seconds of the newest decoded message (None before the first).
        self.last_message_at: float | None = None
        if previous is not None:
            self._inherit(previous)

    def _inherit(self, old: Attributor) -> None:
        with old._lock:
            self.counters = old.counters
            self._seq = old._seq
            self.last_error = old.last_error
            self.last_message_at = old.last_message_at
            self._gpu = OrderedDict(old._gpu)
            for ref, value in old._known.items():
                ctx = old._ctx_list[int.from_bytes(value[-2:], "big")]
                new = self._ctxs.get((ctx.group, ctx.adapter))
                if new is not None and new.fingerprint == ctx.fingerprint:
                    self._known[ref] = value[:-2] + new.tag
            while len(self._known) > self.known_cap:
                self._known.popitem(last=False)
            while len(self._gpu) > self.gpu_cap:
                self._gpu.popitem(last=False)

    # --- input --------------------------------------------------------------------------------------------

    def handle_frames(self, frames: Sequence[bytes]) -> DecodedMessage | None:
        """Decode and apply one multipart message; a malformed one is counted (``decode_errors``) and dropped.

        Never raises for bad input; returns the decoded message (None when dropped).
        """
        try:
            msg = decode_message(frames)
        except EventDecodeError as exc:
            with self._lock:
                self.counters.decode_errors += 1
                self.last_error = str(exc)
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
            self._apply_events(msg.batch.events)

    def handle_events(self, events: Sequence[Any]) -> None:
        """Apply decoded events (no sequence accounting)."""
        with self._lock:
            self._apply_events(events)

    # --- events -------------------------------------------------------------------------------------------

    def _apply_events(self, events: Sequence[Any]) -> None:
        c = self.counters
        c.events += len(events)
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
        gpu = self._gpu
        hashes = ev.block_hashes
        self.counters.gpu_blocks += len(hashes)
        for h in hashes:
            gpu[h] = ev
        extra = len(gpu) - self.gpu_cap
        while extra > 0:
            gpu.popitem(last=False)
            extra -= 1

    def _tokens_from_gpu(self, ev: BlockStored) -> bool:
        """Fill the token ids of a Store event sent without them (vLLM sends ``[]`` when the request's tokens
        are no longer at hand) from remembered GPU events of the same blocks; False when some block is unknown."""
        bs = self.block_size
        toks: list[int] = []
        for h in ev.block_hashes:
            gev = self._gpu.get(h)
            if gev is None or gev.block_size != bs:
                return False
            i = gev.block_hashes.index(h)
            block = gev.token_ids[i * bs:(i + 1) * bs]
            if len(block) != bs:
                return False
            toks += block
        ev.token_ids = toks
        return True

    def _removed(self, ev: BlockRemoved) -> None:
        for ref in ev.block_hashes:
            hit = self._lookup(ref)
            if hit is None:
                continue
            full, ctx = hit
            if self.ledger is not None:
                for ks in ctx.spaces(ev.group_idx):
                    self.ledger.record_removed(ks, [full])
            self.counters.removed_blocks += 1

    # --- attribution --------------------------------------------------------------------------------------

    def _lookup(self, ref: Any) -> tuple[bytes, _Ctx] | None:
        """Full digest and context of an attributed (or GPU-resolved) block, by the engine's hash."""
        value = self._known.get(ref)
        if value is None:
            return None
        return value[:-2], self._ctx_list[int.from_bytes(value[-2:], "big")]

    def _fail_refs(self, refs: Sequence[Any], reason: str, *, count: bool) -> None:
        failed = self._failed
        for ref in refs:
            failed[ref] = reason
        while len(failed) > self.known_cap:
            failed.popitem(last=False)
        if count:
            c = self.counters
            c.blocks_seen += len(refs)
            setattr(c, reason, getattr(c, reason) + len(refs))

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
        bs = self.block_size
        parent_ref = head.parent_block_hash
        parent_full: bytes | None
        if parent_ref is None:
            root = self._resolve_root(refs[0], toks[:bs], head.lora_name)
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
            if self.ledger is not None:
                outcomes = [Outcome.STORED] * k
                record = self.ledger.record_put
                for ks in ctx.spaces(head.group_idx):
                    record(ks, good, parent_full, outcomes, self.block_bytes)
            known = self._known
            tag = ctx.tag
            for r, d in zip(refs, good):
                known[r] = d + tag
            extra = len(known) - self.known_cap
            while extra > 0:
                known.popitem(last=False)
                extra -= 1
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
                self.last_error = str(exc)
            self._fail_refs(rest, reason, count=True)

    def _resolve_root(self, ref: Any, first_toks: list[int], lora_name: str | None) -> tuple[_Ctx, bytes] | str:
        """The (group, adapter) context and full digest of a request's first block, or the failure reason."""
        ev = self._gpu.get(ref)
        if ev is not None and ev.parent_block_hash is None and ev.block_hashes[0] == ref:
            extra = ev.extra_keys[0] if ev.extra_keys else None
            if has_unhashable_extras(extra, ev.lora_name):
                return "unverifiable"
            adapter = ev.lora_name or ""
            ctx = self._by_salt.get((first_block_salt(extra, ev.lora_name), adapter))
            if ctx is None:
                return "unknown_adapter" if adapter not in self._adapters else "unknown_salt"
            digest = ctx.hasher.block_hashes(first_toks)[0]
            return (ctx, digest) if _matches(digest, ref) else "hash_mismatch"
        candidates = self._root_order
        if lora_name:
            candidates = [ctx for ctx in candidates if ctx.adapter == lora_name]
            if not candidates:
                return "unknown_adapter"
        for ctx in candidates:
            digest = ctx.hasher.block_hashes(first_toks)[0]
            if _matches(digest, ref):
                return ctx, digest
        return "unknown_salt"

    def _resolve_via_gpu(self, ref: Any) -> tuple[bytes, _Ctx] | str:
        """Full digest and context of a block the Store events never named, from remembered GPU events:
        walks up to a known block or a request's first block, hashes down and checks every hash."""
        chain: list[tuple[Any, BlockStored, int]] = []
        base: tuple[bytes, _Ctx] | None = None
        cur = ref
        while True:
            hit = self._lookup(cur)
            if hit is not None:
                base = hit
                break
            reason = self._failed.get(cur)
            if reason is not None:
                return reason
            ev = self._gpu.get(cur)
            if ev is None or len(chain) >= MAX_GPU_WALK:
                return "unresolved_parent"
            i = ev.block_hashes.index(cur)
            chain.append((cur, ev, i))
            up = ev.block_hashes[i - 1] if i > 0 else ev.parent_block_hash
            if up is None:
                break
            cur = up
        chain.reverse()
        bs = self.block_size
        if base is None:
            cur, ev, i = chain[0]
            if ev.block_size != bs or len(ev.token_ids) < (i + 1) * bs:
                return "unverifiable"
            resolved = self._resolve_root(cur, ev.token_ids[i * bs:(i + 1) * bs], ev.lora_name)
            if isinstance(resolved, str):
                return resolved
            ctx, full = resolved
            self._known[cur] = full + ctx.tag
            chain = chain[1:]
        else:
            full, ctx = base
        for cur, ev, i in chain:
            if ev.block_size != bs or len(ev.token_ids) < (i + 1) * bs:
                return "unverifiable"
            if ev.extra_keys and has_unhashable_extras(ev.extra_keys[i], ev.lora_name):
                return "unverifiable"
            full = ctx.hasher.block_hashes(ev.token_ids[i * bs:(i + 1) * bs], full)[0]
            if not _matches(full, cur):
                return "hash_mismatch"
            self._known[cur] = full + ctx.tag
        while len(self._known) > self.known_cap:
            self._known.popitem(last=False)
        return full, ctx

    # --- output -------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Counters of this instance (:class:`AttributionCounters` fields) plus ``instance_id``,
        ``last_error``, ``last_message_at`` (unix seconds or None), ``known_blocks`` and ``gpu_memo_blocks`` (map
        sizes)."""
        with self._lock:
            out = self.counters.as_dict()
            out.update(instance_id=self.instance_id, last_error=self.last_error,
                       last_message_at=self.last_message_at, known_blocks=len(self._known),
                       gpu_memo_blocks=len(self._gpu))
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


def _matches(digest: bytes, ref: Any) -> bool:
    if type(ref) is int:
        return int.from_bytes(digest[-8:], "big") == ref
    return digest == ref


__all__ = ["AttributionCounters", "Attributor", "OUTCOMES", "DEFAULT_GPU_MEMO_BLOCKS", "DEFAULT_KNOWN_BLOCKS",
           "instance_block_bytes"]
