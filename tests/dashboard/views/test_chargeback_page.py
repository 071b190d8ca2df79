"""The Chargeback page: linked from the navigation, period picker, rows sorted by use, totals, share of capacity,
the CSV link, errors, tenant scoping."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from dashboard.models import MasterHealth, OccupancySample
from dashboard.views.chargeback import presets
from tests.support.factories import grant_role, make_tenant
from tests.support.rows import sample

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30
PERIOD = {"start": "2026-03-01T12:00:00", "end": "2026-03-01T14:00:00"}


@pytest.fixture
def usage(db):
    for minute in range(60):
        at = T0 + timedelta(minutes=minute)
        sample(ts=at, size=GIB, level=OccupancySample.Level.MINUTE)
        sample(ts=at, tenant_id="beta", model="llama", namespace="main", size=3 * GIB,
               level=OccupancySample.Level.MINUTE)
    MasterHealth.objects.create(pk=1, up=True, capacity_bytes=16 * GIB)


def test_the_navigation_links_the_page(viewer_ui):
    body = viewer_ui.get(reverse("ui:overview")).content.decode()
    assert f'href="{reverse("ui:chargeback")}"' in body


def test_rows_sorted_by_use_with_totals_share_and_csv_link(viewer_ui, usage):
    response = viewer_ui.get(reverse("ui:chargeback"), PERIOD)
    assert response.status_code == 200
    body = response.content.decode()
    table = body[body.index('id="chargeback-rows"'):]
    assert table.index(">beta<") < table.index(">acme<")
    assert [row["gib_hours"] for row in response.context["rows"]] == [3.0, 1.0]
    assert [row["share_percent"] for row in response.context["rows"]] == [3 / 32 * 100, 1 / 32 * 100]
    total = table[table.index('id="chargeback-total"'):]
    assert "4.000" in total and "12.500%" in total  # 4 GiB·h of 32 GiB·h
    assert 'data-share-percent="12.5"' in body
    csv_href = re.search(r'href="([^"]+)" id="chargeback-csv"', body)
    assert csv_href is not None
    url = csv_href.group(1).replace("&amp;", "&")
    assert urlsplit(url).path == "/api/v1/telemetry/chargeback.csv"
    download = viewer_ui.get(url)
    assert download.status_code == 200 and download.content.decode().count("\n") == 3
    assert parse_qs(urlsplit(url).query)["start"] == ["2026-03-01T12:00:00+00:00"]
    assert 'value="2026-03-01T12:00:00"' in body and 'value="2026-03-01T14:00:00"' in body


def test_group_by_release_shows_its_columns(viewer_ui, usage):
    response = viewer_ui.get(reverse("ui:chargeback"), {**PERIOD, "group_by": "release", "tenant_id": "acme"})
    assert response.context["key_labels"] == ["tenant", "served model", "release namespace"]
    assert [row["key"] for row in response.context["rows"]] == [["acme", "qwen3-8b", "production-2026-07"]]


def test_bad_parameters_show_the_error_with_status_400(viewer_ui, usage):
    response = viewer_ui.get(reverse("ui:chargeback"), {"start": "2026-03-01T15:00:00", "end": "2026-03-01T14:00"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "end: end (2026-03-01T14:00:00+00:00) must be after start" in body
    assert 'id="chargeback-rows"' not in body
    assert viewer_ui.get(reverse("ui:chargeback"), {"group_by": "node"}).status_code == 400


def test_presets_cover_days_and_months():
    now = datetime(2026, 3, 15, 10, 30, 5, 123, tzinfo=UTC)
    found = {label: (start, end) for label, start, end in presets(now)}
    assert found["last 24 hours"] == (datetime(2026, 3, 14, 10, 30, 5, tzinfo=UTC),
                                      datetime(2026, 3, 15, 10, 30, 5, tzinfo=UTC))
    assert found["this month"][0] == datetime(2026, 3, 1, tzinfo=UTC)
    assert found["last month"] == (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))


def test_preset_links_keep_the_grouping(viewer_ui):
    response = viewer_ui.get(reverse("ui:chargeback"), {"group_by": "model"})
    assert response.status_code == 200 and response.context["rows"] == []
    for _label, href in response.context["presets"]:
        query = parse_qs(href.lstrip("?"))
        assert query["group_by"] == ["model"] and set(query) == {"group_by", "start", "end"}


def test_a_tenant_member_sees_only_their_tenant(client, django_user_model, usage):
    acme = make_tenant("acme")
    make_tenant("beta")
    client.force_login(grant_role(django_user_model.objects.create_user("alice", password="pw"), acme, "viewer"))
    response = client.get(reverse("ui:chargeback"), {**PERIOD, "group_by": "scope"})
    body = response.content.decode()
    assert [row["key"][0] for row in response.context["rows"]] == ["acme"]
    assert "beta" not in body and "llama" not in body
