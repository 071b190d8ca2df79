"""dashboard.telemetry.ingest: idempotent reports, acks moving node state forward, heartbeats, invalid messages."""
from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from dashboard.models import ConfigAck, NodeState, OccupancySample, Report
from dashboard.telemetry import compat
from dashboard.telemetry.ingest import ingest
from tests.support.messages import T0, ack, heartbeat, register, report, sent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _nodes():
    """The nodes these tests' messages name, registered with their signing secrets."""
    register("node-a", "node-b", "fresh", *(f"node-{i:03d}" for i in range(60)))


def test_reports_are_stored_once_per_node_and_sequence():
    first = ingest([report(sequence=1), report(sequence=2, at=T0 + timedelta(seconds=10))])
    assert (first.reports, first.samples, first.duplicate_reports) == (2, 4, 0)
    again = ingest([report(sequence=2), report(sequence=2), report(sequence=3, at=T0 + timedelta(seconds=20))])
    assert (again.reports, again.samples, again.duplicate_reports) == (1, 2, 2)
    assert Report.objects.count() == 3
    assert OccupancySample.objects.count() == 6
    assert Report.objects.filter(node_name="node-a").latest("sent_at").sent_at == T0 + timedelta(seconds=20)


def test_same_sequence_of_another_node_is_a_different_report():
    ingest([report(node="node-a", sequence=1), report(node="node-b", sequence=1)])
    assert Report.objects.count() == 2


def test_invalid_message_is_logged_and_the_rest_stored(caplog):
    bad = report(sequence=9, secret=None)
    bad["scopes"][0]["bytes"] = "lots"
    nonsense = {"kind": "nonsense", "node": "node-a"}
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.ingest"):
        result = ingest([sent(bad), report(sequence=1), sent(nonsense)])
    assert result.invalid == 2 and result.reports == 1 and result.rejected == {"invalid": 2}
    assert "scopes.0.bytes" in caplog.text and "refused report message naming node 'node-a'" in caplog.text


def test_samples_carry_the_scope_and_values():
    ingest([report(sequence=1, bytes_per_scope=8192)])
    sample = OccupancySample.objects.get(request_group="g1")
    assert (sample.tenant_id, sample.namespace, sample.bytes, sample.max_bytes, sample.blocks) == (
        "acme", "prod-2026-07", 8192, 8192, 8)
    assert sample.level == OccupancySample.Level.RAW and sample.ts == T0


