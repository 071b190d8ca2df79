"""The ledger on disk (agent.node.ledger_file): a restarted agent gets its owned blocks back; a killed writer never
corrupts the file; an unreadable file is moved aside and the agent starts empty. The whole restart against a real
Store and dashboard is bench/faults.py's ``agent`` scenario (tests/integration/test_faults.py)."""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent.datapath.budget import BudgetEnforcer
from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import Ledger, Outcome
from agent.node.ledger_file import LEDGER_FILE, LedgerFile, open_ledger_file
from tests.support.fakes import FakeStore

S = Outcome.STORED
ROOT = Path(__file__).resolve().parents[3]


def vllm(**kw) -> KeySpace:
    base = dict(tenant_id="alpha", engine="vllm", served_model_name="m", namespace="r", block_size=4,
                hash_algo="sha256_cbor", request_group="g", cache_salt="salt")
    return KeySpace(**{**base, **kw})


def sglang() -> KeySpace:
    return KeySpace(tenant_id="beta", engine="sglang", served_model_name="org/m", namespace="r2", block_size=4)


def fill(ledger: Ledger, ks: KeySpace, n: int, start: int = 0, size: int = 1000) -> list[bytes]:
    """One chain of ``n`` blocks, stored in batches of 3 (each continuing the previous)."""
    hashes = ks.block_hashes(list(range(start, start + 4 * n)))
    for i in range(0, n, 3):
        part = hashes[i:i + 3]
        ledger.record_put(ks, part, hashes[i - 1] if i else None, [S] * len(part), size)
    return hashes


def state(ledger: Ledger) -> dict:
    """What a restart must keep: blocks/bytes per scope, the counted keys, each block's parent and leaves."""
    out = {}
    for t in ledger.tables():
        if not t.blocks:
            continue
        out[t.scope] = (t.blocks, t.bytes, t.orphaned_bytes,
                        {e.key: (e.parent, e.size, e.children_count) for e in t.owned_present()},
                        {e.key for e in t.leaves()})
    return out


def test_restart_keeps_owned_blocks_and_their_tree(tmp_path):
    ledger = Ledger()
    file = open_ledger_file(ledger, tmp_path, flush_interval=3600)
    a, b = vllm(), sglang()
    fill(ledger, a, 10)
    fill(ledger, a, 4, start=1000)                # a second chain in the same scope
    fill(ledger, b, 7, size=2000)
    fill(ledger, vllm(tp_rank=1), 5)              # same scope and hashes, another rank's keys
    # a block another instance wrote (foreign) is never counted, so never kept
    other = a.block_hashes(list(range(5000, 5004)))
    ledger.record_put(a, other, None, [Outcome.EXISTED], 1000)
    removed = fill(ledger, a, 3, start=9000)
    ledger.record_removed(a, removed[-1:])        # the agent's own eviction: gone from the file too
    before = state(ledger)
    assert file.flush() > 0
    file.close()

    again = Ledger()
    adopted = BudgetEnforcer(again)               # a budget enforcer made before the restore adopts the blocks
    reopened = open_ledger_file(again, tmp_path, flush_interval=3600)
    try:
        assert reopened.moved_aside is None
        assert state(again) == before
        assert adopted.used_bytes(a) == before[a.scope][1]
        policy = adopted.policy(a)
        assert len(policy) == before[a.scope][0] and all(key in policy for key in before[a.scope][3])
        assert reopened.flush() == 0              # restoring writes nothing back
    finally:
        reopened.close()


def test_changes_after_a_restart_are_kept_too(tmp_path):
    ledger = Ledger()
    file = open_ledger_file(ledger, tmp_path, flush_interval=3600)
    a = vllm()
    hashes = fill(ledger, a, 6)
    file.close()

    again = Ledger()
    file = open_ledger_file(again, tmp_path, flush_interval=3600)
    assert again.record_removed(a, hashes[4:]) == 2  # restored entries carry their key space: removal works
    fill(again, a, 2, start=7000)
    expected = state(again)
    file.close()

    third = Ledger()
    open_ledger_file(third, tmp_path, flush_interval=3600).close()
    assert state(third) == expected
    assert third.table(a).blocks == 4 + 2


