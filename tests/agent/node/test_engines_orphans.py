"""Several writer nodes of one release: orphan counting and collection across ledgers (fake Store shared by two
nodes; the real engines are in tests/integration and the demo's "held under budget" check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import Ledger, Outcome
from agent.datapath.maintenance import FOREIGN_RECHECK_AFTER
from agent.node.engines import NodeEngines
from tests.agent.node.test_engines import document, spec
from tests.support.fakes import FakeStore

S = Outcome.STORED
SIZE = 1000


def ks() -> KeySpace:
    return KeySpace(tenant_id="alpha", engine="vllm", served_model_name="m", namespace="r", block_size=4,
                    hash_algo="sha256_cbor", request_group="g", cache_salt="salt")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write(ledger: Ledger, store: FakeStore, n: KeySpace, hashes: list[bytes], parent: bytes | None) -> None:
    """A node's engine wrote ``hashes`` (continuing ``parent``) into the shared Store; its ledger records it."""
    for h in hashes:
        store.objects[n.primary_key(h)] = b"x"
    ledger.record_put(n, hashes, parent, [S] * len(hashes), SIZE)


def two_nodes():
    """node-a wrote a 6-block chain; node-b (having loaded 4 of them) wrote 3 blocks continuing block 3."""
    n = ks()
    store = FakeStore("alpha")
    a, b = Ledger(clock=Clock()), Ledger(clock=Clock())
    h = n.block_hashes(list(range(4 * 9)))
    write(a, store, n, h[:6], None)
    write(b, store, n, h[6:9], h[3])
    return n, store, a, b, h


def test_blocks_continuing_another_nodes_block_are_not_orphans_while_it_is_present() -> None:
    n, store, a, b, h = two_nodes()
    tb = b.table(n)
    assert (tb.blocks, tb.orphaned_blocks, tb.orphaned_bytes) == (3, 0, 0)  # parent not in b's ledger: not gone
    head = tb.get(n.primary_key(h[3]))
    assert head is not None and not head.owned and head.present and head.children_count == 1
    result = b.check_foreign_parents(store)
    assert (result.checked, result.missing) == (1, 0) and tb.orphaned_blocks == 0
    assert b.reconcile(store, sample=None).missing == 0 and tb.orphaned_blocks == 0


def test_a_foreign_parent_found_gone_orphans_the_subtree_below_it_and_it_is_removed_leaves_first() -> None:
    n, store, a, b, h = two_nodes()
    # node-a trims its leaf-first: blocks 5, 4 and 3 are leaves of *its* ledger (it knows nothing of b's)
    for k in (5, 4, 3):
        del store.objects[n.primary_key(h[k])]
        a.record_removed(n, [h[k]])
    tb = b.table(n)
    assert tb.orphaned_blocks == 0  # not known yet
    result = b.check_foreign_parents(store)
    assert (result.checked, result.missing) == (1, 1)
    assert (tb.blocks, tb.orphaned_blocks, tb.orphaned_bytes) == (3, 3, 3 * SIZE)
    assert b.confirm_cuts(store) == 0  # still gone
    assert b.orphan_leaves("alpha") == {n: [h[8]]}  # leaves first
    assert b.orphan_leaves("other") == {}


def test_a_parent_written_again_takes_its_subtree_out_of_the_orphans() -> None:
    n, store, a, b, h = two_nodes()
    del store.objects[n.primary_key(h[3])]
    b.check_foreign_parents(store)
    tb = b.table(n)
    assert tb.orphaned_blocks == 3
    store.objects[n.primary_key(h[3])] = b"x"  # someone computed and stored block 3 again
    assert b.confirm_cuts(store) == 1
    assert (tb.blocks, tb.orphaned_blocks) == (3, 0) and b.orphan_leaves("alpha") == {}


def test_foreign_parents_are_checked_in_bounded_batches_and_not_again_within_the_recheck_period() -> None:
    n = ks()
    store = FakeStore("alpha")
    clock = Clock()
    b = Ledger(clock=clock)
    heads = [n.block_hashes(list(range(100 * i, 100 * i + 8))) for i in range(5)]  # five foreign 2-block chains
    for chain in heads:
        store.objects[n.primary_key(chain[0])] = b"x"
        write(b, store, n, chain[1:], chain[0])
    assert b.check_foreign_parents(store, limit=2, recheck_after=30).checked == 2
    assert b.check_foreign_parents(store, limit=2, recheck_after=30).checked == 2
    assert b.check_foreign_parents(store, limit=2, recheck_after=30).checked == 1
    assert b.check_foreign_parents(store, limit=2, recheck_after=30).checked == 0  # all checked recently
    clock.now += 30
    assert b.check_foreign_parents(store, limit=10, recheck_after=30).checked == 5


