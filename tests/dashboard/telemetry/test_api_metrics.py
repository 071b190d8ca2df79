"""Telemetry REST API and the Prometheus /metrics endpoint."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from dashboard.models import (
    ConfigVersion,
    MasterQuotaSample,
    MasterQuotaSync,
    NodeState,
)
from dashboard.telemetry.ingest import ingest
from tests.support.factories import PLATFORM_ADMIN, grant, make_tenant
from tests.support.messages import ack, heartbeat, register, report
from tests.support.registry import token_client

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a", "node-b")


@pytest.fixture
def api(django_user_model):
    """A platform admin without model permissions: reads every tenant's telemetry."""
    user = grant(django_user_model.objects.create_user("viewer", password="pw"), PLATFORM_ADMIN)
    return token_client(user)


@pytest.fixture
def telemetry():
    now = timezone.now()
    NodeState.objects.create(node_name="node-a", desired_version=2, desired_digest="a" * 64)
    NodeState.objects.create(node_name="node-b", desired_version=1, desired_digest="b" * 64)
    ConfigVersion.objects.create(node_name="node-a", version=2, digest="a" * 64, content_digest="c" * 64,
                                 document={"node": "node-a", "version": 2})
    ingest([ack(node="node-a", sequence=1, version=2, digest="a" * 64, at=now),
            heartbeat(node="node-a", at=now, applied_version=2, applied_digest="a" * 64),
            ack(node="node-b", sequence=1, version=1, digest="b" * 64, at=now - timedelta(minutes=5)),
            report(node="node-a", sequence=2, at=now - timedelta(seconds=5), bytes_per_scope=1000, hits=3, misses=1),
            report(node="node-b", sequence=2, at=now - timedelta(seconds=5), bytes_per_scope=500, hits=1, misses=1)])
    return now


def test_api_requires_authentication():
    assert APIClient().get("/api/v1/telemetry/nodes/").status_code in (401, 403)


def test_nodes_list_shows_drift_and_filters(api, telemetry):
    rows = {row["node_name"]: row for row in api.get("/api/v1/telemetry/nodes/").json()["results"]}
    assert rows["node-a"]["drift"]["in_sync"] and rows["node-a"]["last_report_at"] is not None
    assert rows["node-b"]["drift"]["silent"] and not rows["node-b"]["drift"]["behind"]
    silent = api.get("/api/v1/telemetry/nodes/?drift=silent").json()["results"]
    assert [row["node_name"] for row in silent] == ["node-b"]
    response = api.get("/api/v1/telemetry/nodes/?drift=sideways")
    assert response.status_code == 400 and "drift" in response.json()


def test_node_detail_has_document_and_acks(api, telemetry):
    body = api.get("/api/v1/telemetry/nodes/node-a/").json()
    assert body["document"]["version"] == 2 and body["acks"][0]["status"] == "applied"
    assert api.get("/api/v1/telemetry/nodes/nobody/").status_code == 404


def test_occupancy_filters_and_bad_input(api, telemetry):
    rows = api.get("/api/v1/telemetry/occupancy/?node=node-a&level=raw").json()["results"]
    assert len(rows) == 2 and {r["level"] for r in rows} == {"raw"}
    assert api.get("/api/v1/telemetry/occupancy/?level=week").status_code == 400
    response = api.get("/api/v1/telemetry/occupancy/?since=yesterday")
    assert response.status_code == 400 and "since" in response.json()


def test_master_overview_shows_sync_errors(api, db):
    MasterQuotaSample.objects.create(ts=timezone.now(), tenant_id="acme", requested_quota_bytes=10,
                                     charged_bytes=4, has_explicit_policy=True)
    MasterQuotaSync.objects.create(tenant_id="gone", pending_delete=True, last_error_code=-1702,
                                   last_error="the master refused to delete tenant 'gone': TENANT_NOT_EMPTY")
    rows = {row["tenant_id"]: row for row in api.get("/api/v1/telemetry/master/").json()}
    assert rows["acme"]["master"]["charged_bytes"] == 4
    assert "TENANT_NOT_EMPTY" in rows["gone"]["sync"]["last_error"]


def test_metrics_exposes_occupancy_quota_and_drift(client, telemetry, settings):
    settings.KVPOOL_METRICS_WINDOW_SECONDS = 120
    tenant = make_tenant("acme")
    MasterQuotaSample.objects.create(ts=timezone.now(), tenant_id="acme", requested_quota_bytes=1 << 30,
                                     effective_quota_bytes=1 << 29, charged_bytes=3000, over_quota=True)
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    ns = 'namespace="prod-2026-07",request_group="g0",served_model_name="qwen3-8b",tenant_id="acme"'
    assert f"kvpool_cache_scope_occupancy_bytes{{{ns}}} 1500.0" in text  # node-a 1000 + node-b 500
    assert f"kvpool_cache_scope_hit_ratio{{{ns}}} 0.6666666666666666" in text  # (3+1) / (3+1+1+1)
    assert 'kvpool_tenant_occupancy_bytes{tenant_id="acme"} 3000.0' in text
    assert 'kvpool_master_tenant_quota_over_quota{tenant_id="acme"} 1.0' in text
    assert 'kvpool_node_silent{node="node-b"} 1.0' in text and 'kvpool_node_silent{node="node-a"} 0.0' in text


    tenant.delete()  # a deleted tenant's series leave /metrics with it
    text = client.get("/metrics").content.decode()
    assert 'tenant_id="acme"' not in text and 'kvpool_node_silent{node="node-a"} 0.0' in text


