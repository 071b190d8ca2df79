"""The pages at fleet size, tested with small numbers (issue 17): the number of queries of each page does not grow
with the number of rows (no query per row), lists are paginated, sortable and searchable, the overview shows top-N
lists with a link to the full list, and a check failing for many nodes is summarized. The registries are fleet-shaped
(``bench.fleet_registry``) with heartbeats and occupancy (``bench.pages.add_telemetry``)."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from bench.fleet_registry import build_fleet
from bench.pages import add_telemetry
from dashboard.models import NodeState
from tenants.models import Node, Release, Tenant

pytestmark = pytest.mark.django_db

SMALL = {"nodes": 3, "tenants": 2, "models": 2, "releases": 4, "scopes": 8, "scopes_per_node": 4}
LARGE = {"nodes": 9, "tenants": 5, "models": 5, "releases": 15, "scopes": 45, "scopes_per_node": 9}
PAGES = ("overview", "occupancy", "registry", "checks", "tenant", "model", "release", "node")


@pytest.fixture(autouse=True)
def _slow_silence(settings):
    """A node is silent after 30 minutes here (the fleets' silent nodes went quiet an hour ago), so that heartbeats
    of "now" stay fresh on a loaded machine."""
    settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS = 1800


def queries(client, url: str, params: dict | None = None) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, params or {})
    assert response.status_code == 200, (url, response.status_code)
    return len(captured)


def page_url(name: str) -> str:
    """The page ``name`` of the fleet in the database (a detail page: of its first object)."""
    release = Release.objects.select_related("model").order_by("namespace").first()
    detail = {"tenant": Tenant.objects.order_by("tenant_id").first(), "model": release.model, "release": release,
              "node": Node.objects.order_by("name").first()}
    if name in detail:
        return reverse(f"ui:{name}", args=[detail[name].pk])
    return reverse(f"ui:{name}") + ("?window=15m" if name == "occupancy" else "")


class _Undo(Exception):
    pass


def page_queries(client, shape: dict) -> dict[str, int]:
    """Queries of every page of ``PAGES`` with a fleet of ``shape`` (heartbeats, occupancy), rolled back after."""
    from django.core.cache import cache

    cache.clear()  # the overview's checklist run of another fleet
    counts: dict[str, int] = {}
    try:
        with transaction.atomic():
            add_telemetry(build_fleet(**shape), silent=1)
            for name in PAGES:
                queries(client, page_url(name))  # warm the per-process caches (content types, settings)
                counts[name] = queries(client, page_url(name))
            raise _Undo
    except _Undo:
        pass
    return counts


def test_query_count_of_every_page_does_not_grow_with_the_rows(ui):
    small, large = page_queries(ui, SMALL), page_queries(ui, LARGE)
    assert large == small, {name: (small[name], large[name]) for name in PAGES if small[name] != large[name]}


def test_registry_lists_are_paginated_sorted_and_searched(ui):
    fleet = build_fleet(nodes=30, tenants=2, models=2, releases=2, scopes=60, scopes_per_node=30)
    html = ui.get(reverse("ui:registry")).content.decode()
    assert html.count('<tr data-node="') == 25 and 'data-pager="nodes_" data-page="1" data-pages="2"' in html
    assert html.count('<tr data-group="') == 25 and 'data-count="60"' in html
    page2 = ui.get(reverse("ui:registry"), {"nodes_page": 2, "groups_page": 2}).content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', page2) == fleet.node_names[25:]
    # each list's pager keeps the other lists' parameters
    assert 'href="?nodes_page=2&amp;groups_page=3"' in page2
    descending = ui.get(reverse("ui:registry"), {"nodes_sort": "-name"}).content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', descending)[:2] == fleet.node_names[:-3:-1]
    assert 'data-sort-key="name" data-sort="descending"' in descending
    unknown = ui.get(reverse("ui:registry"), {"nodes_sort": "signing_secret"}).content.decode()
    assert re.findall(r'<tr data-node="([^"]+)"', unknown)[0] == fleet.node_names[0]  # not a sort key: the default
    found = ui.get(reverse("ui:registry"), {"q": "app-017"}).content.decode()
    assert re.findall(r'<tr data-group="([^"]+)"', found) == ["app-017", "app-017"]  # one per tenant
    assert '<tr data-node="' not in found and "No node matches." in found


def test_detail_page_lists_are_paginated_sorted_and_searched(ui):
    fleet = build_fleet(nodes=12, tenants=1, models=1, releases=12, scopes=480, scopes_per_node=480)
    tenant_url = reverse("ui:tenant", args=[Tenant.objects.get().pk])
    html = ui.get(tenant_url, {"groups_page": 2}).content.decode()
    assert 'data-pager="groups_" data-page="2" data-pages="2" data-count="40"' in html
    html = ui.get(tenant_url, {"groups_q": "app-03"}).content.decode()
    assert 'data-pager="groups_" data-page="1" data-pages="1" data-count="10"' in html
    node = Node.objects.get(name=fleet.node_names[0])
    node_html = ui.get(reverse("ui:node", args=[node.pk]), {"sort": "-port"}).content.decode()
    assert re.findall(r'<tr data-instance="\d+"><td>(\d+)</td>', node_html)[:2] == ["8011", "8010"]
    release = Release.objects.order_by("namespace").first()
    release_html = ui.get(reverse("ui:release", args=[release.pk])).content.decode()
    assert 'data-pager="instances_" data-page="1" data-pages="2" data-count="12"' in release_html


def test_the_overview_shows_the_top_nodes_and_links_the_full_list(ui):
    from dashboard.views.overview import OVERVIEW_ROWS

    fleet = build_fleet(nodes=OVERVIEW_ROWS + 5, tenants=1, models=1, releases=1, scopes=1, scopes_per_node=1)
    add_telemetry(fleet, silent=3, reports=0)
    html = ui.get(reverse("ui:overview")).content.decode()
    nodes = re.findall(r'<tr data-node="([^"]+)"', html)
    assert len(nodes) == OVERVIEW_ROWS
    assert nodes[:3] == fleet.node_names[-3:]  # nodes in trouble first
    assert f"{OVERVIEW_ROWS + 5} nodes" in html and "3 silent" in html
    assert f'href="{reverse("ui:registry")}#nodes"' in html


def test_a_check_failing_for_many_nodes_shows_a_count_the_first_lines_and_a_link(ui):
    from dashboard.checklist import SHOWN_DETAILS
    from dashboard.views.checks import DETAILS_PER_PAGE

    silent = DETAILS_PER_PAGE + 7
    fleet = build_fleet(nodes=silent + 2, tenants=1, models=1, releases=1, scopes=1, scopes_per_node=1)
    add_telemetry(fleet, alive=2, silent=silent, reports=0)
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
    name = fleet.node_names[5]
    found = ui.get(url, {"q": f"{name}:"}).content.decode()
    assert found.count("<li>node ") == 1 and f"node {name}: no heartbeat" in found
    assert ui.get(reverse("ui:check", args=["no_such_check"])).status_code == 404


def test_the_check_page_is_for_platform_admins(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("nobody"))
    assert client.get(reverse("ui:check", args=["nodes_reporting"])).status_code == 403


def test_the_overview_reuses_a_recent_checklist_run_and_the_checks_page_runs_it_afresh(ui):
    from dashboard.checklist import recent_checks

    fleet = build_fleet(nodes=3, tenants=1, models=1, releases=1, scopes=1, scopes_per_node=1)
    add_telemetry(fleet, reports=0)
    first = recent_checks()
    with CaptureQueriesContext(connection) as captured:
        assert recent_checks() == first  # no second run: no query
    assert len(captured) == 0
    html = ui.get(reverse("ui:overview")).content.decode()
    assert "check failed: Agents reporting" not in html
    NodeState.objects.filter(node_name=fleet.node_names[0]).update(heartbeat_at=timezone.now() - timedelta(hours=2))
    assert "check failed: Agents reporting" not in ui.get(reverse("ui:overview")).content.decode()  # the recent run
    assert 'data-check="nodes_reporting" data-status="fail"' in ui.get(reverse("ui:checks")).content.decode()
    assert "check failed: Agents reporting" in ui.get(reverse("ui:overview")).content.decode()  # the page's run


def test_the_occupancy_page_leaves_out_the_data_table_of_a_fleets_namespaces_and_links_the_json(ui, monkeypatch):
    from dashboard.views import occupancy

    monkeypatch.setattr(occupancy, "DATA_TABLE_MAX_SERIES", 3)
    add_telemetry(build_fleet(nodes=4, tenants=2, models=2, releases=4, scopes=8, scopes_per_node=4))
    html = ui.get(reverse("ui:occupancy"), {"window": "15m"}).content.decode()
    assert 'id="occupancy-data-json"' in html and 'id="occupancy-data"' not in html
    assert html.count('<tr data-namespace="') == 4  # the per-namespace table still lists every one
    html = ui.get(reverse("ui:occupancy"), {"window": "15m", "tenant_id": "fleet-t000"}).content.decode()
    assert 'id="occupancy-data"' in html and 'id="occupancy-data-json"' not in html


def test_tenant_bytes_now_sums_in_sql_what_current_occupancy_sums_in_python():
    from dashboard.telemetry.queries import current_occupancy, tenant_bytes, tenant_bytes_now
    from tests.support.rows import sample

    fleet = build_fleet(nodes=6, tenants=3, models=3, releases=6, scopes=18, scopes_per_node=6)
    add_telemetry(fleet, silent=1, reports=3, per_scope=True)
    now = timezone.now()
    sample(ts=now - timedelta(seconds=5), node=fleet.node_names[0], tenant_id="fleet-t000", model="model-0000",
           namespace="rel-00000", group="app-001", size=7 << 20)  # a newer report of one scope only
    sample(ts=now - timedelta(hours=2), node=fleet.node_names[1], tenant_id="fleet-t001", model="model-0001",
           namespace="rel-00001", size=1 << 30)  # too old to count
    expected = tenant_bytes(current_occupancy())
    assert tenant_bytes_now() == expected and len(expected) == 3 and all(expected.values())
