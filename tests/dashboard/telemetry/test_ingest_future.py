"""A signed message whose ``sent_at`` lies in the future (hostile node, or a node whose agent holds its secret) is
refused like one signed in the future (``clock_skew``): otherwise its report stays every "newest sample" query's
answer until that date (occupancy pages, ``tenant_bytes_now``, ``/metrics`` and its series-cap ranking, the
demand-weighted budget shares: the node is never silent and holds what it forged), and its heartbeat keeps the node
looking alive (``heartbeat_at``) whatever its agent does next."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboard.models import MessageRejection, NodeState, OccupancySample, Report
from dashboard.telemetry.ingest import ingest
from tests.support.messages import ack, heartbeat, register, report

pytestmark = pytest.mark.django_db

FAR = datetime(2099, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a")


def test_a_report_sent_in_the_far_future_is_refused():
    result = ingest([report(sequence=1, at=FAR)])
    assert result.reports == 0 and result.rejected.get("clock_skew") == 1
    assert not Report.objects.exists() and not OccupancySample.objects.exists()
    assert MessageRejection.objects.filter(reason="clock_skew", node="node-a").exists()


def test_a_heartbeat_or_ack_sent_in_the_far_future_is_refused():
    result = ingest([heartbeat(at=FAR), ack(sequence=1, at=FAR, digest="a" * 64)])
    assert result.rejected.get("clock_skew") == 2 and result.heartbeats == 0 and result.acks == 0
    state = NodeState.objects.filter(node_name="node-a").first()
    assert state is None or state.heartbeat_at is None or state.heartbeat_at < FAR


def test_a_message_sent_now_or_a_little_ahead_is_still_accepted():
    now = datetime.now(UTC)
    result = ingest([report(sequence=1, at=now), heartbeat(at=now + timedelta(seconds=30))])
    assert result.reports == 1 and result.heartbeats == 1 and not result.rejected
