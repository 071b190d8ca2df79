"""dashboard.telemetry.agent_auth: agent → dashboard messages are accepted only signed by the node they name, and fresh.

Every refusal is logged with its reason, counted in ``MessageRejection`` (``/metrics``) and stores nothing.
"""
from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.contract import signing
from dashboard.models import (
    ConfigAck,
    MessageRejection,
    NodeState,
    OccupancySample,
    Report,
)
from dashboard.telemetry import agent_auth
from dashboard.telemetry.ingest import ingest
from tests.support.messages import T0, ack, heartbeat, register, report, secret_of

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a", "node-b")


def _counts() -> dict[str, int]:
    return dict(MessageRejection.objects.values_list("reason", "count"))


def _nothing_stored() -> bool:
    return not (Report.objects.exists() or OccupancySample.objects.exists() or ConfigAck.objects.exists()
                or NodeState.objects.exists())


def _tampered(wire: dict) -> dict:
    wire = dict(wire)
    wire["applied_version"] = 99
    return wire


@pytest.mark.parametrize("forged, reason", [
    (lambda: report(secret=None), "unsigned"),
    (lambda: ack(secret=None), "unsigned"),
    (lambda: _tampered(report()), "bad_signature"),
    (lambda: _tampered(heartbeat()), "bad_signature"),
    (lambda: report(secret="a guess"), "bad_signature"),
    (lambda: ack(secret=secret_of("node-b")), "wrong_node"),  # names node-a, signed with node-b's key
    (lambda: heartbeat(node="node-z", secret=secret_of("node-z")), "unknown_node"),
    (lambda: report(signed_at=timezone.now() - timedelta(hours=7)), "replayed"),
    (lambda: heartbeat(signed_at=timezone.now() - timedelta(days=3)), "replayed"),
    (lambda: ack(signed_at=timezone.now() + timedelta(minutes=30)), "clock_skew"),
    (lambda: ack(at=timezone.now() - timedelta(days=3)), "expired"),
    (lambda: signing.sign_message({"kind": "ack", "node": "node-a"}, secret_of("node-a")), "invalid"),
    (lambda: "not a message", "invalid"),
])
def test_forged_or_stale_messages_are_refused_logged_counted_and_change_nothing(forged, reason, caplog):
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.ingest"):
        result = ingest([forged()])
    assert result.rejected == {reason: 1} and result.reports == result.acks == result.heartbeats == 0
    assert _nothing_stored()
    assert f": {reason}: " in caplog.text and "refused" in caplog.text
    row = MessageRejection.objects.get(reason=reason)
    assert row.count == 1 and row.last_at is not None and row.last_error


def test_a_forged_message_beside_genuine_ones_is_the_only_one_refused():
    NodeState.objects.create(node_name="node-a", desired_version=3)
    forged_ack = _tampered(ack(sequence=2, version=3, digest="f" * 64, at=T0 + timedelta(seconds=5)))
    result = ingest([report(sequence=1), forged_ack, heartbeat(at=T0 + timedelta(seconds=1), applied_version=1)])
    assert (result.reports, result.acks, result.heartbeats, result.rejected) == (1, 0, 1, {"bad_signature": 1})
    state = NodeState.objects.get(node_name="node-a")
    assert (state.acked_version, state.applied_version) == (0, 1)  # the forged ack moved nothing


def test_a_replay_inside_the_window_is_a_duplicate_and_changes_nothing():
    NodeState.objects.create(node_name="node-a", desired_version=2)
    first_ack = ack(sequence=1, version=1, status="rejected", reason="stale", applied_version=1, digest="")
    ingest([report(sequence=1), first_ack, ack(sequence=2, version=2, digest="b" * 64, at=T0 + timedelta(seconds=1))])
    before = NodeState.objects.values().get(node_name="node-a")
    again = ingest([report(sequence=1), first_ack])  # captured on the broker and sent again
    assert (again.reports, again.acks, again.rejected) == (0, 0, {"duplicate": 2})
    assert NodeState.objects.values().get(node_name="node-a") == before
    assert (Report.objects.count(), ConfigAck.objects.count(), _counts()) == (1, 2, {"duplicate": 2})


def test_replay_window_and_clock_skew_are_settings(settings):
    settings.KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS = 60
    settings.KVPOOL_AGENT_CLOCK_SKEW_SECONDS = 1
    now = timezone.now()
    result = ingest([report(sequence=1, signed_at=now - timedelta(seconds=90)),
                     report(sequence=2, signed_at=now + timedelta(seconds=5)),
                     report(sequence=3, signed_at=now - timedelta(seconds=30))], now=now)
    assert (result.reports, result.rejected) == (1, {"replayed": 1, "clock_skew": 1})


