"""Fault checks on the Checks page: silent agents (``nodes_reporting``) and ``/metrics``' ``kvpool_node_silent``."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.checklist import run_checks
from dashboard.telemetry.metrics import render
from tests.support.factories import make_node
from tests.support.rows import node_alive

pytestmark = pytest.mark.django_db


def nodes_check(now=None):
    return next(check for check in run_checks(now) if check.key == "nodes_reporting")


def test_a_node_silent_longer_than_the_threshold_fails_within_15_seconds(settings):
    assert settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS <= 15  # the default flags a stall within 15 s
    make_node("node-a")
    make_node("node-b", hostname="10.0.0.2")
    node_alive("node-a")
    node_alive("node-b")
    check = nodes_check()
    assert check.passed and check.summary.startswith("2 node(s)")
    later = timezone.now() + timedelta(seconds=settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS + 1)
    check = nodes_check(later)
    assert not check.passed and check.summary == "2 silent node(s)"
    assert "node node-a: no heartbeat for" in check.details[0]
    node_alive("node-a")
    from dashboard.models import NodeState

    NodeState.objects.filter(node_name="node-b").update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS + 1))
    check = nodes_check()
    assert not check.passed and [d.split(":")[0] for d in check.details] == ["node node-b"]
    text = render().decode()
    assert 'kvpool_node_silent{node="node-b"} 1.0' in text and 'kvpool_node_silent{node="node-a"} 0.0' in text


def test_deleted_nodes_are_neither_checked_nor_exported():
    node = make_node("node-a")
    state = node_alive("node-a")
    state.heartbeat_at = timezone.now() - timedelta(hours=1)
    state.save()
    assert not nodes_check().passed
    node.delete()
    assert nodes_check().passed
    assert 'node="node-a"' not in render().decode()


def test_a_node_never_heard_from_is_said_so_not_counted_as_heard():
    """The summary used to say "every agent heard from" while no agent had ever contacted the dashboard."""
    make_node("node-a")
    make_node("node-b", hostname="10.0.0.2")
    node_alive("node-a")
    check = nodes_check()
    assert check.passed and "1 node(s) heard from" in check.summary and "1 never heard from yet" in check.summary
