"""The node page lists agent messages refused in the node's name, with the overview's explanation."""
from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from dashboard.models import MessageRejection
from dashboard.telemetry.agent_auth import NODE_TROUBLE
from dashboard.telemetry.ingest import ingest
from tenants.models import Node
from tests.support.messages import heartbeat, register

pytestmark = pytest.mark.django_db


def test_node_page_explains_refused_messages_after_a_secret_rotation(ui):
    register("node-a", "node-b")
    now = timezone.now()
    # node-a's agent still signs with the secret it had before a rotation; node-b is refused for another reason
    ingest([heartbeat(node="node-a", at=now, secret="the-secret-before-rotation"),
            heartbeat(node="node-a", at=now, secret="the-secret-before-rotation")])
    MessageRejection.objects.create(reason="clock_skew", node="node-b", count=7, last_at=now, last_node="node-b",
                                    last_error="signed 2 h ahead of the dashboard")
    refused = MessageRejection.objects.get(node="node-a")
    assert refused.reason == "bad_signature" and refused.count >= 1

    html = ui.get(reverse("ui:node", args=[Node.objects.get(name="node-a").pk])).content.decode()
    assert "Refused agent messages" in html and "bad_signature" in html
    assert NODE_TROUBLE["bad_signature"] in html
    assert f'<td class="num">{refused.count}</td>' in html
    assert "clock_skew" not in html  # another node's refusals stay on that node's page

    quiet = ui.get(reverse("ui:node", args=[Node.objects.get(name="node-b").pk])).content.decode()
    assert "clock_skew" in quiet and "signed 2 h ahead of the dashboard" in quiet and "bad_signature" not in quiet