def test_old_reports_drop_out_of_metrics(client, db, settings):
    settings.KVPOOL_METRICS_WINDOW_SECONDS = 60
    ingest([report(sequence=1, at=timezone.now() - timedelta(minutes=10))])
    assert "kvpool_cache_scope_occupancy_bytes{" not in client.get("/metrics").content.decode()


def test_ingest_lag_is_the_newest_stored_reports_wait_per_node(client, db, settings):
    settings.KVPOOL_METRICS_WINDOW_SECONDS = 300
    now = timezone.now()
    ingest([report(node="node-a", sequence=1, at=now - timedelta(seconds=60))], now=now - timedelta(seconds=20))
    ingest([report(node="node-a", sequence=2, at=now - timedelta(seconds=10))], now=now - timedelta(seconds=7.5))
    ingest([report(node="node-b", sequence=1, at=now - timedelta(seconds=5))], now=now - timedelta(seconds=6))
    text = client.get("/metrics").content.decode()
    assert 'kvpool_ingest_lag_seconds{node="node-a"} 2.5' in text  # the newest report's wait, not the older 40 s
    assert 'kvpool_ingest_lag_seconds{node="node-b"} 0.0' in text  # received "before" sent: clock skew reads 0

    settings.KVPOOL_METRICS_WINDOW_SECONDS = 8  # node-a's newest report leaves the window, node-b's stays
    text = client.get("/metrics").content.decode()
    assert 'kvpool_ingest_lag_seconds{node="node-a"}' not in text and 'kvpool_ingest_lag_seconds{node="node-b"}' in text


def test_metrics_token(client, db, settings):
    settings.KVPOOL_METRICS_TOKEN = "scrape-me"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200


def test_a_non_ascii_metrics_token_is_a_401(db, settings):
    """``hmac.compare_digest`` raises ``TypeError`` on a non-ASCII ``str``: an anonymous header was a 500."""
    settings.KVPOOL_METRICS_TOKEN = "scrape-me"
    response = Client(raise_request_exception=False).get("/metrics", HTTP_AUTHORIZATION="Bearer \xe9")
    assert response.status_code == 401


def test_push_endpoint_validates_and_sends(api, db):
    from unittest import mock

    from tests.support.factories import make_node

    make_node("node-p")
    with mock.patch("dashboard.rollout.publish.TaskBatch.send") as send_task:
        refused = api.post("/api/v1/telemetry/nodes/node-p/push/", {}, format="json")
        assert refused.status_code == 403 and "tenants.change_node" in refused.json()["detail"]
        assert send_task.call_count == 0
        user = User.objects.get(username="viewer")
        user.user_permissions.add(Permission.objects.get(codename="change_node", content_type__app_label="tenants"))
        assert api.post("/api/v1/telemetry/nodes/node-p/push/", {"force": "maybe"}, format="json").status_code == 400
        body = api.post("/api/v1/telemetry/nodes/node-p/push/", {}, format="json").json()
        assert body == {"versions": 1, "sent": 1, "missing": 0, "failed": 0}
        assert api.post("/api/v1/telemetry/nodes/node-p/push/", {"force": True}, format="json").json()["sent"] == 1
    assert send_task.call_count == 2
    assert api.post("/api/v1/telemetry/nodes/ghost/push/", {}, format="json").status_code == 404


@pytest.mark.parametrize(("query", "parameter", "message"), [
    ("nodes/?drift=sideways", "drift",
     "'sideways' is not one of behind, silent, digest_mismatch, rejected, out_of_sync."),
    ("occupancy/?level=week", "level", "'week' is not one of raw, minute, hour."),
    ("occupancy/?since=yesterday", "since", "Enter a valid date/time."),
    ("occupancy/?until=yesterday", "until", "Enter a valid date/time."),
    ("master/samples/?since=yesterday", "since", "Enter a valid date/time."),
])
def test_telemetry_errors_are_lists_naming_the_parameter(api, query, parameter, message):
    response = api.get(f"/api/v1/telemetry/{query}")
    assert response.status_code == 400 and response.json() == {parameter: [message]}


@pytest.mark.parametrize("resource", ["nodes", "occupancy", "master/samples"])
def test_telemetry_unknown_ordering_is_400(api, resource):
    response = api.get(f"/api/v1/telemetry/{resource}/?ordering=bogus")
    assert response.status_code == 400
    assert response.json()["ordering"][0].startswith("Cannot order by 'bogus': use ")


def test_telemetry_ordering_and_default_level(api, telemetry):
    rows = api.get("/api/v1/telemetry/occupancy/?ordering=bytes").json()["results"]
    assert [row["bytes"] for row in rows] == [500, 500, 1000, 1000]
    rows = api.get("/api/v1/telemetry/occupancy/?ordering=-bytes&level=").json()["results"]
    assert [row["bytes"] for row in rows] == [1000, 1000, 500, 500] and {row["level"] for row in rows} == {"raw"}
    assert api.get("/api/v1/telemetry/occupancy/?level=hour").json()["count"] == 0
    names = [row["node_name"] for row in api.get("/api/v1/telemetry/nodes/?ordering=-node_name").json()["results"]]
    assert names == ["node-b", "node-a"]
    out_of_sync = api.get("/api/v1/telemetry/nodes/?drift=out_of_sync&limit=1").json()
    assert out_of_sync["count"] == 1 and out_of_sync["results"][0]["node_name"] == "node-b"
