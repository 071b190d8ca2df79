"""``NodeState.objects.lock_in_name_order``: the rows of the names given, created when missing, by name."""
from __future__ import annotations

import pytest
from django.db import transaction

from dashboard.models import NodeState

pytestmark = pytest.mark.django_db


def test_lock_in_name_order_returns_every_named_row_creating_the_missing_ones():
    NodeState.objects.create(node_name="node-b", desired_version=4, acked_version=3)
    NodeState.objects.create(node_name="other", desired_version=9)
    with transaction.atomic():
        states = NodeState.objects.lock_in_name_order(["node-c", "node-b", "node-a", "node-b"])
    assert sorted(states) == ["node-a", "node-b", "node-c"]  # each once
    assert (states["node-b"].desired_version, states["node-b"].acked_version) == (4, 3)
    assert states["node-a"].pk is not None and states["node-a"].desired_version == 0  # created
    assert NodeState.objects.count() == 4


def test_lock_in_name_order_with_only_loads_those_columns_and_saves_loaded_rows_back():
    NodeState.objects.create(node_name="node-a", desired_version=2)
    with transaction.atomic():
        states = NodeState.objects.lock_in_name_order(["node-a", "node-z"], only=["node_name"])
        assert states["node-a"].get_deferred_fields() >= {"desired_version"}
        assert states["node-a"].desired_version == 2  # a deferred column still reads its value
        full = NodeState.objects.lock_in_name_order(["node-a"])
        full["node-a"].desired_version = 5
        NodeState.objects.save_fields(full.values(), ["desired_version"])
    assert NodeState.objects.get(node_name="node-a").desired_version == 5
    assert NodeState.objects.filter(node_name="node-z").exists()
