"""dashboard.rollout.push + dashboard.signals: rendering from the registry, versions, signing, push on commit, drift."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone

from agent.contract import signing
from agent.contract.messages import APPLY_CONFIG_TASK, parse_document
from agent.contract.sealing import unseal
from dashboard.models import NodeState
from dashboard.rollout.push import drift, ensure_version, push_nodes, render_content
from tenants.models import Node, Release, ServedModel, Tenant
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class PushRegistry:
    """A tenant's release served on two nodes (prefill on ``node-a``, decode on ``node-b``)."""

    tenant: Tenant
    model: ServedModel
    release: Release
    node_a: Node
    node_b: Node

    def node(self, name: str) -> Node:
        """``node_a`` or ``node_b`` by node name."""
        return {"node-a": self.node_a, "node-b": self.node_b}[name]


@pytest.fixture
def registry() -> PushRegistry:
    tenant = make_tenant("acme", quota="8GB")
    model = make_model(tenant, "qwen3-8b", "/models/Qwen3-8B")
    release = make_release(model, "prod-2026-07", hash_algo="sha256_cbor", hash_seed="42", budget_bytes=1 << 30)
    make_group(tenant, "app-a", cache_salt="salt-a", budget_bytes=1 << 28)
    make_group(tenant, "shared", cache_salt="")
    node_a, node_b = make_node("node-a"), make_node("node-b", hostname="10.0.0.2")
    make_assignment(node_a, release, port=8000, role="prefill", tp_rank=1, tp_size=2)
    make_assignment(node_b, release, port=8001, role="decode")
    return PushRegistry(tenant=tenant, model=model, release=release, node_a=node_a, node_b=node_b)


@pytest.fixture
def sent():
    """Capture what would be published to the broker."""
    with mock.patch("dashboard.rollout.publish.TaskBatch.send") as send_task:
        yield send_task


def test_render_content_carries_what_the_agent_needs(registry, settings):
    settings.KVPOOL_MASTER_ADDRESS = "10.1.1.1:50051"
    content = render_content(registry.node_a)
    [spec] = content["instances"]
    assert content["node"] == "node-a" and content["store"]["master_server_address"] == "10.1.1.1:50051"
    assert (spec["engine"], spec["role"], spec["tenant_id"], spec["served_model_name"], spec["vllm_model_name"]) == (
        "vllm", "prefill", "acme", "qwen3-8b", "Qwen3-8B")
    assert (spec["namespace"], spec["release_state"], spec["hash_algo"], spec["hash_seed"]) == (
        "prod-2026-07", "warming", "sha256_cbor", "42")
    assert spec["kv_layout"]["block_size"] == 16 and spec["ranks"]["tp_rank"] == 1
    assert {(g["name"], g["cache_salt"]) for g in spec["request_groups"]} == {("app-a", "salt-a"), ("shared", "")}
    assert spec["node_budget_bytes"] == 1 << 30 and spec["tenant_quota_bytes"] == 8 << 30
    assert "budget_bytes" not in spec and all("budget_bytes" not in g for g in spec["request_groups"])  # the total's
    assert spec["release_fingerprint"] == registry.release.fingerprint


def test_versions_grow_only_when_content_changes(registry):
    node = registry.node_a
    first = ensure_version(node)
    assert first.created and first.version.version == 1
    again = ensure_version(node)
    assert not again.created and again.version.pk == first.version.pk
    registry.release.state = "serving"
    registry.release.save()
    second = ensure_version(node)
    assert second.created and second.version.version == 2
    parse_document(second.version.document)
    assert second.version.digest == signing.digest(second.version.document)


def test_version_floor_from_an_agent_ahead_makes_the_next_version_higher(registry):
    node = registry.node_a
    ensure_version(node)
    NodeState.objects.filter(node_name="node-a").update(version_floor=41)
    assert ensure_version(node).version.version == 42
    assert not ensure_version(node).created


def test_push_signs_with_the_node_secret_and_targets_its_queue(registry, sent):
    counts = push_nodes(["node-a", "ghost"])
    assert counts == {"versions": 1, "sent": 1, "missing": 1, "failed": 0}
    (name,), kwargs = sent.call_args.args, sent.call_args.kwargs
    assert name == APPLY_CONFIG_TASK and kwargs["queue"] == "agent.node-a"
    [envelope] = kwargs["args"]
    from agent.contract.sealing import SealError, unseal

    assert set(envelope) == {"sealed", "node", "nonce", "ciphertext"}  # the queue holds no seed or salt
    document = unseal(envelope, registry.node_a.signing_secret, node="node-a")
    signing.verify(document, registry.node_a.signing_secret)
    with pytest.raises(signing.SignatureError):
        signing.verify(document, registry.node_b.signing_secret)
    with pytest.raises(SealError, match="does not open"):  # another node's secret opens nothing
        unseal(envelope, registry.node_b.signing_secret, node="node-a")
    state = NodeState.objects.get(node_name="node-a")
    assert (state.desired_version, state.pushed_version) == (1, 1)