def test_own_parents_keep_their_semantics_an_evicted_own_parent_orphans_its_children() -> None:
    n = ks()
    store = FakeStore("alpha")
    led = Ledger()
    h = n.block_hashes(list(range(4 * 4)))
    write(led, store, n, h, None)
    assert led.check_foreign_parents(store).checked == 0  # no foreign parent to check
    del store.objects[n.primary_key(h[1])]  # the master evicted block 1
    led.reconcile(store, sample=None)
    t = led.table(n)
    assert (t.blocks, t.orphaned_blocks) == (3, 2)
    assert led.orphan_leaves("alpha") == {n: [h[3]]}


class Stores:
    """One FakeStore shared by both nodes' engines (the pool), remembering every remove's ``force``."""

    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.forced: list[bool] = []
        remove = store.remove

        def tracked(keys: list[str], *, force: bool = True) -> list[int]:
            self.forced.append(force)
            return remove(keys, force=force)

        store.remove = tracked  # type: ignore[method-assign]

    def __call__(self, endpoints, tenant_id: str) -> FakeStore:
        return self.store if tenant_id == self.store.tenant_id else FakeStore(tenant_id)


@pytest.fixture
def nodes(tmp_path: Path):
    store = FakeStore("alpha")
    stores = Stores(store)
    made = []
    for name in ("node-a", "node-b"):
        ne = NodeEngines(name, Ledger(), tmp_path / name / "instances", state_dir=tmp_path / name, interval=0,
                         metrics_interval=0, probe_interval=0, store_opener=stores)
        ne.document = document([spec("1" if name == "node-a" else "2", budget=None)], 5557,
                               node=name)
        made.append(ne)
    try:
        yield made[0], made[1], store, stores
    finally:
        for ne in made:
            ne.close()


def test_a_node_removes_its_blocks_orphaned_by_another_nodes_trim_by_exact_key_without_force(nodes) -> None:
    node_a, node_b, store, stores = nodes
    n = ks()
    h = n.block_hashes(list(range(4 * 10)))
    write(node_a.ledger, store, n, h[:5], None)
    write(node_b.ledger, store, n, h[5:8], h[4])       # continues node-a's block 4
    write(node_b.ledger, store, n, h[8:10], h[7])      # and its own
    other = n.block_hashes(list(range(1000, 1008)))
    write(node_b.ledger, store, n, other, None)        # an unrelated chain of node-b's: stays
    assert node_b.tick(reconcile=False)["orphans_removed"] == 0  # parent present: nothing to do
    # node-a trims block 4 (a leaf of its ledger)
    del store.objects[n.primary_key(h[4])]
    node_a.ledger.record_removed(n, [h[4]])
    node_b.maintenance.last_foreign_check = None  # the next tick checks foreign parents (not again within the period)
    node_b.ledger.clock = lambda: 1e9  # and the parent's last check is long past
    assert node_b.tick(reconcile=False)["orphans_removed"] == 0  # the default rule: node-b under no pressure
    node_b.maintenance.orphan_collection = "eager"
    node_b.maintenance.last_foreign_check = None
    counts = node_b.tick(reconcile=False)
    assert counts["orphans_removed"] == 5
    assert set(store.objects) == {n.primary_key(x) for x in h[:4] + other}
    tb = node_b.ledger.table(n)
    assert (tb.blocks, tb.orphaned_blocks, tb.agent_evicted_blocks) == (2, 0, 5)
    assert stores.forced and not any(stores.forced)
    assert node_b.status()["removed_orphans"] == 5 and "orphans" not in node_b.errors
    assert FOREIGN_RECHECK_AFTER >= 10  # well above Mooncake's default 10 s read lease


def test_orphans_under_a_read_lease_stay_until_a_later_tick(nodes) -> None:
    _, node_b, store, _ = nodes
    n = ks()
    h = n.block_hashes(list(range(4 * 4)))
    store.objects[n.primary_key(h[0])] = b"x"
    write(node_b.ledger, store, n, h[1:4], h[0])
    del store.objects[n.primary_key(h[0])]
    store.fail[n.primary_key(h[3])] = -706  # another client reads the leaf
    node_b.maintenance.orphan_collection = "eager"
    assert node_b.tick(reconcile=False)["orphans_removed"] == 0
    assert node_b.ledger.table(n).orphaned_blocks == 3
    del store.fail[n.primary_key(h[3])]
    assert node_b.tick(reconcile=False)["orphans_removed"] == 3
    assert not any(k in store.objects for k in (n.primary_key(x) for x in h))
