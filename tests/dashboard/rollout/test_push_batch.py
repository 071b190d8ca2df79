"""A push at size: queries per push independent of the node count, shared parts rendered once, one encoding per
signed and sealed document, task messages built once (``dashboard.rollout.publish``) yet identical to
``app.send_task``'s."""
from __future__ import annotations

import json
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from kombu import Producer

from agent.contract import signing
from agent.contract.messages import APPLY_CONFIG_TASK, parse_document
from agent.contract.sealing import seal, seal_bytes, unseal
from dashboard.models import ConfigVersion, NodeState
from dashboard.rollout.push import PUBLISH_RETRY, push_nodes, render_contents
from tenants.models import Node, Tenant
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet() -> list[str]:
    """55 nodes: two tenants with request groups; a prefill/decode release on every node, a second tenant's
    release on every third node, a standalone-store node every fifth; returns the node names."""
    acme, globex = make_tenant("acme", quota="64GB"), make_tenant("globex", quota="32GB")
    make_group(acme, "app-a", cache_salt="salt-a", budget_bytes=1 << 28)
    make_group(acme, "shared", cache_salt="")
    make_group(globex, "batch", cache_salt="salt-g")
    prod = make_release(make_model(acme, "qwen3-8b", "/models/Qwen3-8B"), "prod-2026-07", budget_bytes=8 << 30)
    other = make_release(make_model(globex, "llama-3-8b", "/models/Llama-3-8B"), "globex-1")
    names = []
    for index in range(55):
        standalone = {"store_mode": "standalone-store", "store_segment_bytes": 16 << 30} if index % 5 == 0 else {}
        node = make_node(f"fleet-{index:02d}", hostname=f"10.0.1.{index}", **standalone)
        make_assignment(node, prod, port=8000, role="prefill" if index % 2 else "decode", gpu_ids="0")
        if index % 3 == 0:
            make_assignment(node, other, port=8001, gpu_ids="1")
        names.append(node.name)
    return names


def _queries(names: list[str], **kwargs) -> tuple[int, dict[str, int]]:
    with CaptureQueriesContext(connection) as captured:
        counts = push_nodes(names, **kwargs)
    return len(captured.captured_queries), counts


def test_a_push_queries_the_database_the_same_number_of_times_for_5_and_for_50_nodes(fleet):
    small, large = fleet[:5], fleet[5:]
    # the nodes' state rows exist (their agents reported): a node's very first push also inserts its row, in
    # batches of the backend's parameter limit (SQLite: about 40 rows a statement)
    NodeState.objects.bulk_create([NodeState(node_name=name) for name in fleet])
    with mock.patch("dashboard.rollout.publish.TaskBatch.send") as send:
        first = _queries(small), _queries(large)  # first versions
        assert [counts["versions"] for _, counts in first] == [5, 50] and send.call_count == 55
        Tenant.objects.filter(tenant_id="acme").update(quota_bytes=65 << 30)  # every node's document changes
        changed = _queries(small), _queries(large)
        assert [counts["versions"] for _, counts in changed] == [5, 50]
        resent = _queries(small, force=True), _queries(large, force=True)  # unchanged: stored documents re-sent
        assert [(counts["versions"], counts["sent"]) for _, counts in resent] == [(0, 5), (0, 50)]
    for pair in (first, changed, resent):
        assert pair[0][0] == pair[1][0], pair


