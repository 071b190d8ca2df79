"""Single-user mode seen from the dashboard (security review F6): an unprivileged agent, or one run with
``--single-user``, runs every instance as its own account, so instances of one node are not kept from each other's
files and sockets. The agent says so in its heartbeats (``single_user``); the node keeps it (``NodeState``); the
engine_events_trusted check fails for a node running instances of more than one tenant in that mode, naming the node
(one tenant alone is a documented choice); the node page shows the mode."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from agent.contract import signing
from agent.contract.messages import Heartbeat, MessageError, parse_ingest
from dashboard.checklist import run_checks
from dashboard.models import ConfigVersion, NodeState
from dashboard.telemetry.ingest import ingest
from tests.support.messages import T0, heartbeat, register

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a", "node-b", applied=False)


def _runs(node: str, *tenants: str) -> None:
    """The node's agent runs a document with one vLLM instance of each of ``tenants`` (its applied digest)."""
    instances = [{"instance_id": str(i), "engine": "vllm", "tenant_id": tenant, "served_model_name": "tiny",
                  "namespace": "tiny-2026-12", "launch": {"instance_id": str(i), "argv": ["python"]}}
                 for i, tenant in enumerate(tenants, start=1)]
    document = {"node": node, "version": 1, "instances": instances}
    digest = signing.digest(document)
    ConfigVersion.objects.update_or_create(node_name=node, version=1, defaults={
        "digest": digest, "content_digest": "c" * 64, "document": document})
    NodeState.objects.update_or_create(node_name=node, defaults={"applied_digest": digest, "applied_version": 1})


def _trusted():
    return next(check for check in run_checks(timezone.now()) if check.key == "engine_events_trusted")


def _beat(node: str, single_user: bool, at=T0) -> None:
    digest = NodeState.objects.get(node_name=node).applied_digest
    assert ingest([heartbeat(node, at=at, applied_digest=digest, single_user=single_user)]).heartbeats == 1


def test_the_heartbeat_says_single_user_and_older_agents_still_validate():
    assert Heartbeat(node="n", sent_at=T0, started_at=T0).single_user is False  # an older agent's heartbeat
    message = {"kind": "heartbeat", "node": "n", "sent_at": T0.isoformat(), "started_at": T0.isoformat(),
               "single_user": "yes"}
    with pytest.raises(MessageError, match="single_user"):
        parse_ingest(message)


def test_a_single_user_node_with_two_tenants_fails_the_trust_check_naming_the_node():
    """Before: the dashboard could not tell; the check passed with every instance 'connected'."""
    _runs("node-a", "acme", "globex")
    _runs("node-b", "acme")
    _beat("node-a", True)
    _beat("node-b", True)
    assert NodeState.objects.get(node_name="node-a").single_user
    check = _trusted()
    assert not check.passed
    assert len(check.details) == 1 and "node node-a" in check.details[0] and "2 tenants" in check.details[0]
    assert "single-user" in check.details[0] and "globex" not in check.details[0]
    # the agent restarted privileged: the newest heartbeat says so
    _beat("node-a", False, at=T0 + timedelta(seconds=5))
    assert not NodeState.objects.get(node_name="node-a").single_user and _trusted().passed


def test_one_tenant_alone_in_single_user_mode_passes():
    _runs("node-b", "acme", "acme")
    _beat("node-b", True)
    assert _trusted().passed


def test_the_node_page_shows_the_mode(client, django_user_model):
    from tenants.models import Node

    node = Node.objects.get(name="node-a")  # registered by the fixture
    _runs("node-a", "acme")
    _beat("node-a", True)
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    page = client.get(reverse("ui:node", args=[node.pk])).content.decode()
    assert "single-user" in page