def test_background_writer_flushes_without_being_asked(tmp_path):
    ledger = Ledger()
    file = open_ledger_file(ledger, tmp_path, flush_interval=0.05)
    try:
        fill(ledger, vllm(), 9)
        deadline = time.monotonic() + 10
        while file.stored_blocks() < 9 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert file.stored_blocks() == 9
    finally:
        file.close()


def test_reconcile_after_restore_drops_blocks_that_left_the_store(tmp_path):
    a = vllm()
    store = FakeStore("alpha")
    ledger = Ledger()
    file = open_ledger_file(ledger, tmp_path, flush_interval=3600)
    hashes = fill(ledger, a, 12)
    for h in hashes:
        store.objects[a.primary_key(h)] = b"x"
    file.close()
    store.evict([a.primary_key(h) for h in hashes[6:]])   # the agent's segment went while it was down

    again = Ledger()
    file = open_ledger_file(again, tmp_path, flush_interval=3600)
    assert again.table(a).blocks == 12                    # restored as they were ...
    # a seeded sample (an unseeded one of 4 in 12 misses all 6 gone blocks 3 % of the time): it finds one gone,
    # so every block is checked
    result = again.reconcile(store, sample=4, rng=random.Random(1))
    assert result.missing == 6 and result.full           # ... until the Store says otherwise
    assert again.table(a).blocks == 6 and again.table(a).bytes == 6000
    file.close()
    third = Ledger()
    open_ledger_file(third, tmp_path, flush_interval=3600).close()
    assert third.table(a).blocks == 6                     # and the file follows


