"""Engine facts of reports (schema 2): stored per (node, instance) by ingest — idempotent, newest report wins —,
checked on the Checks page, listed read-only under /api/v1/telemetry/instances/ and exported on /metrics."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agent.contract import signing
from agent.contract.messages import InstanceStats as Stats
from agent.contract.messages import Report as ReportMessage
from dashboard.checklist import run_checks
from dashboard.models import ConfigVersion, InstanceStats, NodeState, Report
from dashboard.telemetry import metrics
from dashboard.telemetry.ingest import ingest
from tests.support.factories import PLATFORM_ADMIN, grant
from tests.support.messages import T0, register, sent
from tests.support.registry import token_client

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _nodes():
    register("node-a", "node-b", applied=False)
    applied("node-a", "7", "8")
    applied("node-b", "7")


def stats(instance_id: str = "7", **counters: Any) -> Stats:
    values = {"attributed": 19, "blocks_seen": 19, "messages": 8, "events": 40, "prefix_cache_queries": 760,
              "external_prefix_cache_queries": 640, "external_prefix_cache_hits": 320, "metrics_scrapes": 3,
              **counters}
    return Stats(instance_id=instance_id, tenant_id="acme", served_model_name="tiny", namespace="tiny-2026-12",
                 observed_since=values.pop("observed_since", T0 - timedelta(minutes=30)),
                 last_event_at=values.pop("last_event_at", T0 - timedelta(seconds=5)),
                 attributed_by_group={"default": 19}, store_keys={"save_put": 19}, **values)


def report(sequence: int, at, instances: list[Stats], *, node: str = "node-a", unknown_blocks: int = 0) -> dict:
    return sent(ReportMessage(node=node, sequence=sequence, sent_at=at, started_at=T0 - timedelta(hours=1),
                              applied_version=1, instances=instances, unknown_topic_messages=unknown_blocks,
                              unknown_topic_blocks=unknown_blocks).to_wire())


def applied(node: str = "node-a", *instance_ids: str) -> None:
    """The node's agent runs a document with vLLM instances ``instance_ids`` (each with a launch spec)."""
    instances = [{"instance_id": iid, "engine": "vllm", "tenant_id": "acme", "served_model_name": "tiny",
                  "namespace": "tiny-2026-12", "launch": {"instance_id": iid, "argv": ["python"]}}
                 for iid in instance_ids]
    document = {"node": node, "version": 1, "instances": instances}
    digest = signing.digest(document)  # what names a document (ingest keeps what it carries by it)
    ConfigVersion.objects.update_or_create(node_name=node, version=1, defaults={
        "digest": digest, "content_digest": "c" * 64, "document": document})
    NodeState.objects.update_or_create(node_name=node, defaults={"applied_digest": digest, "applied_version": 1})


def test_ingest_keeps_the_newest_facts_per_instance_and_is_idempotent():
    first = ingest([report(1, T0, [stats("7", attributed=10, blocks_seen=10), stats("8")])])
    assert (first.reports, first.instance_stats) == (1, 2)
    newer = report(2, T0 + timedelta(seconds=10), [stats("7", attributed=15, blocks_seen=16, unknown_salt=1)],
                   unknown_blocks=3)
    assert ingest([newer]).instance_stats == 1
    again = ingest([newer, report(1, T0, [stats("7", attributed=10, blocks_seen=10)])])
    assert again.duplicate_reports == 2 and again.instance_stats == 0
    late = ingest([report(3, T0 - timedelta(seconds=10), [stats("7", attributed=1, blocks_seen=1)])])
    assert late.reports == 1 and late.instance_stats == 0  # stored as a receipt, but older: the row stays
    row = InstanceStats.objects.get(node_name="node-a", instance_id="7")
    assert (row.attributed, row.blocks_seen, row.unknown_salt, row.report_sequence) == (15, 16, 1, 2)
    assert row.reported_at == T0 + timedelta(seconds=10) and row.agent_started_at == T0 - timedelta(hours=1)
    assert row.store_keys == {"save_put": 19} and row.attributed_by_group == {"default": 19}
    assert row.external_hit_ratio == 0.5 and row.unknown_blocks == 1
    assert InstanceStats.objects.get(instance_id="8").attributed == 19
    receipt = Report.objects.get(node_name="node-a", sequence=2)
    assert (receipt.unknown_topic_messages, receipt.unknown_topic_blocks) == (3, 3)


def test_a_batch_with_two_reports_of_one_instance_keeps_the_newer():
    ingest([report(5, T0 + timedelta(seconds=50), [stats(attributed=5)]),
            report(4, T0 + timedelta(seconds=40), [stats(attributed=4)])])
    assert InstanceStats.objects.get().attributed == 5


def test_reports_without_engines_store_no_facts():
    assert ingest([report(1, T0, [])]).instance_stats == 0 and not InstanceStats.objects.exists()


def _check(key: str):
    return next(check for check in run_checks(timezone.now()) if check.key == key)