def test_documents_rendered_from_shared_parts_are_what_the_schema_gives_back(fleet):
    """Nothing the schema would add or change is missing from a rendered document (re-dumping the parsed document
    gives the same canonical bytes), and nodes sharing a release share its members but not their own."""
    contents = render_contents(Node.objects.filter(name__in=fleet[:7]))
    for name, content in contents.items():
        document = {**content, "version": 1, "issued_at": "2026-12-02T00:00:00.000000Z"}
        parsed = parse_document(document).to_wire()
        for member in ("sent_at", "signature"):  # defaults of members stamped at sending
            parsed.pop(member)
        assert signing.canonical_bytes(parsed) == signing.canonical_bytes(document), name
    one, two = contents["fleet-01"]["instances"][0], contents["fleet-03"]["instances"][0]
    assert one["kv_layout"] == two["kv_layout"] and one["request_groups"] == two["request_groups"]
    assert one["instance_id"] != two["instance_id"] and one["launch"] != two["launch"]
    decode = contents["fleet-02"]["instances"][0]
    assert decode["node_budget_bytes"] == 0 and one["node_budget_bytes"] > 0  # a decode instance writes nothing


def test_signed_bytes_decode_to_the_signed_document_and_verify():
    document = {"node": "n-ü", "version": 3, "b": [1, {"z": None, "a": "x\n\"y"}], "signature": "stale"}
    raw = signing.signed_bytes(document, "secret")
    decoded = json.loads(raw)
    assert decoded == signing.signed(document, "secret")
    signing.verify(decoded, "secret")
    with pytest.raises(signing.SignatureError):
        signing.verify(decoded, "another secret")
    with pytest.raises(ValueError, match="empty"):
        signing.signed_bytes({}, "secret")
    with pytest.raises(ValueError, match="empty"):
        signing.signed_bytes(document, "")
    opened = unseal(seal_bytes(raw, "secret", node="n-ü"), "secret", node="n-ü")
    assert opened == unseal(seal(signing.signed(document, "secret"), "secret", node="n-ü"), "secret", node="n-ü")


@pytest.mark.parametrize("document", [
    {"node": "n-ü", "version": 3, "b": [1, {"z": None, "a": "x\n\"y"}], "signature": "stale", "\u00e9": "\u2028\t"},
    {"a": 1},
    {"z": {}, "y": [], "x": True, "w": -(2 ** 70), "v": "", "\x7f": "\x00\ud7ff"},
])
def test_members_encoded_once_join_to_the_canonical_bytes_of_any_document_made_of_them(document):
    members = signing.encoded_members(document)
    assert "signature" not in members
    assert signing.joined(members) == signing.canonical_bytes(document)
    stamp = {"sent_at": "2026-12-02T00:00:00.000000Z", "version": 4}  # a member replaced, one added
    merged = {**members, **signing.encoded_members(stamp)}
    assert signing.joined(merged) == signing.canonical_bytes({**document, **stamp})
    assert signing.signed_payload(signing.joined(merged), "secret") == signing.signed_bytes({**document, **stamp},
                                                                                           "secret")
    with pytest.raises(ValueError, match="empty"):
        signing.signed_payload(signing.joined({}), "secret")
    with pytest.raises(ValueError):
        signing.encoded_members({"a": float("nan")})


def test_a_new_version_and_its_resend_deliver_the_same_signed_document(fleet):
    """What ``send_many`` signs from the members ``ensure_versions`` encoded is what it signs from the stored
    document (a re-send), byte for byte but the ``sent_at`` stamp and signature; the digests are the canonical ones."""
    from dashboard.rollout import push

    name = fleet[3]
    node = Node.objects.get(name=name)
    with mock.patch("dashboard.rollout.push._publish_documents") as publish:
        push_nodes([name])
        push_nodes([name], force=True)
    first, again = (call.args[0][0][2] for call in publish.call_args_list)
    opened = [unseal(envelope, node.signing_secret, node=name) for envelope in (first, again)]
    for document in opened:
        signing.verify(document, node.signing_secret)
    stored = ConfigVersion.objects.get(node_name=name)
    strip = ("sent_at", "signature")
    assert [{k: v for k, v in d.items() if k not in strip} for d in opened] == [stored.document] * 2
    assert stored.digest == signing.digest(stored.document) == signing.document_digest(opened[0])
    assert stored.content_digest == push.content_digest(stored.document)


