"""Purge of a retired release: confirmed and audited on the dashboard, signed to each agent of the tenant, run
by ``agent.node.purge`` with ``remove_by_regex`` on the namespace's key regex, and each agent's count recorded."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from agent.contract import keys, signing
from agent.node.purge import (
    PURGE_RESULT_QUEUE,
    PURGE_RESULT_TASK,
    PURGE_TASK,
    PurgeRequest,
    handle_purge,
    purge_release_keys,
    register_purge_task,
    release_keys_regex,
    signed_request,
)
from dashboard.rollout import purge
from tenants.models import AuditEntry
from tests.support.factories import (
    make_assignment,
    make_model,
    make_node,
    make_release,
    make_tenant,
)

H64 = "ab" * 32


class RegexStore:
    """In-memory ``remove_by_regex`` with ECMAScript-compatible patterns (the ones ``agent.contract.keys`` builds)."""

    def __init__(self, keys_: list[str]) -> None:
        self.keys = set(keys_)
        self.closed = False
        self.patterns: list[str] = []

    def remove_by_regex(self, pattern: str, *, force: bool = True) -> int:
        self.patterns.append(pattern)
        gone = {k for k in self.keys if re.search(pattern, k)}
        self.keys -= gone
        return len(gone)

    def close(self) -> None:
        self.closed = True


def vllm_keys(prefix: str, model: str = "Qwen3-8B", blocks: int = 3) -> list[str]:
    return [keys.vllm_key(model, f"{i:064x}", cache_prefix=prefix, tp_rank=tp)
            for i in range(blocks) for tp in (0, 1)]


# --- agent side (no Django) ----------------------------------------------------------------------------------


def test_purge_release_keys_removes_only_that_namespace_and_model():
    store = RegexStore([*vllm_keys("prod-a"), *vllm_keys("prod-b"), *vllm_keys("prod-a", model="Other"),
                        *keys.sglang_keys("qwen3-8b", H64, extra_backend_tag="prod-a")])
    assert purge_release_keys(store, "prod-a", engine="vllm", model="Qwen3-8B") == 6
    assert not any(k.startswith("prod-a@Qwen3-8B@") for k in store.keys)
    assert len(store.keys) == 6 + 6 + 2
    assert purge_release_keys(store, "prod-a", engine="sglang", model="qwen3-8b") == 2


def test_regex_needs_a_namespace_and_model():
    with pytest.raises(ValueError, match="namespace"):
        release_keys_regex("vllm", "", "Qwen3-8B")
    with pytest.raises(ValueError, match="model"):
        release_keys_regex("vllm", "prod", "")
    assert release_keys_regex("vllm", "prod", "Qwen3-8B") == keys.release_regex("vllm", "prod", "Qwen3-8B")


def request(node: str = "node-a", **overrides) -> PurgeRequest:
    fields = dict(purge_id="p1", node=node, tenant_id="acme", engine="vllm", namespace="prod-a", model="Qwen3-8B",
                  served_model_name="qwen3-8b", issued_at=signing.timestamp(datetime.now(UTC)))
    fields.update(overrides)
    return PurgeRequest(**fields)


def test_handle_purge_verifies_and_reports_the_count():
    store = RegexStore(vllm_keys("prod-a"))
    opened: list[str] = []
    result = handle_purge(signed_request(request(), "secret"), node="node-a", secret="secret",
                          open_store=lambda tenant: opened.append(tenant) or store)
    assert (result["purge_id"], result["node"], result["removed"], result["error"]) == ("p1", "node-a", 6, "")
    assert result["kind"] == "purge_result" and result["schema"] == 1
    assert opened == ["acme"] and store.closed


@pytest.mark.parametrize("mutate,error", [
    (lambda raw: {**raw, "namespace": "prod-b"}, "bad_signature"),
    (lambda raw: {k: v for k, v in raw.items() if k != "signature"}, "unsigned"),
    (lambda raw: signing.signed({**raw, "node": "node-b"}, "secret"), "is for node 'node-b'"),
    (lambda raw: signing.signed({**raw, "extra": 1}, "secret"), "invalid purge request"),
    (lambda raw: "not a dict", "expected a JSON object"),
])
def test_handle_purge_refuses_bad_requests_without_touching_the_store(mutate, error):
    store = RegexStore(vllm_keys("prod-a"))
    result = handle_purge(mutate(signed_request(request(), "secret")), node="node-a", secret="secret",
                          open_store=lambda tenant: store)
    assert result["removed"] == 0 and error in result["error"]
    assert store.patterns == [] and len(store.keys) == 6


def test_stale_future_and_replayed_purges_are_refused_with_the_reason(tmp_path):
    """Issue 16 item 10: a purge dated 2020 was applied, twice. Now the age is checked, and a purge id runs once
    per node (remembered on disk, across restarts of the agent)."""
    from agent.node.freshness import SEEN_PURGES_FILE, SeenPurges

    store = RegexStore(vllm_keys("prod-a"))
    seen = SeenPurges(tmp_path / SEEN_PURGES_FILE)

    def run(req: PurgeRequest, seen_ids=seen) -> dict:
        return handle_purge(signed_request(req, "s"), node="node-a", secret="s", open_store=lambda t: store,
                            seen=seen_ids)

    old = run(request(purge_id="p2020", issued_at="2020-01-01T00:00:00.000000Z"))
    assert old["removed"] == 0 and old["error"].startswith("MessageError: stale: issued_at 2020-01-01")
    future = run(request(purge_id="pf", issued_at=signing.timestamp(datetime.now(UTC) + timedelta(hours=1))))
    assert future["removed"] == 0 and "in the future" in future["error"]
    assert store.patterns == [] and len(seen) == 0
    first = run(request(purge_id="p1"))
    assert first["removed"] == 6 and first["error"] == ""
    store.keys = vllm_keys("prod-a")  # the namespace filled again
    again = run(request(purge_id="p1"))
    assert again["removed"] == 0 and "replayed: purge p1 already ran on this node" in again["error"]
    restarted = SeenPurges(tmp_path / SEEN_PURGES_FILE)  # a restarted agent still knows it
    assert run(request(purge_id="p1"), restarted)["error"].endswith("already ran on this node; not run again")
    assert len(store.patterns) == 1 and oct((tmp_path / SEEN_PURGES_FILE).stat().st_mode & 0o777) == "0o600"


def test_seen_purges_forget_ids_once_their_stamp_left_the_window(tmp_path):
    from agent.node.freshness import SeenPurges

    seen = SeenPurges(tmp_path / "seen.json", max_age=3600, limit=3)
    now = datetime.now(UTC)
    seen.remember("old", signing.timestamp(now - timedelta(hours=2)), now=now - timedelta(hours=2))
    for i in range(4):
        seen.remember(f"p{i}", signing.timestamp(now + timedelta(seconds=i)), now=now)
    assert [p for p in ("old", "p0", "p1", "p2", "p3") if p in seen] == ["p1", "p2", "p3"]


def test_store_errors_come_back_as_the_result():
    def broken(tenant):
        raise RuntimeError("master unreachable")

    result = handle_purge(signed_request(request(), "s"), node="node-a", secret="s", open_store=broken)
    assert result["removed"] == 0 and "master unreachable" in result["error"]


def test_registered_celery_task_runs_and_publishes_the_result():
    from agent.node.celery_app import make_app

    app = make_app("node-a", "memory://")
    store = RegexStore(vllm_keys("prod-a"))
    sent: list[dict] = []
    register_purge_task(app, node="node-a", secret="s", open_store=lambda tenant: store, publish=sent.append)
    result = app.tasks[PURGE_TASK].apply(args=[signed_request(request(), "s")]).get()
    assert result["removed"] == 6 and sent == [result]


def test_default_publisher_sends_the_result_task_to_the_dashboard_queue(monkeypatch):
    from agent.node.celery_app import make_app

    app = make_app("node-a", "memory://")
    calls = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: calls.append((name, kw)))
    register_purge_task(app, node="node-a", secret="s", open_store=lambda tenant: RegexStore([]))
    app.tasks[PURGE_TASK].apply(args=[signed_request(request(), "s")])
    (name, kwargs), = calls
    assert name == PURGE_RESULT_TASK and kwargs["queue"] == PURGE_RESULT_QUEUE
    assert kwargs["args"][0]["removed"] == 0 and kwargs["args"][0]["error"] == ""


# --- dashboard side ------------------------------------------------------------------------------------------


@pytest.fixture
def retired(db):
    tenant = make_tenant("acme")
    model = make_model(tenant)
    old = make_release(model, "prod-a", state="serving")
    new = make_release(model, "prod-b", state="serving")
    node_a, node_b = make_node("node-a"), make_node("node-b", hostname="10.0.0.2")
    make_assignment(node_a, new, port=8000)
    make_assignment(node_b, new, port=8000)
    old.state = "draining"
    old.save()
    old.state = "retired"
    old.save()
    return old


@pytest.fixture
def sent(monkeypatch):
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(purge.app, "send_task", lambda name, **kw: calls.append((name, kw)))
    return calls


def test_request_is_audited_and_signed_per_node(retired, sent):
    purge_id = purge.request_purge(retired, confirm="prod-a")
    entry = AuditEntry.objects.get(object_type=purge.REQUEST_TYPE)
    assert entry.request_id == purge_id and entry.actor_repr == "system"
    assert entry.after["nodes"] == ["node-a", "node-b"]
    assert entry.after["regex"] == keys.release_regex("vllm", "prod-a", "Qwen3-8B")
    assert [kw["queue"] for _, kw in sent] == ["agent.node-a", "agent.node-b"]
    assert all(kw["expires"] > 0 for _, kw in sent)
    assert {name for name, _ in sent} == {PURGE_TASK}
    from agent.contract.sealing import is_sealed, unseal
    from tenants.models import Node

    for _, kwargs in sent:
        envelope = kwargs["args"][0]
        assert is_sealed(envelope) and "prod-a" not in str(envelope) and "prod-a" not in kwargs["argsrepr"]
        node = Node.objects.get(name=envelope["node"])
        raw = unseal(envelope, node.signing_secret, node=node.name)  # sealed to each node with its own secret
        signing.verify(raw, node.signing_secret)
        store = RegexStore(vllm_keys("prod-a"))
        result = handle_purge(envelope, node=node.name, secret=node.signing_secret,
                              open_store=lambda t, store=store: store)
        assert purge.record_purge_result(result) is True
    status = purge.purge_status(purge_id)
    assert status.complete and status.total_removed == 12 and not status.failed
    assert set(AuditEntry.objects.filter(object_type=purge.RESULT_TYPE).values_list("actor_repr", flat=True)) == {
        "agent:node-a", "agent:node-b"}


def test_results_are_recorded_once_and_only_for_asked_nodes(retired, sent):
    purge_id = purge.request_purge(retired, confirm="prod-a")
    result = {"schema": 1, "kind": "purge_result", "purge_id": purge_id, "node": "node-a", "removed": 4,
              "error": "", "sent_at": "2026-11-30T12:00:00Z"}
    assert purge.record_purge_result(result) is True
    assert purge.record_purge_result(result) is False
    assert purge.record_purge_result({**result, "node": "node-z"}) is False
    assert purge.record_purge_result({**result, "purge_id": "unknown"}) is False
    with pytest.raises(purge.MessageError):
        purge.record_purge_result({**result, "removed": -1})
    assert purge.purge_result.run({**result, "removed": "x"}) is False  # the task logs and drops it
    status = purge.purge_status(purge_id)
    assert not status.complete and status.total_removed == 4
    assert [(n.node, n.removed) for n in status.nodes] == [("node-a", 4), ("node-b", None)]


def test_a_live_release_cannot_be_purged(retired, sent):
    live = retired.model.releases.get(namespace="prod-b")
    with pytest.raises(purge.ValidationError) as info:
        purge.request_purge(live, confirm="prod-b")
    assert "only a retired release" in info.value.message_dict["state"][0]
    assert sent == [] and not AuditEntry.objects.filter(object_type=purge.REQUEST_TYPE).exists()


def test_the_namespace_must_be_typed(retired, sent):
    with pytest.raises(purge.ValidationError) as info:
        purge.request_purge(retired, confirm="prod")
    assert info.value.message_dict["confirm"] == ["Type the release namespace 'prod-a' to confirm the purge."]
    assert sent == []


def test_no_agent_no_purge(db, sent):
    release = make_release(make_model(make_tenant("lonely")), "prod-x")
    release.state = "retired"
    release.save()
    with pytest.raises(purge.PurgeError, match="No node runs an instance"):
        purge.request_purge(release, confirm="prod-x")


def test_broker_failure_is_recorded_as_the_nodes_answer(retired, monkeypatch):
    def down(name, **kwargs):
        raise ConnectionError("redis down")

    monkeypatch.setattr(purge.app, "send_task", down)
    purge_id = purge.request_purge(retired, confirm="prod-a")
    status = purge.purge_status(purge_id)
    assert status.complete and len(status.failed) == 2 and "not sent: ConnectionError" in status.failed[0].error


def test_purge_page_confirms_requests_and_shows_counts(ui, retired, sent):
    url = reverse("ui:purge", args=[retired.pk])
    page = ui.get(url).content.decode()
    assert "prod-a@Qwen3-8B@tp_rank" in page and "<code>node-a</code>, <code>node-b</code>" in page
    wrong = ui.post(url, {"confirm": "nope"})
    assert wrong.status_code == 400 and "Type the release namespace" in wrong.content.decode()
    response = ui.post(url, {"confirm": "prod-a"})
    assert response.status_code == 302 and len(sent) == 2
    entry = AuditEntry.objects.get(object_type=purge.REQUEST_TYPE)
    assert entry.actor_repr == "operator"
    purge.record_purge_result({"schema": 1, "kind": "purge_result", "purge_id": entry.request_id, "node": "node-b",
                               "removed": 7, "error": "", "sent_at": "2026-11-30T12:00:00Z"})
    page = ui.get(url).content.decode()
    assert 'data-total-removed="7"' in page and 'data-removed="7"' in page and "waiting" in page
    release_page = ui.get(reverse("ui:release", args=[retired.pk])).content.decode()
    assert 'data-total-removed="7"' in release_page


def test_purge_page_of_a_live_release_offers_no_form(ui, retired, sent):
    live = retired.model.releases.get(namespace="prod-b")
    page = ui.get(reverse("ui:purge", args=[live.pk])).content.decode()
    assert "Only a retired release" in page and 'id="purge-button"' not in page
    assert ui.post(reverse("ui:purge", args=[live.pk]), {"confirm": "prod-b"}).status_code == 400
    assert sent == []


def test_the_agents_ledger_forgets_the_purged_release():
    from agent.datapath.keyspace import KeySpace
    from agent.datapath.ledger import Ledger, Outcome

    ledger = Ledger()
    common = dict(tenant_id="acme", engine="vllm", served_model_name="qwen3-8b", vllm_model_name="Qwen3-8B",
                  block_size=16, hash_algo="sha256")
    purged, kept = KeySpace(namespace="prod-a", **common), KeySpace(namespace="prod-b", **common)
    hashes = [bytes([i]) * 32 for i in range(1, 4)]
    for ns in (purged, kept):
        ledger.record_put(ns, hashes, None, [Outcome.STORED] * 3, 1024)
    store = RegexStore([purged.primary_key(h) for h in hashes] + [kept.primary_key(h) for h in hashes])
    result = handle_purge(signed_request(request(), "s"), node="node-a", secret="s", open_store=lambda t: store,
                          ledger=ledger)
    assert result["removed"] == 3
    rows = {row["namespace"]: row for row in ledger.snapshot()}
    assert (rows["prod-a"]["blocks"], rows["prod-a"]["bytes"]) == (0, 0)
    assert (rows["prod-b"]["blocks"], rows["prod-b"]["bytes"]) == (3, 3072)


def test_refused_purge_of_a_live_release_says_why_once(ui, retired, sent):
    live = retired.model.releases.get(namespace="prod-b")
    html = ui.post(reverse("ui:purge", args=[live.pk]), {"confirm": "prod-b"}).content.decode()
    assert html.count("only a retired release") + html.count("Only a retired release") == 1
