"""Each node's share of a release's and request group's budget in its config document (issue 12: with several
writer nodes, each agent holds only its own writes under its share, so the release stays under its budget)."""
from __future__ import annotations

from unittest import mock

import pytest

from dashboard.rollout.push import budget_share, render_contents
from tests.support.factories import make_assignment, make_group, make_model, make_node, make_release, make_tenant

pytestmark = pytest.mark.django_db


def test_budget_share_rule() -> None:
    assert budget_share(None, 1, 2) is None
    assert budget_share(1000, 1, 1) == 1000
    assert budget_share(1000, 1, 3) == 333 and 3 * budget_share(1000, 1, 3) <= 1000
    assert budget_share(1000, 2, 3) == 666
    assert budget_share(1000, 0, 3) == 0       # the node writes nothing of the release: keeps nothing
    assert budget_share(1000, 0, 0) == 0       # nobody writes


def specs(contents, node: str) -> list[dict]:
    return contents[node]["instances"]


@pytest.fixture
def three_nodes():
    tenant = make_tenant("acme", quota="8GB")
    model = make_model(tenant, "qwen3-8b", "/models/Qwen3-8B")
    release = make_release(model, "prod-2026-07", budget_bytes=1000)
    other = make_release(model, "prod-2026-08", budget_bytes=600)
    make_group(tenant, "app-a", cache_salt="salt-a", budget_bytes=300)
    make_group(tenant, "shared", cache_salt="")
    nodes = [make_node("node-a"), make_node("node-b", hostname="10.0.0.2"), make_node("node-c", hostname="10.0.0.3")]
    make_assignment(nodes[0], release, port=8000, role="both")
    make_assignment(nodes[0], release, port=8001, role="prefill")
    make_assignment(nodes[1], release, port=8000, role="both")
    make_assignment(nodes[2], release, port=8000, role="decode")
    make_assignment(nodes[2], other, port=8001, role="both")
    return nodes, release, other


def test_each_node_gets_its_writer_instances_share_of_the_release_and_group_budgets(three_nodes) -> None:
    nodes, release, other = three_nodes
    contents = render_contents(nodes)
    a, b, c = (specs(contents, n.name) for n in nodes)
    # release: 3 writers (2 on node-a, 1 on node-b); node-c's decode instance writes nothing
    assert [s["node_budget_bytes"] for s in a] == [666, 666] and [s["node_budget_bytes"] for s in b] == [333]
    assert c[0]["namespace"] == "prod-2026-07" and c[0]["node_budget_bytes"] == 0
    assert c[1]["namespace"] == "prod-2026-08" and c[1]["node_budget_bytes"] == 600  # its only writer
    assert release.budget_bytes >= 666 + 333 + 0
    groups = {s["instance_id"]: {g["name"]: g["node_budget_bytes"] for g in s["request_groups"]} for s in a + b + c}
    assert [groups[s["instance_id"]] for s in a] == [{"app-a": 200, "shared": None}] * 2
    assert groups[b[0]["instance_id"]] == {"app-a": 100, "shared": None}
    assert groups[c[0]["instance_id"]] == {"app-a": 0, "shared": None}
    assert groups[c[1]["instance_id"]] == {"app-a": 300, "shared": None}
    # rendering one node alone gives the same share (counts cover every node, not just the rendered ones)
    assert render_contents([nodes[1]])["node-b"]["instances"][0]["node_budget_bytes"] == 333


