"""The node form carries the launch settings (device, KV-events port, store mode, mooncake_client segment/port):
defaults when left out, the model rules' messages otherwise, and the node page shows them."""
from __future__ import annotations

import pytest
from django.urls import reverse

from tenants.models import Node
from tests.dashboard.views.test_forms import form_data
from tests.support.factories import make_node

pytestmark = pytest.mark.django_db


def test_create_without_settings_gets_defaults(ui):
    response = ui.post(reverse("ui:node-new"), {"name": "node-a", "hostname": "10.0.0.1"})
    assert response.status_code == 302
    node = Node.objects.get(name="node-a")
    assert (node.device, node.kv_events_port, node.store_mode, node.store_client_port) == (
        "cuda", 5557, "embedded", 50052)


def test_create_standalone_cpu_node(ui):
    response = ui.post(reverse("ui:node-new"), {
        "name": "cpu-a", "hostname": "127.0.0.1", "device": "cpu", "kv_events_port": "6001",
        "store_mode": "standalone-store", "store_segment_bytes": "256MB", "store_client_port": "50100"})
    assert response.status_code == 302
    node = Node.objects.get(name="cpu-a")
    assert (node.device, node.store_segment_bytes, node.store_client_port) == ("cpu", 256 << 20, 50100)
    page = ui.get(reverse("ui:node", args=[node.pk])).content.decode()
    assert "ipc://kv-events.sock" in page and "tcp://127.0.0.1:6001" not in page and "port 50100" in page
    assert "CPU only" in page


def test_edit_refusal_shows_the_model_message(ui):
    node = make_node("node-a")
    response = ui.post(reverse("ui:node-edit", args=[node.pk]),
                       form_data("node", node, store_mode="standalone-store", store_segment_bytes=""))
    assert response.status_code == 400
    assert "needs store_segment_bytes" in response.content.decode()
    node.refresh_from_db()
    assert node.store_mode == "embedded"