@pytest.mark.parametrize("content", [b"this is not a database" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_corrupt_file_is_moved_aside_and_the_agent_starts_empty(tmp_path, content, caplog):
    (tmp_path / LEDGER_FILE).write_bytes(content)
    ledger = Ledger()
    file = open_ledger_file(ledger, tmp_path, flush_interval=3600)
    try:
        assert ledger.snapshot() == []
        assert file.moved_aside is not None and file.moved_aside.read_bytes() == content
        assert "unreadable" in caplog.text and str(file.moved_aside) in caplog.text
        fill(ledger, vllm(), 3)                            # and the new file works
        file.flush()
        assert file.stored_blocks() == 3
    finally:
        file.close()


def test_a_file_of_another_format_is_moved_aside(tmp_path):
    db = sqlite3.connect(tmp_path / LEDGER_FILE)
    db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('format', 'kvpool-ledger'), ('schema', '99')")
    db.commit()
    db.close()
    file = LedgerFile(tmp_path / LEDGER_FILE)
    try:
        assert file.moved_aside is not None and file.load() == []
    finally:
        file.close()


def test_bad_rows_are_handled(tmp_path):
    ledger = Ledger()
    file = open_ledger_file(ledger, tmp_path, flush_interval=3600)
    fill(ledger, vllm(), 3)
    fill(ledger, sglang(), 2)
    file.close()
    db = sqlite3.connect(tmp_path / LEDGER_FILE)
    ks_id, spec = next((i, json.loads(s)) for i, s in db.execute("SELECT id, spec FROM keyspaces")
                       if json.loads(s)["engine"] == "sglang")
    db.execute("UPDATE keyspaces SET spec = ? WHERE id = ?",
               (json.dumps({**spec, "hash_algo": "md5"}), ks_id))  # a key space this version no longer accepts
    db.commit()
    db.close()

    again = Ledger()
    file = open_ledger_file(again, tmp_path, flush_interval=3600)
    assert again.table(vllm()).blocks == 3 and again.table(sglang()).blocks == 0
    file.close()

    db = sqlite3.connect(tmp_path / LEDGER_FILE)
    db.execute("UPDATE blocks SET size = 'big'")                  # a row of the wrong type: the whole file goes
    db.commit()
    db.close()
    third = Ledger()
    file = open_ledger_file(third, tmp_path, flush_interval=3600)
    try:
        assert third.snapshot() == [] and file.moved_aside is not None
    finally:
        file.close()


WRITER = textwrap.dedent("""
    import sys
    from agent.datapath.keyspace import KeySpace
    from agent.datapath.ledger import Ledger, Outcome
    from agent.node.ledger_file import open_ledger_file

    state_dir, start = sys.argv[1], int(sys.argv[2])
    ks = KeySpace(tenant_id="alpha", engine="vllm", served_model_name="m", block_size=4)
    ledger = Ledger()
    file = open_ledger_file(ledger, state_dir, flush_interval=0.001)  # the writer thread flushes all the time
    print("restored", ledger.table(ks).blocks, flush=True)
    n = start
    while True:
        hashes = ks.block_hashes(list(range(4 * n, 4 * (n + 16))))
        ledger.record_put(ks, hashes, None, [Outcome.STORED] * 16, 100)
        n += 16
        if n % 256 == 0:
            file.flush()
            print("flushed", ledger.table(ks).blocks, flush=True)
""")


def test_a_writer_killed_mid_batch_leaves_a_consistent_file(tmp_path):
    """SIGKILL the writing agent at random moments (its writer thread flushes every millisecond); each restart
    finds a readable file holding whole put batches, at least what it last reported flushed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = 0
    for round_ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(start)], env=env,
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert proc.stdout is not None
        restored = int(proc.stdout.readline().split()[1])
        flushed = 0
        for _ in range(2 + round_):
            flushed = int(proc.stdout.readline().split()[1])
        time.sleep(0.01 * round_)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert flushed >= restored

        file = LedgerFile(tmp_path / LEDGER_FILE)
        try:
            assert file.moved_aside is None
            blocks = file.load()
        finally:
            file.close()
        assert len(blocks) >= flushed and len(blocks) % 16 == 0      # whole batches, nothing lost that was flushed
        assert len({b.block_hash for b in blocks}) == len(blocks)
        start = 4096 * (round_ + 1)                                   # the next run writes new chains
    assert not list(tmp_path.glob(f"{LEDGER_FILE}.bad-*"))


def test_agent_run_restores_the_ledger_before_the_worker_starts_and_keeps_it(tmp_path, monkeypatch):
    """`kvpool-agent run` restores the ledger from its state directory before the worker (and the daemon's reports)
    starts, and what changes while it runs is in the file once it stops."""
    from agent.node import celery_app, cli

    state_dir = tmp_path / "state"
    earlier = Ledger()
    file = open_ledger_file(earlier, state_dir, flush_interval=3600)
    fill(earlier, vllm(), 5)
    file.close()

    seen: dict = {}
    register = celery_app.register_tasks
    monkeypatch.setattr(celery_app, "register_tasks", lambda app, daemon: (seen.update(daemon=daemon),
                                                                          register(app, daemon))[1])

    def worker(app, node, **kw) -> int:
        ledger = seen["daemon"].ledger
        seen["restored"] = ledger.table(vllm()).blocks
        fill(ledger, vllm(), 2, start=900)
        return 0

    monkeypatch.setattr(celery_app, "run_worker", worker)
    monkeypatch.setenv("KVPOOL_NODE_SECRET", "s" * 32)
    status = cli.main(["run", "--node", "n1", "--broker", "memory://", "--state-dir", str(state_dir),
                       "--report-interval", "3600", "--heartbeat-interval", "3600"])
    assert status == 0 and seen["restored"] == 5
    again = Ledger()
    open_ledger_file(again, state_dir, flush_interval=3600).close()
    assert again.table(vllm()).blocks == 7


def test_an_agent_without_a_writable_ledger_file_still_starts(tmp_path, caplog):
    from agent.node import cli

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert cli._restore_ledger(Ledger(), not_a_dir) is None
    assert "running without one" in caplog.text
