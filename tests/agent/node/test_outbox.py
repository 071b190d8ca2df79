"""agent.node.outbox: persistent sequence, bound, delivery that survives failures and restarts."""
from __future__ import annotations

import pytest

from agent.node.outbox import Outbox


def _msg(sequence: int) -> dict:
    return {"kind": "report", "sequence": sequence}


def test_sequences_continue_across_reopen(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    assert [box.add(_msg) for _ in range(3)] == [1, 2, 3]
    box.close()
    box = Outbox(tmp_path / "o.sqlite3")
    assert len(box) == 3
    assert box.add(_msg) == 4
    assert [m["sequence"] for m in box.peek(10)] == [1, 2, 3, 4]


def test_failed_send_keeps_messages_in_order(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    for _ in range(5):
        box.add(_msg)
    sent: list[int] = []

    def broken(batch):
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        box.deliver(broken)
    assert len(box) == 5

    def ok(batch):
        sent.extend(m["sequence"] for m in batch)

    assert box.deliver(ok, batch=2) == 5
    assert sent == [1, 2, 3, 4, 5]
    assert len(box) == 0


def test_partial_failure_resends_only_the_failed_batch(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    for _ in range(4):
        box.add(_msg)
    calls: list[list[int]] = []

    def flaky(batch):
        calls.append([m["sequence"] for m in batch])
        if len(calls) == 2:
            raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        box.deliver(flaky, batch=2)
    assert [m["sequence"] for m in box.peek(10)] == [3, 4]
    box.deliver(flaky, batch=2)
    assert calls == [[1, 2], [3, 4], [3, 4]]


def test_bound_drops_oldest_and_counts(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3", max_messages=3)
    for _ in range(5):
        box.add(_msg)
    assert [m["sequence"] for m in box.peek(10)] == [3, 4, 5]
    assert box.dropped == 2
    assert box.last_sequence == 5


def test_builder_error_stores_nothing_and_burns_no_sequence(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")

    def bad(sequence):
        raise ValueError("no")

    with pytest.raises(ValueError):
        box.add(bad)
    assert len(box) == 0
    assert box.add(_msg) == 1


def test_invalid_bound_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_messages"):
        Outbox(tmp_path / "o.sqlite3", max_messages=0)


def test_a_new_file_starts_at_first_sequence_and_an_old_one_continues(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3", first_sequence=1_000_000)
    assert [box.add(_msg) for _ in range(2)] == [1_000_000, 1_000_001]
    box.close()
    box = Outbox(tmp_path / "o.sqlite3", first_sequence=5)
    assert box.add(_msg) == 1_000_002
    with pytest.raises(ValueError, match="first_sequence"):
        Outbox(tmp_path / "p.sqlite3", first_sequence=0)
