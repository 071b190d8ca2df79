"""A node's report speaks only for the instances of the document its agent applied
(``dashboard.telemetry.report_scope``): other rows are refused one by one, counted and logged without another
tenant's names; the valid rows of the same report, the node's own unknown-topic counts and the duplicate check
keep working; the documents of a batch are read in one query."""
from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.contract.messages import MAX_BYTES, Report, ScopeOccupancy
from agent.contract.messages import InstanceStats as Stats
from dashboard.models import InstanceStats, MessageRejection, OccupancySample
from dashboard.models import Report as Receipt
from dashboard.rollout.push import ensure_version
from dashboard.telemetry import metrics, report_scope
from dashboard.telemetry.ingest import ingest
from tests.support.factories import make_assignment, make_model, make_node, make_release, make_tenant
from tests.support.messages import register, report, secret_of, sent
from tests.support.registry import fast_password_hashing, operator, token_client  # noqa: F401  (fixtures)
from tests.support.ui import ui  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

HUGE = MAX_BYTES  # the most bytes a row may carry
#: Names of the other tenant and of the tenant that does not exist: none may appear in what ingest writes or logs.
FOREIGN = ("globex", "llama-70b", "globex-prod", "ghost")


@pytest.fixture
def registry():
    """node-a runs an instance of acme's release; globex's release runs on node-b only."""
    node_a = make_node("node-a", signing_secret=secret_of("node-a"))
    acme = make_assignment(node_a, make_release(make_model(make_tenant("acme"), "qwen3-8b"), "prod-2026-07"))
    globex = make_assignment(make_node("node-b", hostname="10.0.0.2", signing_secret=secret_of("node-b")),
                             make_release(make_model(make_tenant("globex"), "llama-70b"), "globex-prod"), port=9000)
    return {"node": node_a, "acme": acme, "globex": globex, "applied": ensure_version(node_a).version.version}


