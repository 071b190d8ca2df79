"""End to end on real services: private Redis, dashboard and agent Celery workers, a real mooncake_master."""
from __future__ import annotations

import sqlite3
import subprocess
import textwrap

import pytest
from celery import Celery
from django.db import transaction

from agent.contract import signing
from agent.contract.messages import APPLY_CONFIG_TASK, node_queue
from dashboard.models import (
    ConfigAck,
    ConfigVersion,
    MasterQuotaSample,
    NodeState,
    Report,
)
from tenants.models import Tenant
from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
)
from tests.support.telemetry import PYTHON, ROOT, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _state(name: str) -> NodeState | None:
    return NodeState.objects.filter(node_name=name).first()


def _acked(name: str, version: int | None = None) -> bool:
    state = _state(name)
    if state is None or state.desired_version == 0:
        return False
    target = version if version is not None else state.desired_version
    return state.acked_version >= target and state.acked_version == state.desired_version


def test_registry_change_reaches_two_agents_and_is_acked_and_bad_documents_are_refused(
        dashboard_broker, workers, settings):
    broker = dashboard_broker.url
    setup = _create_registry_after_broker()
    dashboard = workers.dashboard(broker)
    agents = {node.name: workers.agent(node.name, node.signing_secret, broker) for node in setup["nodes"]}
    for worker in (dashboard, *agents.values()):
        worker.wait_ready()
    # wait_for calls each predicate before the loop moves on: late binding of ``name`` is what is meant (B023).
    for name in agents:
        wait_for(lambda: _acked(name), 60, f"{name} to ack its first document")  # noqa: B023

    with transaction.atomic():  # one registry change affecting both nodes, pushed after commit
        release = setup["release"]
        release.state = "serving"
        release.save()
    for name in agents:
        wait_for(lambda: _acked(name) and _state(name).desired_version >= 2, 60,  # noqa: B023
                 f"{name} to ack the new version")
        state = _state(name)
        newest = ConfigVersion.objects.get(node_name=name, version=state.desired_version)
        assert newest.document["instances"][0]["release_state"] == "serving"
        assert state.acked_digest == newest.digest
        wait_for(lambda: _state(name).heartbeat_at is not None, 30, f"{name} heartbeat")  # noqa: B023
        wait_for(lambda: Report.objects.filter(node_name=name).exists(), 30, f"{name} report")  # noqa: B023

    # Tampered and stale documents, published straight to node-a's queue, are refused with a reason.
    node_a = setup["nodes"][0]
    current = ConfigVersion.objects.filter(node_name="node-a").order_by("-version").first()
    tampered = signing.signed({**current.document, "version": current.version + 1}, node_a.signing_secret)
    tampered["instances"][0]["tenant_id"] = "intruder"
    stale = signing.signed(ConfigVersion.objects.get(node_name="node-a", version=1).document,
                           node_a.signing_secret)
    with Celery("test-producer", broker=broker, set_as_current=False) as producer:
        producer.conf.task_serializer = "json"
        for doc in (tampered, stale):
            producer.send_task(APPLY_CONFIG_TASK, args=[doc], queue=node_queue("node-a"))
    wait_for(lambda: ConfigAck.objects.filter(node_name="node-a", status="rejected").count() >= 2, 30,
             "two rejections from node-a")
    reasons = set(ConfigAck.objects.filter(node_name="node-a", status="rejected").values_list("reason", flat=True))
    assert reasons == {"bad_signature", "stale"}
    log = agents["node-a"].log()
    assert f"rejected config document version={current.version + 1}: bad_signature" in log
    assert "rejected config document version=1: stale" in log
    state = _state("node-a")
    assert state.acked_version == current.version and state.rejection_reason in {"bad_signature", "stale"}


def _create_registry_after_broker():
    """Registry objects, created once the app publishes to the private broker (their pushes go there)."""
    tenant = make_tenant("acme", quota="8GB")
    model = make_model(tenant, "qwen3-8b", "/models/Qwen3-8B")
    release = make_release(model, "prod-2026-07")
    make_group(tenant, "app-a")
    nodes = [make_node("node-a"), make_node("node-b", hostname="10.0.0.2")]
    make_assignment(nodes[0], release, port=8000, role="prefill")
    make_assignment(nodes[1], release, port=8000, role="decode")
    return {"tenant": tenant, "release": release, "nodes": nodes}


def _outbox_last_sequence(state_dir, name: str = "last_sequence") -> int:
    with sqlite3.connect(state_dir / "outbox.sqlite3") as db:
        return db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()[0]


def _outbox_pending(state_dir) -> int:
    with sqlite3.connect(state_dir / "outbox.sqlite3") as db:
        return db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]