def test_the_launch_form_a_document_carries_is_the_validated_launch_spec_in_json_form(fleet):
    """``launch_form()`` (unvalidated, validated with its document) gives what ``launch_spec().to_dict()`` gives,
    for every instance of the fleet (both engines' roles, standalone-store nodes); a broken launch is still refused
    when the document is validated."""
    from tenants.models import InstanceAssignment
    from tenants.rendering import RenderTarget, render_assignment

    target = RenderTarget.from_settings()
    assignments = list(InstanceAssignment.objects.select_related("node", "release__model__tenant"))
    assert len(assignments) > 55
    for assignment in assignments:
        rendered = render_assignment(assignment, target)
        assert rendered.launch_form() == rendered.launch_spec().to_dict()
    content = render_contents(Node.objects.filter(name=fleet[0]))[fleet[0]]
    content["instances"][0]["launch"]["files"]["../escape"] = "x"
    with pytest.raises(ValueError, match="invalid instance file name"):
        parse_document({**content, "version": 1, "issued_at": "2026-12-02T00:00:00.000000Z"})


def _published(send) -> dict:
    """The arguments the producer's ``publish`` got from ``send(producer)`` (one message)."""
    from dashboard.celery import app

    with app.connection_for_write("memory://") as conn, \
            mock.patch.object(Producer, "publish", autospec=True) as publish:
        send(Producer(conn))
    [call] = publish.call_args_list
    (_producer, body), kwargs = call.args, dict(call.kwargs)
    headers, properties = dict(kwargs.pop("headers")), kwargs
    task_id = headers["id"]
    assert headers.pop("root_id") == properties.pop("correlation_id") == task_id
    assert headers.pop("expires")  # counted from the moment each was built
    headers.pop("id")
    return {"body": body, "headers": headers, "properties": properties}


@pytest.mark.parametrize("declare", [[], None])
def test_a_task_batch_publishes_what_send_task_publishes(declare):
    from dashboard.celery import app
    from dashboard.rollout.publish import TaskBatch

    args, queue, argsrepr = [{"sealed": 1, "node": "node-a"}], "agent.node-a", "[<config document>]"
    expected = _published(lambda producer: app.send_task(
        APPLY_CONFIG_TASK, args=args, queue=queue, producer=producer, declare=declare, argsrepr=argsrepr,
        expires=60, retry=True, retry_policy=PUBLISH_RETRY))
    got = _published(lambda producer: TaskBatch(app, producer, expires=60, retry_policy=PUBLISH_RETRY).send(
        APPLY_CONFIG_TASK, args=args, queue=queue, declare=declare, argsrepr=argsrepr))
    assert got == expected


def test_each_message_of_a_batch_has_its_own_task_id_and_arguments():
    from dashboard.celery import app
    from dashboard.rollout.publish import TaskBatch

    with app.connection_for_write("memory://") as conn, \
            mock.patch.object(Producer, "publish", autospec=True) as publish:
        batch = TaskBatch(app, Producer(conn), expires=None)
        ids = [batch.send(APPLY_CONFIG_TASK, args=[n], queue=f"agent.n{n}", argsrepr=f"[{n}]", declare=[])
               for n in range(3)]
    assert len(set(ids)) == 3
    for n, call in enumerate(publish.call_args_list):
        assert call.args[1][0] == [n] and call.kwargs["routing_key"] == f"agent.n{n}"
        assert call.kwargs["headers"]["id"] == ids[n] and call.kwargs["headers"]["argsrepr"] == f"[{n}]"
        assert call.kwargs["headers"]["expires"] is None and "expiration" not in call.kwargs


def test_pushed_documents_are_stored_once_per_version(fleet):
    with mock.patch("dashboard.rollout.publish.TaskBatch.send"):
        push_nodes(fleet[:10])
        push_nodes(fleet[:10])  # unchanged: no new version
    assert ConfigVersion.objects.filter(node_name__in=fleet[:10]).count() == 10
