"""GET /api/v1/telemetry/chargeback/ and chargeback.csv: numbers, tenant scoping, strict parameters, the CSV, the
schema."""
from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from dashboard.models import MasterHealth, OccupancySample
from tests.support.factories import grant_role, make_tenant
from tests.support.registry import token_client
from tests.support.rows import sample

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30
URL = "/api/v1/telemetry/chargeback/"
CSV_URL = "/api/v1/telemetry/chargeback.csv"
PERIOD = {"start": "2026-03-01T12:00:00Z", "end": "2026-03-01T14:00:00Z"}


@pytest.fixture
def usage(db):
    """acme: 1 GiB on node-a and 1 GiB on node-b for an hour (1-minute rows), plus 3 GiB in request group app-a
    for the first 30 minutes; beta: 4 GiB for an hour. A 32 GiB pool."""
    for minute in range(60):
        at = T0 + timedelta(minutes=minute)
        sample(ts=at, node="node-a", size=GIB, level=OccupancySample.Level.MINUTE)
        sample(ts=at, node="node-b", size=GIB, level=OccupancySample.Level.MINUTE)
        sample(ts=at, tenant_id="beta", model="llama", namespace="main", size=4 * GIB,
               level=OccupancySample.Level.MINUTE)
        if minute < 30:
            sample(ts=at, node="node-a", group="app-a", size=3 * GIB, level=OccupancySample.Level.MINUTE)
    MasterHealth.objects.create(pk=1, up=True, capacity_bytes=32 * GIB)


def test_rows_per_tenant_with_totals_and_share_of_capacity(viewer_api, usage):
    response = viewer_api.get(URL, PERIOD)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["start"], body["end"], body["hours"], body["group_by"]) == (
        "2026-03-01T12:00:00Z", "2026-03-01T14:00:00Z", 2.0, "tenant")
    assert body["capacity_bytes"] == 32 * GIB and body["capacity_byte_hours"] == 64 * GIB
    assert [(row["tenant_id"], row["gib_hours"]) for row in body["rows"]] == [("beta", 4.0), ("acme", 3.5)]
    acme = body["rows"][1]
    assert acme["byte_hours"] == 3.5 * GIB and acme["average_bytes"] == 1.75 * GIB
    assert acme["capacity_share"] == pytest.approx(3.5 / 64)
    assert acme["served_model_name"] is None and acme["request_group"] is None
    assert body["total_gib_hours"] == 7.5 and body["total_capacity_share"] == pytest.approx(7.5 / 64)
    assert body["max_gap_seconds"] == 60


def test_group_by_and_filters(viewer_api, usage):
    groups = viewer_api.get(URL, {**PERIOD, "group_by": "request_group", "tenant_id": "acme"}).json()["rows"]
    assert [(row["tenant_id"], row["request_group"], row["gib_hours"]) for row in groups] == [
        ("acme", "", 2.0), ("acme", "app-a", 1.5)]
    assert groups[0]["namespace"] is None
    releases = viewer_api.get(URL, {**PERIOD, "group_by": "release"}).json()["rows"]
    assert [(row["namespace"], row["gib_hours"]) for row in releases] == [("main", 4.0), ("production-2026-07", 3.5)]
    only = viewer_api.get(URL, {**PERIOD, "group_by": "scope", "request_group": "app-a"}).json()["rows"]
    assert [(row["request_group"], row["gib_hours"]) for row in only] == [("app-a", 1.5)]


def test_period_cuts_and_defaults(viewer_api, usage, settings):
    half = viewer_api.get(URL, {"start": "2026-03-01T12:15:00", "end": "2026-03-01T12:45:00",
                                "tenant_id": "beta"}).json()  # no offset: UTC
    assert half["rows"][0]["gib_hours"] == 2.0 and half["start"] == "2026-03-01T12:15:00Z"
    default = viewer_api.get(URL).json()  # the last 24 hours: nothing of 2026-03-01
    assert default["rows"] == [] and default["hours"] == 24.0
    blank = viewer_api.get(URL, {"start": "", "end": "", "group_by": "", "tenant_id": ""}).json()
    assert blank["rows"] == [] and blank["group_by"] == "tenant"
    end_only = viewer_api.get(URL, {"end": "2026-03-01T13:00:00+01:00"}).json()  # 12:00 UTC: before any row
    assert end_only["start"] == "2026-02-28T12:00:00Z" and end_only["rows"] == []


def test_capacity_unknown_gives_no_share(viewer_api, usage):
    MasterHealth.objects.filter(pk=1).update(capacity_bytes=None)
    body = viewer_api.get(URL, PERIOD).json()
    assert body["capacity_bytes"] is None and body["total_capacity_share"] is None
    assert {row["capacity_share"] for row in body["rows"]} == {None}


