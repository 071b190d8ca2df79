"""The pages at fleet size, tested with small numbers (issue 17): the number of queries of each page does not grow
with the number of rows (no query per row), lists are paginated, sortable and searchable, and the overview shows
top-N lists with a link to the full list."""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.support.fleet import build_fleet

pytestmark = pytest.mark.django_db

SMALL = {"tenants": 2, "releases_per_model": 2, "groups_per_tenant": 3, "nodes": 3, "instances_per_node": 2}
LARGE = {"tenants": 5, "releases_per_model": 4, "groups_per_tenant": 9, "nodes": 9, "instances_per_node": 3}


def queries(client, url: str, params: dict | None = None) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, params or {})
    assert response.status_code == 200, (url, response.status_code)
    return len(captured)


def page_urls(fleet) -> dict[str, str]:
    tenant, release, node = fleet.tenants[0], fleet.releases[0], fleet.nodes[0]
    return {
        "overview": reverse("ui:overview"), "occupancy": reverse("ui:occupancy") + "?window=15m",
        "registry": reverse("ui:registry"), "checks": reverse("ui:checks"),
        "tenant": reverse("ui:tenant", args=[tenant.pk]), "model": reverse("ui:model", args=[release.model.pk]),
        "release": reverse("ui:release", args=[release.pk]), "node": reverse("ui:node", args=[node.pk]),
    }


@pytest.mark.parametrize("name", ["overview", "occupancy", "registry", "checks", "tenant", "model", "release", "node"])
def test_query_count_of_a_page_does_not_grow_with_the_rows(ui, name):
    small = page_urls(build_fleet(**SMALL))
    queries(ui, small[name])  # warm the per-process caches (content types, settings)
    before = queries(ui, small[name])
    large = page_urls(build_fleet(**LARGE, tag="x"))  # added to the small one: every index list grows
    after = queries(ui, large[name])
    assert after == before, f"{name}: {before} queries with the small fleet, {after} with the large one"


def test_registry_lists_are_paginated_sorted_and_searched(ui):
    build_fleet(tenants=2, groups_per_tenant=30, nodes=30, instances_per_node=1)
    html = ui.get(reverse("ui:registry")).content.decode()
    assert html.count('<tr data-node="') == 25 and 'data-pager="nodes_" data-page="1" data-pages="2"' in html
    assert html.count('<tr data-group="') == 25 and 'data-count="60"' in html
    page2 = ui.get(reverse("ui:registry"), {"nodes_page": 2}).content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', page2) == [f"node-{n:03d}" for n in range(25, 30)]
    # the other lists keep their first page; the pager links keep the other lists' parameters
    assert 'href="?nodes_page=2&amp;groups_page=2"' in page2
    descending = ui.get(reverse("ui:registry"), {"nodes_sort": "-name"}).content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', descending)[:2] == ["node-029", "node-028"]
    assert 'data-sort-key="name" data-sort="descending"' in descending
    unknown = ui.get(reverse("ui:registry"), {"nodes_sort": "signing_secret"}).content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', unknown)[0] == "node-000"  # not a sort key: the default
    found = ui.get(reverse("ui:registry"), {"q": "g017"}).content.decode()
    assert re.findall(r'<tr data-group="([^"]+)"', found) == ["t00-g017", "t01-g017"]
    assert '<tr data-node="' not in found and "No node matches." in found


def test_detail_page_lists_are_paginated_and_searched(ui):
    fleet = build_fleet(tenants=1, releases_per_model=3, groups_per_tenant=40, nodes=2, instances_per_node=30)
    tenant_url = reverse("ui:tenant", args=[fleet.tenants[0].pk])
    html = ui.get(tenant_url, {"groups_page": 2}).content.decode()
    assert 'data-pager="groups_" data-page="2" data-pages="2" data-count="40"' in html
    html = ui.get(tenant_url, {"groups_q": "g03"}).content.decode()
    assert 'data-pager="groups_" data-page="1" data-pages="1" data-count="10"' in html
    node_html = ui.get(reverse("ui:node", args=[fleet.nodes[0].pk]), {"sort": "-port"}).content.decode()
    assert re.findall(r'<tr data-instance="\d+"><td>(\d+)</td>', node_html)[:2] == ["8029", "8028"]
    release_html = ui.get(reverse("ui:release", args=[fleet.releases[0].pk])).content.decode()
    assert 'data-pager="instances_" data-page="1" data-pages="2" data-count="20"' in release_html


def test_the_overview_shows_the_top_nodes_and_links_the_full_list(ui):
    from dashboard.views.overview import OVERVIEW_ROWS

    build_fleet(tenants=1, nodes=OVERVIEW_ROWS + 5, instances_per_node=1, silent_nodes=3)
    html = ui.get(reverse("ui:overview")).content.decode()
    nodes = re.findall(r'<tr data-node="([^"]+)"', html)
    assert len(nodes) == OVERVIEW_ROWS
    silent = [f"node-{n:03d}" for n in range(OVERVIEW_ROWS + 2, OVERVIEW_ROWS + 5)]
    assert nodes[:3] == silent  # nodes in trouble first
    assert f"{OVERVIEW_ROWS + 5} nodes" in html and "3 silent" in html
    assert f'href="{reverse("ui:registry")}#nodes"' in html


def test_a_check_failing_for_many_nodes_shows_a_count_the_first_lines_and_a_link(ui):
    from dashboard.checklist import SHOWN_DETAILS
    from dashboard.views.checks import DETAILS_PER_PAGE

    silent = DETAILS_PER_PAGE + 7
    build_fleet(tenants=1, nodes=silent + 2, instances_per_node=1, silent_nodes=silent, samples=False)
    html = ui.get(reverse("ui:checks")).content.decode()
    card = html[html.index('data-check="nodes_reporting"'):]
    card = card[:card.index("</li>\n")]
    assert f'data-details-total="{silent}"' in card and f"{silent} silent node(s)" in card
    assert card.count("<li>node ") == SHOWN_DETAILS  # not one line per silent node
    assert f'href="{reverse("ui:check", args=["nodes_reporting"])}"' in card
    data = ui.get(reverse("ui:checks-data")).json()["checks"]
    reporting = next(check for check in data if check["key"] == "nodes_reporting")
    assert reporting["details_total"] == silent and len(reporting["details"]) == SHOWN_DETAILS
    # the check's own page pages through every line and searches them
    url = reverse("ui:check", args=["nodes_reporting"])
    last = ui.get(url, {"page": 2}).content.decode()
    assert last.count("<li>node ") == 7 and f'data-pages="2" data-count="{silent}"' in last
    found = ui.get(url, {"q": "node-003:"}).content.decode()
    assert found.count("<li>node ") == 1 and "node node-003: no heartbeat" in found
    assert ui.get(reverse("ui:check", args=["no_such_check"])).status_code == 404


def test_the_check_page_is_for_platform_admins(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("nobody"))
    assert client.get(reverse("ui:check", args=["nodes_reporting"])).status_code == 403