def test_unchanged_and_acked_node_is_not_resent_but_a_lagging_one_is(registry, sent, settings):
    settings.KVPOOL_REPUSH_AFTER_SECONDS = 30
    push_nodes(["node-a"])
    assert push_nodes(["node-a"])["sent"] == 0  # pushed just now, ack pending
    NodeState.objects.filter(node_name="node-a").update(pushed_at=timezone.now() - timedelta(seconds=60))
    assert push_nodes(["node-a"])["sent"] == 1  # still not acked: re-push
    NodeState.objects.filter(node_name="node-a").update(acked_version=1,
                                                         pushed_at=timezone.now() - timedelta(seconds=60))
    assert push_nodes(["node-a"])["sent"] == 0
    assert push_nodes(["node-a"], force=True)["sent"] == 1


def test_broker_failure_is_recorded_not_raised(registry):
    with mock.patch("dashboard.rollout.publish.TaskBatch.send", side_effect=ConnectionRefusedError("redis down")):
        counts = push_nodes(["node-a"])
    assert counts["sent"] == 0 and counts["versions"] == 1
    assert "redis down" in NodeState.objects.get(node_name="node-a").push_error


def test_registry_change_schedules_one_push_on_commit(registry, django_capture_on_commit_callbacks):
    with mock.patch("dashboard.tasks.push_nodes.apply_async") as push, \
            mock.patch("dashboard.tasks.sync_master_quotas.apply_async"):
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            with transaction.atomic():
                registry.release.description = "canary"
                registry.release.save()
                make_group(registry.tenant, "app-b")
            assert push.call_count == 0  # nothing before the commit
        assert len(callbacks) >= 2
    assert push.call_count == 1
    assert push.call_args.kwargs["args"] == [["node-a", "node-b"]]


def test_rolled_back_change_pushes_nothing(registry, django_capture_on_commit_callbacks):
    with (mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
          django_capture_on_commit_callbacks(execute=True)):
        try:
            with transaction.atomic():
                registry.release.description = "never"
                registry.release.save()
                raise RuntimeError("abort")
        except RuntimeError:
            pass
    assert push.call_count == 0


def test_moving_an_assignment_pushes_both_nodes(registry, django_capture_on_commit_callbacks):
    assignment = registry.node_a.assignments.get()
    with (mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
          django_capture_on_commit_callbacks(execute=True)):
        assignment.node = registry.node_b
        assignment.port = 8100
        assignment.save()
    assert push.call_args.kwargs["args"] == [["node-a", "node-b"]]


def test_drift_flags(settings):
    settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS = 30
    now = timezone.now()
    state = NodeState(node_name="n", desired_version=3, desired_digest="a" * 64, acked_version=3,
                      acked_digest="a" * 64, applied_version=3, applied_digest="a" * 64, heartbeat_at=now)
    assert drift(state, now)["in_sync"]
    state.heartbeat_at = now - timedelta(seconds=31)
    assert drift(state, now)["silent"] and not drift(state, now)["in_sync"]
    state.heartbeat_at, state.acked_version = now, 2
    assert drift(state, now)["behind"]
    state.acked_version, state.applied_digest = 3, "b" * 64
    assert drift(state, now)["digest_mismatch"]
    assert drift(NodeState(node_name="never"), now)["silent"]


def test_one_broken_document_does_not_block_the_other_nodes(registry, sent):
    from dashboard.rollout import push

    real = push._instance

    def broken_for_node_b(assignment, groups, *shares):
        if assignment.node.name == "node-b":
            raise ValueError("registry holds something the schema refuses")
        return real(assignment, groups, *shares)

    with mock.patch.object(push, "_instance", broken_for_node_b):
        counts = push_nodes(["node-a", "node-b"])
    assert counts == {"versions": 1, "sent": 1, "missing": 0, "failed": 1}
    assert sent.call_args.kwargs["queue"] == "agent.node-a"