def test_a_new_writer_instance_re_renders_every_node_of_the_release(three_nodes, django_capture_on_commit_callbacks):
    nodes, release, _ = three_nodes
    node_d = make_node("node-d", hostname="10.0.0.4")
    with (mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
          django_capture_on_commit_callbacks(execute=True)):
        assignment = make_assignment(node_d, release, port=8000, role="both")
    assert push.call_args.kwargs["args"] == [["node-a", "node-b", "node-c", "node-d"]]
    assert specs(render_contents([nodes[1]]), "node-b")[0]["node_budget_bytes"] == 250  # 1000 * 1 // 4
    with (mock.patch("dashboard.tasks.push_nodes.apply_async") as push,
          django_capture_on_commit_callbacks(execute=True)):
        assignment.delete()
    assert push.call_args.kwargs["args"] == [["node-a", "node-b", "node-c", "node-d"]]
    assert specs(render_contents([nodes[1]]), "node-b")[0]["node_budget_bytes"] == 333


# --- demand-weighted shares (issue 18 item 6: cross-node budgets without waste) --------------------------------


def sample(node: str, group: str, size: int, trims: int, age: float, namespace: str = "prod-2026-07",
           puts: int = 0) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from dashboard.models import OccupancySample

    OccupancySample.objects.create(ts=timezone.now() - timedelta(seconds=age), node_name=node, tenant_id="acme",
                                   served_model_name="qwen3-8b", namespace=namespace, request_group=group,
                                   bytes=size, budget_evicted_blocks=trims, puts=puts)


@pytest.fixture
def two_writers():
    tenant = make_tenant("acme", quota="8GB")
    model = make_model(tenant, "qwen3-8b", "/models/Qwen3-8B")
    release = make_release(model, "prod-2026-07", budget_bytes=1_000_000)
    make_group(tenant, "app-a", cache_salt="salt-a", budget_bytes=400_000)
    nodes = [make_node("node-a"), make_node("node-b", hostname="10.0.0.2")]
    for node in nodes:
        make_assignment(node, release, port=8000, role="both")
    return nodes, release


def shares_of(nodes) -> dict[str, tuple[int, int]]:
    from dashboard.rollout.push import ensure_versions

    versions = ensure_versions(nodes)
    return {name: (item.version.document["instances"][0]["node_budget_bytes"],
                   item.version.document["instances"][0]["request_groups"][0]["node_budget_bytes"])
            for name, item in versions.items()}


def test_uneven_traffic_moves_the_unused_share_to_the_node_trimmed_at_its_share(two_writers) -> None:
    nodes, _ = two_writers
    assert shares_of(nodes) == {"node-a": (500_000, 200_000), "node-b": (500_000, 200_000)}  # nobody reported
    # node-a is trimmed at its share (its budget evictions grow), node-b holds little
    for age, trims, puts in ((90, 10, 3), (30, 25, 5)):
        sample("node-a", "app-a", 180_000, trims, age, puts=puts)
        sample("node-a", "", 270_000, trims, age, puts=puts)
        sample("node-b", "app-a", 40_000, 0, age, puts=puts)   # node-b writes a little
        sample("node-b", "", 20_000, 0, age, puts=puts)
    shares = shares_of(nodes)
    assert shares["node-b"] == (69_000, 46_000)            # what it holds (60,000 / 40,000) plus 15 % headroom
    assert shares["node-a"] == (931_000, 354_000)          # the rest: the shares sum to each budget
    # the next reconcile with about the same reports: no new version (hysteresis)
    sample("node-b", "app-a", 42_000, 0, 5, puts=6)
    from dashboard.rollout.push import ensure_versions

    again = ensure_versions(nodes)
    assert not any(item.created for item in again.values()), {
        n: (i.version.document["instances"][0]["node_budget_bytes"],
            i.version.document["instances"][0]["request_groups"]) for n, i in again.items()}


