"""``agent.datapath.pending.PendingWrites``: reported block writes are booked only once the Store holds their keys
(fake Store and a logical clock; the real master: tests/agent/node/test_engines_forged.py)."""

from __future__ import annotations

import hashlib

import pytest

from agent.datapath.errors import StoreError
from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import Ledger
from agent.datapath.pending import PENDING_ENTRY_BYTES, PendingWrites
from tests.support.fakes import FakeStore

KS = KeySpace("tenant-b", "vllm", "tiny-llama", namespace="rel-1", block_size=32)
SIZE = 16 << 10


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def chain(n: int, tag: str = "a") -> list[bytes]:
    return [hashlib.sha256(f"{tag}{i}".encode()).digest() for i in range(n)]


def holding(hashes: list[bytes], ks: KeySpace = KS) -> FakeStore:
    store = FakeStore(ks.tenant_id)
    store.objects = {ks.primary_key(h): b"x" for h in hashes}
    return store


def booked(ledger: Ledger) -> set[str]:
    return {key for t in ledger.tables() for key in ledger.present_keys(t.scope)}


def test_a_reported_write_is_booked_only_once_the_store_holds_it() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=5.0, clock=clock)
    real = chain(4)
    pending.add(KS, real, None, SIZE)
    assert not ledger.tables() and len(pending) == 4
    result = pending.confirm(holding(real), ledger)
    assert (result.checked, result.confirmed, result.unconfirmed) == (4, 4, 0)
    table = ledger.table(KS)
    assert booked(ledger) == {KS.primary_key(h) for h in real} and table.bytes == 4 * SIZE
    parents = [table.entries[KS.primary_key(h)].parent for h in real]
    assert parents == [None] + [KS.primary_key(h) for h in real[:-1]]  # the chain, parents first
    assert len(pending) == 0 and pending.confirmed == 4


def test_a_forged_write_is_never_booked_and_counts_unconfirmed_after_the_grace() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=5.0, clock=clock)
    store = holding(chain(3, "real"))
    forged = chain(200, "forged")
    pending.add(KS, forged, None, SIZE)
    assert pending.confirm(store, ledger).waiting == 200  # absent, but still within the grace
    clock.now += 5.0
    result = pending.confirm(store, ledger)
    assert (result.confirmed, result.unconfirmed) == (0, 200)
    assert booked(ledger) == set() and ledger.snapshot() == []
    assert len(store.objects) == 3 and "remove" not in store.calls  # no byte of the Store changed
    assert (pending.unconfirmed, len(pending)) == (200, 0)


def test_a_child_waits_for_its_parent_and_is_booked_as_an_orphan_when_the_parent_never_shows() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=5.0, clock=clock)
    h = chain(3)
    pending.add(KS, h, None, SIZE)
    store = holding(h[1:])  # the master dropped the first block (Mooncake #3741), its children landed
    assert pending.confirm(store, ledger).waiting == 3 and booked(ledger) == set()
    clock.now += 6.0
    result = pending.confirm(store, ledger)
    assert (result.confirmed, result.unconfirmed) == (2, 1)
    table = ledger.table(KS)
    assert booked(ledger) == {KS.primary_key(x) for x in h[1:]}
    assert table.orphaned_blocks == 2  # unreachable by prefix lookup: orphan collection may take them


def test_the_set_is_bounded_in_bytes_and_counts_what_it_could_not_keep() -> None:
    pending = PendingWrites(max_bytes=10 * PENDING_ENTRY_BYTES)
    assert pending.add(KS, chain(25), None, SIZE) == 10
    assert len(pending) == 10 and pending.size_bytes <= 10 * PENDING_ENTRY_BYTES and pending.overflow == 15
    assert pending.add(KS, chain(10), None, SIZE) == 10  # already waiting: kept as first reported, nothing new


def test_each_confirmation_checks_a_bounded_number_of_blocks() -> None:
    pending = PendingWrites()
    h = chain(100)
    pending.add(KS, h, None, SIZE)
    store = holding(h)
    assert pending.confirm(store, Ledger(), limit=30).checked == 30
    assert store.calls.count("exists") == 1 and len(pending) == 70


def test_expired_blocks_are_looked_up_under_the_namespace_the_engine_really_writes_under() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=1.0, clock=clock)
    typo = KS.replace(namespace="rel-l")
    h = chain(5)
    pending.add(KS, h, None, SIZE)
    store = holding(h, typo)
    calls: list[int] = []

    def alternates():
        calls.append(1)
        return [("rel-l@tiny-llama", lambda ks, digest: typo.replace(tp_rank=ks.tp_rank).primary_key(digest))]

    pending.confirm(store, ledger, alternates=alternates)
    assert calls == []  # nothing expired yet: nothing to look for
    clock.now += 1.0
    result = pending.confirm(store, ledger, alternates=alternates)
    assert result.unknown_namespace == {"rel-l@tiny-llama": 5} and result.unconfirmed == 0
    assert pending.unknown_namespace_keys == {"rel-l@tiny-llama": 5}
    assert pending.unknown_namespace_bytes == {"rel-l@tiny-llama": 5 * SIZE}
    assert booked(ledger) == set()  # counted, never booked to the release


def test_a_store_error_books_and_drops_nothing() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=0.0, clock=clock)
    h = chain(3)
    pending.add(KS, h, None, SIZE)
    store = holding(h)
    store.exists = lambda keys: [1, -1, 1]  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        pending.confirm(store, ledger)
    assert len(pending) == 3 and booked(ledger) == set() and pending.unconfirmed == 0


def test_blocks_left_after_a_partial_check_keep_their_report_time_and_bytes() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=5.0, clock=clock)
    h = chain(10)
    pending.add(KS, h, None, SIZE)
    store = holding(h)
    assert pending.confirm(store, ledger, limit=4).confirmed == 4
    clock.now += 60.0  # long past the grace: the rest is still checked as reported, and booked with its bytes
    assert pending.confirm(store, ledger).confirmed == 6
    assert ledger.table(KS).bytes == 10 * SIZE and booked(ledger) == {KS.primary_key(x) for x in h}


def test_a_block_kept_after_its_reports_first_block_left_keeps_its_grace() -> None:
    clock, ledger = Clock(), Ledger()
    pending = PendingWrites(grace=5.0, clock=clock)
    h = chain(3)
    pending.add(KS, h, None, SIZE)
    store = holding([h[0], h[2]])  # the middle block is not there (yet)
    clock.now += 1.0
    result = pending.confirm(store, ledger)
    assert (result.confirmed, result.waiting) == (1, 2)  # the third waits for its parent's verdict
    clock.now += 4.0  # 5 s after the report: the middle block's grace is over
    result = pending.confirm(store, ledger)
    assert (result.confirmed, result.unconfirmed) == (1, 1)
    assert ledger.table(KS).orphaned_blocks == 1 and ledger.table(KS).bytes == 2 * SIZE