def test_a_failed_publish_of_the_batch_is_tried_once_more(registry):
    from dashboard.rollout import push

    with mock.patch.object(push, "_publish_documents", side_effect=[ConnectionError("reset"), None]) as publish:
        counts = push_nodes(["node-a", "node-b"])
    assert counts["sent"] == 2 and publish.call_count == 2
    [documents] = publish.call_args.args
    assert [name for name, _, _ in documents] == ["node-a", "node-b"]
    assert set(NodeState.objects.values_list("push_error", "pushed_version")) == {("", 1)}


def test_a_batch_the_broker_never_takes_marks_every_node(registry):
    from dashboard.rollout import push

    with mock.patch.object(push, "_publish_documents", side_effect=ConnectionError("redis down")):
        counts = push_nodes(["node-a", "node-b"])
    assert counts["sent"] == 0 and counts["versions"] == 2
    states = NodeState.objects.order_by("node_name")
    assert [(s.pushed_version, "redis down" in s.push_error) for s in states] == [(0, True), (0, True)]


@pytest.mark.integration
def test_documents_of_one_push_reach_every_node_queue(registry, dashboard_broker):
    import base64
    import json

    client = dashboard_broker.client()
    assert push_nodes(["node-a", "node-b"])["sent"] == 2
    for node in ("node-a", "node-b"):
        [raw] = client.lrange(f"agent.{node}", 0, -1)
        message = json.loads(raw)
        assert message["headers"]["task"] == APPLY_CONFIG_TASK and message["headers"]["expires"]
        assert message["headers"]["argsrepr"] == f"[<config document node={node} version=1>]"
        secret = registry.node(node).signing_secret
        [envelope], _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        document = unseal(envelope, secret, node=node)
        signing.verify(document, secret)
        assert document["node"] == node and document["version"] == 1


def test_another_client_reading_the_raw_broker_finds_no_seed_or_salt(registry, dashboard_broker):
    """Issue 16 item 3: a client with read access to the broker (another node's credentials, a backup) reads every
    key raw and finds ciphertext only; each node's envelope opens with its own secret alone."""
    import base64
    import json

    from dashboard.rollout.purge import request_purge
    from tenants.services import validated_save

    assert push_nodes(["node-a", "node-b"])["sent"] == 2
    registry.release.state = "retired"
    validated_save(registry.release)
    request_purge(registry.release, confirm="prod-2026-07")
    reader = dashboard_broker.client()
    dump = b""
    for key in reader.keys("*"):
        kind = reader.type(key)
        if kind == b"list":
            dump += b"".join(reader.lrange(key, 0, -1))
        elif kind == b"set":
            dump += b"".join(reader.smembers(key))
        elif kind == b"hash":
            dump += b"".join(k + v for k, v in reader.hgetall(key).items())
        elif kind == b"string":
            dump += reader.get(key) or b""
    bodies = b"".join(base64.b64decode(json.loads(raw)["body"]) for key in (b"agent.node-a", b"agent.node-b")
                      for raw in reader.lrange(key, 0, -1))
    assert len(reader.lrange("agent.node-a", 0, -1)) == 2  # the document and the purge request
    for secret_text in (b"salt-a", b"PYTHONHASHSEED", b"hash_seed", b"cache_salt", b"prod-2026-07"):
        assert secret_text not in dump and secret_text not in bodies, secret_text
    [envelope], _kwargs, _embed = json.loads(base64.b64decode(json.loads(reader.lrange("agent.node-a", -1, -1)[0])
                                                                ["body"]))
    opened = unseal(envelope, registry.node_a.signing_secret, node="node-a")
    assert any(g["cache_salt"] == "salt-a" for g in opened["instances"][0]["request_groups"])


def test_every_delivery_is_stamped_fresh_and_keeps_the_version_s_digest(registry, sent):
    """Issue 16 item 10: a re-push of the same version carries a new signed ``sent_at`` (the agent's freshness check)
    but the same digest, so the agent's ack matches the version the dashboard stored."""
    from agent.contract.sealing import unseal
    from dashboard.models import ConfigVersion

    push_nodes(["node-a"])
    push_nodes(["node-a"], force=True)
    first, second = (unseal(call.kwargs["args"][0], registry.node_a.signing_secret, node="node-a")
                     for call in sent.call_args_list)
    stored = ConfigVersion.objects.get(node_name="node-a", version=1)
    assert first["version"] == second["version"] == 1 and first["sent_at"] and first["sent_at"] <= second["sent_at"]
    assert first["issued_at"] == second["issued_at"] and "sent_at" not in stored.document
    for delivered in (first, second):
        signing.verify(delivered, registry.node_a.signing_secret)  # the stamp is signed
        assert signing.document_digest(delivered) == stored.digest
