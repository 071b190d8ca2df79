"""Deleting a registry node forgets its telemetry state; its history rows stay."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from dashboard.models import NodeState, OccupancySample
from dashboard.telemetry.ingest import ingest
from tenants.models import Node
from tests.support.factories import grant_registry_writes
from tests.support.messages import ack, register, report

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_api(django_user_model):
    client = APIClient()
    client.force_authenticate(grant_registry_writes(django_user_model.objects.create_user("op", password="pw")))
    return client


def test_deleting_a_node_removes_its_node_state_and_metrics(operator_api, client, settings):
    settings.KVPOOL_METRICS_WINDOW_SECONDS = 120
    register("node-a", "node-b")
    now = timezone.now()
    for name in ("node-a", "node-b"):
        NodeState.objects.create(node_name=name, desired_version=1, desired_digest="d" * 64)
    ingest([ack(node="node-b", sequence=1, version=1, digest="d" * 64, at=now - timedelta(minutes=5)),
            report(node="node-b", sequence=2, at=now - timedelta(seconds=5), bytes_per_scope=500)])
    assert 'kvpool_node_silent{node="node-b"}' in client.get("/metrics").content.decode()
    samples = OccupancySample.objects.filter(node_name="node-b").count()
    assert samples

    node = Node.objects.get(name="node-b")
    assert operator_api.delete(f"/api/v1/nodes/{node.pk}/").status_code == 204

    assert not NodeState.objects.filter(node_name="node-b").exists()
    assert NodeState.objects.filter(node_name="node-a").exists()
    text = client.get("/metrics").content.decode()
    assert not [line for line in text.splitlines() if line.startswith("kvpool_node_") and 'node="node-b"' in line]
    assert 'kvpool_node_silent{node="node-a"}' in text
    assert OccupancySample.objects.filter(node_name="node-b").count() == samples  # history kept