def test_a_node_rendered_alone_grows_only_into_what_the_other_documents_leave(two_writers) -> None:
    from dashboard.rollout.push import ensure_versions

    nodes, _ = two_writers
    ensure_versions(nodes)                                  # 500,000 each
    for age, trims in ((90, 10), (30, 25)):
        sample("node-a", "", 450_000, trims, age)
        sample("node-b", "", 60_000, 0, age)
    # node-a alone: node-b's document still holds 500,000, so node-a stays at 500,000
    assert render_contents([nodes[0]])["node-a"]["instances"][0]["node_budget_bytes"] == 500_000
    ensure_versions([nodes[1]])                  # node-b (no longer writing) gives back what it does not hold
    # ... then node-a grows into it; the documents never sum above the budget
    assert render_contents([nodes[0]])["node-a"]["instances"][0]["node_budget_bytes"] == 940_000
    # and stays there: node-b, holding exactly its share but writing nothing, needs no more
    ensure_versions(nodes)
    assert not any(item.created for item in ensure_versions(nodes).values())
    assert render_contents([nodes[1]])["node-b"]["instances"][0]["node_budget_bytes"] == 60_000


def test_a_silent_node_keeps_what_it_last_held(two_writers) -> None:
    nodes, _ = two_writers
    shares_of(nodes)
    for age, trims in ((90, 10), (30, 25)):
        sample("node-a", "", 450_000, trims, age)
    sample("node-b", "", 300_000, 0, 900)                  # its last report, 15 minutes ago
    shares = shares_of(nodes)
    assert shares["node-b"][0] == 300_000 and shares["node-a"][0] == 700_000


def test_without_reports_the_writer_split_is_rendered_without_reading_documents(two_writers) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    nodes, _ = two_writers
    shares_of(nodes)
    with CaptureQueriesContext(connection) as queries:
        contents = render_contents(nodes)
    sql = [q["sql"].lower() for q in queries.captured_queries]
    assert not any("dashboard_configversion" in q for q in sql)       # the writer split needs no documents
    assert sum("dashboard_occupancysample" in q for q in sql) == 2    # the window, then the silent nodes' lookback
    assert contents["node-a"]["instances"][0]["node_budget_bytes"] == 500_000


def test_a_silent_node_costs_a_render_one_row_per_scope_not_an_hour_of_reports(two_writers) -> None:
    """A node that reported for an hour (or flooded reports: agents are not rate-limited) and then fell silent is
    read by every render at its newest row per cache scope: the plan uses only that row (what it last held)."""
    from dashboard.rollout import budget_shares

    nodes, _ = two_writers
    shares_of(nodes)
    for age, trims in ((90, 10), (30, 25)):
        sample("node-a", "", 450_000, trims, age)
    for age in range(3000, 900, -5):                       # 420 reports, the newest 15 minutes ago
        sample("node-b", "", 300_000 if age == 905 else 1, 0, age)
    seen = []
    real = budget_shares._add

    def counting(held, scopes, row, *, trimming):
        seen.append((row[0], trimming))
        return real(held, scopes, row, trimming=trimming)

    with mock.patch.object(budget_shares, "_add", counting):
        shares = shares_of(nodes)
    assert shares["node-b"][0] == 300_000 and shares["node-a"][0] == 700_000   # as before
    assert seen.count(("node-b", False)) == 1              # its newest row only, not 420


def test_a_node_flooding_reports_costs_a_render_at_most_window_rows_per_scope(two_writers) -> None:
    from dashboard.rollout import budget_shares

    nodes, _ = two_writers
    shares_of(nodes)
    for index in range(300):                               # 300 reports in the 120 s window, trims growing
        sample("node-a", "", 450_000, index, 100 - index * 0.3)
    for age, trims in ((90, 0), (30, 0)):
        sample("node-b", "", 60_000, trims, age)
    seen = []
    real = budget_shares._add

    def counting(held, scopes, row, *, trimming):
        seen.append(row[0])
        return real(held, scopes, row, trimming=trimming)

    with mock.patch.object(budget_shares, "_add", counting):
        shares = shares_of(nodes)
    assert seen.count("node-a") == budget_shares.WINDOW_ROWS
    assert shares["node-a"][0] > shares["node-b"][0]        # still pressed (trimmed in its newest reports)
    assert shares["node-a"][0] + shares["node-b"][0] == 1_000_000