def test_a_tenant_member_sees_only_their_tenant(django_user_model, usage):
    acme = make_tenant("acme")
    make_tenant("beta")
    client = token_client(grant_role(django_user_model.objects.create_user("alice", password="pw"), acme,
                                     "viewer"))
    body = client.get(URL, {**PERIOD, "group_by": "scope"}).json()
    assert {row["tenant_id"] for row in body["rows"]} == {"acme"}
    assert body["total_gib_hours"] == 3.5
    assert client.get(URL, {**PERIOD, "tenant_id": "beta"}).json()["rows"] == []
    text = client.get(CSV_URL, {**PERIOD, "group_by": "release"}).content.decode()
    assert "beta" not in text and "main" not in text and "acme" in text


@pytest.mark.parametrize(("params", "field", "message"), [
    ({"start": "yesterday"}, "start", "Enter a valid date/time"),
    ({"end": "2026-13-01T00:00:00Z"}, "end", "Enter a valid date/time"),
    ({"start": "0001-01-01T00:00:00+05:00"}, "start", "out of range"),
    ({"group_by": "node"}, "group_by", "Select a valid choice"),
    ({"start": "2026-03-01T14:00:00Z", "end": "2026-03-01T14:00:00Z"}, "end", "must be after start"),
    ({"start": "2026-03-01T15:00:00Z", "end": "2026-03-01T14:00:00Z"}, "end", "must be after start"),
    ({"end": "0001-01-01T12:00:00Z"}, "start", "before year 1"),
])
def test_bad_parameters_are_a_400_naming_them(viewer_api, params, field, message):
    for url in (URL, CSV_URL):
        response = viewer_api.get(url, params)
        assert response.status_code == 400, (url, response.content)
        assert response["Content-Type"] == "application/json"
        body = response.json()
        assert list(body) == [field] and message in body[field][0], body


def test_a_parameter_given_twice_is_refused(viewer_api):
    response = viewer_api.get(f"{URL}?start=2026-03-01T12:00:00Z&start=2026-03-01T13:00:00Z&end=2026-03-02T00:00:00Z")
    assert response.status_code == 400 and list(response.json()) == ["start"]
    assert "more than once" in response.json()["start"][0]


def test_the_widest_period_is_answered(viewer_api, usage):
    body = viewer_api.get(URL, {"start": "0001-01-01T00:00:00Z", "end": "9999-12-31T23:59:59Z"}).json()
    assert body["total_gib_hours"] == 7.5


def test_csv_has_the_same_rows_with_units_in_the_header(viewer_api, usage):
    response = viewer_api.get(CSV_URL, {**PERIOD, "group_by": "model"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="chargeback-model-20260301T120000Z-20260301T140000Z.csv"')
    rows = list(csv.reader(io.StringIO(response.content.decode("utf-8"))))
    assert rows[0] == ["period_start", "period_end", "tenant_id", "served_model_name", "byte_hours (B·h)",
                       "gib_hours (GiB·h)", "average_bytes (B)", "capacity_share (fraction)"]
    json_rows = viewer_api.get(URL, {**PERIOD, "group_by": "model"}).json()["rows"]
    assert [(line[2], line[3], float(line[4]), float(line[5]), float(line[7])) for line in rows[1:]] == [
        (row["tenant_id"], row["served_model_name"], row["byte_hours"], row["gib_hours"], row["capacity_share"])
        for row in json_rows]
    assert {tuple(line[:2]) for line in rows[1:]} == {("2026-03-01T12:00:00+00:00", "2026-03-01T14:00:00+00:00")}
    assert viewer_api.get(CSV_URL, PERIOD, HTTP_ACCEPT="text/csv").status_code == 200
    assert viewer_api.get(CSV_URL, {**PERIOD, "format": "csv"}).status_code == 200


def test_anonymous_is_refused(anon):
    assert anon.get(URL).status_code == 401
    assert anon.get(CSV_URL).status_code == 401


def test_schema_documents_both_routes(admin_api):
    schema = admin_api.get("/api/schema/?format=json").json()
    operation = schema["paths"][URL]["get"]
    params = {param["name"]: param for param in operation["parameters"]}
    assert set(params) == {"start", "end", "group_by", "tenant_id", "served_model_name", "namespace",
                           "request_group"}
    assert set(params["group_by"]["schema"]["enum"]) == {"tenant", "model", "release", "request_group", "scope"}
    assert params["start"]["schema"] == {"type": "string", "format": "date-time"}
    assert "400" in operation["responses"]
    csv_operation = schema["paths"][CSV_URL]["get"]
    assert list(csv_operation["responses"]["200"]["content"]) == ["text/csv"]
