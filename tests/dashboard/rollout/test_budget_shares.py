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
