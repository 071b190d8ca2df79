"""A confirmed delete of a warming release that already held keys, end to end on a real mooncake_master: the
namespace is reserved, the tenant's agent is asked (signed request, audited under the deleted release's id) to
purge it, its real ``remove_by_regex`` removes exactly that namespace's keys, the answer is recorded, and a new
release can never take the namespace back — the issue's "new weights read the old weights' KV" cannot happen."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.urls import reverse

from agent.contract import keys
from agent.node.purge import daemon_store_opener, handle_purge
from dashboard.rollout import purge
from tenants.models import AuditEntry, ReservedNamespace
from tests.dashboard.rollout.test_purge_integration import put
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant
from tests.support.registry import api  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
RELEASE_BODY = {"num_layers": 36, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "engine": "vllm",
                "engine_version": "0.33.0"}


def test_deleted_warming_release_is_purged_and_its_namespace_never_returns(
        api, ui, monkeypatch, django_capture_on_commit_callbacks, mooncake_master, store_client_factory,  # noqa: F811
        unique_name):
    model = make_model(make_tenant("alpha", "1GB"), "qwen3-8b", "/models/Qwen3-8B")
    warming = make_release(model, unique_name("warm"), weights_revision="r1")
    live = make_release(model, unique_name("live"))
    node = make_node("node-a", "127.0.0.1")
    make_assignment(node, live)  # the node runs an instance of the tenant: its agent carries the purge
    client = store_client_factory(mooncake_master, "alpha", "reserved-purge")
    old_keys = [keys.vllm_key("Qwen3-8B", f"{i:064x}", cache_prefix=warming.namespace, tp_rank=tp)
                for i in range(3) for tp in (0, 1)]
    live_keys = [keys.vllm_key("Qwen3-8B", f"{i:064x}", cache_prefix=live.namespace) for i in range(2)]
    put(client, old_keys + live_keys)
    sent = []
    monkeypatch.setattr(purge.app, "send_task", lambda name, args, **kw: sent.append((name, args, kw)))
    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/v1/releases/{warming.pk}/?confirm_namespace={warming.namespace}")
    assert response.status_code == 204
    reservation = ReservedNamespace.objects.get()
    assert reservation.purge_id and [kw["queue"] for _, _, kw in sent] == ["agent.node-a"]
    request = AuditEntry.objects.get(object_type=purge.REQUEST_TYPE)
    assert request.object_id == str(warming.pk) and request.actor_repr == "operator"
    assert request.after["reason"] == "release deleted" and request.after["nodes"] == ["node-a"]

    daemon = SimpleNamespace(current=SimpleNamespace(document=SimpleNamespace(store=mooncake_master.endpoints())))
    result = handle_purge(sent[0][1][0], node="node-a", secret=node.signing_secret,
                          open_store=daemon_store_opener(daemon))
    assert result["error"] == "" and result["removed"] == len(old_keys)
    assert client.exists(old_keys) == [0] * len(old_keys) and client.exists(live_keys) == [1] * len(live_keys)
    assert purge.record_purge_result(result)
    status = purge.purge_status(reservation.purge_id)
    assert status.complete and status.total_removed == len(old_keys) and not status.failed

    response = api.post("/api/v1/releases/", {"model": model.pk, "namespace": warming.namespace,
                                              "weights_revision": "r2", **RELEASE_BODY}, format="json")
    assert response.status_code == 400 and "is reserved" in response.json()["namespace"][0]
    page = ui.get(reverse("ui:model", args=[model.pk])).content.decode().split('id="reserved-namespaces"')[1]
    assert f"<code>{warming.namespace}</code>" in page and f'data-total-removed="{len(old_keys)}"' in page


def test_no_node_means_no_purge_but_the_namespace_stays_reserved(api, django_capture_on_commit_callbacks):  # noqa: F811
    release = make_release(make_model(make_tenant()), "canary")
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/api/v1/releases/{release.pk}/?confirm_namespace=canary").status_code == 204
    assert ReservedNamespace.objects.get().purge_id == ""
    assert not AuditEntry.objects.filter(object_type=purge.REQUEST_TYPE).exists()