def _schema_1_report(sequence: int, group: str) -> dict:
    """A report as agents before report schema 2 sent it: its rows and their request group under the field names
    of schema 1 (``dashboard.telemetry.compat`` holds them: the only place they are spelled)."""
    row = {"tenant_id": "acme", "served_model_name": "qwen3-8b", "namespace": "prod-2026-07",
           compat.V1_GROUP_FIELD: group, "blocks": 2, "bytes": 2048, "puts": 5, "gets": 6, "hit_blocks": 3,
           "miss_blocks": 1, "evicted_blocks": 0, "orphaned_bytes": 0, "in_flight_requests": 1}
    return {"schema": 1, "kind": "report", "node": "node-a", "sequence": sequence,
            "sent_at": T0.isoformat().replace("+00:00", "Z"),
            "started_at": (T0 - timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
            "applied_version": 1, compat.V1_ROWS_FIELD: [row], "signed_at": None, "signature": ""}


def test_signed_schema_1_report_of_an_older_agent_is_still_ingested():
    result = ingest([sent(_schema_1_report(7, "g9")), report(sequence=8)])
    assert (result.reports, result.samples, result.invalid, result.rejected) == (2, 3, 0, {})
    sample = OccupancySample.objects.get(request_group="g9")
    assert (sample.node_name, sample.namespace, sample.bytes, sample.in_flight_requests) == (
        "node-a", "prod-2026-07", 2048, 1)
    assert ingest([sent(_schema_1_report(7, "g9"))]).duplicate_reports == 1  # same (node, sequence)


def test_schema_1_report_keeps_its_signature_checked():
    tampered = sent(_schema_1_report(9, "g9"))
    tampered[compat.V1_ROWS_FIELD][0]["bytes"] = 1 << 40
    result = ingest([tampered])
    assert result.reports == 0 and result.rejected == {"bad_signature": 1}
    assert not OccupancySample.objects.filter(request_group="g9").exists()


def test_acks_move_versions_forward_only():
    NodeState.objects.create(node_name="node-a", desired_version=3, desired_digest="c" * 64)
    ingest([ack(sequence=5, version=3, digest="c" * 64, at=T0 + timedelta(seconds=5)),
            ack(sequence=4, version=2, digest="b" * 64, at=T0)])
    state = NodeState.objects.get(node_name="node-a")
    assert (state.acked_version, state.acked_digest, state.applied_version) == (3, "c" * 64, 3)
    ingest([ack(sequence=5, version=3, digest="c" * 64)])  # duplicate delivery
    assert ConfigAck.objects.count() == 2


def test_rejection_is_recorded_and_stale_from_ahead_raises_the_floor(caplog):
    NodeState.objects.create(node_name="node-a", desired_version=2)
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.ingest"):
        ingest([ack(sequence=1, version=2, status="rejected", reason="stale", applied_version=9, digest="")])
    state = NodeState.objects.get(node_name="node-a")
    assert (state.rejection_reason, state.rejected_version, state.version_floor) == ("stale", 2, 9)
    assert "rejected config version 2: stale" in caplog.text


def test_heartbeats_update_liveness_and_applied_version_newest_wins():
    ingest([heartbeat(at=T0 + timedelta(seconds=10), applied_version=4, applied_digest="e" * 64),
            heartbeat(at=T0, applied_version=3)])
    state = NodeState.objects.get(node_name="node-a")
    assert state.heartbeat_at == T0 + timedelta(seconds=10)
    assert (state.applied_version, state.applied_digest, state.agent_hostname) == (4, "e" * 64, "gpu-1")
    ingest([ack(sequence=1, version=3, digest="f" * 64, at=T0 + timedelta(seconds=5))])  # older than heartbeat
    assert NodeState.objects.get(node_name="node-a").applied_version == 4


def test_first_message_of_a_node_creates_its_state():
    ingest([ack(node="fresh", sequence=1, version=1, digest="a" * 64)])
    state = NodeState.objects.get(node_name="fresh")
    assert (state.acked_version, state.acked_digest, state.applied_version, state.acked_at) == (1, "a" * 64, 1, T0)


def test_a_redelivered_older_ack_changes_nothing():
    NodeState.objects.create(node_name="node-a", desired_version=6)
    older = ack(sequence=1, version=5, status="rejected", reason="invalid", digest="", applied_version=4)
    newer = ack(sequence=2, version=6, status="rejected", reason="bad_signature", digest="", applied_version=4,
                at=T0 + timedelta(seconds=5))
    ingest([older, newer])
    again = ingest([older, older])  # the outbox delivered it again, twice in one batch
    assert (again.acks, again.duplicate_acks) == (0, 2)
    state = NodeState.objects.get(node_name="node-a")
    assert (state.rejected_version, state.rejection_reason) == (6, "bad_signature")
    assert ConfigAck.objects.count() == 2


def test_acks_and_heartbeats_of_many_nodes_in_one_batch():
    names = [f"node-{i:03d}" for i in range(60)]
    NodeState.objects.bulk_create([NodeState(node_name=name, desired_version=2) for name in names[::2]])
    batch = []
    for i, name in enumerate(reversed(names)):  # not in name order; half the nodes have no state row yet
        batch.append(ack(name, sequence=7, version=2, digest=f"{i % 10}" * 64, at=T0))
        batch.append(heartbeat(name, at=T0 + timedelta(seconds=1), applied_version=2,
                               applied_digest=f"{i % 10}" * 64))
    result = ingest(batch)
    assert (result.acks, result.heartbeats) == (60, 60)
    states = {state.node_name: state for state in NodeState.objects.all()}
    assert sorted(states) == names
    assert all(s.acked_version == 2 and s.applied_version == 2 and s.heartbeat_at == T0 + timedelta(seconds=1)
               and s.applied_seen_at == T0 + timedelta(seconds=1) and s.acked_digest == s.applied_digest
               for s in states.values())


def test_acks_folded_in_one_batch_leave_the_states_acks_stored_one_at_a_time_leave():
    """A batch folds nodes with one new ack together (one statement on PostgreSQL) and a node's several acks in
    order: the node states must be those of the same acks ingested one by one."""
    def acks_for(prefix: str) -> list[dict]:
        return [
            ack(f"{prefix}-1", sequence=3, version=4, digest="a" * 64, at=T0 + timedelta(seconds=2)),
            ack(f"{prefix}-2", sequence=1, version=4, status="rejected", reason="stale", applied_version=7,
                digest=""),
            ack(f"{prefix}-3", sequence=1, version=3, digest="b" * 64, at=T0),  # three acks of one node
            ack(f"{prefix}-3", sequence=2, version=4, status="rejected", reason="invalid", digest="",
                applied_version=3, at=T0 + timedelta(seconds=1)),
            ack(f"{prefix}-3", sequence=3, version=2, digest="c" * 64, at=T0 + timedelta(seconds=3)),
            ack(f"{prefix}-4", sequence=9, version=None, status="rejected", reason="invalid", digest="",
                applied_version=0, at=T0),
        ]

    register(*(f"{prefix}-{i}" for prefix in ("batch", "alone") for i in range(1, 5)))
    for prefix in ("batch", "alone"):
        NodeState.objects.bulk_create([NodeState(node_name=f"{prefix}-{i}", desired_version=4, acked_version=1)
                                       for i in range(1, 5)])
    assert ingest(acks_for("batch")).acks == 6
    for message in acks_for("alone"):
        assert ingest([message]).acks == 1
    fields = ("acked_version", "acked_digest", "acked_at", "rejected_version", "rejection_reason", "rejected_at",
              "version_floor", "applied_version", "applied_digest", "applied_seen_at")
    for i in range(1, 5):
        batch, alone = (NodeState.objects.values(*fields).get(node_name=f"{prefix}-{i}")
                        for prefix in ("batch", "alone"))
        assert batch == alone, i
    state = NodeState.objects.get(node_name="batch-2")
    assert (state.rejected_version, state.rejection_reason, state.version_floor) == (4, "stale", 7)
    assert NodeState.objects.get(node_name="batch-1").acked_version == 4