def test_engine_checks_pass_for_healthy_engines_and_ignore_instances_that_left():
    now = timezone.now()
    applied("node-a", "7")
    ingest([report(1, now, [stats("7", events_status="connected"), stats("9", hash_mismatch=4)])])  # 9 left
    for key in ("engines_hash_registered", "blocks_registered", "engine_events_flow", "engine_events_trusted"):
        check = _check(key)
        assert check.passed, (key, check.summary, check.details)
    assert "19 attributed" in _check("engines_hash_registered").summary


def test_engine_checks_name_the_instance_and_the_count():
    now = timezone.now()
    applied("node-a", "7", "8", "9")
    ingest([report(1, now, [stats("7", hash_mismatch=4, attributed=15),
                            stats("8", unknown_salt=6, attributed=13),
                            stats("9", seq_gaps=2, messages=0, observed_since=now - timedelta(hours=1))],
                   unknown_blocks=5)])
    hashing = _check("engines_hash_registered")
    assert not hashing.passed and hashing.details == [hashing.details[0]]
    assert "instance 7 on node node-a (acme/tiny/tiny-2026-12): 4 of 19 Store block(s)" in hashing.details[0]
    unknown = _check("blocks_registered")
    assert not unknown.passed and any("instance 8" in d and "6 Store block(s)" in d for d in unknown.details)
    assert any(d.startswith("node node-a: 5 Store block(s)") for d in unknown.details)
    events = _check("engine_events_flow")
    assert not events.passed
    assert any("instance 9" in d and "2 KV-event message(s) lost" in d for d in events.details)
    assert any("instance 9" in d and "no KV event reached the agent" in d for d in events.details)


def test_an_engine_that_never_answers_fails_the_events_check():
    now = timezone.now()
    applied("node-a", "7")
    ingest([report(1, now, [stats("7", messages=0, metrics_scrapes=0, metrics_errors=30, prefix_cache_queries=0,
                                  metrics_error="connection refused",
                                  observed_since=now - timedelta(minutes=10))])])
    events = _check("engine_events_flow")
    assert not events.passed and "has not answered /metrics" in events.details[0]
    assert "connection refused" in events.details[0]


@pytest.fixture
def api(django_user_model):
    """A platform admin without model permissions: reads every tenant's telemetry."""
    user = grant(django_user_model.objects.create_user("viewer", password="pw"), PLATFORM_ADMIN)
    return token_client(user)


def test_api_lists_and_filters_instance_stats(api):
    now = timezone.now()
    ingest([report(1, now, [stats("7"), stats("8", hash_mismatch=2)]),
            report(1, now, [stats("7")], node="node-b")])
    assert APIClient().get("/api/v1/telemetry/instances/").status_code in (401, 403)
    rows = api.get("/api/v1/telemetry/instances/").json()["results"]
    assert [(r["node_name"], r["instance_id"]) for r in rows] == [("node-a", "7"), ("node-a", "8"), ("node-b", "7")]
    assert rows[0]["external_hit_ratio"] == 0.5 and rows[0]["attributed"] == 19 and "id" not in rows[0]
    assert [r["instance_id"] for r in api.get("/api/v1/telemetry/instances/?trouble=true").json()["results"]] == ["8"]
    assert len(api.get("/api/v1/telemetry/instances/?node=node-b").json()["results"]) == 1
    assert len(api.get("/api/v1/telemetry/instances/?namespace=tiny-2026-12&instance_id=7").json()["results"]) == 2
    assert api.get("/api/v1/telemetry/instances/?since=2999-01-01T00:00:00Z").json()["results"] == []
    detail = api.get("/api/v1/telemetry/instances/node-a/8/")
    assert detail.status_code == 200 and detail.json()["hash_mismatch"] == 2
    assert api.get("/api/v1/telemetry/instances/node-a/99/").status_code == 404
    for query, parameter in (("trouble=maybe", "trouble"), ("engine=tgi", "engine"), ("since=yesterday", "since"),
                             ("ordering=secret", "ordering")):
        response = api.get(f"/api/v1/telemetry/instances/?{query}")
        assert response.status_code == 400 and parameter in response.json(), (query, response.json())
    assert api.post("/api/v1/telemetry/instances/", {}).status_code == 405


def test_metrics_export_engine_instances_and_unknown_topic_blocks():
    from tests.support.factories import make_tenant

    make_tenant("acme")  # series of tenants not in the registry are not exported
    now = timezone.now()
    ingest([report(1, now, [stats("7", unknown_salt=2, blocks_seen=21)], unknown_blocks=4)])
    text = metrics.render().decode()

    def labels(**extra: str) -> str:  # the exposition sorts labels by name
        values = {"tenant_id": "acme", "served_model_name": "tiny", "namespace": "tiny-2026-12", "instance_id": "7",
                  "node": "node-a", **extra}
        return ",".join(f'{name}="{value}"' for name, value in sorted(values.items()))

    assert f"kvpool_engine_store_blocks_total{{{labels(outcome='attributed')}}} 19.0" in text
    assert f"kvpool_engine_store_blocks_total{{{labels(outcome='unknown_salt')}}} 2.0" in text
    assert f"kvpool_engine_external_prefix_cache_hits_tokens_total{{{labels()}}} 320.0" in text
    assert f"kvpool_engine_external_hit_ratio{{{labels()}}} 0.5" in text
    assert f"kvpool_engine_last_event_age_seconds{{{labels()}}}" in text
    assert 'kvpool_node_engine_unknown_topic_blocks_total{node="node-a"} 4.0' in text