def test_agent_restarted_while_broker_is_down_loses_no_report(dashboard_broker, workers, tmp_path):
    redis_server = dashboard_broker
    node = make_node("node-r")
    state_dir = tmp_path / "state-node-r"
    workers.dashboard(redis_server.url).wait_ready()
    agent = workers.agent("node-r", node.signing_secret, redis_server.url, state_dir, report_interval=0.3)
    agent.wait_ready()
    wait_for(lambda: Report.objects.filter(node_name="node-r").count() >= 2, 30, "first reports")

    redis_server.stop()
    wait_for(lambda: "broker unavailable, buffering" in agent.log(), 30, "the agent to notice the outage")
    wait_for(lambda: _outbox_pending(state_dir) >= 2, 30, "reports buffered on disk")
    before_crash = _outbox_last_sequence(state_dir)
    first = _outbox_last_sequence(state_dir, "first_sequence")  # the Unix time in µs when the state dir was new
    agent.kill()  # crash while the broker is down: nothing can be flushed
    restarted = workers.agent("node-r", node.signing_secret, redis_server.url, state_dir, report_interval=0.3)
    wait_for(lambda: _outbox_last_sequence(state_dir) >= before_crash + 3, 30, "reports of the restarted agent")
    assert Report.objects.filter(node_name="node-r", sequence__gt=before_crash - 2).count() == 0
    redis_server.start()
    restarted.wait_ready()
    wait_for(lambda: Report.objects.filter(node_name="node-r").count() >= before_crash - first, 60,
             "buffered reports")
    restarted.stop()  # a clean stop flushes what is left
    last = _outbox_last_sequence(state_dir)
    stored = set(Report.objects.filter(node_name="node-r").values_list("sequence", flat=True))
    acks = set(ConfigAck.objects.filter(node_name="node-r").values_list("sequence", flat=True))
    wait_for(lambda: len(set(Report.objects.filter(node_name="node-r").values_list("sequence", flat=True))
                         | acks) == last - first + 1, 30, "every sequence to be stored")
    stored = set(Report.objects.filter(node_name="node-r").values_list("sequence", flat=True))
    assert stored | acks == set(range(first, last + 1))
    assert not stored & acks
    assert Report.objects.filter(node_name="node-r").count() == len(stored)  # stored once each


STORE_CLIENT = textwrap.dedent("""
    import ctypes, sys
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    rpc, metadata, tenant = sys.argv[1:4]
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "metadata_server": metadata,
                        "global_segment_size": 32 << 20, "local_buffer_size": 16 << 20, "protocol": "tcp",
                        "master_server_addr": rpc, "tenant_id": tenant, "device_name": ""}) == 0
    buf = ctypes.create_string_buffer(1 << 20)
    assert store.register_buffer(ctypes.addressof(buf), 1 << 20) == 0
    print("put", store.batch_put_from(["blk-1", "blk-2"], [ctypes.addressof(buf)] * 2, [4096, 4096],
                                      ReplicateConfig()), flush=True)
    sys.stdin.read()
""")


def test_quota_edits_reach_the_master_and_a_non_empty_tenant_delete_is_refused(
        dashboard_broker, workers, master, settings, django_user_model, tmp_path):
    settings.KVPOOL_MASTER_ADMIN_URL = master.admin_url
    workers.dashboard(dashboard_broker.url, KVPOOL_MASTER_ADMIN_URL=master.admin_url).wait_ready()
    tenant = make_tenant("team-q", quota="64MB")
    wait_for(lambda: any(q["tenant_id"] == "team-q" and q["requested_quota_bytes"] == 64 << 20
                         for q in master.tenant_quotas()), 30, "the new tenant on the master")
    tenant.quota_bytes = 96 << 20
    tenant.save()
    wait_for(lambda: master.tenant_quota("team-q")["requested_quota_bytes"] == 96 << 20, 30,
             "the edited quota on the master")
    assert "team-q" in master.quota_file.read_text()  # the master persisted the admin change itself
    policy = tmp_path / "var" / "tenant_quotas.yaml"  # rendered by the worker for a master restart
    wait_for(lambda: policy.exists() and "96MB" in policy.read_text(), 30, "the rendered tenant_quotas.yaml")

    from dashboard.tasks import sample_master_quotas

    assert sample_master_quotas.apply().get() >= 1
    sample = MasterQuotaSample.objects.get(tenant_id="team-q")
    assert sample.requested_quota_bytes == 96 << 20 and sample.has_explicit_policy

    client = subprocess.Popen([PYTHON, "-c", STORE_CLIENT, master.rpc_address, master.metadata_server, "team-q"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        assert client.stdout.readline().strip() == "put [0, 0]"
        from tests.support.factories import PLATFORM_ADMIN, grant
        from tests.support.registry import token_client

        user = grant(django_user_model.objects.create_user("op", password="pw"), PLATFORM_ADMIN,
                     "tenants.delete_tenant")
        api = token_client(user)
        response = api.delete(f"/api/v1/tenants/{tenant.pk}/")
        assert response.status_code == 409, response.content
        assert "TENANT_NOT_EMPTY" in response.json()["detail"] and "still owns objects" in response.json()["detail"]
        assert Tenant.objects.filter(tenant_id="team-q").exists()
        assert master.tenant_quota("team-q")["charged_bytes"] > 0
    finally:
        client.stdin.close()
        client.wait(timeout=30)
    wait_for(lambda: master.tenant_quota("team-q")["charged_bytes"] == 0, 30, "the client's objects to go")
    assert api.delete(f"/api/v1/tenants/{tenant.pk}/").status_code == 204
    assert all(q["tenant_id"] != "team-q" for q in master.tenant_quotas())
    wait_for(lambda: "team-q" not in policy.read_text(), 30, "the tenant to leave tenant_quotas.yaml")
