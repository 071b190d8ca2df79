"""``request_group`` has one meaning per value (docs/design.md, Names): a request group's name is that group's row,
``""`` (``NO_REQUEST_GROUP``) the release's row without a request group, ``"(engine)"`` (``ENGINE_LOOKUPS``) the
release's row of the engines' lookups, and ``None`` (JSON ``null``, no query parameter) the whole release; never
``""`` for the whole release or for "every group"."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.http import QueryDict
from django.urls import reverse

from agent.contract.scope import ENGINE_LOOKUPS, NO_REQUEST_GROUP, CacheScope, instance_scopes
from dashboard.models import MasterHealth, OccupancySample
from dashboard.telemetry.queries import OccupancyFilter, current_occupancy, occupancy_series
from tests.support.rows import sample

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
RELEASE = CacheScope("acme", "qwen3-8b", "production-2026-07")


def test_a_scope_without_request_group_is_the_whole_release_not_the_row_without_a_group():
    row = RELEASE._replace(request_group=NO_REQUEST_GROUP)
    group = RELEASE._replace(request_group="app-a")
    assert RELEASE.request_group is None and row != RELEASE
    assert row.release_scope() == group.release_scope() == RELEASE.release_scope() == RELEASE
    assert (RELEASE.label, row.label, group.label) == ("acme/qwen3-8b/production-2026-07",
                                                       "acme/qwen3-8b/production-2026-07/-",
                                                       "acme/qwen3-8b/production-2026-07/app-a")


def test_an_instance_speaks_for_rows_only():
    scopes = instance_scopes("acme", "qwen3-8b", "production-2026-07", ["app-a"])
    assert scopes == {RELEASE._replace(request_group=""), RELEASE._replace(request_group="app-a"),
                      RELEASE._replace(request_group=ENGINE_LOOKUPS)}
    assert all(scope.request_group is not None for scope in scopes)


@pytest.mark.django_db
def test_the_engine_lookups_row_is_no_request_group_name_and_no_unregistered_group():
    from django.core.exceptions import ValidationError

    from dashboard.checklist import check_names_stable
    from tenants.validators import validate_dns_label
    from tests.support.factories import make_model, make_release, make_tenant

    with pytest.raises(ValidationError):
        validate_dns_label(ENGINE_LOOKUPS)
    make_release(make_model(make_tenant("acme"), "qwen3-8b"), "production-2026-07", hash_seed="42")
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=30), group=ENGINE_LOOKUPS, size=0, hit_blocks=3)
    sample(ts=now - timedelta(seconds=30), group="no-such-group", size=0)
    details = check_names_stable(now).details
    assert any("'no-such-group' is not registered" in line for line in details)  # the check reads these rows
    assert not any(ENGINE_LOOKUPS in line for line in details)


def test_blank_or_absent_request_group_parameter_is_no_filter():
    for query in ("", "request_group=", "request_group=%20"):
        assert OccupancyFilter.from_params(QueryDict(query)).request_group is None
    assert OccupancyFilter.from_params(QueryDict("request_group=app-a")).request_group == "app-a"
    assert OccupancyFilter(request_group="app-a").as_params() == {"request_group": "app-a"}
    assert OccupancyFilter().as_params() == OccupancyFilter(request_group="").as_params() == {}


@pytest.mark.django_db
def test_the_row_without_a_group_can_be_selected_on_its_own_and_none_selects_every_row():
    sample(ts=NOW - timedelta(seconds=30), group="", size=1000, hit_blocks=3)
    sample(ts=NOW - timedelta(seconds=30), group="app-a", size=24)
    whole = occupancy_series("15m", OccupancyFilter(request_group=None), now=NOW).series
    assert [(s.key, s.latest_bytes) for s in whole] == [(RELEASE, 1024)]
    alone = occupancy_series("15m", OccupancyFilter(request_group=NO_REQUEST_GROUP), now=NOW).series
    assert [(s.key, s.latest_bytes) for s in alone] == [(RELEASE, 1000)]
    queryset = OccupancyFilter(request_group="").apply(OccupancySample.objects.all())
    assert list(queryset.values_list("request_group", flat=True)) == [""]


@pytest.mark.django_db
def test_current_occupancy_keys_whole_releases_and_lists_the_row_without_a_group():
    now = datetime.now(UTC)
    sample(ts=now - timedelta(seconds=30), group="", size=10)
    sample(ts=now - timedelta(seconds=30), group="app-a", size=5)
    (key, entry), = current_occupancy(now=now).items()
    assert key == RELEASE and key.request_group is None
    assert entry.bytes == 15 and entry.by_group == {"": 10, "app-a": 5}


@pytest.mark.django_db
def test_occupancy_json_sends_null_for_the_whole_release(ui):
    sample(ts=datetime.now(UTC) - timedelta(seconds=30), group="app-a", size=1 << 20)
    payload = ui.get(reverse("ui:occupancy-data"), {"window": "15m", "request_group": ""}).json()
    assert payload["filters"]["request_group"] is None
    (series,) = payload["series"]
    assert series["request_group"] is None and series["label"] == "acme/qwen3-8b/production-2026-07"
    one = ui.get(reverse("ui:occupancy-data"), {"window": "15m", "request_group": "app-a"}).json()
    assert one["filters"]["request_group"] == "app-a" and one["series"][0]["request_group"] is None


@pytest.mark.django_db
def test_chargeback_names_the_row_without_a_group_only_in_the_request_group_column(viewer_ui):
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    for minute in range(60):
        at = start + timedelta(minutes=minute)
        sample(ts=at, group="", namespace="", size=1 << 30, level=OccupancySample.Level.MINUTE)
        sample(ts=at, group="app-a", namespace="", size=1 << 30, level=OccupancySample.Level.MINUTE)
    MasterHealth.objects.create(pk=1, up=True, capacity_bytes=16 << 30)
    period = {"start": "2026-03-01T12:00:00", "end": "2026-03-01T14:00:00"}
    body = viewer_ui.get(reverse("ui:chargeback"), {**period, "group_by": "scope"}).content.decode()
    table = body[body.index('id="chargeback-rows"'):body.index('id="chargeback-total"')]
    assert table.count("(no group)") == 1  # the empty namespace is not a request group
    body = viewer_ui.get(reverse("ui:chargeback"), {**period, "group_by": "release"}).content.decode()
    assert "(no group)" not in body[body.index('id="chargeback-rows"'):]
    api = viewer_ui.get(reverse("telemetry-chargeback"), {**period, "group_by": "request_group",
                                                          "request_group": ""}).json()
    assert sorted(row["request_group"] for row in api["rows"]) == ["", "app-a"]  # blank: every group