def test_instances_whose_events_the_agent_cannot_vouch_for_fail_the_trust_check_and_are_exported():
    from tests.support.factories import make_tenant

    make_tenant("acme")  # /metrics exports registered tenants' series only
    now = timezone.now()
    applied("node-a", "7", "8", "9")
    ingest([report(1, now, [stats("7", events_status="refused", events_refusals=5,
                                  events_problem="directory /i/7 is writable by group or others (mode 0777)"),
                            stats("8", events_status="insecure", events_problem="tcp://127.0.0.1:5557"),
                            stats("9", events_status="connected", topic_mismatch=3)])])
    check = _check("engine_events_trusted")
    assert not check.passed and len(check.details) == 3
    assert "instance 7 on node node-a" in check.details[0] and "5 refused connection attempt(s)" in check.details[0]
    assert "writable by group or others" in check.details[0] and "insecure" in check.details[1]
    assert "3 KV-event message(s) on its socket under another topic" in check.details[2]
    row = InstanceStats.objects.get(instance_id="7")
    assert (row.events_status, row.events_refusals, row.events_untrusted) == ("refused", 5, True)
    text = metrics.render().decode()
    assert 'kvpool_engine_events_untrusted{' in text
    untrusted = [line for line in text.splitlines() if line.startswith("kvpool_engine_events_untrusted{")]
    assert sorted(line.rsplit(" ", 1)[1] for line in untrusted) == ["0.0", "1.0", "1.0"]
    assert any('instance_id="7"' in line and 'status="refused"' in line and line.endswith(" 1.0")
               for line in untrusted)


ELSEWHERE = "tiny-2026-1@tiny-llama"


def test_confirmation_and_unknown_namespaces_are_stored_checked_listed_and_exported(api):
    from tests.support.factories import make_tenant

    make_tenant("acme")
    now = timezone.now()
    applied("node-a", "7", "8")
    ingest([report(1, now, [stats("7", confirmed=19), stats("8", attributed=168, blocks_seen=168, unconfirmed=3,
                                                             unknown_namespace_keys={ELSEWHERE: 165},
                                                             unknown_namespace_bytes={ELSEWHERE: 165 * 16384},
                                                             pending=2, dropped_messages=1)])])
    row = InstanceStats.objects.get(instance_id="8")
    assert (row.unconfirmed, row.pending, row.dropped_messages) == (3, 2, 1)
    assert row.unknown_namespaces == [(ELSEWHERE, 165, 165 * 16384)]
    check = _check("engine_writes_in_store")
    assert not check.passed and len(check.details) == 2
    assert f"165 key(s), 2.58 MiB, under namespace {ELSEWHERE}" in check.details[0] and "instance 8" in check.details[0]
    assert "3 Store write(s) the engine reported were not in the Store" in check.details[1]
    listed = {r["instance_id"]: r for r in api.get("/api/v1/telemetry/instances/").json()["results"]}
    assert listed["8"]["unknown_namespace_keys"] == {ELSEWHERE: 165} and listed["7"]["confirmed"] == 19
    text = metrics.render().decode()
    base = 'instance_id="8",namespace="tiny-2026-12",node="node-a",served_model_name="tiny",tenant_id="acme"'
    assert (f'kvpool_engine_unknown_namespace_blocks_total{{instance_id="8",key_prefix="{ELSEWHERE}",'
            'namespace="tiny-2026-12",node="node-a",served_model_name="tiny",tenant_id="acme"} 165.0') in text
    assert f"kvpool_engine_store_writes_unconfirmed_blocks_total{{{base}}} 3.0" in text
    assert f"kvpool_engine_store_writes_pending_blocks{{{base}}} 2.0" in text


def test_engines_whose_writes_are_all_confirmed_pass_and_old_agents_still_validate():
    now = timezone.now()
    applied("node-a", "7")
    old = stats("7").model_dump(mode="json")
    for name in ("confirmed", "unconfirmed", "pending", "pending_overflow", "dropped_messages",
                 "unknown_namespace_keys", "unknown_namespace_bytes"):
        old.pop(name)
    ingest([report(1, now, [Stats.model_validate(old)])])  # an agent from before confirmation
    assert _check("engine_writes_in_store").passed
    ingest([report(2, now + timedelta(seconds=1), [stats("7", confirmed=19)])])
    check = _check("engine_writes_in_store")
    assert check.passed and "19 engine-written block(s)" in check.summary