def _row(tenant: str, model: str, namespace: str, nbytes: int, group: str = "") -> ScopeOccupancy:
    return ScopeOccupancy(tenant_id=tenant, served_model_name=model, namespace=namespace, request_group=group,
                          blocks=nbytes // 1024, bytes=nbytes)


def _stats(assignment, **identity) -> Stats:
    now = timezone.now()
    values = {"instance_id": str(assignment.pk), "tenant_id": assignment.release.model.tenant.tenant_id,
              "served_model_name": assignment.release.model.served_model_name,
              "namespace": assignment.release.namespace, **identity}
    return Stats(observed_since=now, last_event_at=now, blocks_seen=5, attributed=5, **values)


def _report(applied: int, scopes, instances=(), sequence: int = 1, **extra) -> dict:
    now = timezone.now()
    return sent(Report(node="node-a", sequence=sequence, sent_at=now, started_at=now, applied_version=applied,
                       scopes=list(scopes), instances=list(instances), **extra).to_wire())


def test_rows_of_another_tenants_namespace_and_of_no_tenant_are_refused_and_the_valid_one_stored(
        registry, caplog, operator, ui):  # noqa: F811
    forged = _report(registry["applied"], [
        _row("acme", "qwen3-8b", "prod-2026-07", 4096),
        _row("globex", "llama-70b", "globex-prod", HUGE),  # a tenant with no instance on node-a
        _row("ghost", "qwen3-8b", "prod-2026-07", HUGE),  # a tenant that does not exist
    ], unknown_topic_messages=2, unknown_topic_blocks=7)
    with caplog.at_level(logging.WARNING, logger="kvpool.dashboard.ingest"):
        result = ingest([forged])
    assert (result.reports, result.samples, result.refused_scopes) == (1, 1, 2)
    assert result.rejected == {"scope_not_in_document": 2}
    assert list(OccupancySample.objects.values_list("tenant_id", "bytes")) == [("acme", 4096)]
    receipt = Receipt.objects.get(node_name="node-a")  # the node's own bucket stays its own
    assert (receipt.unknown_topic_messages, receipt.unknown_topic_blocks) == (2, 7)

    counted = MessageRejection.objects.get(reason="scope_not_in_document", node="node-a")
    assert counted.count == 2
    [line] = [r.getMessage() for r in caplog.records if "not carry" in r.getMessage()]
    assert "node node-a" in line and f"v{registry['applied']}" in line
    for name in FOREIGN:
        assert name not in line and name not in counted.last_error

    text = metrics.render().decode()
    assert 'kvpool_agent_messages_rejected_total{node="node-a",reason="scope_not_in_document"} 2.0' in text
    assert str(float(HUGE)) not in text
    rows = token_client(operator).get("/api/v1/telemetry/occupancy/").json()["results"]
    assert {(row["tenant_id"], row["bytes"]) for row in rows} == {("acme", 4096)}
    node_page = ui.get(f"/nodes/{registry['node'].pk}/").content.decode()
    assert "<code>scope_not_in_document</code>" in node_page
    assert "node node-a: 2 report row(s) refused as scope_not_in_document" in ui.get("/").content.decode()


def test_instance_stats_of_instances_the_document_does_not_carry_are_refused(registry):
    own, other = registry["acme"], registry["globex"]
    result = ingest([_report(registry["applied"], [], [
        _stats(own),
        _stats(other),  # node-b's instance
        _stats(own, tenant_id="globex", served_model_name="llama-70b", namespace="globex-prod"),  # own id, B's scope
        _stats(own, engine="sglang"),  # own id, another engine
    ])])
    assert (result.instance_stats, result.refused_instances) == (1, 3)
    assert result.rejected == {"instance_not_in_document": 3}
    assert list(InstanceStats.objects.values_list("instance_id", "tenant_id")) == [(str(own.pk), "acme")]
    counted = MessageRejection.objects.get(reason="instance_not_in_document", node="node-a")
    assert counted.count == 3 and not any(name in counted.last_error for name in FOREIGN)


@pytest.mark.parametrize("applied", [0, 999])
def test_a_report_under_a_document_the_dashboard_never_rendered_stores_only_its_receipt(registry, applied):
    first = ingest([_report(applied, [_row("acme", "qwen3-8b", "prod-2026-07", 4096)], [_stats(registry["acme"])],
                            unknown_topic_blocks=3)])
    assert (first.reports, first.samples, first.instance_stats) == (1, 0, 0)
    assert (first.refused_scopes, first.refused_instances) == (1, 1)
    assert Receipt.objects.get().unknown_topic_blocks == 3
    again = ingest([_report(applied, [_row("acme", "qwen3-8b", "prod-2026-07", 4096)])])  # same (node, sequence)
    assert again.duplicate_reports == 1 and again.refused_scopes == 0
    assert MessageRejection.objects.get(reason="scope_not_in_document").count == 1


def test_every_group_of_the_document_and_the_release_scope_are_accepted(registry):
    from tests.support.factories import make_group

    acme = registry["acme"].release.model.tenant
    make_group(acme, "app-a", cache_salt="salt-a")
    applied = ensure_version(registry["node"]).version.version
    result = ingest([_report(applied, [_row("acme", "qwen3-8b", "prod-2026-07", 1024, group)
                                       for group in ("", "app-a", "app-b")])])
    assert (result.samples, result.refused_scopes) == (2, 1)
    assert set(OccupancySample.objects.values_list("request_group", flat=True)) == {"", "app-a"}


def test_the_documents_of_a_batch_are_read_in_one_query_and_kept():
    nodes = [f"node-{index:03d}" for index in range(60)]
    register(*nodes)
    report_scope._cache.clear()

    def document_queries(sequences) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            result = ingest([report(node, sequence) for node in nodes for sequence in sequences])
        assert (result.reports, result.samples, result.refused_scopes) == (60 * len(sequences),
                                                                             120 * len(sequences), 0)
        documents = [q["sql"] for q in queries.captured_queries if "dashboard_configversion" in q["sql"]]
        return len(documents), sum("instances" in sql for sql in documents)

    assert document_queries((1, 2)) == (2, 1)  # which documents; the instances of the 60 not seen yet
    assert document_queries((3, 4)) == (1, 0)  # the same documents: only which


def test_rows_of_the_nodes_own_tenant_and_model_under_an_unregistered_namespace_are_kept_and_flagged(registry):
    """An engine of node-a launched by hand with a mistyped namespace: its rows stay visible (the overview marks
    the namespace, ``names_stable`` names it); registered namespaces the document does not carry stay refused."""
    from dashboard.checklist import check_names_stable

    make_release(registry["acme"].release.model, "prod-2026-08")  # registered, not on node-a
    result = ingest([_report(registry["applied"], [
        _row("acme", "qwen3-8b", "prod-2026-07", 4096),
        _row("acme", "qwen3-8b", "prod-2026-7", 2048),  # the mistyped namespace: kept
        _row("acme", "qwen3-8b", "prod-2026-08", HUGE),  # registered elsewhere: refused
        _row("acme", "qwen3-8b", "prod-2026-7", HUGE, group="no-such-group"),  # a group the node lacks
        _row("globex", "llama-70b", "typo", HUGE),  # a tenant with no instance on node-a
    ])])
    assert (result.samples, result.refused_scopes) == (2, 3)
    assert set(OccupancySample.objects.values_list("namespace", "bytes")) == {("prod-2026-07", 4096),
                                                                               ("prod-2026-7", 2048)}
    check = check_names_stable(timezone.now())
    assert not check.passed
    assert any("'prod-2026-7' is not registered" in line for line in check.details)


def test_a_report_keeps_rows_of_a_bounded_number_of_unregistered_namespaces(registry):
    names = [f"typo-{index}" for index in range(report_scope.UNREGISTERED_PER_REPORT + 5)]
    with CaptureQueriesContext(connection) as queries:
        result = ingest([_report(registry["applied"], [_row("acme", "qwen3-8b", name, 1024) for name in names])])
    assert (result.samples, result.refused_scopes) == (report_scope.UNREGISTERED_PER_REPORT, 5)
    assert sum("tenants_release" in q["sql"] for q in queries.captured_queries) == 1
