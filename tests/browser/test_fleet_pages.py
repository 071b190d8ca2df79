"""The pages on a fleet-shaped registry (issue 17), in real headless Chromium, with small numbers: 60 nodes, 4 tenants,
8 served models, 40 release namespaces, 320 cache scopes (``bench.fleet_registry``) — enough for every list to need
pages. The overview shows the nodes needing attention and counts the rest; the occupancy filters' type-ahead offers
names and filtering by one works; the registry lists go to page 2, sort and search; a check failing for many nodes
shows its first lines and links the rest."""
from __future__ import annotations

import re

import pytest

from bench.fleet_registry import build_fleet
from bench.pages import add_telemetry

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
#: Nodes whose agent heartbeats now; the next SILENT ones went silent an hour ago; the rest never reported.
ALIVE, SILENT = 20, 30


@pytest.fixture
def fleet(settings):
    """The small fleet, nodes' heartbeats (``ALIVE`` now, ``SILENT`` an hour ago) and one occupancy sample per
    instance of the heartbeating nodes. A node is silent after 30 minutes here, so that the heartbeats of "now" stay
    fresh however slowly a loaded machine walks the pages."""
    settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS = 1800
    fleet = build_fleet(nodes=60, tenants=4, models=8, releases=40, scopes=300, scopes_per_node=16)
    add_telemetry(fleet, alive=ALIVE, silent=SILENT)
    return fleet


def rows(page, table: str, attribute: str) -> list[str]:
    return page.eval_on_selector_all(f"#{table} tbody tr[{attribute}]",
                                     f"rows => rows.map(r => r.getAttribute('{attribute}'))")


def names_offered(page, input_id: str, text: str) -> list[str]:
    """Type ``text`` into the filter input and return the names its type-ahead offers."""
    page.fill(f"#{input_id}", "")
    page.type(f"#{input_id}", text)
    page.wait_for_function(
        "([id, text]) => { const input = document.getElementById(id); return input.dataset.namesState === 'ready' "
        "&& input.value === text; }", arg=[input_id, text])
    page.wait_for_timeout(300)  # a later keystroke's answer replaces an earlier one
    page.wait_for_function("id => document.getElementById(id).dataset.namesState === 'ready'", arg=input_id)
    return page.eval_on_selector_all(f"#{input_id}-names option", "options => options.map(o => o.value)")


def test_fleet_pages_load_and_stay_usable(page, shot, fleet):
    # Overview: counts over every node, the ones needing attention listed, a link to all of them.
    response = page.goto("/")
    assert response.status == 200
    assert page.get_attribute("#node-summary", "data-total") == "60"
    assert "30 silent" in page.inner_text("#node-summary")
    shown = rows(page, "nodes", "data-node")
    assert len(shown) == 20 and set(shown) <= set(fleet.node_names[ALIVE:])  # the silent and the never heard
    shot(page, "fleet-overview")
    page.click('#node-summary a[href$="#nodes"]')
    page.wait_for_url("**/registry/#nodes")

    # Registry: 60 nodes in pages of 25; page 2, then sorted by name descending, then searched.
    assert rows(page, "registry-nodes", "data-node") == fleet.node_names[:25]
    page.click('nav[data-pager="nodes_"] a[rel="next"]')
    page.wait_for_url("**/registry/?nodes_page=2")
    assert rows(page, "registry-nodes", "data-node") == fleet.node_names[25:50]
    assert rows(page, "registry-releases", "data-namespace")[0] == "rel-00000"  # the other lists stay on page 1
    page.click('#registry-nodes a[data-sort-key="name"]')
    page.wait_for_url("**/registry/?nodes_sort=-name")
    assert rows(page, "registry-nodes", "data-node")[:2] == [fleet.node_names[59], fleet.node_names[58]]
    assert page.get_attribute('#registry-nodes a[data-sort-key="name"]', "data-sort") == "descending"
    page.click('#registry-releases a[data-sort-key="namespace"]')  # another list's sort keeps this one's
    page.wait_for_url(re.compile(r".*nodes_sort=-name.*releases_sort=namespace|.*releases_sort=namespace.*"
                                 r"nodes_sort=-name"))
    assert rows(page, "registry-nodes", "data-node")[0] == fleet.node_names[59]
    page.fill("#registry-search input[name=q]", "n0042")
    page.click("#registry-search button")
    page.wait_for_url("**/registry/?q=n0042")
    assert rows(page, "registry-nodes", "data-node") == ["fleet-n0042"]
    assert rows(page, "registry-releases", "data-namespace") == []
    page.fill("#registry-search input[name=q]", "app-007")
    page.click("#registry-search button")
    page.wait_for_url("**/registry/?q=app-007")
    assert page.locator("#registry-groups tbody tr[data-group]").count() == 4  # one per tenant
    shot(page, "fleet-registry")

    # Occupancy: the filters' type-ahead offers names (narrowed by the tenant), and filtering by one works.
    page.goto("/occupancy/?window=15m")
    page.wait_for_function("() => document.getElementById('occupancy-chart').dataset.state === 'ready'")
    assert names_offered(page, "f-tenant", "fleet-t") == fleet.tenant_ids
    assert names_offered(page, "f-tenant", "fleet-t001") == ["fleet-t001"]
    offered = names_offered(page, "f-release", "rel-0000")  # narrowed by the tenant typed above
    assert offered == ["rel-00001", "rel-00005", "rel-00009"]
    page.fill("#f-release", "")
    page.click("#occupancy-filters button[type=submit]")
    page.wait_for_url("**/occupancy/?window=15m&tenant_id=fleet-t001**")
    page.wait_for_function("() => document.getElementById('occupancy-chart').dataset.state === 'ready'")
    labels = page.evaluate("() => Chart.getChart('occupancy-chart').data.datasets"
                           ".filter(d => !(d.kvpool && d.kvpool.kind)).map(d => d.label)")
    assert labels and all(label.startswith("fleet-t001/") for label in labels)
    assert page.input_value("#f-tenant") == "fleet-t001"
    shot(page, "fleet-occupancy")

    # Checks: the nodes check fails for 30 silent nodes and shows 10 lines, a count and a link to all of them.
    page.goto("/checks/")
    card = page.locator('#checks [data-check="nodes_reporting"]')
    assert card.get_attribute("data-status") == "fail" and card.get_attribute("data-details-total") == "30"
    assert card.locator("details ul li").count() == 10
    shot(page, "fleet-checks")
    card.locator("a", has_text="All 30 details").click()
    page.wait_for_url("**/checks/nodes_reporting/")
    assert page.locator("#check-details li").count() == 30
    page.fill('form[data-search] input[name="q"]', "n0033")
    page.click("form[data-search] button")
    page.wait_for_url("**/checks/nodes_reporting/?q=n0033")
    assert page.locator("#check-details li").all_inner_texts()[0].startswith("node fleet-n0033: no heartbeat")