def test_the_receipt_horizon_bounds_what_can_be_told_from_a_replay(settings):
    settings.KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = 3600
    now = timezone.now()
    result = ingest([report(sequence=1, at=now - timedelta(minutes=61)), heartbeat(at=now - timedelta(minutes=61)),
                     report(sequence=2, at=now - timedelta(minutes=59))], now=now)
    assert (result.reports, result.heartbeats, result.rejected) == (1, 1, {"expired": 1})


def test_wrong_node_attribution_is_bounded_per_batch(monkeypatch):
    monkeypatch.setattr(agent_auth, "WRONG_NODE_PROBES", 1)
    result = ingest([ack(sequence=1, secret=secret_of("node-b")), ack(sequence=2, secret=secret_of("node-b"))])
    assert result.rejected == {"wrong_node": 1, "bad_signature": 1}


def test_a_rotated_secret_refuses_what_the_old_one_signed():
    from tenants.models import Node

    node = Node.objects.get(name="node-a")
    old = report(sequence=1)
    node.rotate_secret()
    assert ingest([old]).rejected == {"bad_signature": 1}
    assert ingest([report(sequence=2, secret=node.signing_secret)]).reports == 1


def test_counts_accumulate_and_metrics_expose_every_reason(client):
    ingest([report(sequence=1, secret=None), ack(secret=None), heartbeat(secret=secret_of("node-b"))])
    ingest([report(sequence=1, secret=None)])
    assert _counts() == {"unsigned": 3, "wrong_node": 1}
    text = client.get("/metrics").content.decode()
    assert 'kvpool_agent_messages_rejected_total{node="node-a",reason="unsigned"} 3.0' in text
    assert 'kvpool_agent_messages_rejected_total{node="node-a",reason="wrong_node"} 1.0' in text
    assert 'kvpool_agent_messages_rejected_total{node="",reason="replayed"} 0.0' in text
    assert set(agent_auth.rejection_counts()) >= set(agent_auth.REASONS)


def test_refusals_are_attributed_to_registered_nodes_only(client):
    """A forger can name any node: unregistered names share the node="" series, so labels stay bounded."""
    forged = [report(node=f"ghost-{i}", sequence=1, secret="forged-secret") for i in range(5)]
    ingest(forged + [report(node="node-b", sequence=1, secret=secret_of("node-a")),
                     report(node="node-a", sequence=2, secret=None)])
    series = agent_auth.rejection_series()
    assert series[("unknown_node", "")] == 5
    assert series[("wrong_node", "node-b")] == 1 and series[("unsigned", "node-a")] == 1
    assert not any(node.startswith("ghost") for _, node in series)
    text = client.get("/metrics").content.decode()
    assert 'kvpool_agent_messages_rejected_total{node="node-b",reason="wrong_node"} 1.0' in text
    assert "ghost" not in text
    recent = agent_auth.recent_node_refusals(timezone.now() - timedelta(minutes=5))
    assert [(r.reason, r.node) for r in recent] == [("wrong_node", "node-b")]


def test_the_ingest_task_counts_an_argument_that_is_not_a_list():
    from dashboard.tasks import ingest as task

    assert task("not a list")["rejected"] == {"invalid": 1}
    assert _counts() == {"invalid": 1}


def test_purge_results_must_be_signed_by_the_node_they_name(caplog, monkeypatch):
    from dashboard.rollout import purge

    stored = []
    monkeypatch.setattr(purge, "record_purge_result", lambda raw: stored.append(raw) or True)
    result = {"schema": 1, "kind": "purge_result", "purge_id": "p1", "node": "node-a", "removed": 4, "error": "",
              "sent_at": timezone.now().isoformat()}
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.agent_auth"):
        assert purge.purge_result.run(result) is False
        assert purge.purge_result.run(signing.sign_message(result, secret_of("node-b"))) is False
        assert purge.purge_result.run({**signing.sign_message(result, secret_of("node-a")), "removed": 400}) is False
    signed = signing.sign_message(result, secret_of("node-a"))
    assert purge.purge_result.run(signed) is True and stored == [signed]
    assert _counts() == {"unsigned": 1, "wrong_node": 1, "bad_signature": 1}
    assert "purge result: refused purge_result message naming node 'node-a': unsigned" in caplog.text


def test_duplicates_are_counted_under_the_node_they_named():
    first = [report(node="node-a", sequence=7), ack(node="node-b", sequence=3)]
    ingest(first)
    assert ingest(first + [report(node="node-a", sequence=8)]).rejected == {"duplicate": 2}
    series = agent_auth.rejection_series()
    assert series[("duplicate", "node-a")] == 1 and series[("duplicate", "node-b")] == 1
    assert series[("duplicate", "")] == 0
