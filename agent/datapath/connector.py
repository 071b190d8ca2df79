"""The KV connector: zero-copy moves of paged KV blocks between torch tensors and a real Mooncake Store.

One stored object is one block across all layers, as vLLM 0.33.0's ``MooncakeStoreConnector`` stores it (an
SGLang 0.5.23 key space stores a ``_k`` and a ``_v`` object per page, each across all layers, tied together
with ``ReplicateConfig.group_ids`` so memory eviction takes both). Blocks are written straight from the cache
tensors (registered with the store once) with ``batch_put_from`` (one contiguous region: cross-layer layout) or
``batch_put_from_multi_buffers`` (one region per layer), and read back with ``batch_get_into`` /
``batch_get_into_multi_buffers``. Blocks already in the store are skipped (``batch_is_exist``).

Key space swaps: every operation reads ``self._keyspace`` exactly once, at its start, into a local, and uses
only that local. :attr:`KVConnector.keyspace`'s setter validates the new :class:`KeySpace` and then performs a
single reference assignment, so a daemon may swap key spaces from another thread at any time: batches already
running finish under the old key space, the next batch starts under the new one, and no batch mixes the two.
A caller serving several request groups at once passes ``keyspace=`` per call instead.

Errors: negative store codes become the typed exceptions of :mod:`agent.datapath.errors` naming keys and codes (a
failed put's exception carries its :class:`PutResult` in ``result``); the ledger is updated before raising, and
only for blocks that were really stored (a failed block is never claimed). Stored blocks that follow a failed
block of the same chain are removed again: a lookup could never reach them (prefix semantics), so they would only
waste the tenant's quota as orphans.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.contract.keys import sglang_page_group
from agent.datapath.errors import LayoutError, StoreError, store_error
from agent.datapath.keyspace import KeySpace
from agent.datapath.kv_cache import PagedKVCache
from agent.datapath.ledger import Ledger, Outcome
from agent.datapath.store import StoreClient

log = logging.getLogger("kvpool.agent.connector")

#: Missing-object code (OBJECT_NOT_FOUND): a get or remove of an absent block, not an error of the call.
_NOT_FOUND = -704


@dataclass(frozen=True)
class PutResult:
    """Outcome of one put: blocks ``stored`` now, ``existing`` (skipped), ``failed`` (refused by the store),
    ``dropped`` (behind a failed block of the chain: removed again, or not sent at all); ``bytes_written`` of the
    stored ones; ``failures`` as ``(key, code)``."""

    stored: int = 0
    existing: int = 0
    failed: int = 0
    dropped: int = 0
    bytes_written: int = 0
    failures: tuple[tuple[str, int], ...] = field(default=())

    @property
    def blocks(self) -> int:
        """Blocks in the batch."""
        return self.stored + self.existing + self.failed + self.dropped


class KVConnector:
    """Moves blocks of one :class:`PagedKVCache` to and from the store in a :class:`KeySpace`.

    Args:
        store: an open :class:`StoreClient`; its ``tenant_id`` must be the key space's.
        cache: the KV cache; its memory is registered with the store here, once.
        keyspace: the initial key space (block size must equal the cache's).
        ledger: occupancy ledger to update (a private one when None).
        max_batch_blocks: blocks per store call (longer requests are split).
        replica_num: replicas per object (``ReplicateConfig.replica_num``).

    Raises:
        LayoutError: the key space's block size differs from the cache's.
        ValueError: the key space's tenant differs from the store client's.
        StoreError: registering the cache memory failed.
    """

    def __init__(self, store: StoreClient, cache: PagedKVCache, keyspace: KeySpace, *,
                 ledger: Ledger | None = None, max_batch_blocks: int = 1024, replica_num: int = 1) -> None:
        if max_batch_blocks <= 0:
            raise ValueError(f"max_batch_blocks must be positive, got {max_batch_blocks}")
        self.store = store
        self.cache = cache
        self.ledger = ledger if ledger is not None else Ledger()
        self.max_batch_blocks = max_batch_blocks
        self.replica_num = replica_num
        self._check_keyspace(keyspace)
        self._keyspace = keyspace
        self._plain_config = store.replicate_config(replica_num=replica_num)
        self._registered: list[int] = []
        for ptr, size in cache.memory_regions():
            store.register(ptr, size)
            self._registered.append(ptr)

    # --- key space ------------------------------------------------------------------------------------------

    def _check_keyspace(self, ks: KeySpace) -> None:
        if not isinstance(ks, KeySpace):
            raise TypeError(f"keyspace must be an agent.datapath.keyspace.KeySpace, got {type(ks).__name__}")
        if ks.block_size != self.cache.spec.block_size:
            raise LayoutError(f"key space block_size {ks.block_size} != cache block_size "
                              f"{self.cache.spec.block_size}")
        if ks.tenant_id != self.store.tenant_id:
            raise ValueError(f"tenant_id: key space tenant {ks.tenant_id!r} differs from the store client's "
                             f"{self.store.tenant_id!r}")

    @property
    def keyspace(self) -> KeySpace:
        """The key space the next batch uses."""
        return self._keyspace

    @keyspace.setter
    def keyspace(self, ks: KeySpace) -> None:
        self._check_keyspace(ks)
        self._keyspace = ks  # one reference assignment: batches in flight keep their own local copy

    def _ks(self, keyspace: KeySpace | None) -> KeySpace:
        if keyspace is None:
            return self._keyspace  # read once per operation
        self._check_keyspace(keyspace)
        return keyspace

    # --- geometry -------------------------------------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        """Bytes a block occupies in the store (all its objects; the same for both key grammars)."""
        return self.cache.spec.block_bytes

    def _objects(self, ks: KeySpace, block_ids: Sequence[int], hashes: Sequence[bytes]
                 ) -> tuple[list[str], list[list[tuple[int, int]]]]:
        """Flat keys and, per key, its (pointer, bytes) regions."""
        keys = ks.keys(hashes)
        cache = self.cache
        if ks.objects_per_block == 1:
            regions = [cache.block_regions(b) for b in block_ids]
        else:
            regions = []
            for b in block_ids:
                regions.append(cache.half_regions(b, 0))
                regions.append(cache.half_regions(b, 1))
        return keys, regions

    @staticmethod
    def _check_ids(block_ids: Sequence[int], hashes: Sequence[bytes]) -> None:
        if len(block_ids) != len(hashes):
            raise LayoutError(f"{len(block_ids)} block ids for {len(hashes)} block hashes")

    def _exists(self, ks: KeySpace, keys: list[str]) -> list[bool]:
        """Per block: all of its objects exist."""
        codes: list[int] = []
        for start in range(0, len(keys), self.max_batch_blocks * 2):
            codes.extend(self.store.exists(keys[start:start + self.max_batch_blocks * 2]))
        errors = [(k, c) for k, c in zip(keys, codes) if c < 0]
        if errors or len(codes) != len(keys):
            raise store_error("exist", errors or [(keys[0], -1)], tenant_id=self.store.tenant_id)
        per = ks.objects_per_block
        if per == 1:
            return [c == 1 for c in codes]
        return [codes[i] == 1 and codes[i + 1] == 1 for i in range(0, len(codes), 2)]

    # --- hashing and lookup ---------------------------------------------------------------------------------

    def block_hashes(self, token_ids: Any, *, parent: bytes | None = None,
                     keyspace: KeySpace | None = None) -> list[bytes]:
        """Chained hashes of every full block of ``token_ids`` in the key space."""
        return self._ks(keyspace).block_hashes(token_ids, parent)

    def lookup(self, token_ids: Any = None, *, block_hashes: Sequence[bytes] | None = None,
               keyspace: KeySpace | None = None) -> int:
        """Number of leading blocks present in the store (the first missing block ends the prefix).

        Give ``token_ids`` (hashed here) or ``block_hashes`` of a chain from its first block.

        Raises:
            ValueError: neither or both given.
            StoreError: ``batch_is_exist`` answered -1.
        """
        ks = self._ks(keyspace)
        if (token_ids is None) == (block_hashes is None):
            raise ValueError("lookup needs exactly one of token_ids or block_hashes")
        hashes = list(block_hashes) if block_hashes is not None else ks.block_hashes(token_ids)
        if not hashes:
            return 0
        present = self._exists(ks, ks.keys(hashes))
        return self.ledger.record_lookup(ks, hashes, present)

    # --- put ------------------------------------------------------------------------------------------------

    def put(self, block_ids: Sequence[int], block_hashes: Sequence[bytes], *, parent: bytes | None = None,
            keyspace: KeySpace | None = None, soft_pin: bool = False) -> PutResult:
        """Store cache blocks ``block_ids`` under ``block_hashes`` (one chain; ``parent`` precedes its first
        block, None when it starts at block 0), skipping blocks already present. ``soft_pin`` asks the master
        to evict these objects last (``ReplicateConfig.soft_pin_action``; e.g. hot prefix roots).

        Returns:
            the :class:`PutResult` when every block is stored or present.

        Raises:
            StoreError: (typed: QuotaExceeded, UnknownTenant, NoSpace, ...) naming failing keys and codes; its
                ``result`` field holds the :class:`PutResult`. The ledger holds only stored blocks.
            LayoutError: ids and hashes differ in number, or a block id is outside the cache.
        """
        ks = self._ks(keyspace)
        hashes = list(block_hashes)
        self._check_ids(block_ids, hashes)
        if not hashes:
            return PutResult()
        per = ks.objects_per_block
        keys, regions = self._objects(ks, block_ids, hashes)
        present = self._exists(ks, keys)
        self.ledger.observe(ks, hashes, present)
        outcomes = [Outcome.EXISTED if p else Outcome.STORED for p in present]
        todo = [i for i, p in enumerate(present) if not p]
        failures: list[tuple[str, int]] = []
        for start in range(0, len(todo), self.max_batch_blocks):
            chunk = todo[start:start + self.max_batch_blocks]
            obj = [i * per + j for i in chunk for j in range(per)]
            codes = self._put_objects(ks, [keys[o] for o in obj], [regions[o] for o in obj], soft_pin)
            for n, i in enumerate(chunk):
                block_codes = codes[n * per:(n + 1) * per]
                bad = [(keys[i * per + j], c) for j, c in enumerate(block_codes) if c != 0]
                if bad:
                    outcomes[i] = Outcome.FAILED
                    failures.extend(bad)
            if failures:  # later chunks could only add blocks behind a failed one: unreachable, not sent
                for i in todo[start + len(chunk):]:
                    outcomes[i] = Outcome.DROPPED
                break
        dropped_keys: list[str] = []
        if failures:
            failed_keys = {k for k, _ in failures}
            first_failed = outcomes.index(Outcome.FAILED)
            for i in range(first_failed, len(hashes)):
                block_keys = keys[i * per:(i + 1) * per]
                if outcomes[i] is Outcome.FAILED:
                    if per > 1:  # an SGLang half that was written is useless without its pair
                        dropped_keys.extend(k for k in block_keys if k not in failed_keys)
                elif outcomes[i] is Outcome.STORED:
                    outcomes[i] = Outcome.DROPPED
                    dropped_keys.extend(block_keys)
            if dropped_keys:
                codes = self.store.remove(dropped_keys)
                stuck = [(k, c) for k, c in zip(dropped_keys, codes) if c < 0 and c != _NOT_FOUND]
                if stuck:
                    log.warning("tenant %s: %d unreachable object(s) could not be removed after a failed put "
                                "(first %s: %d)", self.store.tenant_id, len(stuck), stuck[0][0], stuck[0][1])
        self.ledger.record_put(ks, hashes, parent, outcomes, self.block_bytes)
        stored = outcomes.count(Outcome.STORED)
        result = PutResult(stored=stored, existing=outcomes.count(Outcome.EXISTED),
                           failed=outcomes.count(Outcome.FAILED), dropped=outcomes.count(Outcome.DROPPED),
                           bytes_written=stored * self.block_bytes, failures=tuple(failures))
        if failures:
            raise store_error("put", failures, tenant_id=self.store.tenant_id, result=result,
                              detail=f"{result.stored} stored, {result.existing} present, {result.failed} failed, "
                                     f"{result.dropped} dropped behind the first failure")
        return result

    def _put_objects(self, ks: KeySpace, keys: list[str], regions: list[list[tuple[int, int]]],
                     soft_pin: bool) -> list[int]:
        if ks.objects_per_block == 2 or soft_pin:
            group_ids = [sglang_page_group(k) for k in keys] if ks.objects_per_block == 2 else None
            config = self.store.replicate_config(replica_num=self.replica_num, group_ids=group_ids,
                                                 soft_pin=soft_pin)
        else:
            config = self._plain_config
        if all(len(r) == 1 for r in regions):
            codes = self.store.put_from(keys, [r[0][0] for r in regions], [r[0][1] for r in regions], config)
        else:
            codes = self.store.put_from_multi(keys, [[p for p, _ in r] for r in regions],
                                              [[s for _, s in r] for r in regions], config)
        if len(codes) != len(keys):
            raise LayoutError(f"store put returned {len(codes)} results for {len(keys)} keys")
        return codes

    def save(self, token_ids: Any, block_ids: Sequence[int], *, keyspace: KeySpace | None = None) -> PutResult:
        """Hash ``token_ids`` and store its full blocks from cache blocks ``block_ids`` (at least one id per
        full block; extra ids, e.g. of a trailing partial block, are ignored)."""
        ks = self._ks(keyspace)
        hashes = ks.block_hashes(token_ids)
        if len(block_ids) < len(hashes):
            raise LayoutError(f"{len(block_ids)} block ids for {len(hashes)} full blocks")
        return self.put(list(block_ids)[: len(hashes)], hashes, keyspace=ks)

    # --- get ------------------------------------------------------------------------------------------------

    def get(self, block_ids: Sequence[int], block_hashes: Sequence[bytes], *,
            keyspace: KeySpace | None = None) -> int:
        """Read blocks ``block_hashes`` into cache blocks ``block_ids``; returns how many *leading* blocks were
        loaded (a block evicted since the lookup ends the prefix; later blocks are not valid KV).

        Raises:
            LayoutError: ids/hashes mismatch, or an object's size differs from this cache's block layout (the
                key was written with another KV layout: a key space error).
            StoreError: a negative code other than -704 (absent).
        """
        ks = self._ks(keyspace)
        hashes = list(block_hashes)
        self._check_ids(block_ids, hashes)
        if not hashes:
            return 0
        per = ks.objects_per_block
        keys, regions = self._objects(ks, block_ids, hashes)
        loaded = [True] * len(hashes)
        failures: list[tuple[str, int]] = []
        mismatched: list[tuple[str, int, int]] = []
        step = self.max_batch_blocks * per
        for start in range(0, len(keys), step):
            chunk, rs = keys[start:start + step], regions[start:start + step]
            if all(len(r) == 1 for r in rs):
                codes = self.store.get_into(chunk, [r[0][0] for r in rs], [r[0][1] for r in rs])
            else:
                codes = self.store.get_into_multi(chunk, [[p for p, _ in r] for r in rs],
                                                  [[s for _, s in r] for r in rs])
            if len(codes) != len(chunk):
                raise LayoutError(f"store get returned {len(codes)} results for {len(chunk)} keys")
            for n, (k, r, c) in enumerate(zip(chunk, rs, codes)):
                block = (start + n) // per
                want = sum(s for _, s in r)
                if c == want:
                    continue
                loaded[block] = False
                if c == _NOT_FOUND:
                    continue
                if c < 0:
                    failures.append((k, c))
                else:
                    mismatched.append((k, c, want))
        self.ledger.record_get(ks, hashes, loaded)
        if failures and not mismatched:
            # a buffer smaller than the object fails the whole read: ask the store what it holds
            key_sizes = {k: sum(s for _, s in r) for k, r in zip(keys, regions)}
            for k, _ in failures[:3]:
                size = self.store.size_of(k)
                if size > 0 and size != key_sizes[k]:
                    mismatched.append((k, size, key_sizes[k]))
        if mismatched:
            k, got, want = mismatched[0]
            raise LayoutError(f"object {k!r} holds {got} bytes, this cache's layout reads {want}: it was "
                              f"written with another KV layout ({len(mismatched)} such object(s))")
        if failures:
            raise store_error("get", failures, tenant_id=self.store.tenant_id)
        hits = 0
        for ok in loaded:
            if not ok:
                break
            hits += 1
        return hits

    def load(self, token_ids: Any, block_ids: Sequence[int], *, keyspace: KeySpace | None = None) -> int:
        """Look up ``token_ids`` and read its leading present blocks into ``block_ids``; returns blocks loaded."""
        ks = self._ks(keyspace)
        hashes = ks.block_hashes(token_ids)
        hit = self.lookup(block_hashes=hashes, keyspace=ks)
        if hit == 0:
            return 0
        if len(block_ids) < hit:
            raise LayoutError(f"{len(block_ids)} block ids for {hit} blocks to load")
        return self.get(list(block_ids)[:hit], hashes[:hit], keyspace=ks)

    # --- remove ---------------------------------------------------------------------------------------------

    def remove(self, block_hashes: Sequence[bytes], *, keyspace: KeySpace | None = None,
               force: bool = False) -> int:
        """Remove blocks from the store (the agent's own eviction); returns how many counted blocks it freed.

        The caller chooses blocks without present descendants (leaves), or it creates orphans. All objects of a
        block go in one ``batch_remove`` call (SGLang's ``_k`` and ``_v`` together); a block counts as gone once
        any of its objects is gone (a lone half can never be read; reconciliation removes it later).

        ``force=False`` (the default) leaves objects under a read lease in place (Mooncake 0.3.13.post1 answers
        -706 OBJECT_HAS_LEASE): forcing would free memory under another client's transfer. Pass ``force=True``
        only when no reader can exist (e.g. the release namespace is retired).

        Raises:
            StoreError: a negative code other than -704 (already gone), e.g. -706 for a leased block, after the
                ledger recorded the blocks that did go.
        """
        ks = self._ks(keyspace)
        hashes = list(block_hashes)
        if not hashes:
            return 0
        keys = ks.keys(hashes)
        codes = self.store.remove(keys, force=force)
        per = ks.objects_per_block
        failures: list[tuple[str, int]] = []
        gone_blocks: set[int] = set()
        for n, (k, c) in enumerate(zip(keys, codes)):
            if c < 0 and c != _NOT_FOUND:
                failures.append((k, c))
            else:
                gone_blocks.add(n // per)
        gone = [h for i, h in enumerate(hashes) if i in gone_blocks]
        freed = self.ledger.record_removed(ks, gone)
        if failures:
            raise store_error("remove", failures, tenant_id=self.store.tenant_id)
        return freed

    def purge_release(self, *, keyspace: KeySpace | None = None, all_models: bool = False) -> int:
        """Remove every key of the key space's release namespace (all ranks) with ``remove_by_regex``; the
        ledger marks those blocks gone (:meth:`Ledger.forget_release`). Returns the number of objects removed."""
        ks = self._ks(keyspace)
        count = self.store.remove_by_regex(ks.release_regex(all_models=all_models))
        self.ledger.forget_release(tenant_id=ks.tenant_id, namespace=ks.namespace, engine=ks.engine,
                                   served_model_name=None if all_models else ks.served_model_name)
        return count

    # --- lifecycle ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Unregister the cache memory (the store client stays open; its owner closes it)."""
        for ptr in self._registered:
            if not self.store.closed:
                self.store.unregister(ptr)
        self._registered.clear()

    def __enter__(self) -> KVConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["KVConnector", "PutResult", "StoreError"]
